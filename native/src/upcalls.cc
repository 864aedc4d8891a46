#include "upcalls.h"

#include <pmix.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "bridge.h"
#include "values.h"

namespace dpmix {
namespace upcalls {

namespace {

Napi::FunctionReference g_handler;  // JavaScript thread only
std::atomic<bool> g_finalized{false};
// Upcalls (or "upcall.op") that JavaScript only hears about: libpmix is answered at once with
// PMIX_OPERATION_SUCCEEDED. Set at Install, read-only afterwards.
std::vector<std::string> g_immediate;

bool IsImmediate(const char* name) {
  for (const auto& n : g_immediate)
    if (n == name) return true;
  return false;
}

// One upcall in flight. Constructed on the progress thread with copies of its arguments,
// answered on the JavaScript thread (Reply) or wherever it is dropped (Fail).
class Upcall {
 public:
  explicit Upcall(const char* name) : name_(name) {}
  virtual ~Upcall() = default;
  const char* name() const { return name_; }
  virtual Napi::Object Args(Napi::Env env) const = 0;
  // Converts `result` and calls libpmix's callback. Throws (before calling back) on bad input.
  virtual void Reply(Napi::Env env, pmix_status_t status, const Napi::Value& result) = 0;
  // Calls libpmix's callback with an error and no data.
  virtual void Fail(pmix_status_t status) = 0;

 protected:
  static bool CanCallBack() { return !g_finalized.load(); }

 private:
  const char* name_;
};

// ---- reply kinds: one per libpmix callback type --------------------------------------------

class OpUpcall : public Upcall {
 public:
  OpUpcall(const char* name, pmix_op_cbfunc_t cb, void* cbdata) : Upcall(name), cb_(cb), cbdata_(cbdata) {}
  void Reply(Napi::Env, pmix_status_t status, const Napi::Value&) override { Fail(status); }
  void Fail(pmix_status_t status) override {
    if (cb_ && CanCallBack()) cb_(status, cbdata_);
  }

 private:
  pmix_op_cbfunc_t cb_;
  void* cbdata_;
};

void FreeRelease(void* p) { free(p); }

class ModexUpcall : public Upcall {
 public:
  ModexUpcall(const char* name, pmix_modex_cbfunc_t cb, void* cbdata) : Upcall(name), cb_(cb), cbdata_(cbdata) {}
  void Reply(Napi::Env, pmix_status_t status, const Napi::Value& result) override {
    Bytes b = Bytes::FromJs(result);
    if (!cb_ || !CanCallBack()) return free(b.data);
    // libpmix keeps the blob until it calls FreeRelease.
    cb_(status, b.data, b.size, cbdata_, FreeRelease, b.data);
  }
  void Fail(pmix_status_t status) override {
    if (cb_ && CanCallBack()) cb_(status, nullptr, 0, cbdata_, nullptr, nullptr);
  }

 private:
  pmix_modex_cbfunc_t cb_;
  void* cbdata_;
};

struct InfoRelease {
  pmix_info_t* info;
  size_t n;
};
void ReleaseInfo(void* p) {
  auto* r = static_cast<InfoRelease*>(p);
  if (r->info) PMIx_Info_free(r->info, r->n);
  delete r;
}

class InfoUpcall : public Upcall {
 public:
  InfoUpcall(const char* name, pmix_info_cbfunc_t cb, void* cbdata) : Upcall(name), cb_(cb), cbdata_(cbdata) {}
  void Reply(Napi::Env, pmix_status_t status, const Napi::Value& result) override {
    Info info = Info::FromJs(result);
    if (!cb_ || !CanCallBack()) return;
    size_t n = info.size();
    auto* rel = new InfoRelease{info.Release(), n};
    // libpmix keeps the array until it calls ReleaseInfo.
    cb_(status, rel->info, n, cbdata_, ReleaseInfo, rel);
  }
  void Fail(pmix_status_t status) override {
    if (cb_ && CanCallBack()) cb_(status, nullptr, 0, cbdata_, nullptr, nullptr);
  }

 private:
  pmix_info_cbfunc_t cb_;
  void* cbdata_;
};

class LookupUpcall : public Upcall {
 public:
  LookupUpcall(const char* name, pmix_lookup_cbfunc_t cb, void* cbdata) : Upcall(name), cb_(cb), cbdata_(cbdata) {}
  void Reply(Napi::Env env, pmix_status_t status, const Napi::Value& result) override {
    size_t n = 0;
    pmix_pdata_t* pdata = nullptr;
    if (result.IsArray()) {
      Napi::Array a = result.As<Napi::Array>();
      n = a.Length();
      pdata = n ? PMIx_Pdata_create(n) : nullptr;
      try {
        for (uint32_t i = 0; i < n; ++i) {
          Napi::Value item = a.Get(i);
          if (!item.IsObject()) throw Napi::TypeError::New(env, "lookup result items are {proc, key, value}");
          Napi::Object o = item.As<Napi::Object>();
          pdata[i].proc = ProcFromJs(o.Get("proc"));
          std::string key = o.Get("key").ToString().Utf8Value();
          if (key.size() > PMIX_MAX_KEYLEN) throw Napi::TypeError::New(env, "lookup key too long");
          std::strncpy(pdata[i].key, key.c_str(), PMIX_MAX_KEYLEN);
          ValueFromJs(o.Get("value"), &pdata[i].value);
        }
      } catch (...) {
        if (pdata) PMIx_Pdata_free(pdata, n);
        throw;
      }
    } else if (!result.IsUndefined() && !result.IsNull()) {
      throw Napi::TypeError::New(env, "lookup result must be an array");
    }
    // libpmix packs the data before returning, so it is freed right after.
    if (cb_ && CanCallBack()) cb_(status, pdata, n, cbdata_);
    if (pdata) PMIx_Pdata_free(pdata, n);
  }
  void Fail(pmix_status_t status) override {
    if (cb_ && CanCallBack()) cb_(status, nullptr, 0, cbdata_);
  }

