// The commands of MPI_Init's hot path, answered on the engine's thread: PMI-1 init, get_maxes,
// get_appnum, get_my_kvsname, get_universe_size, put, get, barrier_in; PMI-2 fullinit (after the
// starter's initack), job-getid, kvs-put, kvs-get, kvs-fence, info-getjobattr, info-putnodeattr,
// info-getnodeattr. Their replies are those of src/pmi/pmi1-session.ts and pmi2-session.ts.
//
// A command is served here only on its happy path or where its error depends on the job's state
// (budget, visibility, the job's end, a failed fence). Anything else, a malformed argument
// included, returns false and goes to JavaScript whole, where the TypeScript handlers word the
// error; so do finalize and abort, which the job lifecycle must see before the rank hears back.
#include "pmi/engine.h"

namespace dpmix::pmi {

namespace {

constexpr std::string_view kReserved = "PMI_";

// connection-state.ts checkKey without its errors: false where it would throw.
bool KeyOk(const std::string_view *key, bool forPut) {
  if (!key || key->empty() || key->size() > static_cast<size_t>(kKeyMax)) return false;
  for (char ch : *key) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) return false;
  }
  return !(forPut && key->substr(0, kReserved.size()) == kReserved);
}

bool ValueOk(const std::string_view *v) { return v && v->size() <= static_cast<size_t>(kValueMax); }

bool IsTrue(const std::string_view *s) { return s && (*s == "TRUE" || *s == "true" || *s == "1"); }

Waiter WaiterFor(const Engine::Conn &c, bool pmi2, const std::string_view *thrid) {
  Waiter w;
  w.conn = c.id;
  w.pmi2 = pmi2;
  if (thrid) {
    w.hasThrid = true;
    w.thrid = std::string(*thrid);
  }
  return w;
}

// A job attribute: those the server derives whatever the job's state, then (while the job lives)
// those of ranks on this host. nullptr with `over` set: the job has ended.
const std::string *JobAttr(const Engine::Conn &c, std::string_view key, const std::string **over) {
  if (const std::string *v = c.job->Derived(key)) return v;
  if (c.job->over()) {
    *over = &*c.job->over();
    return nullptr;
  }
  return c.job->LocalAttr(c.rank, key);
}

// finalize / abort (either protocol): JavaScript tells the job lifecycle, then answers; from
// here on the connection is done, and a finalized rank's staged puts are dropped.
bool Ends(Engine &e, Engine::Conn &c, const Frame &f, std::string_view name) {
  e.Forward(c, f);
  c.phase = name == "finalize" ? Phase::kFinalized : Phase::kAborted;
  if (name == "finalize") c.job->Drop(c.rank);
  return true;
}

}  // namespace

