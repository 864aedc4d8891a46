#pragma once

#include <napi.h>

namespace dpmix {

// Adds secureListener, handOff, handoffStats, handoffCloseAll, closeStrangers and closePeers to `exports`.
void InitHandoff(Napi::Env env, Napi::Object exports);

}  // namespace dpmix
