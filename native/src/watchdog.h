#pragma once

#include <napi.h>

namespace dpmix {

// Adds progressProbe and exitNow to `exports`.
void InitWatchdog(Napi::Env env, Napi::Object exports);
// Forgets a probe left in flight by a previous server (call when a server starts).
void ResetProbe();

}  // namespace dpmix
