#pragma once

#include <napi.h>

namespace dpmix {

// Adds allocatorStats and allocatorTrim to `exports`.
void InitAllocator(Napi::Env env, Napi::Object exports);

}  // namespace dpmix
