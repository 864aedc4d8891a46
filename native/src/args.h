// The arguments of an upcall: deep copies taken on libpmix's progress thread, turned into one
// JavaScript object on the JavaScript thread. Every upcall describes its arguments with this one
// builder, so each upcall reads as the list of what it passes.
#pragma once

#include <napi.h>
#include <pmix_server.h>

#include <functional>
#include <string>
#include <vector>

namespace dpmix {

class Args {
 public:
  Args &Proc(const char *name, const pmix_proc_t *proc);  // null becomes JS null
  Args &Procs(const char *name, const pmix_proc_t *procs, size_t n);
  Args &Infos(const char *name, const pmix_info_t *info, size_t n);
  Args &OneInfo(const char *name, const pmix_info_t *info);  // absent when null
  Args &Strings(const char *name, char **argv);              // a NULL-terminated list
  Args &Bytes(const char *name, const char *data, size_t n);
  Args &String(const char *name, std::string value);
  Args &Number(const char *name, double value);
  Args &Numbers(const char *name, const pmix_status_t *values, size_t n);
  Args &Queries(const char *name, const pmix_query_t *queries, size_t n);
  Args &Apps(const char *name, const pmix_app_t *apps, size_t n);

  Napi::Object ToJs(Napi::Env env) const;

 private:
  using Make = std::function<Napi::Value(Napi::Env)>;
  Args &Add(const char *name, Make make);
  std::vector<std::pair<const char *, Make>> fields_;
};

}  // namespace dpmix
