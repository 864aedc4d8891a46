#pragma once

#include <napi.h>

namespace dpmix {

// Adds the PMIx server API functions to `exports`.
void InitServer(Napi::Env env, Napi::Object exports);

}  // namespace dpmix
