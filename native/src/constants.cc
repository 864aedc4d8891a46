#include "constants.h"

#include <pmix.h>
#include <pmix_server.h>

namespace dpmix {

void InitConstants(Napi::Env env, Napi::Object exports) {
  Napi::Object keys = Napi::Object::New(env);
  Napi::Object ints = Napi::Object::New(env);
#define DPMIX_KEY(name) keys.Set(#name, Napi::String::New(env, name));
#define DPMIX_INT(name) ints.Set(#name, Napi::Number::New(env, static_cast<double>(name)));
#include "constants.inc"
#undef DPMIX_KEY
#undef DPMIX_INT
  Napi::Object constants = Napi::Object::New(env);
  constants.Set("keys", keys);
  constants.Set("ints", ints);
  constants.Set("headerVersion",
                Napi::String::New(env, std::to_string(PMIX_VERSION_MAJOR) + "." + std::to_string(PMIX_VERSION_MINOR) +
                                           "." + std::to_string(PMIX_VERSION_RELEASE)));
  exports.Set("constants", constants);
}

}  // namespace dpmix