 private:
  pmix_lookup_cbfunc_t cb_;
  void* cbdata_;
};

class SpawnUpcall : public Upcall {
 public:
  SpawnUpcall(const char* name, pmix_spawn_cbfunc_t cb, void* cbdata) : Upcall(name), cb_(cb), cbdata_(cbdata) {}
  void Reply(Napi::Env env, pmix_status_t status, const Napi::Value& result) override {
    pmix_nspace_t ns;
    std::memset(ns, 0, sizeof ns);
    if (result.IsString()) {
      std::string s = result.As<Napi::String>().Utf8Value();
      if (s.size() > PMIX_MAX_NSLEN) throw Napi::TypeError::New(env, "spawned nspace too long");
      std::memcpy(ns, s.data(), s.size());
    }
    if (cb_ && CanCallBack()) cb_(status, ns, cbdata_);
  }
  void Fail(pmix_status_t status) override {
    pmix_nspace_t ns;
    std::memset(ns, 0, sizeof ns);
    if (cb_ && CanCallBack()) cb_(status, ns, cbdata_);
  }

 private:
  pmix_spawn_cbfunc_t cb_;
  void* cbdata_;
};

class ToolUpcall : public Upcall {
 public:
  ToolUpcall(const char* name, pmix_tool_connection_cbfunc_t cb, void* cbdata)
      : Upcall(name), cb_(cb), cbdata_(cbdata) {}
  void Reply(Napi::Env, pmix_status_t status, const Napi::Value& result) override {
    pmix_proc_t proc;
    PMIx_Proc_construct(&proc);
    if (result.IsObject()) proc = ProcFromJs(result);
    if (cb_ && CanCallBack()) cb_(status, &proc, cbdata_);
  }
  void Fail(pmix_status_t status) override {
    if (cb_ && CanCallBack()) cb_(status, nullptr, cbdata_);
  }

 private:
  pmix_tool_connection_cbfunc_t cb_;
  void* cbdata_;
};

class CredentialUpcall : public Upcall {
 public:
  CredentialUpcall(const char* name, pmix_credential_cbfunc_t cb, void* cbdata)
      : Upcall(name), cb_(cb), cbdata_(cbdata) {}
  // result: {credential: Buffer, info?: Info[]}
  void Reply(Napi::Env env, pmix_status_t status, const Napi::Value& result) override {
    if (!result.IsObject()) throw Napi::TypeError::New(env, "credential result is {credential, info}");
    Napi::Object o = result.As<Napi::Object>();
    Bytes b = Bytes::FromJs(o.Get("credential"));
    Info info;
    try {
      info = Info::FromJs(o.Get("info"));
    } catch (...) {
      free(b.data);
      throw;
    }
    pmix_byte_object_t bo{b.data, b.size};
    if (cb_ && CanCallBack()) cb_(status, &bo, info.data(), info.size(), cbdata_);
    free(b.data);
  }
  void Fail(pmix_status_t status) override {
    if (cb_ && CanCallBack()) cb_(status, nullptr, nullptr, 0, cbdata_);
  }

 private:
  pmix_credential_cbfunc_t cb_;
  void* cbdata_;
};

class ValidationUpcall : public Upcall {
 public:
  ValidationUpcall(const char* name, pmix_validation_cbfunc_t cb, void* cbdata)
      : Upcall(name), cb_(cb), cbdata_(cbdata) {}
  void Reply(Napi::Env, pmix_status_t status, const Napi::Value& result) override {
    Info info = Info::FromJs(result);
    if (cb_ && CanCallBack()) cb_(status, info.data(), info.size(), cbdata_);
  }
  void Fail(pmix_status_t status) override {
    if (cb_ && CanCallBack()) cb_(status, nullptr, 0, cbdata_);
  }

 private:
  pmix_validation_cbfunc_t cb_;
  void* cbdata_;
};

// ---- delivery to JavaScript -----------------------------------------------------------------

// Owned by the JS `done` function: answers libpmix if JavaScript drops the request unanswered.
struct Pending {
  Upcall* upcall;
};

void FinalizePending(Napi::Env, Pending* pending) {
  if (pending->upcall) {
    pending->upcall->Fail(PMIX_ERROR);
    delete pending->upcall;
  }
  delete pending;
}

Napi::Value Done(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto* pending = static_cast<Pending*>(info.Data());
  if (!pending->upcall) throw Napi::Error::New(env, "this upcall has already been answered");
  std::unique_ptr<Upcall> upcall(pending->upcall);
  pending->upcall = nullptr;
  pmix_status_t status = PMIX_SUCCESS;
  if (info.Length() > 0 && !info[0].IsUndefined()) {
    if (!info[0].IsNumber()) {
      upcall->Fail(PMIX_ERR_BAD_PARAM);
      throw Napi::TypeError::New(env, "done(status, result): status must be a number");
    }
    status = info[0].As<Napi::Number>().Int32Value();
  }
  Napi::Value result = info.Length() > 1 ? info[1] : env.Undefined();
  try {
    upcall->Reply(env, status, result);
  } catch (const Napi::Error&) {
    // The reply could not be converted: the client gets an error, the caller the exception.
    upcall->Fail(PMIX_ERR_BAD_PARAM);
    throw;
  }
  return env.Undefined();
}

class Delivery : public Task {
 public:
  explicit Delivery(Upcall* upcall) : upcall_(upcall) {}
  void Run(Napi::Env env) override {
    Napi::HandleScope scope(env);
    if (g_handler.IsEmpty()) return upcall_->Fail(PMIX_ERR_NOT_AVAILABLE);
    Napi::Object args = upcall_->Args(env);
    const char* name = upcall_->name();
    auto* pending = new Pending{upcall_.release()};
    Napi::Function done = Napi::Function::New(env, Done, name, pending);
    napi_add_finalizer(
        env, done, pending,
        [](napi_env e, void* data, void*) { FinalizePending(Napi::Env(e), static_cast<Pending*>(data)); },
        nullptr, nullptr);
    try {
      g_handler.Call({Napi::String::New(env, name), args, done});
    } catch (const Napi::Error& e) {
      // A throwing handler must not leave the client waiting.
      if (pending->upcall) {
        pending->upcall->Fail(PMIX_ERROR);
        delete pending->upcall;
        pending->upcall = nullptr;
      }
      e.Value().Set("upcall", Napi::String::New(env, name));
      throw;
    }
  }
  void Abandon() override { upcall_->Fail(PMIX_ERR_NOT_AVAILABLE); }

