#include "bridge.h"

#include <atomic>
#include <mutex>

namespace dpmix {
namespace bridge {

namespace {

void CallJs(Napi::Env env, Napi::Function, std::nullptr_t *, Task *task) {
  if (env == nullptr) {
    task->Abandon();
  } else {
    task->Run(env);
  }
  delete task;
}

using Tsfn = Napi::TypedThreadSafeFunction<std::nullptr_t, Task, CallJs>;

std::mutex g_mutex;  // guards g_tsfn against Close racing a Post from the progress thread
Tsfn g_tsfn;
std::atomic<bool> g_open{false};

}  // namespace

void Open(Napi::Env env) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_open) return;
  g_tsfn = Tsfn::New(env, "dask-pmix-bridge", 0, 1);
  g_open = true;
}

void Close() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_open) return;
  g_open = false;
  g_tsfn.Release();
}

bool IsOpen() { return g_open; }

bool Post(Task *task) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_open && g_tsfn.NonBlockingCall(task) == napi_ok) return true;
  }
  return false;
}

}  // namespace bridge
}  // namespace dpmix
