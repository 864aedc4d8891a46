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
  Upcall(const char* name, Args args) : name_(name), args_(std::move(args)) {}
  virtual ~Upcall() = default;
  const char* name() const { return name_; }
  Napi::Object ArgsToJs(Napi::Env env) const { return args_.ToJs(env); }
  // Converts `result` and calls libpmix's callback. Throws (before calling back) on bad input.
  virtual void Reply(Napi::Env env, pmix_status_t status, const Napi::Value& result) = 0;
  // Calls libpmix's callback with an error and no data.
  virtual void Fail(pmix_status_t status) = 0;

 private:
  const char* name_;
  Args args_;
};

// pmix_op_cbfunc_t: a status only. A null callback makes the upcall a notification.
class OpReply : public Upcall {
 public:
  OpReply(const char* name, Args args, pmix_op_cbfunc_t cb, void* cbdata)
      : Upcall(name, std::move(args)), cb_(cb), cbdata_(cbdata) {}
  void Reply(Napi::Env, pmix_status_t status, const Napi::Value&) override { Fail(status); }
  void Fail(pmix_status_t status) override;

 private:
  pmix_op_cbfunc_t cb_;
  void* cbdata_;
};

// pmix_modex_cbfunc_t: a blob (Buffer) that libpmix frees through our release callback.
class ModexReply : public Upcall {
 public:
  ModexReply(const char* name, Args args, pmix_modex_cbfunc_t cb, void* cbdata)
      : Upcall(name, std::move(args)), cb_(cb), cbdata_(cbdata) {}
  void Reply(Napi::Env env, pmix_status_t status, const Napi::Value& result) override;
  void Fail(pmix_status_t status) override;

 private:
  pmix_modex_cbfunc_t cb_;
  void* cbdata_;
};

// pmix_info_cbfunc_t: an info array that libpmix frees through our release callback.
class InfoReply : public Upcall {
 public:
  InfoReply(const char* name, Args args, pmix_info_cbfunc_t cb, void* cbdata)
      : Upcall(name, std::move(args)), cb_(cb), cbdata_(cbdata) {}
  void Reply(Napi::Env env, pmix_status_t status, const Napi::Value& result) override;
  void Fail(pmix_status_t status) override;

 private:
  pmix_info_cbfunc_t cb_;
  void* cbdata_;
};

// pmix_lookup_cbfunc_t: published data [{proc, key, value}], packed by libpmix during the call.
class LookupReply : public Upcall {
 public:
  LookupReply(const char* name, Args args, pmix_lookup_cbfunc_t cb, void* cbdata)
      : Upcall(name, std::move(args)), cb_(cb), cbdata_(cbdata) {}
  void Reply(Napi::Env env, pmix_status_t status, const Napi::Value& result) override;
  void Fail(pmix_status_t status) override;

 private:
  pmix_lookup_cbfunc_t cb_;
  void* cbdata_;
};

// pmix_spawn_cbfunc_t: the spawned namespace.
class SpawnReply : public Upcall {
 public:
  SpawnReply(const char* name, Args args, pmix_spawn_cbfunc_t cb, void* cbdata)
      : Upcall(name, std::move(args)), cb_(cb), cbdata_(cbdata) {}
  void Reply(Napi::Env env, pmix_status_t status, const Napi::Value& result) override;
  void Fail(pmix_status_t status) override;

 private:
  pmix_spawn_cbfunc_t cb_;
  void* cbdata_;
};

// pmix_tool_connection_cbfunc_t: the proc a tool is given.
class ToolReply : public Upcall {
 public:
  ToolReply(const char* name, Args args, pmix_tool_connection_cbfunc_t cb, void* cbdata)
      : Upcall(name, std::move(args)), cb_(cb), cbdata_(cbdata) {}
  void Reply(Napi::Env env, pmix_status_t status, const Napi::Value& result) override;
  void Fail(pmix_status_t status) override;

 private:
  pmix_tool_connection_cbfunc_t cb_;
  void* cbdata_;
};

// pmix_credential_cbfunc_t: {credential: Buffer, info?: Info[]}.
class CredentialReply : public Upcall {
 public:
  CredentialReply(const char* name, Args args, pmix_credential_cbfunc_t cb, void* cbdata)
      : Upcall(name, std::move(args)), cb_(cb), cbdata_(cbdata) {}
  void Reply(Napi::Env env, pmix_status_t status, const Napi::Value& result) override;
  void Fail(pmix_status_t status) override;

 private:
  pmix_credential_cbfunc_t cb_;
  void* cbdata_;
};

// pmix_validation_cbfunc_t: an info array, copied by libpmix during the call.
class ValidationReply : public Upcall {
 public:
  ValidationReply(const char* name, Args args, pmix_validation_cbfunc_t cb, void* cbdata)
      : Upcall(name, std::move(args)), cb_(cb), cbdata_(cbdata) {}
  void Reply(Napi::Env env, pmix_status_t status, const Napi::Value& result) override;
  void Fail(pmix_status_t status) override;

 private:
  pmix_validation_cbfunc_t cb_;
  void* cbdata_;
};

}  // namespace dpmix