 private:
  std::unique_ptr<Upcall> upcall_;
};

// Posts the upcall; the return value is what the module function gives libpmix.
pmix_status_t Post(Upcall* upcall) {
  if (g_finalized) {
    delete upcall;
    return PMIX_ERR_NOT_AVAILABLE;
  }
  auto* delivery = new Delivery(upcall);
  if (bridge::Post(delivery)) return PMIX_SUCCESS;
  // Not delivered: answer through the return value, never through the callback from in here.
  delete delivery;  // without Abandon, so no callback runs
  return PMIX_ERR_NOT_AVAILABLE;
}

// ---- the upcalls ----------------------------------------------------------------------------

std::vector<pmix_proc_t> CopyProcs(const pmix_proc_t* procs, size_t n) {
  return procs ? std::vector<pmix_proc_t>(procs, procs + n) : std::vector<pmix_proc_t>();
}

Napi::Value ProcOrNull(Napi::Env env, const pmix_proc_t* proc, bool present) {
  return present ? Napi::Value(ProcToJs(env, *proc)) : env.Null();
}

class ClientConnected : public OpUpcall {
 public:
  ClientConnected(const pmix_proc_t* proc, const pmix_info_t* info, size_t ninfo, pmix_op_cbfunc_t cb, void* cbdata)
      : OpUpcall("clientConnected", cb, cbdata), proc_(*proc), info_(info, ninfo) {}
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    a.Set("proc", ProcToJs(env, proc_));
    a.Set("info", info_.ToJs(env));
    return a;
  }

 private:
  pmix_proc_t proc_;
  Info info_;
};

pmix_status_t client_connected2(const pmix_proc_t* proc, void*, pmix_info_t info[], size_t ninfo,
                                pmix_op_cbfunc_t cbfunc, void* cbdata) {
  pmix_status_t rc = Post(new ClientConnected(proc, info, ninfo, cbfunc, cbdata));
  // Before PMIx 5.0.8 libpmix passes no callback: the host is told, but cannot hold the client.
  return (rc == PMIX_SUCCESS && cbfunc == nullptr) ? PMIX_OPERATION_SUCCEEDED : rc;
}

class ProcOp : public OpUpcall {
 public:
  ProcOp(const char* name, const pmix_proc_t* proc, pmix_op_cbfunc_t cb, void* cbdata)
      : OpUpcall(name, cb, cbdata), proc_(*proc) {}
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    a.Set("proc", ProcToJs(env, proc_));
    return a;
  }

 private:
  pmix_proc_t proc_;
};

pmix_status_t client_finalized(const pmix_proc_t* proc, void*, pmix_op_cbfunc_t cbfunc, void* cbdata) {
  return Post(new ProcOp("clientFinalized", proc, cbfunc, cbdata));
}

class Abort : public OpUpcall {
 public:
  Abort(const pmix_proc_t* proc, int status, const char* msg, const pmix_proc_t* procs, size_t nprocs,
        pmix_op_cbfunc_t cb, void* cbdata)
      : OpUpcall("abort", cb, cbdata), proc_(*proc), status_(status), msg_(msg ? msg : ""),
        procs_(CopyProcs(procs, nprocs)) {}
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    a.Set("proc", ProcToJs(env, proc_));
    a.Set("status", Napi::Number::New(env, status_));
    a.Set("message", Napi::String::New(env, msg_));
    a.Set("procs", ProcsToJs(env, procs_.data(), procs_.size()));
    return a;
  }

 private:
  pmix_proc_t proc_;
  int status_;
  std::string msg_;
  std::vector<pmix_proc_t> procs_;
};

pmix_status_t abort_fn(const pmix_proc_t* proc, void*, int status, const char msg[], pmix_proc_t procs[],
                       size_t nprocs, pmix_op_cbfunc_t cbfunc, void* cbdata) {
  return Post(new Abort(proc, status, msg, procs, nprocs, cbfunc, cbdata));
}

class Fence : public ModexUpcall {
 public:
  Fence(const pmix_proc_t* procs, size_t nprocs, const pmix_info_t* info, size_t ninfo, const char* data,
        size_t ndata, pmix_modex_cbfunc_t cb, void* cbdata)
      : ModexUpcall("fence", cb, cbdata), procs_(CopyProcs(procs, nprocs)), info_(info, ninfo),
        data_(data ? std::string(data, ndata) : std::string()) {}
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    a.Set("procs", ProcsToJs(env, procs_.data(), procs_.size()));
    a.Set("info", info_.ToJs(env));
    a.Set("data", Napi::Buffer<char>::Copy(env, data_.data(), data_.size()));
    return a;
  }

 private:
  std::vector<pmix_proc_t> procs_;
  Info info_;
  std::string data_;
};

