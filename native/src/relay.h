#pragma once

#include <napi.h>

namespace dpmix {

// Adds relayStart, relayPorts and relayCloseAll to `exports`.
void InitRelay(Napi::Env env, Napi::Object exports);

}  // namespace dpmix
