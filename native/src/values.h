// Conversion between PMIx values and their JavaScript form.
//
// A PMIx value keeps its exact data type ({type: 'uint16', value: 3}) because clients such as
// Open MPI reject a key registered with the wrong width. Everything that libpmix hands us on its
// progress thread is deep-copied there (Info, ProcList, ...) and only turned into JS objects on
// the JS thread.
#pragma once

#include <napi.h>
#include <pmix.h>
#include <pmix_server.h>

#include <string>
#include <vector>

namespace dpmix {

// Name of a PMIx data type as used in JS ('uint32', 'proc', 'data_array', ...); "" if unknown.
const char *TypeName(pmix_data_type_t type);
// Inverse of TypeName; PMIX_UNDEF if the name is unknown.
pmix_data_type_t TypeFromName(const std::string &name);

Napi::Value ValueToJs(Napi::Env env, const pmix_value_t &value);
// Loads a JS {type, value} into a constructed pmix_value_t. Throws a TypeError on bad input.
void ValueFromJs(const Napi::Value &js, pmix_value_t *out);

Napi::Object ProcToJs(Napi::Env env, const pmix_proc_t &proc);
pmix_proc_t ProcFromJs(const Napi::Value &js);
Napi::Array ProcsToJs(Napi::Env env, const pmix_proc_t *procs, size_t n);
std::vector<pmix_proc_t> ProcsFromJs(const Napi::Value &js);

// An owned array of pmix_info_t. Copies are deep (libpmix's own xfer), so every type survives.
class Info {
 public:
  Info() = default;
  Info(const pmix_info_t *src, size_t n);
  explicit Info(size_t n);
  ~Info();
  Info(Info &&other) noexcept;
  Info &operator=(Info &&other) noexcept;
  Info(const Info &) = delete;
  Info &operator=(const Info &) = delete;

  // Reads a JS array of {key, value: {type, value}, flags?}. Throws a TypeError on bad input.
  static Info FromJs(const Napi::Value &js);
  Napi::Array ToJs(Napi::Env env) const;

  pmix_info_t *data() const { return info_; }
  size_t size() const { return n_; }
  // Gives up ownership; the caller frees with PMIx_Info_free(ptr, n).
  pmix_info_t *Release();

 private:
  pmix_info_t *info_ = nullptr;
  size_t n_ = 0;
};

// A NULL-terminated argv-style list of strings, as libpmix passes keys.
std::vector<std::string> CopyArgv(char **argv);
Napi::Array StringsToJs(Napi::Env env, const std::vector<std::string> &strings);

// A byte buffer that can be handed to libpmix and freed by its release callback.
struct Bytes {
  char *data = nullptr;
  size_t size = 0;
  static Bytes FromJs(const Napi::Value &js);  // Buffer, Uint8Array, or undefined/null (empty)
};

}  // namespace dpmix