pmix_status_t fence_nb(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[], size_t ninfo,
                       char* data, size_t ndata, pmix_modex_cbfunc_t cbfunc, void* cbdata) {
  return Post(new Fence(procs, nprocs, info, ninfo, data, ndata, cbfunc, cbdata));
}

class DirectModex : public ModexUpcall {
 public:
  DirectModex(const pmix_proc_t* proc, const pmix_info_t* info, size_t ninfo, pmix_modex_cbfunc_t cb, void* cbdata)
      : ModexUpcall("directModex", cb, cbdata), proc_(*proc), info_(info, ninfo) {}
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    a.Set("proc", ProcToJs(env, proc_));
    a.Set("info", info_.ToJs(env));
    return a;
  }

 private:
  pmix_proc_t proc_;
  Info info_;
};

pmix_status_t direct_modex(const pmix_proc_t* proc, const pmix_info_t info[], size_t ninfo,
                           pmix_modex_cbfunc_t cbfunc, void* cbdata) {
  return Post(new DirectModex(proc, info, ninfo, cbfunc, cbdata));
}

// publish, unpublish, and other "proc + info (+ keys)" operations answered with a status.
class ProcInfoOp : public OpUpcall {
 public:
  ProcInfoOp(const char* name, const pmix_proc_t* proc, char** keys, const pmix_info_t* info, size_t ninfo,
             pmix_op_cbfunc_t cb, void* cbdata)
      : OpUpcall(name, cb, cbdata), proc_(*proc), keys_(CopyArgv(keys)), hasKeys_(keys != nullptr),
        info_(info, ninfo) {}
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    a.Set("proc", ProcToJs(env, proc_));
    if (hasKeys_) a.Set("keys", StringsToJs(env, keys_));
    a.Set("info", info_.ToJs(env));
    return a;
  }

 private:
  pmix_proc_t proc_;
  std::vector<std::string> keys_;
  bool hasKeys_;
  Info info_;
};

pmix_status_t publish(const pmix_proc_t* proc, const pmix_info_t info[], size_t ninfo, pmix_op_cbfunc_t cbfunc,
                      void* cbdata) {
  return Post(new ProcInfoOp("publish", proc, nullptr, info, ninfo, cbfunc, cbdata));
}

pmix_status_t unpublish(const pmix_proc_t* proc, char** keys, const pmix_info_t info[], size_t ninfo,
                        pmix_op_cbfunc_t cbfunc, void* cbdata) {
  static char* none[] = {nullptr};
  return Post(new ProcInfoOp("unpublish", proc, keys ? keys : none, info, ninfo, cbfunc, cbdata));
}

class Lookup : public LookupUpcall {
 public:
  Lookup(const pmix_proc_t* proc, char** keys, const pmix_info_t* info, size_t ninfo, pmix_lookup_cbfunc_t cb,
         void* cbdata)
      : LookupUpcall("lookup", cb, cbdata), proc_(*proc), keys_(CopyArgv(keys)), info_(info, ninfo) {}
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    a.Set("proc", ProcToJs(env, proc_));
    a.Set("keys", StringsToJs(env, keys_));
    a.Set("info", info_.ToJs(env));
    return a;
  }

 private:
  pmix_proc_t proc_;
  std::vector<std::string> keys_;
  Info info_;
};

pmix_status_t lookup(const pmix_proc_t* proc, char** keys, const pmix_info_t info[], size_t ninfo,
                     pmix_lookup_cbfunc_t cbfunc, void* cbdata) {
  return Post(new Lookup(proc, keys, info, ninfo, cbfunc, cbdata));
}

struct AppCopy {
  std::string cmd;
  std::vector<std::string> argv, env;
  std::string cwd;
  int maxprocs;
  Info info;
};

class Spawn : public SpawnUpcall {
 public:
  Spawn(const pmix_proc_t* proc, const pmix_info_t* jobInfo, size_t ninfo, const pmix_app_t* apps, size_t napps,
        pmix_spawn_cbfunc_t cb, void* cbdata)
      : SpawnUpcall("spawn", cb, cbdata), proc_(*proc), jobInfo_(jobInfo, ninfo) {
    for (size_t i = 0; i < napps; ++i) {
      apps_.push_back(AppCopy{apps[i].cmd ? apps[i].cmd : "", CopyArgv(apps[i].argv), CopyArgv(apps[i].env),
                              apps[i].cwd ? apps[i].cwd : "", apps[i].maxprocs, Info(apps[i].info, apps[i].ninfo)});
    }
  }
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    a.Set("proc", ProcToJs(env, proc_));
    a.Set("jobInfo", jobInfo_.ToJs(env));
    Napi::Array apps = Napi::Array::New(env, apps_.size());
    for (size_t i = 0; i < apps_.size(); ++i) {
      Napi::Object o = Napi::Object::New(env);
      o.Set("cmd", apps_[i].cmd);
      o.Set("argv", StringsToJs(env, apps_[i].argv));
      o.Set("env", StringsToJs(env, apps_[i].env));
      o.Set("cwd", apps_[i].cwd);
      o.Set("maxprocs", Napi::Number::New(env, apps_[i].maxprocs));
      o.Set("info", apps_[i].info.ToJs(env));
      apps.Set(static_cast<uint32_t>(i), o);
    }
    a.Set("apps", apps);
    return a;
  }

 private:
  pmix_proc_t proc_;
  Info jobInfo_;
  std::vector<AppCopy> apps_;
};

