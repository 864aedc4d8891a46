#include "delivery.h"

#include <atomic>
#include <memory>

#include "bridge.h"

namespace dpmix {
namespace delivery {

namespace {

Napi::FunctionReference g_handler;  // JavaScript thread only
std::atomic<bool> g_finalized{false};
std::vector<std::string> g_immediate;  // set before PMIx_server_init, read-only afterwards

// Owned by the JS `done` function.
struct Pending {
  Upcall *upcall;
};

void FinalizePending(Pending *pending) {
  if (pending->upcall) {
    pending->upcall->Fail(PMIX_ERROR);
    delete pending->upcall;
  }
  delete pending;
}

Napi::Value Done(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  auto *pending = static_cast<Pending *>(info.Data());
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
  } catch (const Napi::Error &) {
    // The reply could not be converted: the client gets an error, the caller the exception.
    upcall->Fail(PMIX_ERR_BAD_PARAM);
    throw;
  }
  return env.Undefined();
}

class Delivery : public Task {
 public:
  explicit Delivery(Upcall *upcall) : upcall_(upcall) {}

  void Run(Napi::Env env) override {
    Napi::HandleScope scope(env);
    if (g_handler.IsEmpty()) return upcall_->Fail(PMIX_ERR_NOT_AVAILABLE);
    Napi::Object args = upcall_->ArgsToJs(env);
    const char *name = upcall_->name();
    auto *pending = new Pending{upcall_.release()};
    Napi::Function done = Napi::Function::New(env, Done, name, pending);
    napi_add_finalizer(
        env, done, pending, [](napi_env, void *data, void *) { FinalizePending(static_cast<Pending *>(data)); },
        nullptr, nullptr);
    try {
      g_handler.Call({Napi::String::New(env, name), args, done});
    } catch (const Napi::Error &e) {
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

}  // namespace

void SetHandler(Napi::Function handler, std::vector<std::string> immediate) {
  g_immediate = std::move(immediate);
  g_handler = Napi::Persistent(handler);
  g_finalized = false;
}

void ResetHandler() { g_handler.Reset(); }

void MarkFinalized() { g_finalized = true; }

bool CanCallBack() { return !g_finalized.load(); }

bool IsImmediate(const char *name) {
  for (const auto &n : g_immediate)
    if (n == name) return true;
  return false;
}

pmix_status_t Post(Upcall *upcall) {
  if (g_finalized) {
    delete upcall;
    return PMIX_ERR_NOT_AVAILABLE;
  }
  auto *delivery = new Delivery(upcall);
  if (bridge::Post(delivery)) return PMIX_SUCCESS;
  delete delivery;  // without Abandon: never call back from inside an upcall
  return PMIX_ERR_NOT_AVAILABLE;
}

}  // namespace delivery
}  // namespace dpmix