bool ServePmi1(Engine &e, Engine::Conn &c, const Command &cmd, const Frame &f) {
  Job &job = *c.job;
  const JobSpec &spec = job.spec();
  const std::string_view name = cmd.cmd;

  if (name == "put" || name == "get") {
    const std::string_view *kvs = cmd.Get("kvsname");
    if (!kvs || *kvs != spec.kvsname) return false;
  }

  if (name == "get") {
    const std::string_view *key = cmd.Get("key");
    if (!KeyOk(key, false)) return false;
    const std::string *over = nullptr;
    const std::string *attr = JobAttr(c, *key, &over);
    if (attr) {
      e.Send(c, Pmi1Reply("get_result").Str("rc", "0").Str("value", *attr).Done());
      return true;
    }
    if (over) {
      e.Send(c, Pmi1Error("get_result", *over));
      return true;
    }
    if (key->substr(0, kReserved.size()) == kReserved || *key == "universeSize") {
      e.Send(c, Pmi1Error("get_result", "job attribute " + std::string(*key) + " not available"));
      return true;
    }
    const std::string *value = nullptr;
    switch (job.Lookup(c.rank, *key, &value)) {
      case Job::Found::kYes: {
        std::string scratch;
        e.Send(c,
               Pmi1Reply("get_result", value->size()).Str("rc", "0").Str("value", Pmi1Value(*value, scratch)).Done());
      } break;
      case Job::Found::kUnfenced:
        e.Send(c, Pmi1Error("get_result", "key " + std::string(*key) +
                                              " was put by another rank and is visible after the next barrier"));
        break;
      case Job::Found::kUnknown:
        e.Send(c, Pmi1Error("get_result", "key " + std::string(*key) + " not found"));
        break;
    }
    return true;
  }

  if (name == "put") {
    const std::string_view *key = cmd.Get("key");
    const std::string_view *value = cmd.Get("value");
    if (!KeyOk(key, true) || !ValueOk(value)) return false;
    if (job.over()) {
      e.Send(c, Pmi1Error("put_result", *job.over()));
      return true;
    }
    if (auto err = job.Stage(c.rank, *key, *value)) {
      e.Send(c, Pmi1Error("put_result", *err));
      return true;
    }
    static const std::string ok = Pmi1Reply("put_result").Str("rc", "0").Done();
    e.Send(c, ok);
    return true;
  }

  if (name == "barrier_in") {
    if (cmd.Get("group")) return false;
    if (job.over()) {
      e.Send(c, Pmi1Error("barrier_out", *job.over(), true));
      return true;
    }
    std::optional<FenceEnd> ended;
    if (auto err = job.Join(c.rank, WaiterFor(c, false, nullptr), e.Now(), &ended)) {
      e.Send(c, Pmi1Error("barrier_out", *err, true));
      return true;
    }
    c.pmi1Blocked = true;
    c.pmi1Seq = 0;
    // Last: answering may end connections, this one included.
    if (ended) e.Answer(*ended, c.jobId);
    return true;
  }

  if (name == "init") {
    const std::string_view *v = cmd.Get("pmi_version");
    if (!v || (*v != "1" && *v != "2")) return false;
    // 1.1, not 1.2: keeps the client single-threaded and off tagged group barriers.
    e.Send(c, Pmi1Reply("response_to_init")
                  .Str("rc", "0")
                  .Str("pmi_version", *v)
                  .Str("pmi_subversion", *v == "1" ? "1" : "0")
                  .Done());
    return true;
  }
  if (name == "get_maxes") {
    static const std::string maxes = Pmi1Reply("maxes")
                                         .Str("rc", "0")
                                         .Int("kvsname_max", kKvsnameMax)
                                         .Int("keylen_max", kKeyMax)
                                         .Int("vallen_max", kValueMax)
                                         .Done();
    e.Send(c, maxes);
    return true;
  }
  if (name == "get_appnum") {
    e.Send(c, Pmi1Reply("appnum").Str("rc", "0").Int("appnum", spec.appnum).Done());
    return true;
  }
  if (name == "get_my_kvsname") {
    e.Send(c, Pmi1Reply("my_kvsname").Str("rc", "0").Str("kvsname", spec.kvsname).Done());
    return true;
  }
  if (name == "get_universe_size") {
    e.Send(c, Pmi1Reply("universe_size").Str("rc", "0").Int("size", spec.universeSize).Done());
    return true;
  }
  if (name == "finalize" || name == "abort") return Ends(e, c, f, name);
  return false;
}

