#pragma once

#include <napi.h>

namespace dpmix {

// Adds valueRoundTrip to `exports`.
void InitRoundTrip(Napi::Env env, Napi::Object exports);

}  // namespace dpmix
