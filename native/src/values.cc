#include "values.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace dpmix {

namespace {

struct TypeEntry {
  pmix_data_type_t type;
  const char *name;
};

// The types the host exchanges with libpmix. Others are passed to JS as {type: 'unsupported'}.
const TypeEntry kTypes[] = {
    {PMIX_BOOL, "bool"},
    {PMIX_BYTE, "byte"},
    {PMIX_STRING, "string"},
    {PMIX_SIZE, "size"},
    {PMIX_PID, "pid"},
    {PMIX_INT, "int"},
    {PMIX_INT8, "int8"},
    {PMIX_INT16, "int16"},
    {PMIX_INT32, "int32"},
    {PMIX_INT64, "int64"},
    {PMIX_UINT, "uint"},
    {PMIX_UINT8, "uint8"},
    {PMIX_UINT16, "uint16"},
    {PMIX_UINT32, "uint32"},
    {PMIX_UINT64, "uint64"},
    {PMIX_FLOAT, "float"},
    {PMIX_DOUBLE, "double"},
    {PMIX_TIMEVAL, "timeval"},
    {PMIX_TIME, "time"},
    {PMIX_STATUS, "status"},
    {PMIX_PROC, "proc"},
    {PMIX_INFO, "info"},
    {PMIX_BYTE_OBJECT, "byte_object"},
    {PMIX_PERSIST, "persist"},
    {PMIX_SCOPE, "scope"},
    {PMIX_DATA_RANGE, "data_range"},
    {PMIX_PROC_STATE, "proc_state"},
    {PMIX_PROC_INFO, "proc_info"},
    {PMIX_DATA_ARRAY, "data_array"},
    {PMIX_PROC_RANK, "proc_rank"},
    {PMIX_ALLOC_DIRECTIVE, "alloc_directive"},
    {PMIX_ENVAR, "envar"},
    {PMIX_REGEX, "regex"},
    {PMIX_JOB_STATE, "job_state"},
    {PMIX_LINK_STATE, "link_state"},
    {PMIX_COMPRESSED_STRING, "compressed_string"},
    {PMIX_COMPRESSED_BYTE_OBJECT, "compressed_byte_object"},
    {PMIX_PROC_NSPACE, "proc_nspace"},
    {PMIX_DATA_TYPE, "data_type"},
    {PMIX_INFO_DIRECTIVES, "info_directives"},
    {PMIX_POINTER, "pointer"},
};

[[noreturn]] void Throw(Napi::Env env, const std::string &msg) { throw Napi::TypeError::New(env, msg); }

Napi::Value Int64ToJs(Napi::Env env, int64_t v) {
  if (v > (int64_t(1) << 53) || v < -(int64_t(1) << 53)) return Napi::BigInt::New(env, v);
  return Napi::Number::New(env, static_cast<double>(v));
}

Napi::Value Uint64ToJs(Napi::Env env, uint64_t v) {
  if (v > (uint64_t(1) << 53)) return Napi::BigInt::New(env, v);
  return Napi::Number::New(env, static_cast<double>(v));
}

// Reads an integer from a JS number or bigint and checks it fits [lo, hi].
template <typename T>
T IntFromJs(const Napi::Value &v, const char *type) {
  Napi::Env env = v.Env();
  if (v.IsBigInt()) {
    bool lossless = true;
    if (std::numeric_limits<T>::is_signed) {
      int64_t x = v.As<Napi::BigInt>().Int64Value(&lossless);
      if (!lossless || x < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          x > static_cast<int64_t>(std::numeric_limits<T>::max()))
        Throw(env, std::string("value out of range for ") + type);
      return static_cast<T>(x);
    }
    uint64_t x = v.As<Napi::BigInt>().Uint64Value(&lossless);
    if (!lossless || x > static_cast<uint64_t>(std::numeric_limits<T>::max()))
      Throw(env, std::string("value out of range for ") + type);
    return static_cast<T>(x);
  }
  if (!v.IsNumber()) Throw(env, std::string("expected a number for ") + type);
  double d = v.As<Napi::Number>().DoubleValue();
  if (std::isnan(d) || std::floor(d) != d) Throw(env, std::string("expected an integer for ") + type);
  if (d < static_cast<double>(std::numeric_limits<T>::min()) || d > static_cast<double>(std::numeric_limits<T>::max()))
    Throw(env, std::string("value out of range for ") + type);
  return static_cast<T>(d);
}

std::string StringFromJs(const Napi::Value &v, const char *what) {
  if (!v.IsString()) Throw(v.Env(), std::string("expected a string for ") + what);
  return v.As<Napi::String>().Utf8Value();
}

// Copies a string into a fixed-size, NUL-terminated PMIx field (nspace, key).
template <size_t N>
void LoadFixed(char (&dst)[N], const std::string &src, Napi::Env env, const char *what) {
  if (src.size() >= N) Throw(env, std::string(what) + " longer than " + std::to_string(N - 1) + " characters");
  std::memset(dst, 0, N);
  std::memcpy(dst, src.data(), src.size());
}

Napi::Buffer<char> BytesToJs(Napi::Env env, const pmix_byte_object_t &bo) {
  return Napi::Buffer<char>::Copy(env, bo.bytes ? bo.bytes : "", bo.bytes ? bo.size : 0);
}

void BytesFromJs(const Napi::Value &v, pmix_byte_object_t *bo) {
  Bytes b = Bytes::FromJs(v);
  bo->bytes = b.data;
  bo->size = b.size;
}

Napi::Object ProcInfoToJs(Napi::Env env, const pmix_proc_info_t &p) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("proc", ProcToJs(env, p.proc));
  o.Set("hostname", p.hostname ? Napi::String::New(env, p.hostname) : env.Null());
  o.Set("executable", p.executable_name ? Napi::String::New(env, p.executable_name) : env.Null());
  o.Set("pid", Napi::Number::New(env, p.pid));
  o.Set("exitCode", Napi::Number::New(env, p.exit_code));
  o.Set("state", Napi::Number::New(env, p.state));
  return o;
}

