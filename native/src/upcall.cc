#include "upcall.h"

#include <cstdlib>
#include <cstring>

#include "delivery.h"
#include "values.h"

namespace dpmix {

namespace {

void FreeRelease(void *p) { free(p); }

struct InfoRelease {
  pmix_info_t *info;
  size_t n;
};

void ReleaseInfo(void *p) {
  auto *r = static_cast<InfoRelease *>(p);
  if (r->info) PMIx_Info_free(r->info, r->n);
  delete r;
}

}  // namespace

template <>
void OpReply::Reply(Napi::Env, pmix_status_t status, const Napi::Value &) {
  Fail(status);
}

template <>
void OpReply::Fail(pmix_status_t status) {
  if (cb_ && delivery::CanCallBack()) cb_(status, cbdata_);
}

template <>
void ModexReply::Reply(Napi::Env, pmix_status_t status, const Napi::Value &result) {
  Bytes b = Bytes::FromJs(result);
  if (!cb_ || !delivery::CanCallBack()) return free(b.data);
  cb_(status, b.data, b.size, cbdata_, FreeRelease, b.data);  // libpmix frees it through FreeRelease
}

template <>
void ModexReply::Fail(pmix_status_t status) {
  if (cb_ && delivery::CanCallBack()) cb_(status, nullptr, 0, cbdata_, nullptr, nullptr);
}

template <>
void InfoReply::Reply(Napi::Env, pmix_status_t status, const Napi::Value &result) {
  Info info = Info::FromJs(result);
  if (!cb_ || !delivery::CanCallBack()) return;
  size_t n = info.size();
  auto *rel = new InfoRelease{info.Release(), n};
  cb_(status, rel->info, n, cbdata_, ReleaseInfo, rel);  // libpmix frees it through ReleaseInfo
}

template <>
void InfoReply::Fail(pmix_status_t status) {
  if (cb_ && delivery::CanCallBack()) cb_(status, nullptr, 0, cbdata_, nullptr, nullptr);
}

template <>
void LookupReply::Reply(Napi::Env env, pmix_status_t status, const Napi::Value &result) {
  size_t n = 0;
  pmix_pdata_t *pdata = nullptr;
  if (result.IsArray()) {
    Napi::Array a = result.As<Napi::Array>();
    n = a.Length();
    pdata = n ? PMIx_Pdata_create(n) : nullptr;
    try {
      for (uint32_t i = 0; i < n; ++i) {
        Napi::Value item = a.Get(i);
        if (!item.IsObject()) throw Napi::TypeError::New(env, "lookup result items are {proc, key, value}");
        Napi::Object o = item.As<Napi::Object>();
        pdata[i].proc = ProcFromJs(o.Get("proc"));
        std::string key = o.Get("key").ToString().Utf8Value();
        if (key.size() > PMIX_MAX_KEYLEN) throw Napi::TypeError::New(env, "lookup key too long");
        std::strncpy(pdata[i].key, key.c_str(), PMIX_MAX_KEYLEN);
        ValueFromJs(o.Get("value"), &pdata[i].value);
      }
    } catch (...) {
      if (pdata) PMIx_Pdata_free(pdata, n);
      throw;
    }
  } else if (!result.IsUndefined() && !result.IsNull()) {
    throw Napi::TypeError::New(env, "lookup result must be an array");
  }
  // libpmix packs the data before returning, so it is freed right after.
  if (cb_ && delivery::CanCallBack()) cb_(status, pdata, n, cbdata_);
  if (pdata) PMIx_Pdata_free(pdata, n);
}

template <>
void LookupReply::Fail(pmix_status_t status) {
  if (cb_ && delivery::CanCallBack()) cb_(status, nullptr, 0, cbdata_);
}

template <>
void SpawnReply::Reply(Napi::Env env, pmix_status_t status, const Napi::Value &result) {
  pmix_nspace_t ns;
  std::memset(ns, 0, sizeof ns);
  if (result.IsString()) {
    std::string s = result.As<Napi::String>().Utf8Value();
    if (s.size() > PMIX_MAX_NSLEN) throw Napi::TypeError::New(env, "spawned nspace too long");
    std::memcpy(ns, s.data(), s.size());
  }
  if (cb_ && delivery::CanCallBack()) cb_(status, ns, cbdata_);
}

template <>
void SpawnReply::Fail(pmix_status_t status) {
  pmix_nspace_t ns;
  std::memset(ns, 0, sizeof ns);
  if (cb_ && delivery::CanCallBack()) cb_(status, ns, cbdata_);
}

template <>
void ToolReply::Reply(Napi::Env, pmix_status_t status, const Napi::Value &result) {
  pmix_proc_t proc;
  PMIx_Proc_construct(&proc);
  if (result.IsObject()) proc = ProcFromJs(result);
  if (cb_ && delivery::CanCallBack()) cb_(status, &proc, cbdata_);
}

template <>
void ToolReply::Fail(pmix_status_t status) {
  // libpmix 5.0.11 reads the proc even when the status is an error.
  pmix_proc_t proc;
  PMIx_Proc_construct(&proc);
  if (cb_ && delivery::CanCallBack()) cb_(status, &proc, cbdata_);
}

template <>
void CredentialReply::Reply(Napi::Env env, pmix_status_t status, const Napi::Value &result) {
  if (!result.IsObject()) throw Napi::TypeError::New(env, "credential result is {credential, info}");
  Napi::Object o = result.As<Napi::Object>();
  Bytes b = Bytes::FromJs(o.Get("credential"));
  Info info;
  try {
    info = Info::FromJs(o.Get("info"));
  } catch (...) {
    free(b.data);
    throw;
  }
  pmix_byte_object_t bo{b.data, b.size};
  if (cb_ && delivery::CanCallBack()) cb_(status, &bo, info.data(), info.size(), cbdata_);
  free(b.data);
}

template <>
void CredentialReply::Fail(pmix_status_t status) {
  if (cb_ && delivery::CanCallBack()) cb_(status, nullptr, nullptr, 0, cbdata_);
}

template <>
void ValidationReply::Reply(Napi::Env, pmix_status_t status, const Napi::Value &result) {
  Info info = Info::FromJs(result);
  if (cb_ && delivery::CanCallBack()) cb_(status, info.data(), info.size(), cbdata_);
}

template <>
void ValidationReply::Fail(pmix_status_t status) {
  if (cb_ && delivery::CanCallBack()) cb_(status, nullptr, 0, cbdata_);
}

}  // namespace dpmix
