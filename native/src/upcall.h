// One upcall in flight, and the ways to answer libpmix: one reply kind per libpmix callback type.
//
// An Upcall is made on the progress thread with copies of its arguments (Args), answered on the
// JavaScript thread (Reply) or wherever it is dropped (Fail). Reply converts the JavaScript
// result before calling back, so a bad result throws without having answered libpmix.
#pragma once

#include <napi.h>
#include <pmix_server.h>

#include "args.h"

namespace dpmix {

class Upcall {
 public:
  Upcall(const char *name, Args args) : name_(name), args_(std::move(args)) {}
  virtual ~Upcall() = default;
  const char *name() const { return name_; }
  Napi::Object ArgsToJs(Napi::Env env) const { return args_.ToJs(env); }
  // Converts `result` and calls libpmix's callback. Throws (before calling back) on bad input.
  virtual void Reply(Napi::Env env, pmix_status_t status, const Napi::Value &result) = 0;
  // Calls libpmix's callback with an error and no data.
  virtual void Fail(pmix_status_t status) = 0;

 private:
  const char *name_;
  Args args_;
};

// Answers through one libpmix callback type; Reply and Fail are specialised per type in
// upcall.cc. A null callback makes the upcall a notification.
template <typename Callback>
class Replying : public Upcall {
 public:
  Replying(const char *name, Args args, Callback cb, void *cbdata)
      : Upcall(name, std::move(args)), cb_(cb), cbdata_(cbdata) {}
  void Reply(Napi::Env env, pmix_status_t status, const Napi::Value &result) override;
  void Fail(pmix_status_t status) override;

 private:
  Callback cb_;
  void *cbdata_;
};

// The specialisations, declared here so that every translation unit knows they exist.
#define DPMIX_REPLYING(Callback)                                                                  \
  template <>                                                                                     \
  void Replying<Callback>::Reply(Napi::Env env, pmix_status_t status, const Napi::Value &result); \
  template <>                                                                                     \
  void Replying<Callback>::Fail(pmix_status_t status);
DPMIX_REPLYING(pmix_op_cbfunc_t)
DPMIX_REPLYING(pmix_modex_cbfunc_t)
DPMIX_REPLYING(pmix_info_cbfunc_t)
DPMIX_REPLYING(pmix_lookup_cbfunc_t)
DPMIX_REPLYING(pmix_spawn_cbfunc_t)
DPMIX_REPLYING(pmix_tool_connection_cbfunc_t)
DPMIX_REPLYING(pmix_credential_cbfunc_t)
DPMIX_REPLYING(pmix_validation_cbfunc_t)
#undef DPMIX_REPLYING

using OpReply = Replying<pmix_op_cbfunc_t>;                  // a status only
using ModexReply = Replying<pmix_modex_cbfunc_t>;            // a Buffer, freed by our release callback
using InfoReply = Replying<pmix_info_cbfunc_t>;              // Info[], freed by our release callback
using LookupReply = Replying<pmix_lookup_cbfunc_t>;          // [{proc, key, value}], packed during the call
using SpawnReply = Replying<pmix_spawn_cbfunc_t>;            // the spawned namespace
using ToolReply = Replying<pmix_tool_connection_cbfunc_t>;   // the proc given to a tool
using CredentialReply = Replying<pmix_credential_cbfunc_t>;  // {credential: Buffer, info?: Info[]}
using ValidationReply = Replying<pmix_validation_cbfunc_t>;  // Info[], copied during the call

}  // namespace dpmix