bool ServePmi2(Engine &e, Engine::Conn &c, const Command &cmd, const Frame &f) {
  Job &job = *c.job;
  const JobSpec &spec = job.spec();
  const std::string_view name = cmd.cmd;
  const std::string_view *thrid = cmd.Get("thrid");
  const std::string response = std::string(name) + "-response";
  auto ok = [&]() { return Pmi2Reply(response, thrid, c.state.escapes).Str("rc", "0"); };
  auto fail = [&](const std::string &message) { e.Send(c, Pmi2Error(response, message, thrid)); };

  if (name == "kvs-put") {
    const std::string_view *key = cmd.Get("key");
    const std::string_view *value = cmd.Get("value");
    if (!KeyOk(key, true) || !ValueOk(value)) return false;
    if (job.over())
      fail(*job.over());
    else if (auto err = job.Stage(c.rank, *key, *value))
      fail(*err);
    else
      e.Send(c, ok().Done());
    return true;
  }

  if (name == "kvs-get") {
    if (const std::string_view *jobid = cmd.Get("jobid"); jobid && *jobid != spec.kvsname) return false;
    const std::string_view *key = cmd.Get("key");
    if (!KeyOk(key, false)) return false;
    if (job.over()) {
      fail(*job.over());
      return true;
    }
    const std::string *value = nullptr;
    switch (job.Lookup(c.rank, *key, &value)) {
      case Job::Found::kYes:
        e.Send(c, ok().Bool("found", true).Str("value", *value).Done());
        break;
      case Job::Found::kUnfenced:
        fail("key " + std::string(*key) + " was put by another rank and is visible after the next kvs-fence");
        break;
      case Job::Found::kUnknown:
        e.Send(c, ok().Bool("found", false).Done());
        break;
    }
    return true;
  }

  if (name == "kvs-fence") {
    if (job.over()) {
      fail(*job.over());
      return true;
    }
    std::optional<FenceEnd> ended;
    if (auto err = job.Join(c.rank, WaiterFor(c, true, thrid), e.Now(), &ended)) {
      fail(*err);
      return true;
    }
    if (ended) e.Answer(*ended, c.jobId);
    return true;
  }

  if (name == "info-getjobattr") {
    if (const std::string_view *kvs = cmd.Get("kvsname"); kvs && *kvs != spec.kvsname) return false;
    const std::string_view *key = cmd.Get("key");
    if (!KeyOk(key, false)) return false;
    const std::string *over = nullptr;
    const std::string *attr = JobAttr(c, *key, &over);
    if (over)
      fail(*over);
    else if (attr)
      e.Send(c, ok().Bool("found", true).Str("value", *attr).Done());
    else
      e.Send(c, ok().Bool("found", false).Done());
    return true;
  }

  if (name == "info-putnodeattr") {
    const std::string_view *key = cmd.Get("key");
    const std::string_view *value = cmd.Get("value");
    if (!KeyOk(key, false) || !ValueOk(value)) return false;
    if (job.over()) {
      fail(*job.over());
      return true;
    }
    std::vector<Waiter> woken;
    if (auto err = job.PutNode(c.rank, *key, *value, &woken)) {
      fail(*err);
      return true;
    }
    e.Send(c, ok().Done());
    const std::string v(*value);
    for (const Waiter &w : woken) e.AnswerNode(w, &v, nullptr);
    return true;
  }

  if (name == "info-getnodeattr") {
    const std::string_view *key = cmd.Get("key");
    if (!KeyOk(key, false)) return false;
    if (job.over()) {
      fail(*job.over());
      return true;
    }
    if (const std::string *v = job.GetNode(c.rank, *key))
      e.Send(c, ok().Bool("found", true).Str("value", *v).Done());
    else if (IsTrue(cmd.Get("wait")))
      job.WaitNode(c.rank, *key, WaiterFor(c, true, thrid));
    else
      e.Send(c, ok().Bool("found", false).Done());
    return true;
  }

  if (name == "job-getid") {
    e.Send(c, ok().Str("jobid", spec.kvsname).Done());
    return true;
  }

  if (name == "fullinit") {
    // Handed over after the starter's initack: the client names itself by its rank, or by
    // nothing (-1). Anything else (a second fullinit, another rank) JavaScript refuses.
    if (!c.state.fullinitDue) return false;
    const std::string_view *id = cmd.Get("srcid");
    if (!id) id = cmd.Get("pmirank");
    if (id && *id != "-1" && *id != std::to_string(c.rank)) return false;
    c.state.fullinitDue = false;
    c.state.escapes = cmd.Get("threaded") != nullptr;
    // Older clients insist on pmi-version and pmi-subversion and read pmiverbose as TRUE/FALSE.
    e.Send(c, ok().Int("pmi-version", 2)
                  .Int("pmi-subversion", 0)
                  .Int("rank", c.rank)
                  .Int("size", spec.size)
                  .Int("appnum", spec.appnum)
                  .Bool("pmiverbose", false)
                  .Done());
    return true;
  }

  if (name == "finalize" || name == "abort") return Ends(e, c, f, name);
  return false;
}

}  // namespace dpmix::pmi