pmix_status_t spawn(const pmix_proc_t* proc, const pmix_info_t job_info[], size_t ninfo, const pmix_app_t apps[],
                    size_t napps, pmix_spawn_cbfunc_t cbfunc, void* cbdata) {
  return Post(new Spawn(proc, job_info, ninfo, apps, napps, cbfunc, cbdata));
}

// connect, disconnect, iof_pull: a set of procs plus directives.
class ProcsOp : public OpUpcall {
 public:
  ProcsOp(const char* name, const pmix_proc_t* procs, size_t nprocs, const pmix_info_t* info, size_t ninfo,
          pmix_op_cbfunc_t cb, void* cbdata, int channels = -1)
      : OpUpcall(name, cb, cbdata), procs_(CopyProcs(procs, nprocs)), info_(info, ninfo), channels_(channels) {}
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    a.Set("procs", ProcsToJs(env, procs_.data(), procs_.size()));
    a.Set("info", info_.ToJs(env));
    if (channels_ >= 0) a.Set("channels", Napi::Number::New(env, channels_));
    return a;
  }

 private:
  std::vector<pmix_proc_t> procs_;
  Info info_;
  int channels_;
};

pmix_status_t connect(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[], size_t ninfo,
                      pmix_op_cbfunc_t cbfunc, void* cbdata) {
  return Post(new ProcsOp("connect", procs, nprocs, info, ninfo, cbfunc, cbdata));
}

pmix_status_t disconnect(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[], size_t ninfo,
                         pmix_op_cbfunc_t cbfunc, void* cbdata) {
  return Post(new ProcsOp("disconnect", procs, nprocs, info, ninfo, cbfunc, cbdata));
}

pmix_status_t iof_pull(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t directives[], size_t ndirs,
                       pmix_iof_channel_t channels, pmix_op_cbfunc_t cbfunc, void* cbdata) {
  return Post(new ProcsOp("iofPull", procs, nprocs, directives, ndirs, cbfunc, cbdata, channels));
}

class Events : public OpUpcall {
 public:
  Events(const char* name, const pmix_status_t* codes, size_t ncodes, const pmix_info_t* info, size_t ninfo,
         pmix_op_cbfunc_t cb, void* cbdata)
      : OpUpcall(name, cb, cbdata), codes_(codes ? std::vector<pmix_status_t>(codes, codes + ncodes)
                                                 : std::vector<pmix_status_t>()),
        info_(info, ninfo) {}
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    Napi::Array codes = Napi::Array::New(env, codes_.size());
    for (size_t i = 0; i < codes_.size(); ++i) codes.Set(static_cast<uint32_t>(i), Napi::Number::New(env, codes_[i]));
    a.Set("codes", codes);
    a.Set("info", info_.ToJs(env));
    return a;
  }

 private:
  std::vector<pmix_status_t> codes_;
  Info info_;
};

pmix_status_t register_events(pmix_status_t* codes, size_t ncodes, const pmix_info_t info[], size_t ninfo,
                              pmix_op_cbfunc_t cbfunc, void* cbdata) {
  return Post(new Events("registerEvents", codes, ncodes, info, ninfo, cbfunc, cbdata));
}

pmix_status_t deregister_events(pmix_status_t* codes, size_t ncodes, pmix_op_cbfunc_t cbfunc, void* cbdata) {
  return Post(new Events("deregisterEvents", codes, ncodes, nullptr, 0, cbfunc, cbdata));
}

class NotifyEvent : public OpUpcall {
 public:
  NotifyEvent(pmix_status_t code, const pmix_proc_t* source, pmix_data_range_t range, const pmix_info_t* info,
              size_t ninfo, pmix_op_cbfunc_t cb, void* cbdata)
      : OpUpcall("notifyEvent", cb, cbdata), code_(code), hasSource_(source != nullptr), range_(range),
        info_(info, ninfo) {
    if (source) source_ = *source;
  }
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    a.Set("status", Napi::Number::New(env, code_));
    a.Set("source", ProcOrNull(env, &source_, hasSource_));
    a.Set("range", Napi::Number::New(env, range_));
    a.Set("info", info_.ToJs(env));
    return a;
  }

 private:
  pmix_status_t code_;
  bool hasSource_;
  pmix_proc_t source_{};
  pmix_data_range_t range_;
  Info info_;
};

pmix_status_t notify_event(pmix_status_t code, const pmix_proc_t* source, pmix_data_range_t range,
                           pmix_info_t info[], size_t ninfo, pmix_op_cbfunc_t cbfunc, void* cbdata) {
  return Post(new NotifyEvent(code, source, range, info, ninfo, cbfunc, cbdata));
}

// Not an upcall: an event libpmix raises inside the server itself, e.g. PMIX_ERR_LOST_CONNECTION
// when a client's connection drops before it finalized (libpmix tells the host no other way).
// JavaScript only hears about it; the event is marked complete at once.
class LocalEvent : public OpUpcall {
 public:
  LocalEvent(pmix_status_t code, const pmix_proc_t* source, const pmix_info_t* info, size_t ninfo)
      : OpUpcall("localEvent", nullptr, nullptr), code_(code), hasSource_(source != nullptr), info_(info, ninfo) {
    if (source) source_ = *source;
  }
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    a.Set("status", Napi::Number::New(env, code_));
    a.Set("source", ProcOrNull(env, &source_, hasSource_));
    a.Set("info", info_.ToJs(env));
    return a;
  }

 private:
  pmix_status_t code_;
  bool hasSource_;
  pmix_proc_t source_{};
  Info info_;
};