void ProcInfoFromJs(const Napi::Value &v, pmix_proc_info_t *out) {
  Napi::Env env = v.Env();
  if (!v.IsObject()) Throw(env, "expected {proc, hostname, executable, pid, exitCode, state} for proc_info");
  Napi::Object o = v.As<Napi::Object>();
  out->proc = ProcFromJs(o.Get("proc"));
  Napi::Value host = o.Get("hostname");
  Napi::Value exe = o.Get("executable");
  out->hostname = host.IsString() ? strdup(host.As<Napi::String>().Utf8Value().c_str()) : nullptr;
  out->executable_name = exe.IsString() ? strdup(exe.As<Napi::String>().Utf8Value().c_str()) : nullptr;
  out->pid = IntFromJs<pid_t>(o.Get("pid"), "proc_info.pid");
  out->exit_code = IntFromJs<int>(o.Get("exitCode"), "proc_info.exitCode");
  out->state = IntFromJs<uint8_t>(o.Get("state"), "proc_info.state");
}

// Storage width of one element of a data array of `type`; 0 for types handled separately.
size_t ElementWidth(pmix_data_type_t type) {
  switch (type) {
    case PMIX_BOOL:
      return sizeof(bool);
    case PMIX_BYTE:
    case PMIX_UINT8:
    case PMIX_INT8:
    case PMIX_PERSIST:
    case PMIX_SCOPE:
    case PMIX_DATA_RANGE:
    case PMIX_PROC_STATE:
    case PMIX_ALLOC_DIRECTIVE:
    case PMIX_JOB_STATE:
    case PMIX_LINK_STATE:
      return 1;
    case PMIX_STRING:
      return sizeof(char *);
    case PMIX_SIZE:
      return sizeof(size_t);
    case PMIX_PID:
      return sizeof(pid_t);
    case PMIX_INT:
    case PMIX_UINT:
      return sizeof(int);
    case PMIX_INT16:
    case PMIX_UINT16:
    case PMIX_DATA_TYPE:
      return 2;
    case PMIX_INT32:
    case PMIX_UINT32:
    case PMIX_STATUS:
    case PMIX_PROC_RANK:
    case PMIX_INFO_DIRECTIVES:
      return 4;
    case PMIX_INT64:
    case PMIX_UINT64:
      return 8;
    case PMIX_FLOAT:
      return sizeof(float);
    case PMIX_DOUBLE:
      return sizeof(double);
    case PMIX_TIME:
      return sizeof(time_t);
    case PMIX_TIMEVAL:
      return sizeof(struct timeval);
    case PMIX_BYTE_OBJECT:
    case PMIX_COMPRESSED_STRING:
    case PMIX_COMPRESSED_BYTE_OBJECT:
    case PMIX_REGEX:
      return sizeof(pmix_byte_object_t);
    case PMIX_ENVAR:
      return sizeof(pmix_envar_t);
    default:
      return 0;
  }
}

