#pragma once

#include <napi.h>

namespace dpmix {

// Adds tcpKeepAlive and peerUid to `exports`.
void InitTcp(Napi::Env env, Napi::Object exports);

}  // namespace dpmix