void local_event(size_t, pmix_status_t status, const pmix_proc_t* source, pmix_info_t info[], size_t ninfo,
                 pmix_info_t*, size_t, pmix_event_notification_cbfunc_fn_t cbfunc, void* cbdata) {
  Post(new LocalEvent(status, source, info, ninfo));
  if (cbfunc) cbfunc(PMIX_EVENT_ACTION_COMPLETE, nullptr, 0, nullptr, nullptr, cbdata);
}

bool g_local_events = false;

class Query : public InfoUpcall {
 public:
  Query(const pmix_proc_t* proc, const pmix_query_t* queries, size_t nqueries, pmix_info_cbfunc_t cb, void* cbdata)
      : InfoUpcall("query", cb, cbdata), hasProc_(proc != nullptr) {
    if (proc) proc_ = *proc;
    for (size_t i = 0; i < nqueries; ++i)
      queries_.push_back({CopyArgv(queries[i].keys), Info(queries[i].qualifiers, queries[i].nqual)});
  }
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    a.Set("proc", ProcOrNull(env, &proc_, hasProc_));
    Napi::Array qs = Napi::Array::New(env, queries_.size());
    for (size_t i = 0; i < queries_.size(); ++i) {
      Napi::Object q = Napi::Object::New(env);
      q.Set("keys", StringsToJs(env, queries_[i].keys));
      q.Set("qualifiers", queries_[i].qualifiers.ToJs(env));
      qs.Set(static_cast<uint32_t>(i), q);
    }
    a.Set("queries", qs);
    return a;
  }

 private:
  struct QueryCopy {
    std::vector<std::string> keys;
    Info qualifiers;
  };
  bool hasProc_;
  pmix_proc_t proc_{};
  std::vector<QueryCopy> queries_;
};

pmix_status_t query(pmix_proc_t* proct, pmix_query_t* queries, size_t nqueries, pmix_info_cbfunc_t cbfunc,
                    void* cbdata) {
  return Post(new Query(proct, queries, nqueries, cbfunc, cbdata));
}

class ToolConnected : public ToolUpcall {
 public:
  ToolConnected(const pmix_info_t* info, size_t ninfo, pmix_tool_connection_cbfunc_t cb, void* cbdata)
      : ToolUpcall("toolConnected", cb, cbdata), info_(info, ninfo) {}
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    a.Set("info", info_.ToJs(env));
    return a;
  }

 private:
  Info info_;
};

void tool_connected(pmix_info_t* info, size_t ninfo, pmix_tool_connection_cbfunc_t cbfunc, void* cbdata) {
  Post(new ToolConnected(info, ninfo, cbfunc, cbdata));
}

class Log : public OpUpcall {
 public:
  Log(const pmix_proc_t* client, const pmix_info_t* data, size_t ndata, const pmix_info_t* dirs, size_t ndirs,
      pmix_op_cbfunc_t cb, void* cbdata)
      : OpUpcall("log", cb, cbdata), proc_(*client), data_(data, ndata), directives_(dirs, ndirs) {}
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    a.Set("proc", ProcToJs(env, proc_));
    a.Set("data", data_.ToJs(env));
    a.Set("directives", directives_.ToJs(env));
    return a;
  }

 private:
  pmix_proc_t proc_;
  Info data_, directives_;
};

void log_fn(const pmix_proc_t* client, const pmix_info_t data[], size_t ndata, const pmix_info_t directives[],
            size_t ndirs, pmix_op_cbfunc_t cbfunc, void* cbdata) {
  Post(new Log(client, data, ndata, directives, ndirs, cbfunc, cbdata));
}

// allocate, job_control, monitor, fabric, session_control: a requestor plus directives, answered
// with info. `extra` carries each one's own argument.
class RequestInfo : public InfoUpcall {
 public:
  RequestInfo(const char* name, const pmix_proc_t* requestor, const pmix_info_t* dirs, size_t ndirs,
              pmix_info_cbfunc_t cb, void* cbdata)
      : InfoUpcall(name, cb, cbdata), proc_(*requestor), directives_(dirs, ndirs) {}
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    a.Set("proc", ProcToJs(env, proc_));
    a.Set("directives", directives_.ToJs(env));
    if (hasNumber_) a.Set(numberName_, Napi::Number::New(env, number_));
    if (!targets_.empty() || hasTargets_) a.Set("targets", ProcsToJs(env, targets_.data(), targets_.size()));
    if (monitor_.size()) a.Set("monitor", monitor_.ToJs(env).Get(uint32_t(0)));
    return a;
  }
  RequestInfo* WithNumber(const char* name, double n) {
    hasNumber_ = true;
    numberName_ = name;
    number_ = n;
    return this;
  }
  RequestInfo* WithTargets(const pmix_proc_t* procs, size_t n) {
    hasTargets_ = true;
    targets_ = CopyProcs(procs, n);
    return this;
  }
  RequestInfo* WithMonitor(const pmix_info_t* monitor) {
    if (monitor) monitor_ = Info(monitor, 1);
    return this;
  }

 private:
  pmix_proc_t proc_;
  Info directives_;
  bool hasNumber_ = false;
  const char* numberName_ = "";
  double number_ = 0;
  bool hasTargets_ = false;
  std::vector<pmix_proc_t> targets_;
  Info monitor_;
};

pmix_status_t allocate(const pmix_proc_t* client, pmix_alloc_directive_t directive, const pmix_info_t data[],
                       size_t ndata, pmix_info_cbfunc_t cbfunc, void* cbdata) {
  return Post((new RequestInfo("allocate", client, data, ndata, cbfunc, cbdata))->WithNumber("directive", directive));
}