// Converts one element stored at `p` with data type `type`. Used for pmix_value_t payloads and for
// the elements of data arrays, which share the scalar layouts.
Napi::Value ElementToJs(Napi::Env env, pmix_data_type_t type, const void *p) {
  switch (type) {
    case PMIX_BOOL:
      return Napi::Boolean::New(env, *static_cast<const bool *>(p));
    case PMIX_BYTE:
    case PMIX_UINT8:
    case PMIX_PERSIST:
    case PMIX_SCOPE:
    case PMIX_DATA_RANGE:
    case PMIX_PROC_STATE:
    case PMIX_ALLOC_DIRECTIVE:
    case PMIX_JOB_STATE:
    case PMIX_LINK_STATE:
      return Napi::Number::New(env, *static_cast<const uint8_t *>(p));
    case PMIX_STRING: {
      const char *s = *static_cast<char *const *>(p);
      return s ? Napi::Value(Napi::String::New(env, s)) : env.Null();
    }
    case PMIX_SIZE:
      return Uint64ToJs(env, *static_cast<const size_t *>(p));
    case PMIX_PID:
      return Napi::Number::New(env, *static_cast<const pid_t *>(p));
    case PMIX_INT:
      return Napi::Number::New(env, *static_cast<const int *>(p));
    case PMIX_INT8:
      return Napi::Number::New(env, *static_cast<const int8_t *>(p));
    case PMIX_INT16:
      return Napi::Number::New(env, *static_cast<const int16_t *>(p));
    case PMIX_INT32:
      return Napi::Number::New(env, *static_cast<const int32_t *>(p));
    case PMIX_INT64:
      return Int64ToJs(env, *static_cast<const int64_t *>(p));
    case PMIX_UINT:
      return Napi::Number::New(env, *static_cast<const unsigned int *>(p));
    case PMIX_UINT16:
      return Napi::Number::New(env, *static_cast<const uint16_t *>(p));
    case PMIX_UINT32:
      return Napi::Number::New(env, *static_cast<const uint32_t *>(p));
    case PMIX_UINT64:
      return Uint64ToJs(env, *static_cast<const uint64_t *>(p));
    case PMIX_FLOAT:
      return Napi::Number::New(env, *static_cast<const float *>(p));
    case PMIX_DOUBLE:
      return Napi::Number::New(env, *static_cast<const double *>(p));
    case PMIX_TIME:
      return Int64ToJs(env, static_cast<int64_t>(*static_cast<const time_t *>(p)));
    case PMIX_TIMEVAL: {
      const struct timeval *tv = static_cast<const struct timeval *>(p);
      Napi::Object o = Napi::Object::New(env);
      o.Set("sec", Int64ToJs(env, tv->tv_sec));
      o.Set("usec", Int64ToJs(env, tv->tv_usec));
      return o;
    }
    case PMIX_STATUS:
      return Napi::Number::New(env, *static_cast<const pmix_status_t *>(p));
    case PMIX_PROC_RANK:
      return Napi::Number::New(env, *static_cast<const pmix_rank_t *>(p));
    case PMIX_DATA_TYPE:
      return Napi::Number::New(env, *static_cast<const pmix_data_type_t *>(p));
    case PMIX_INFO_DIRECTIVES:
      return Napi::Number::New(env, *static_cast<const pmix_info_directives_t *>(p));
    case PMIX_BYTE_OBJECT:
    case PMIX_COMPRESSED_STRING:
    case PMIX_COMPRESSED_BYTE_OBJECT:
      return BytesToJs(env, *static_cast<const pmix_byte_object_t *>(p));
    case PMIX_REGEX: {
      // libpmix 5.0.11 unpacks a regex as a bare NUL-terminated string in bytes, size left 0.
      pmix_byte_object_t bo = *static_cast<const pmix_byte_object_t *>(p);
      if (bo.size == 0 && bo.bytes) bo.size = strlen(bo.bytes) + 1;
      return BytesToJs(env, bo);
    }
    case PMIX_ENVAR: {
      const pmix_envar_t *e = static_cast<const pmix_envar_t *>(p);
      Napi::Object o = Napi::Object::New(env);
      o.Set("envar", e->envar ? Napi::Value(Napi::String::New(env, e->envar)) : env.Null());
      o.Set("value", e->value ? Napi::Value(Napi::String::New(env, e->value)) : env.Null());
      o.Set("separator", Napi::String::New(env, std::string(1, e->separator ? e->separator : ':')));
      return o;
    }
    default:
      return env.Undefined();
  }
}

