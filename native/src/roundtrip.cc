// valueRoundTrip(value, throughLibpmix): a value from JavaScript to a pmix_value_t and back, and
// with throughLibpmix also packed and unpacked by libpmix in between (PMIx_Data_pack/unpack, as
// on the wire). For the tests of the value codec; it decides nothing.
#include "roundtrip.h"

#include <pmix.h>

#include <string>

#include "values.h"

namespace dpmix {

namespace {

Napi::Value ValueRoundTrip(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  bool through = info.Length() > 1 && info[1].ToBoolean().Value();
  pmix_value_t in;
  ValueFromJs(info.Length() > 0 ? info[0] : env.Undefined(), &in);
  if (!through) {
    Napi::Value out = ValueToJs(env, in);
    PMIx_Value_destruct(&in);
    return out;
  }
  pmix_data_buffer_t buf;
  PMIx_Data_buffer_construct(&buf);
  pmix_status_t rc = PMIx_Data_pack(nullptr, &buf, &in, 1, PMIX_VALUE);
  PMIx_Value_destruct(&in);
  if (rc != PMIX_SUCCESS) {
    PMIx_Data_buffer_destruct(&buf);
    throw Napi::Error::New(env, std::string("PMIx_Data_pack: ") + PMIx_Error_string(rc));
  }
  pmix_value_t out;
  PMIx_Value_construct(&out);
  int32_t n = 1;
  rc = PMIx_Data_unpack(nullptr, &buf, &out, &n, PMIX_VALUE);
  PMIx_Data_buffer_destruct(&buf);
  if (rc != PMIX_SUCCESS) throw Napi::Error::New(env, std::string("PMIx_Data_unpack: ") + PMIx_Error_string(rc));
  Napi::Value js = ValueToJs(env, out);
  PMIx_Value_destruct(&out);
  return js;
}

}  // namespace

void InitRoundTrip(Napi::Env env, Napi::Object exports) {
  exports.Set("valueRoundTrip", Napi::Function::New(env, ValueRoundTrip, "valueRoundTrip"));
}

}  // namespace dpmix
