#pragma once

#include <napi.h>

namespace dpmix {

// Adds tcpKeepAlive, peerUid and unixPeerUid to `exports`.
void InitTcp(Napi::Env env, Napi::Object exports);

}  // namespace dpmix
