// The PMIx server API, as JavaScript functions.
//
// Calls that complete through a libpmix callback return Promises. Their arguments (info arrays,
// proc lists) live in the pending operation until the callback fires; the callback itself only
// posts the result to the JavaScript thread. Calls that libpmix serves by blocking on its own
// progress thread run on a libuv worker, so the event loop never waits for them.
#include "server.h"

#include <pmix.h>
#include <pmix_server.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bridge.h"
#include "upcalls.h"
#include "values.h"
#include "watchdog.h"

namespace dpmix {

namespace {

pmix_server_module_t g_module;
bool g_initialized = false;
bool g_finalizing = false;  // PMIx_server_finalize is running on a worker

Napi::Error StatusError(Napi::Env env, const std::string &what, pmix_status_t status) {
  Napi::Error e = Napi::Error::New(env, what + ": " + PMIx_Error_string(status) + " (" + std::to_string(status) + ")");
  e.Value().Set("status", Napi::Number::New(env, status));
  e.Value().Set("code", Napi::String::New(env, PMIx_Error_string(status)));
  return e;
}

void RequireInitialized(Napi::Env env, const char *what) {
  if (!g_initialized) throw Napi::Error::New(env, std::string(what) + ": the PMIx server is not initialized");
}

std::string StringArg(const Napi::CallbackInfo &info, size_t i, const char *what) {
  if (info.Length() <= i || !info[i].IsString())
    throw Napi::TypeError::New(info.Env(), std::string(what) + " must be a string");
  return info[i].As<Napi::String>().Utf8Value();
}

void NspaceArg(const Napi::CallbackInfo &info, size_t i, pmix_nspace_t out) {
  std::string ns = StringArg(info, i, "nspace");
  if (ns.empty() || ns.size() > PMIX_MAX_NSLEN)
    throw Napi::TypeError::New(info.Env(), "nspace must have 1 to " + std::to_string(PMIX_MAX_NSLEN) + " characters");
  std::memset(out, 0, sizeof(pmix_nspace_t));
  std::memcpy(out, ns.data(), ns.size());
}

// A libpmix operation that completes through a pmix_op_cbfunc_t; settles a Promise.
class PendingOp : public Task {
 public:
  PendingOp(Napi::Env env, std::string what) : deferred_(Napi::Promise::Deferred::New(env)), what_(std::move(what)) {}
  Napi::Promise Promise() const { return deferred_.Promise(); }

  static void Callback(pmix_status_t status, void *cbdata) {
    auto *self = static_cast<PendingOp *>(cbdata);
    self->status_ = status;
    if (!bridge::Post(self)) delete self;  // nobody is left to tell
  }
  // For a call that returned without promising a callback.
  Napi::Promise SettleNow(Napi::Env env, pmix_status_t status) {
    status_ = status;
    Napi::Promise p = Promise();
    Run(env);
    delete this;
    return p;
  }
  void Run(Napi::Env env) override {
    Napi::HandleScope scope(env);
    if (status_ == PMIX_SUCCESS || status_ == PMIX_OPERATION_SUCCEEDED) {
      deferred_.Resolve(env.Undefined());
    } else {
      deferred_.Reject(StatusError(env, what_, status_).Value());
    }
  }

  Info info;                       // kept alive until libpmix calls back
  std::vector<pmix_proc_t> procs;  // likewise
  pmix_proc_t proc{};