// The inverse of ElementToJs for the same storage layouts. `p` points to zeroed storage.
void ElementFromJs(const Napi::Value &v, pmix_data_type_t type, void *p) {
  Napi::Env env = v.Env();
  switch (type) {
    case PMIX_BOOL:
      if (!v.IsBoolean()) Throw(env, "expected a boolean for bool");
      *static_cast<bool *>(p) = v.As<Napi::Boolean>().Value();
      return;
    case PMIX_BYTE:
    case PMIX_UINT8:
    case PMIX_PERSIST:
    case PMIX_SCOPE:
    case PMIX_DATA_RANGE:
    case PMIX_PROC_STATE:
    case PMIX_ALLOC_DIRECTIVE:
    case PMIX_JOB_STATE:
    case PMIX_LINK_STATE:
      *static_cast<uint8_t *>(p) = IntFromJs<uint8_t>(v, TypeName(type));
      return;
    case PMIX_STRING:
      *static_cast<char **>(p) = strdup(StringFromJs(v, "string").c_str());
      return;
    case PMIX_SIZE:
      *static_cast<size_t *>(p) = IntFromJs<size_t>(v, "size");
      return;
    case PMIX_PID:
      *static_cast<pid_t *>(p) = IntFromJs<pid_t>(v, "pid");
      return;
    case PMIX_INT:
      *static_cast<int *>(p) = IntFromJs<int>(v, "int");
      return;
    case PMIX_INT8:
      *static_cast<int8_t *>(p) = IntFromJs<int8_t>(v, "int8");
      return;
    case PMIX_INT16:
      *static_cast<int16_t *>(p) = IntFromJs<int16_t>(v, "int16");
      return;
    case PMIX_INT32:
      *static_cast<int32_t *>(p) = IntFromJs<int32_t>(v, "int32");
      return;
    case PMIX_INT64:
      *static_cast<int64_t *>(p) = IntFromJs<int64_t>(v, "int64");
      return;
    case PMIX_UINT:
      *static_cast<unsigned int *>(p) = IntFromJs<unsigned int>(v, "uint");
      return;
    case PMIX_UINT16:
      *static_cast<uint16_t *>(p) = IntFromJs<uint16_t>(v, "uint16");
      return;
    case PMIX_UINT32:
      *static_cast<uint32_t *>(p) = IntFromJs<uint32_t>(v, "uint32");
      return;
    case PMIX_UINT64:
      *static_cast<uint64_t *>(p) = IntFromJs<uint64_t>(v, "uint64");
      return;
    case PMIX_FLOAT:
      if (!v.IsNumber()) Throw(env, "expected a number for float");
      *static_cast<float *>(p) = v.As<Napi::Number>().FloatValue();
      return;
    case PMIX_DOUBLE:
      if (!v.IsNumber()) Throw(env, "expected a number for double");
      *static_cast<double *>(p) = v.As<Napi::Number>().DoubleValue();
      return;
    case PMIX_TIME:
      *static_cast<time_t *>(p) = IntFromJs<int64_t>(v, "time");
      return;
    case PMIX_TIMEVAL: {
      if (!v.IsObject()) Throw(env, "expected {sec, usec} for timeval");
      Napi::Object o = v.As<Napi::Object>();
      struct timeval *tv = static_cast<struct timeval *>(p);
      tv->tv_sec = IntFromJs<int64_t>(o.Get("sec"), "timeval.sec");
      tv->tv_usec = IntFromJs<int64_t>(o.Get("usec"), "timeval.usec");
      return;
    }
    case PMIX_STATUS:
      *static_cast<pmix_status_t *>(p) = IntFromJs<int32_t>(v, "status");
      return;
    case PMIX_PROC_RANK:
      *static_cast<pmix_rank_t *>(p) = IntFromJs<uint32_t>(v, "proc_rank");
      return;
    case PMIX_DATA_TYPE:
      *static_cast<pmix_data_type_t *>(p) = IntFromJs<uint16_t>(v, "data_type");
      return;
    case PMIX_INFO_DIRECTIVES:
      *static_cast<pmix_info_directives_t *>(p) = IntFromJs<uint32_t>(v, "info_directives");
      return;
    case PMIX_BYTE_OBJECT:
    case PMIX_COMPRESSED_STRING:
    case PMIX_COMPRESSED_BYTE_OBJECT:
    case PMIX_REGEX:
      BytesFromJs(v, static_cast<pmix_byte_object_t *>(p));
      return;
    case PMIX_ENVAR: {
      if (!v.IsObject()) Throw(env, "expected {envar, value, separator} for envar");
      Napi::Object o = v.As<Napi::Object>();
      pmix_envar_t *e = static_cast<pmix_envar_t *>(p);
      e->envar = strdup(StringFromJs(o.Get("envar"), "envar.envar").c_str());
      e->value = strdup(StringFromJs(o.Get("value"), "envar.value").c_str());
      Napi::Value sep = o.Get("separator");
      e->separator =
          sep.IsString() && !sep.As<Napi::String>().Utf8Value().empty() ? sep.As<Napi::String>().Utf8Value()[0] : ':';
      return;
    }
    default:
      Throw(env, std::string("data type ") + (TypeName(type)[0] ? TypeName(type) : std::to_string(type)) +
                     " cannot be sent to libpmix");
  }
}

