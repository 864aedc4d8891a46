#pragma once

#include <napi.h>

namespace dpmix {

// Adds `constants`: the status codes and attribute keys of the PMIx headers the addon was built
// with, so the TypeScript definitions can be checked against them.
void InitConstants(Napi::Env env, Napi::Object exports);

}  // namespace dpmix
