// dask-pmix native addon: a thin binding of the PMIx server library.
#include <napi.h>

#include "allocator.h"
#include "constants.h"
#include "handoff.h"
#include "pmi/engine.h"
#include "roundtrip.h"
#include "server.h"
#include "tcp.h"
#include "watchdog.h"

namespace {

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  dpmix::InitServer(env, exports);
  dpmix::InitConstants(env, exports);
  dpmix::InitWatchdog(env, exports);
  dpmix::InitAllocator(env, exports);
  dpmix::InitRoundTrip(env, exports);
  dpmix::InitHandoff(env, exports);
  dpmix::InitTcp(env, exports);
  dpmix::pmi::InitPmiEngine(env, exports);
  return exports;
}

}  // namespace

NODE_API_MODULE(dask_pmix_native, Init)