void LoadInfo(const Napi::Value &js, pmix_info_t *out);

Napi::Value DataArrayToJs(Napi::Env env, const pmix_data_array_t *da) {
  Napi::Object o = Napi::Object::New(env);
  Napi::Array items = Napi::Array::New(env);
  if (!da) {
    o.Set("type", "undef");
    o.Set("items", items);
    return o;
  }
  o.Set("type", TypeName(da->type)[0] ? TypeName(da->type) : "unsupported");
  for (size_t i = 0; i < da->size; ++i) {
    Napi::Value item;
    switch (da->type) {
      case PMIX_INFO: {
        Info one(static_cast<const pmix_info_t *>(da->array) + i, 1);
        item = one.ToJs(env).Get(uint32_t(0));
        break;
      }
      case PMIX_PROC:
        item = ProcToJs(env, static_cast<const pmix_proc_t *>(da->array)[i]);
        break;
      case PMIX_PROC_INFO:
        item = ProcInfoToJs(env, static_cast<const pmix_proc_info_t *>(da->array)[i]);
        break;
      case PMIX_VALUE:
        item = ValueToJs(env, static_cast<const pmix_value_t *>(da->array)[i]);
        break;
      default: {
        size_t width = ElementWidth(da->type);
        item = width ? ElementToJs(env, da->type, static_cast<const char *>(da->array) + i * width) : env.Undefined();
      }
    }
    items.Set(static_cast<uint32_t>(i), item);
  }
  o.Set("items", items);
  return o;
}