 private:
  Napi::Promise::Deferred deferred_;
  std::string what_;
  pmix_status_t status_ = PMIX_SUCCESS;
};

// Starts an operation: `start` returns libpmix's immediate status.
template <typename Start>
Napi::Value RunOp(Napi::Env env, PendingOp *op, Start start) {
  Napi::Promise p = op->Promise();
  pmix_status_t rc = start(op);
  if (rc == PMIX_SUCCESS) return p;
  return op->SettleNow(env, rc == PMIX_OPERATION_SUCCEEDED ? PMIX_SUCCESS : rc);
}

// init({info, handler, upcalls, immediate})
Napi::Value Init(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (g_initialized) throw Napi::Error::New(env, "the PMIx server is already initialized");
  if (g_finalizing) throw Napi::Error::New(env, "the previous PMIx server is still finalizing");
  if (info.Length() < 1 || !info[0].IsObject()) throw Napi::TypeError::New(env, "init(options) expects an object");
  Napi::Object opts = info[0].As<Napi::Object>();
  if (!opts.Get("handler").IsFunction()) throw Napi::TypeError::New(env, "options.handler must be a function");
  std::vector<std::string> handled;
  Napi::Value names = opts.Get("upcalls");
  if (!names.IsArray()) throw Napi::TypeError::New(env, "options.upcalls must be an array of upcall names");
  for (uint32_t i = 0; i < names.As<Napi::Array>().Length(); ++i)
    handled.push_back(names.As<Napi::Array>().Get(i).ToString().Utf8Value());
  std::vector<std::string> immediate;
  Napi::Value imm = opts.Get("immediate");
  if (imm.IsArray())
    for (uint32_t i = 0; i < imm.As<Napi::Array>().Length(); ++i)
      immediate.push_back(imm.As<Napi::Array>().Get(i).ToString().Utf8Value());
  Info sinfo = Info::FromJs(opts.Get("info"));

  ResetProbe();
  upcalls::Install(env, opts.Get("handler").As<Napi::Function>(), handled, immediate, &g_module);
  bridge::Open(env);
  pmix_status_t rc = PMIx_server_init(&g_module, sinfo.data(), sinfo.size());
  if (rc != PMIX_SUCCESS) {
    bridge::Close();
    upcalls::Uninstall();
    throw StatusError(env, "PMIx_server_init", rc);
  }
  g_initialized = true;
  rc = upcalls::RegisterLocalEvents();
  if (rc != PMIX_SUCCESS) throw StatusError(env, "PMIx_Register_event_handler", rc);
  return env.Undefined();
}

// PMIx_server_finalize stops libpmix's progress thread and waits for it: run it on a worker, so
// that a progress thread that never stops cannot hold the JavaScript thread (the caller bounds
// the wait). Nothing calls back into libpmix once finalize has begun.
class FinalizeWorker : public Napi::AsyncWorker {
 public:
  explicit FinalizeWorker(Napi::Env env) : Napi::AsyncWorker(env), deferred_(Napi::Promise::Deferred::New(env)) {}
  Napi::Promise Promise() const { return deferred_.Promise(); }
  void Execute() override { rc_ = PMIx_server_finalize(); }
  void OnOK() override {
    g_finalizing = false;
    bridge::Close();
    upcalls::Uninstall();
    if (rc_ == PMIX_SUCCESS) {
      deferred_.Resolve(Env().Undefined());
    } else {
      deferred_.Reject(StatusError(Env(), "PMIx_server_finalize", rc_).Value());
    }
  }