pmix_status_t job_control(const pmix_proc_t* requestor, const pmix_proc_t targets[], size_t ntargets,
                          const pmix_info_t directives[], size_t ndirs, pmix_info_cbfunc_t cbfunc, void* cbdata) {
  return Post((new RequestInfo("jobControl", requestor, directives, ndirs, cbfunc, cbdata))
                  ->WithTargets(targets, ntargets));
}

pmix_status_t monitor(const pmix_proc_t* requestor, const pmix_info_t* monitor, pmix_status_t error,
                      const pmix_info_t directives[], size_t ndirs, pmix_info_cbfunc_t cbfunc, void* cbdata) {
  return Post((new RequestInfo("monitor", requestor, directives, ndirs, cbfunc, cbdata))
                  ->WithMonitor(monitor)
                  ->WithNumber("error", error));
}

pmix_status_t fabric(const pmix_proc_t* requestor, pmix_fabric_operation_t op, const pmix_info_t directives[],
                     size_t ndirs, pmix_info_cbfunc_t cbfunc, void* cbdata) {
  return Post((new RequestInfo("fabric", requestor, directives, ndirs, cbfunc, cbdata))->WithNumber("op", op));
}

pmix_status_t session_control(const pmix_proc_t* requestor, uint32_t sessionID, const pmix_info_t directives[],
                              size_t ndirs, pmix_info_cbfunc_t cbfunc, void* cbdata) {
  return Post((new RequestInfo("sessionControl", requestor, directives, ndirs, cbfunc, cbdata))
                  ->WithNumber("sessionId", sessionID));
}

class GetCredential : public CredentialUpcall {
 public:
  GetCredential(const pmix_proc_t* proc, const pmix_info_t* dirs, size_t ndirs, pmix_credential_cbfunc_t cb,
                void* cbdata)
      : CredentialUpcall("getCredential", cb, cbdata), proc_(*proc), directives_(dirs, ndirs) {}
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    a.Set("proc", ProcToJs(env, proc_));
    a.Set("directives", directives_.ToJs(env));
    return a;
  }

 private:
  pmix_proc_t proc_;
  Info directives_;
};

pmix_status_t get_credential(const pmix_proc_t* proc, const pmix_info_t directives[], size_t ndirs,
                             pmix_credential_cbfunc_t cbfunc, void* cbdata) {
  return Post(new GetCredential(proc, directives, ndirs, cbfunc, cbdata));
}

class ValidateCredential : public ValidationUpcall {
 public:
  ValidateCredential(const pmix_proc_t* proc, const pmix_byte_object_t* cred, const pmix_info_t* dirs, size_t ndirs,
                     pmix_validation_cbfunc_t cb, void* cbdata)
      : ValidationUpcall("validateCredential", cb, cbdata), proc_(*proc),
        cred_(cred && cred->bytes ? std::string(cred->bytes, cred->size) : std::string()), directives_(dirs, ndirs) {}
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    a.Set("proc", ProcToJs(env, proc_));
    a.Set("credential", Napi::Buffer<char>::Copy(env, cred_.data(), cred_.size()));
    a.Set("directives", directives_.ToJs(env));
    return a;
  }

 private:
  pmix_proc_t proc_;
  std::string cred_;
  Info directives_;
};

pmix_status_t validate_credential(const pmix_proc_t* proc, const pmix_byte_object_t* cred,
                                  const pmix_info_t directives[], size_t ndirs, pmix_validation_cbfunc_t cbfunc,
                                  void* cbdata) {
  return Post(new ValidateCredential(proc, cred, directives, ndirs, cbfunc, cbdata));
}

class PushStdin : public OpUpcall {
 public:
  PushStdin(const pmix_proc_t* source, const pmix_proc_t* targets, size_t ntargets, const pmix_info_t* dirs,
            size_t ndirs, const pmix_byte_object_t* bo, pmix_op_cbfunc_t cb, void* cbdata)
      : OpUpcall("pushStdin", cb, cbdata), source_(*source), targets_(CopyProcs(targets, ntargets)),
        directives_(dirs, ndirs), data_(bo && bo->bytes ? std::string(bo->bytes, bo->size) : std::string()) {}
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    a.Set("source", ProcToJs(env, source_));
    a.Set("targets", ProcsToJs(env, targets_.data(), targets_.size()));
    a.Set("directives", directives_.ToJs(env));
    a.Set("data", Napi::Buffer<char>::Copy(env, data_.data(), data_.size()));
    return a;
  }

 private:
  pmix_proc_t source_;
  std::vector<pmix_proc_t> targets_;
  Info directives_;
  std::string data_;
};

pmix_status_t push_stdin(const pmix_proc_t* source, const pmix_proc_t targets[], size_t ntargets,
                         const pmix_info_t directives[], size_t ndirs, const pmix_byte_object_t* bo,
                         pmix_op_cbfunc_t cbfunc, void* cbdata) {
  return Post(new PushStdin(source, targets, ntargets, directives, ndirs, bo, cbfunc, cbdata));
}

class Group : public InfoUpcall {
 public:
  Group(pmix_group_operation_t op, const char* grp, const pmix_proc_t* procs, size_t nprocs, const pmix_info_t* dirs,
        size_t ndirs, pmix_info_cbfunc_t cb, void* cbdata)
      : InfoUpcall("group", cb, cbdata), op_(op), group_(grp ? grp : ""), procs_(CopyProcs(procs, nprocs)),
        directives_(dirs, ndirs) {}
  Napi::Object Args(Napi::Env env) const override {
    Napi::Object a = Napi::Object::New(env);
    a.Set("op", op_ == PMIX_GROUP_CONSTRUCT ? "construct" : op_ == PMIX_GROUP_DESTRUCT ? "destruct" : "none");
    a.Set("group", group_);
    a.Set("procs", ProcsToJs(env, procs_.data(), procs_.size()));
    a.Set("directives", directives_.ToJs(env));
    return a;
  }

