#include "args.h"

#include <memory>

#include "values.h"

namespace dpmix {

Args &Args::Add(const char *name, Make make) {
  fields_.emplace_back(name, std::move(make));
  return *this;
}

Args &Args::Proc(const char *name, const pmix_proc_t *proc) {
  if (!proc) return Add(name, [](Napi::Env env) { return env.Null(); });
  pmix_proc_t copy = *proc;
  return Add(name, [copy](Napi::Env env) { return ProcToJs(env, copy); });
}

Args &Args::Procs(const char *name, const pmix_proc_t *procs, size_t n) {
  std::vector<pmix_proc_t> copy = procs ? std::vector<pmix_proc_t>(procs, procs + n) : std::vector<pmix_proc_t>();
  return Add(name, [copy](Napi::Env env) { return ProcsToJs(env, copy.data(), copy.size()); });
}

Args &Args::Infos(const char *name, const pmix_info_t *info, size_t n) {
  auto copy = std::make_shared<Info>(info, n);  // std::function needs a copyable capture
  return Add(name, [copy](Napi::Env env) { return copy->ToJs(env); });
}

Args &Args::OneInfo(const char *name, const pmix_info_t *info) {
  if (!info) return *this;
  auto copy = std::make_shared<Info>(info, 1);
  return Add(name, [copy](Napi::Env env) { return copy->ToJs(env).Get(uint32_t(0)); });
}

Args &Args::Strings(const char *name, char **argv) {
  std::vector<std::string> copy = CopyArgv(argv);
  return Add(name, [copy](Napi::Env env) { return StringsToJs(env, copy); });
}

Args &Args::Bytes(const char *name, const char *data, size_t n) {
  std::string copy = data ? std::string(data, n) : std::string();
  return Add(name, [copy](Napi::Env env) { return Napi::Buffer<char>::Copy(env, copy.data(), copy.size()); });
}

Args &Args::String(const char *name, std::string value) {
  return Add(name, [value](Napi::Env env) { return Napi::String::New(env, value); });
}

Args &Args::Number(const char *name, double value) {
  return Add(name, [value](Napi::Env env) { return Napi::Number::New(env, value); });
}

Args &Args::Numbers(const char *name, const pmix_status_t *values, size_t n) {
  std::vector<double> copy;
  for (size_t i = 0; values && i < n; ++i) copy.push_back(values[i]);
  return Add(name, [copy](Napi::Env env) {
    Napi::Array a = Napi::Array::New(env, copy.size());
    for (size_t i = 0; i < copy.size(); ++i) a.Set(static_cast<uint32_t>(i), Napi::Number::New(env, copy[i]));
    return a;
  });
}

Args &Args::Queries(const char *name, const pmix_query_t *queries, size_t n) {
  struct Query {
    std::vector<std::string> keys;
    std::shared_ptr<Info> qualifiers;
  };
  std::vector<Query> copy;
  for (size_t i = 0; i < n; ++i)
    copy.push_back({CopyArgv(queries[i].keys), std::make_shared<Info>(queries[i].qualifiers, queries[i].nqual)});
  return Add(name, [copy](Napi::Env env) {
    Napi::Array a = Napi::Array::New(env, copy.size());
    for (size_t i = 0; i < copy.size(); ++i) {
      Napi::Object q = Napi::Object::New(env);
      q.Set("keys", StringsToJs(env, copy[i].keys));
      q.Set("qualifiers", copy[i].qualifiers->ToJs(env));
      a.Set(static_cast<uint32_t>(i), q);
    }
    return a;
  });
}

Args &Args::Apps(const char *name, const pmix_app_t *apps, size_t n) {
  struct App {
    std::string cmd, cwd;
    std::vector<std::string> argv, env;
    int maxprocs;
    std::shared_ptr<Info> info;
  };
  std::vector<App> copy;
  for (size_t i = 0; i < n; ++i) {
    copy.push_back({apps[i].cmd ? apps[i].cmd : "", apps[i].cwd ? apps[i].cwd : "", CopyArgv(apps[i].argv),
                    CopyArgv(apps[i].env), apps[i].maxprocs, std::make_shared<Info>(apps[i].info, apps[i].ninfo)});
  }
  return Add(name, [copy](Napi::Env env) {
    Napi::Array a = Napi::Array::New(env, copy.size());
    for (size_t i = 0; i < copy.size(); ++i) {
      Napi::Object o = Napi::Object::New(env);
      o.Set("cmd", copy[i].cmd);
      o.Set("argv", StringsToJs(env, copy[i].argv));
      o.Set("env", StringsToJs(env, copy[i].env));
      o.Set("cwd", copy[i].cwd);
      o.Set("maxprocs", Napi::Number::New(env, copy[i].maxprocs));
      o.Set("info", copy[i].info->ToJs(env));
      a.Set(static_cast<uint32_t>(i), o);
    }
    return a;
  });
}

Napi::Object Args::ToJs(Napi::Env env) const {
  Napi::Object o = Napi::Object::New(env);
  for (const auto &[name, make] : fields_) o.Set(name, make(env));
  return o;
}

}  // namespace dpmix