 private:
  Napi::Promise::Deferred deferred_;
  pmix_status_t rc_ = PMIX_SUCCESS;
};

Napi::Value Finalize(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  auto deferred = Napi::Promise::Deferred::New(env);
  if (!g_initialized) {
    deferred.Resolve(env.Undefined());
    return deferred.Promise();
  }
  g_initialized = false;
  g_finalizing = true;
  upcalls::MarkFinalized();
  auto *w = new FinalizeWorker(env);
  Napi::Promise p = w->Promise();
  w->Queue();
  return p;
}

Napi::Value IsInitialized(const Napi::CallbackInfo &info) { return Napi::Boolean::New(info.Env(), g_initialized); }

// registerNspace(nspace, nlocalprocs, info)
Napi::Value RegisterNspace(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  RequireInitialized(env, "registerNspace");
  pmix_nspace_t ns;
  NspaceArg(info, 0, ns);
  if (info.Length() < 2 || !info[1].IsNumber()) throw Napi::TypeError::New(env, "nlocalprocs must be a number");
  int nlocal = info[1].As<Napi::Number>().Int32Value();
  auto *op = new PendingOp(env, std::string("PMIx_server_register_nspace(") + ns + ")");
  try {
    op->info = Info::FromJs(info.Length() > 2 ? info[2] : env.Undefined());
  } catch (...) {
    delete op;
    throw;
  }
  return RunOp(env, op, [&](PendingOp *o) {
    return PMIx_server_register_nspace(ns, nlocal, o->info.data(), o->info.size(), PendingOp::Callback, o);
  });
}

Napi::Value DeregisterNspace(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  RequireInitialized(env, "deregisterNspace");
  pmix_nspace_t ns;
  NspaceArg(info, 0, ns);
  auto *op = new PendingOp(env, std::string("PMIx_server_deregister_nspace(") + ns + ")");
  Napi::Promise p = op->Promise();
  PMIx_server_deregister_nspace(ns, PendingOp::Callback, op);
  return p;
}

// registerClient(proc, uid, gid)
Napi::Value RegisterClient(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  RequireInitialized(env, "registerClient");
  pmix_proc_t proc = ProcFromJs(info[0]);
  if (info.Length() < 3 || !info[1].IsNumber() || !info[2].IsNumber())
    throw Napi::TypeError::New(env, "registerClient(proc, uid, gid): uid and gid must be numbers");
  uid_t uid = info[1].As<Napi::Number>().Uint32Value();
  gid_t gid = info[2].As<Napi::Number>().Uint32Value();
  auto *op = new PendingOp(env, "PMIx_server_register_client");
  op->proc = proc;
  return RunOp(env, op, [&](PendingOp *o) {
    return PMIx_server_register_client(&o->proc, uid, gid, nullptr, PendingOp::Callback, o);
  });
}

Napi::Value DeregisterClient(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  RequireInitialized(env, "deregisterClient");
  auto *op = new PendingOp(env, "PMIx_server_deregister_client");
  op->proc = ProcFromJs(info[0]);
  Napi::Promise p = op->Promise();
  PMIx_server_deregister_client(&op->proc, PendingOp::Callback, op);
  return p;
}

// setupFork(proc) -> {NAME: value}: the environment a client needs to connect.
Napi::Value SetupFork(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  RequireInitialized(env, "setupFork");
  pmix_proc_t proc = ProcFromJs(info[0]);
  char **envp = static_cast<char **>(calloc(1, sizeof(char *)));
  pmix_status_t rc = PMIx_server_setup_fork(&proc, &envp);
  Napi::Object out = Napi::Object::New(env);
  for (size_t i = 0; envp && envp[i]; ++i) {
    const char *eq = std::strchr(envp[i], '=');
    if (eq) out.Set(std::string(envp[i], eq - envp[i]), Napi::String::New(env, eq + 1));
    free(envp[i]);
  }
  free(envp);
  if (rc != PMIX_SUCCESS) throw StatusError(env, "PMIx_server_setup_fork", rc);
  return out;
}

class PendingModex : public Task {
 public:
  explicit PendingModex(Napi::Env env) : deferred_(Napi::Promise::Deferred::New(env)) {}
  Napi::Promise Promise() const { return deferred_.Promise(); }
  // The blob belongs to libpmix and is valid only during the call: copy it.
  static void Callback(pmix_status_t status, char *data, size_t ndata, void *cbdata) {
    auto *self = static_cast<PendingModex *>(cbdata);
    self->status_ = status;
    if (data && ndata) self->data_.assign(data, ndata);
    if (!bridge::Post(self)) delete self;
  }
  void Run(Napi::Env env) override {
    Napi::HandleScope scope(env);
    if (status_ == PMIX_SUCCESS) {
      deferred_.Resolve(Napi::Buffer<char>::Copy(env, data_.data(), data_.size()));
    } else {
      deferred_.Reject(StatusError(env, "PMIx_server_dmodex_request", status_).Value());
    }
  }
  pmix_proc_t proc{};