pmix_data_array_t *DataArrayFromJs(const Napi::Value &v) {
  Napi::Env env = v.Env();
  if (!v.IsObject()) Throw(env, "expected {type, items} for data_array");
  Napi::Object o = v.As<Napi::Object>();
  pmix_data_type_t type = TypeFromName(StringFromJs(o.Get("type"), "data_array.type"));
  Napi::Value itemsV = o.Get("items");
  if (!itemsV.IsArray()) Throw(env, "expected an array for data_array.items");
  Napi::Array items = itemsV.As<Napi::Array>();
  if (type == PMIX_UNDEF || type == PMIX_DATA_ARRAY || type == PMIX_POINTER)
    Throw(env, "unsupported data_array element type");
  // PMIx_Data_array_create refuses a size of 0; an empty array is still a value to hand over.
  pmix_data_array_t *da = items.Length() > 0 ? PMIx_Data_array_create(items.Length(), type)
                                             : static_cast<pmix_data_array_t *>(calloc(1, sizeof(pmix_data_array_t)));
  if (!da) Throw(env, "cannot allocate data array");
  da->type = type;
  try {
    for (uint32_t i = 0; i < items.Length(); ++i) {
      Napi::Value item = items.Get(i);
      switch (type) {
        case PMIX_INFO:
          LoadInfo(item, static_cast<pmix_info_t *>(da->array) + i);
          break;
        case PMIX_PROC:
          static_cast<pmix_proc_t *>(da->array)[i] = ProcFromJs(item);
          break;
        case PMIX_PROC_INFO:
          ProcInfoFromJs(item, static_cast<pmix_proc_info_t *>(da->array) + i);
          break;
        case PMIX_VALUE:
          ValueFromJs(item, static_cast<pmix_value_t *>(da->array) + i);
          break;
        default: {
          size_t width = ElementWidth(type);
          if (width == 0) Throw(env, std::string("unsupported data_array element type ") + TypeName(type));
          ElementFromJs(item, type, static_cast<char *>(da->array) + i * width);
        }
      }
    }
  } catch (...) {
    PMIx_Data_array_free(da);
    throw;
  }
  return da;
}

void LoadInfo(const Napi::Value &js, pmix_info_t *out) {
  Napi::Env env = js.Env();
  if (!js.IsObject()) Throw(env, "expected an info object {key, value}");
  Napi::Object o = js.As<Napi::Object>();
  std::string key = StringFromJs(o.Get("key"), "info.key");
  LoadFixed(out->key, key, env, "info key");
  ValueFromJs(o.Get("value"), &out->value);
  Napi::Value flags = o.Get("flags");
  if (!flags.IsUndefined() && !flags.IsNull()) out->flags = IntFromJs<uint32_t>(flags, "info.flags");
}

}  // namespace

const char *TypeName(pmix_data_type_t type) {
  for (const auto &e : kTypes)
    if (e.type == type) return e.name;
  return "";
}

pmix_data_type_t TypeFromName(const std::string &name) {
  for (const auto &e : kTypes)
    if (name == e.name) return e.type;
  return PMIX_UNDEF;
}

