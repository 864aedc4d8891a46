// Mechanisms for noticing and surviving a libpmix that no longer progresses. JavaScript decides
// when to use them.
//
// - progressProbe(): a no-op through libpmix's progress thread. PMIx_Deregister_event_handler
//   with an id that names no handler shifts to the progress thread, finds nothing and calls back.
//   It is issued from a short-lived thread of its own: the API entry takes libpmix's global lock,
//   and neither the JavaScript thread nor libuv's pool may wait on a wedged libpmix.
//   Its callback names the thread it runs on, libpmix's progress thread, "pmix-progress" (libpmix
//   leaves it "node" like every other thread of the process): top -H, gdb and the tests that stall
//   that one thread find it by name.
// - exitNow(code): _exit, for a shutdown whose libpmix finalize does not return.
#include "watchdog.h"

#include <pmix.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace dpmix {

namespace {

std::atomic<bool> g_probe_out{false};
std::atomic<int64_t> g_probe_since{0};
std::atomic<int64_t> g_probe_rtt{0};
std::atomic<bool> g_named{false};

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void ProbeDone(pmix_status_t, void *) {
  if (!g_named.exchange(true)) pthread_setname_np(pthread_self(), "pmix-progress");
  g_probe_rtt = NowMs() - g_probe_since.load();
  g_probe_out = false;
}

// progressProbe() -> {waitingMs, lastRoundTripMs}: waitingMs is how long the probe in flight has
// waited (0 when none was; a new one is then issued).
Napi::Value ProgressProbe(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  Napi::Object out = Napi::Object::New(env);
  bool expected = false;
  if (g_probe_out.compare_exchange_strong(expected, true)) {
    g_probe_since = NowMs();
    std::thread([] {
      pmix_status_t rc = PMIx_Deregister_event_handler(SIZE_MAX - 7, ProbeDone, nullptr);
      if (rc != PMIX_SUCCESS) g_probe_out = false;  // not initialized: nothing to wait for
    }).detach();
    out.Set("waitingMs", Napi::Number::New(env, 0));
  } else {
    out.Set("waitingMs", Napi::Number::New(env, static_cast<double>(NowMs() - g_probe_since.load())));
  }
  out.Set("lastRoundTripMs", Napi::Number::New(env, static_cast<double>(g_probe_rtt.load())));
  return out;
}

Napi::Value ExitNow(const Napi::CallbackInfo &info) {
  int code = info.Length() > 0 && info[0].IsNumber() ? info[0].As<Napi::Number>().Int32Value() : 1;
  _exit(code);
}

}  // namespace

void ResetProbe() {
  g_probe_out = false;
  g_named = false;  // a new libpmix, a new progress thread
  g_probe_rtt = 0;
}

void InitWatchdog(Napi::Env env, Napi::Object exports) {
  exports.Set("progressProbe", Napi::Function::New(env, ProgressProbe, "progressProbe"));
  exports.Set("exitNow", Napi::Function::New(env, ExitNow, "exitNow"));
}

}  // namespace dpmix
