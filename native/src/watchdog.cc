// Mechanisms for noticing and surviving a libpmix that no longer progresses. JavaScript decides
// when to use them.
//
// - progressProbe(): a no-op through libpmix's progress thread. PMIx_Deregister_event_handler
//   with an id that names no handler shifts to the progress thread, finds nothing and calls back.
//   It is issued from a short-lived thread of its own: the API entry takes libpmix's global lock,
//   and neither the JavaScript thread nor libuv's pool may wait on a wedged libpmix.
// - closeStrangers(port, keep): shuts down the connections accepted on libpmix's listener whose
//   peer port is not in `keep`, and that are still blocking (libpmix makes a socket non-blocking
//   once its handshake is done, so these are the ones its progress thread may be stuck reading).
// - exitNow(code): _exit, for a shutdown whose libpmix finalize does not return.
#include "watchdog.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pmix.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

namespace dpmix {

namespace {

std::atomic<bool> g_probe_out{false};
std::atomic<int64_t> g_probe_since{0};
std::atomic<int64_t> g_probe_rtt{0};

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void ProbeDone(pmix_status_t, void*) {
  g_probe_rtt = NowMs() - g_probe_since.load();
  g_probe_out = false;
}

// progressProbe() -> {waitingMs, lastRoundTripMs}: waitingMs is how long the probe in flight has
// waited (0 when none was; a new one is then issued).
Napi::Value ProgressProbe(const Napi::CallbackInfo& info) {
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

int PortOf(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(ss).sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(ss).sin6_port);
  return -1;
}

// closeStrangers(port, keepPeerPorts) -> number of connections shut down.
Napi::Value CloseStrangers(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsNumber() || !info[1].IsArray())
    throw Napi::TypeError::New(env, "closeStrangers(port, keepPeerPorts)");
  int port = info[0].As<Napi::Number>().Int32Value();
  std::set<int> keep;
  Napi::Array k = info[1].As<Napi::Array>();
  for (uint32_t i = 0; i < k.Length(); ++i) keep.insert(k.Get(i).As<Napi::Number>().Int32Value());
  int closed = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return Napi::Number::New(env, 0);
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    long fd = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || fd < 0 || fd == dirfd(dir)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;  // not a socket
    if (PortOf(local) != port) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;  // the listener
    if (keep.count(PortOf(peer))) continue;
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || (flags & O_NONBLOCK)) continue;  // handshake done: libpmix is not reading it
    if (shutdown(fd, SHUT_RDWR) == 0) ++closed;       // libpmix's blocking recv returns, it closes
  }
  closedir(dir);
  return Napi::Number::New(env, closed);
}

Napi::Value ExitNow(const Napi::CallbackInfo& info) {
  int code = info.Length() > 0 && info[0].IsNumber() ? info[0].As<Napi::Number>().Int32Value() : 1;
  _exit(code);
}

}  // namespace

void ResetProbe() {
  g_probe_out = false;
  g_probe_rtt = 0;
}

void InitWatchdog(Napi::Env env, Napi::Object exports) {
  exports.Set("progressProbe", Napi::Function::New(env, ProgressProbe, "progressProbe"));
  exports.Set("closeStrangers", Napi::Function::New(env, CloseStrangers, "closeStrangers"));
  exports.Set("exitNow", Napi::Function::New(env, ExitNow, "exitNow"));
}

}  // namespace dpmix