Napi::Value ValueToJs(Napi::Env env, const pmix_value_t &value) {
  Napi::Object o = Napi::Object::New(env);
  const char *name = TypeName(value.type);
  switch (value.type) {
    case PMIX_PROC:
      o.Set("type", name);
      o.Set("value", value.data.proc ? Napi::Value(ProcToJs(env, *value.data.proc)) : env.Null());
      return o;
    case PMIX_PROC_INFO:
      o.Set("type", name);
      o.Set("value", value.data.pinfo ? Napi::Value(ProcInfoToJs(env, *value.data.pinfo)) : env.Null());
      return o;
    case PMIX_DATA_ARRAY:
      o.Set("type", name);
      o.Set("value", DataArrayToJs(env, value.data.darray));
      return o;
    case PMIX_PROC_NSPACE:
      o.Set("type", name);
      o.Set("value", value.data.nspace ? Napi::Value(Napi::String::New(env, *value.data.nspace)) : env.Null());
      return o;
    case PMIX_UNDEF:
      o.Set("type", "undef");
      o.Set("value", env.Null());
      return o;
    default:
      break;
  }
  Napi::Value v = ElementToJs(env, value.type, &value.data);
  if (v.IsUndefined()) {
    // Keep what libpmix can say about values we do not translate, instead of dropping them.
    char *s = PMIx_Value_string(&value);
    o.Set("type", "unsupported");
    o.Set("typeId", Napi::Number::New(env, value.type));
    o.Set("value", s ? Napi::String::New(env, s) : Napi::String::New(env, ""));
    free(s);
    return o;
  }
  o.Set("type", name);
  o.Set("value", v);
  return o;
}

void ValueFromJs(const Napi::Value &js, pmix_value_t *out) {
  Napi::Env env = js.Env();
  if (!js.IsObject()) Throw(env, "expected a typed value {type, value}");
  Napi::Object o = js.As<Napi::Object>();
  std::string typeName = StringFromJs(o.Get("type"), "value.type");
  pmix_data_type_t type = TypeFromName(typeName);
  PMIx_Value_construct(out);
  if (typeName == "undef") return;  // a bare key: PMIX_UNDEF, as libpmix hands it over
  if (type == PMIX_UNDEF) Throw(env, "unknown PMIx data type '" + typeName + "'");
  Napi::Value v = o.Get("value");
  switch (type) {
    case PMIX_PROC: {
      pmix_proc_t p = ProcFromJs(v);
      out->data.proc = PMIx_Proc_create(1);
      *out->data.proc = p;
      break;
    }
    case PMIX_DATA_ARRAY:
      out->data.darray = DataArrayFromJs(v);
      break;
    case PMIX_PROC_NSPACE: {
      std::string ns = StringFromJs(v, "proc_nspace");
      out->data.nspace = static_cast<pmix_nspace_t *>(calloc(1, sizeof(pmix_nspace_t)));
      LoadFixed(*out->data.nspace, ns, env, "nspace");
      break;
    }
    case PMIX_PROC_INFO:
      out->data.pinfo = PMIx_Proc_info_create(1);
      try {
        ProcInfoFromJs(v, out->data.pinfo);
      } catch (...) {
        PMIx_Proc_info_free(out->data.pinfo, 1);
        out->data.pinfo = nullptr;
        throw;
      }
      break;
    case PMIX_INFO:
    case PMIX_POINTER:
      Throw(env, "data type " + typeName + " cannot be sent to libpmix as a value");
    default:
      ElementFromJs(v, type, &out->data);
      break;
  }
  out->type = type;
}

Napi::Object ProcToJs(Napi::Env env, const pmix_proc_t &proc) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("nspace", Napi::String::New(env, std::string(proc.nspace, strnlen(proc.nspace, PMIX_MAX_NSLEN + 1))));
  o.Set("rank", Napi::Number::New(env, proc.rank));
  return o;
}

pmix_proc_t ProcFromJs(const Napi::Value &js) {
  Napi::Env env = js.Env();
  if (!js.IsObject()) Throw(env, "expected a proc {nspace, rank}");
  Napi::Object o = js.As<Napi::Object>();
  pmix_proc_t p;
  PMIx_Proc_construct(&p);
  LoadFixed(p.nspace, StringFromJs(o.Get("nspace"), "proc.nspace"), env, "nspace");
  p.rank = IntFromJs<uint32_t>(o.Get("rank"), "proc.rank");
  return p;
}