 private:
  Napi::Promise::Deferred deferred_;
  pmix_status_t status_ = PMIX_SUCCESS;
  std::string data_;
};

// dmodexRequest(proc) -> Buffer: the modex blob libpmix holds for a local client.
Napi::Value DmodexRequest(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  RequireInitialized(env, "dmodexRequest");
  auto *op = new PendingModex(env);
  op->proc = ProcFromJs(info[0]);
  Napi::Promise p = op->Promise();
  pmix_status_t rc = PMIx_server_dmodex_request(&op->proc, PendingModex::Callback, op);
  if (rc != PMIX_SUCCESS) {
    delete op;
    throw StatusError(env, "PMIx_server_dmodex_request", rc);
  }
  return p;
}

// PMIx_server_define/delete_process_set wait on libpmix's progress thread: run them off the loop.
class PsetWorker : public Napi::AsyncWorker {
 public:
  PsetWorker(Napi::Env env, std::string name, std::vector<pmix_proc_t> members, bool define)
      : Napi::AsyncWorker(env),
        deferred_(Napi::Promise::Deferred::New(env)),
        name_(std::move(name)),
        members_(std::move(members)),
        define_(define) {}
  Napi::Promise Promise() const { return deferred_.Promise(); }
  void Execute() override {
    rc_ = define_ ? PMIx_server_define_process_set(members_.data(), members_.size(), name_.c_str())
                  : PMIx_server_delete_process_set(const_cast<char *>(name_.c_str()));
  }
  void OnOK() override {
    if (rc_ == PMIX_SUCCESS || rc_ == PMIX_OPERATION_SUCCEEDED) {
      deferred_.Resolve(Env().Undefined());
    } else {
      deferred_.Reject(
          StatusError(Env(), define_ ? "PMIx_server_define_process_set" : "PMIx_server_delete_process_set", rc_)
              .Value());
    }
  }