 private:
  pmix_group_operation_t op_;
  std::string group_;
  std::vector<pmix_proc_t> procs_;
  Info directives_;
};

pmix_status_t group(pmix_group_operation_t op, char grp[], const pmix_proc_t procs[], size_t nprocs,
                    const pmix_info_t directives[], size_t ndirs, pmix_info_cbfunc_t cbfunc, void* cbdata) {
  if (op == PMIX_GROUP_DESTRUCT && IsImmediate("group.destruct")) {
    Post(new Group(op, grp, procs, nprocs, directives, ndirs, nullptr, nullptr));
    return PMIX_OPERATION_SUCCEEDED;
  }
  return Post(new Group(op, grp, procs, nprocs, directives, ndirs, cbfunc, cbdata));
}

// ---- the module table -----------------------------------------------------------------------

struct Entry {
  const char* name;
  void (*install)(pmix_server_module_t*);
};

const Entry kEntries[] = {
    {"clientConnected", [](pmix_server_module_t* m) { m->client_connected2 = client_connected2; }},
    {"clientFinalized", [](pmix_server_module_t* m) { m->client_finalized = client_finalized; }},
    {"abort", [](pmix_server_module_t* m) { m->abort = abort_fn; }},
    {"fence", [](pmix_server_module_t* m) { m->fence_nb = fence_nb; }},
    {"directModex", [](pmix_server_module_t* m) { m->direct_modex = direct_modex; }},
    {"publish", [](pmix_server_module_t* m) { m->publish = publish; }},
    {"lookup", [](pmix_server_module_t* m) { m->lookup = lookup; }},
    {"unpublish", [](pmix_server_module_t* m) { m->unpublish = unpublish; }},
    {"spawn", [](pmix_server_module_t* m) { m->spawn = spawn; }},
    {"connect", [](pmix_server_module_t* m) { m->connect = connect; }},
    {"disconnect", [](pmix_server_module_t* m) { m->disconnect = disconnect; }},
    {"registerEvents", [](pmix_server_module_t* m) { m->register_events = register_events; }},
    {"deregisterEvents", [](pmix_server_module_t* m) { m->deregister_events = deregister_events; }},
    {"notifyEvent", [](pmix_server_module_t* m) { m->notify_event = notify_event; }},
    {"query", [](pmix_server_module_t* m) { m->query = query; }},
    {"toolConnected", [](pmix_server_module_t* m) { m->tool_connected = tool_connected; }},
    {"log", [](pmix_server_module_t* m) { m->log = log_fn; }},
    {"allocate", [](pmix_server_module_t* m) { m->allocate = allocate; }},
    {"jobControl", [](pmix_server_module_t* m) { m->job_control = job_control; }},
    {"monitor", [](pmix_server_module_t* m) { m->monitor = monitor; }},
    {"getCredential", [](pmix_server_module_t* m) { m->get_credential = get_credential; }},
    {"validateCredential", [](pmix_server_module_t* m) { m->validate_credential = validate_credential; }},
    {"iofPull", [](pmix_server_module_t* m) { m->iof_pull = iof_pull; }},
    {"pushStdin", [](pmix_server_module_t* m) { m->push_stdin = push_stdin; }},
    {"group", [](pmix_server_module_t* m) { m->group = group; }},
    {"fabric", [](pmix_server_module_t* m) { m->fabric = fabric; }},
    {"sessionControl", [](pmix_server_module_t* m) { m->session_control = session_control; }},
    // Not in pmix_server_module_t: an event handler registered after init (RegisterLocalEvents).
    {"localEvent", [](pmix_server_module_t*) { g_local_events = true; }},
};

}  // namespace

const std::vector<std::string>& Names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& e : kEntries) v.emplace_back(e.name);
    return v;
  }();
  return names;
}

void Install(Napi::Env env, Napi::Function handler, const std::vector<std::string>& handled,
             const std::vector<std::string>& immediate, pmix_server_module_t* module) {
  g_immediate = immediate;
  g_local_events = false;
  std::memset(module, 0, sizeof *module);
  for (const auto& name : handled) {
    const Entry* found = nullptr;
    for (const auto& e : kEntries)
      if (name == e.name) found = &e;
    if (!found) throw Napi::TypeError::New(env, "unknown PMIx upcall '" + name + "'");
    found->install(module);
  }
  g_handler = Napi::Persistent(handler);
  g_finalized = false;
}

pmix_status_t RegisterLocalEvents() {
  if (!g_local_events) return PMIX_SUCCESS;
  pmix_status_t codes[] = {PMIX_ERR_LOST_CONNECTION, PMIX_ERR_UNREACH, PMIX_ERR_PROC_TERM_WO_SYNC};
  // Without a registration callback the call blocks until libpmix's progress thread has
  // registered the handler: brief, and we are on the JavaScript thread, not in an upcall.
  pmix_status_t rc = PMIx_Register_event_handler(codes, sizeof codes / sizeof codes[0], nullptr, 0, local_event,
                                                 nullptr, nullptr);
  return rc < 0 ? rc : PMIX_SUCCESS;  // a non-negative result is the handler's id
}

void Uninstall() { g_handler.Reset(); }

void MarkFinalized() { g_finalized = true; }

}  // namespace upcalls
}  // namespace dpmix