Napi::Array ProcsToJs(Napi::Env env, const pmix_proc_t *procs, size_t n) {
  Napi::Array a = Napi::Array::New(env, n);
  for (size_t i = 0; i < n; ++i) a.Set(static_cast<uint32_t>(i), ProcToJs(env, procs[i]));
  return a;
}

std::vector<pmix_proc_t> ProcsFromJs(const Napi::Value &js) {
  if (!js.IsArray()) Throw(js.Env(), "expected an array of procs");
  Napi::Array a = js.As<Napi::Array>();
  std::vector<pmix_proc_t> out;
  out.reserve(a.Length());
  for (uint32_t i = 0; i < a.Length(); ++i) out.push_back(ProcFromJs(a.Get(i)));
  return out;
}

Info::Info(const pmix_info_t *src, size_t n) : n_(n) {
  if (n == 0) return;
  info_ = PMIx_Info_create(n);
  for (size_t i = 0; i < n; ++i) PMIx_Info_xfer(&info_[i], &src[i]);
}

Info::Info(size_t n) : n_(n) {
  if (n > 0) info_ = PMIx_Info_create(n);
}

Info::~Info() {
  if (info_) PMIx_Info_free(info_, n_);
}

Info::Info(Info &&other) noexcept : info_(other.info_), n_(other.n_) {
  other.info_ = nullptr;
  other.n_ = 0;
}

Info &Info::operator=(Info &&other) noexcept {
  if (this != &other) {
    if (info_) PMIx_Info_free(info_, n_);
    info_ = other.info_;
    n_ = other.n_;
    other.info_ = nullptr;
    other.n_ = 0;
  }
  return *this;
}

pmix_info_t *Info::Release() {
  pmix_info_t *p = info_;
  info_ = nullptr;
  n_ = 0;
  return p;
}

Info Info::FromJs(const Napi::Value &js) {
  if (js.IsUndefined() || js.IsNull()) return Info();
  if (!js.IsArray()) Throw(js.Env(), "expected an array of info {key, value}");
  Napi::Array a = js.As<Napi::Array>();
  Info info(a.Length());
  for (uint32_t i = 0; i < a.Length(); ++i) LoadInfo(a.Get(i), &info.info_[i]);
  return info;
}

Napi::Array Info::ToJs(Napi::Env env) const {
  Napi::Array a = Napi::Array::New(env, n_);
  for (size_t i = 0; i < n_; ++i) {
    Napi::Object o = Napi::Object::New(env);
    o.Set("key", Napi::String::New(env, std::string(info_[i].key, strnlen(info_[i].key, PMIX_MAX_KEYLEN + 1))));
    o.Set("value", ValueToJs(env, info_[i].value));
    if (info_[i].flags) o.Set("flags", Napi::Number::New(env, info_[i].flags));
    a.Set(static_cast<uint32_t>(i), o);
  }
  return a;
}

std::vector<std::string> CopyArgv(char **argv) {
  std::vector<std::string> out;
  for (size_t i = 0; argv && argv[i]; ++i) out.emplace_back(argv[i]);
  return out;
}

Napi::Array StringsToJs(Napi::Env env, const std::vector<std::string> &strings) {
  Napi::Array a = Napi::Array::New(env, strings.size());
  for (size_t i = 0; i < strings.size(); ++i) a.Set(static_cast<uint32_t>(i), Napi::String::New(env, strings[i]));
  return a;
}

Bytes Bytes::FromJs(const Napi::Value &js) {
  Bytes b;
  if (js.IsUndefined() || js.IsNull()) return b;
  if (!js.IsTypedArray() && !js.IsBuffer()) Throw(js.Env(), "expected a Buffer");
  Napi::Uint8Array u = js.As<Napi::Uint8Array>();
  b.size = u.ByteLength();
  if (b.size > 0) {
    b.data = static_cast<char *>(malloc(b.size));
    std::memcpy(b.data, u.Data(), b.size);
  }
  return b;
}

}  // namespace dpmix