 private:
  Napi::Promise::Deferred deferred_;
  std::string name_;
  std::vector<pmix_proc_t> members_;
  bool define_;
  pmix_status_t rc_ = PMIX_SUCCESS;
};

Napi::Value DefineProcessSet(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  RequireInitialized(env, "defineProcessSet");
  std::string name = StringArg(info, 0, "pset name");
  auto *w = new PsetWorker(env, name, ProcsFromJs(info[1]), true);
  Napi::Promise p = w->Promise();
  w->Queue();
  return p;
}

Napi::Value DeleteProcessSet(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  RequireInitialized(env, "deleteProcessSet");
  auto *w = new PsetWorker(env, StringArg(info, 0, "pset name"), {}, false);
  Napi::Promise p = w->Promise();
  w->Queue();
  return p;
}

// notifyEvent(status, source, range, info): PMIx_Notify_event from the host to its clients.
Napi::Value NotifyEvent(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  RequireInitialized(env, "notifyEvent");
  if (info.Length() < 3 || !info[0].IsNumber() || !info[2].IsNumber())
    throw Napi::TypeError::New(env, "notifyEvent(status, source, range, info)");
  pmix_status_t status = info[0].As<Napi::Number>().Int32Value();
  auto *op = new PendingOp(env, "PMIx_Notify_event");
  try {
    op->proc = ProcFromJs(info[1]);
    op->info = Info::FromJs(info.Length() > 3 ? info[3] : env.Undefined());
  } catch (...) {
    delete op;
    throw;
  }
  auto range = static_cast<pmix_data_range_t>(info[2].As<Napi::Number>().Uint32Value());
  return RunOp(env, op, [&](PendingOp *o) {
    return PMIx_Notify_event(status, &o->proc, range, o->info.data(), o->info.size(), PendingOp::Callback, o);
  });
}

// generateRegex / generatePpn return the regex as bytes, exactly as PMIX_REGEX values carry it.
Napi::Value RegexToBuffer(Napi::Env env, char *regex) {
  pmix_value_t v;
  PMIx_Value_construct(&v);
  pmix_status_t rc = PMIx_Value_load(&v, regex, PMIX_REGEX);
  free(regex);
  if (rc != PMIX_SUCCESS) throw StatusError(env, "PMIx_Value_load(PMIX_REGEX)", rc);
  Napi::Value out = Napi::Buffer<char>::Copy(env, v.data.bo.bytes, v.data.bo.size);
  PMIx_Value_destruct(&v);
  return out;
}

Napi::Value GenerateRegex(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  std::string input = StringArg(info, 0, "regex input");
  char *regex = nullptr;
  pmix_status_t rc = PMIx_generate_regex(input.c_str(), &regex);
  if (rc != PMIX_SUCCESS) throw StatusError(env, "PMIx_generate_regex", rc);
  return RegexToBuffer(env, regex);
}

Napi::Value GeneratePpn(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  std::string input = StringArg(info, 0, "ppn input");
  char *regex = nullptr;
  pmix_status_t rc = PMIx_generate_ppn(input.c_str(), &regex);
  if (rc != PMIX_SUCCESS) throw StatusError(env, "PMIx_generate_ppn", rc);
  return RegexToBuffer(env, regex);
}

Napi::Value Version(const Napi::CallbackInfo &info) { return Napi::String::New(info.Env(), PMIx_Get_version()); }

Napi::Value ErrorString(const Napi::CallbackInfo &info) {
  if (info.Length() < 1 || !info[0].IsNumber()) throw Napi::TypeError::New(info.Env(), "status must be a number");
  return Napi::String::New(info.Env(), PMIx_Error_string(info[0].As<Napi::Number>().Int32Value()));
}

Napi::Value UpcallNames(const Napi::CallbackInfo &info) { return StringsToJs(info.Env(), upcalls::Names()); }

}  // namespace

void InitServer(Napi::Env env, Napi::Object exports) {
  exports.Set("init", Napi::Function::New(env, Init, "init"));
  exports.Set("finalize", Napi::Function::New(env, Finalize, "finalize"));
  exports.Set("isInitialized", Napi::Function::New(env, IsInitialized, "isInitialized"));
  exports.Set("registerNspace", Napi::Function::New(env, RegisterNspace, "registerNspace"));
  exports.Set("deregisterNspace", Napi::Function::New(env, DeregisterNspace, "deregisterNspace"));
  exports.Set("registerClient", Napi::Function::New(env, RegisterClient, "registerClient"));
  exports.Set("deregisterClient", Napi::Function::New(env, DeregisterClient, "deregisterClient"));
  exports.Set("setupFork", Napi::Function::New(env, SetupFork, "setupFork"));
  exports.Set("dmodexRequest", Napi::Function::New(env, DmodexRequest, "dmodexRequest"));
  exports.Set("defineProcessSet", Napi::Function::New(env, DefineProcessSet, "defineProcessSet"));
  exports.Set("deleteProcessSet", Napi::Function::New(env, DeleteProcessSet, "deleteProcessSet"));
  exports.Set("notifyEvent", Napi::Function::New(env, NotifyEvent, "notifyEvent"));
  exports.Set("generateRegex", Napi::Function::New(env, GenerateRegex, "generateRegex"));
  exports.Set("generatePpn", Napi::Function::New(env, GeneratePpn, "generatePpn"));
  exports.Set("version", Napi::Function::New(env, Version, "version"));
  exports.Set("errorString", Napi::Function::New(env, ErrorString, "errorString"));
  exports.Set("upcallNames", Napi::Function::New(env, UpcallNames, "upcallNames"));
}

}  // namespace dpmix
