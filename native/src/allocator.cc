// What the C allocator holds in the sidecar process: libpmix, the addon, Node's own C++ and the
// ArrayBuffers of JavaScript, all of it outside V8's heap.
//
// RSS cannot tell a leak from an allocator that keeps what was freed. glibc keeps freed chunks
// in one arena per thread that allocated them (libpmix's progress thread, libuv's pool, the main
// thread), and it returns a chunk to the kernel only from the top of an arena or when it was
// mmapped. A burst (a restarted cluster's new epoch, a REST flood) leaves the sidecar's RSS
// higher for good although every byte of it was freed. mallinfo2 counts the bytes in use across
// every arena, which is what a leak grows; malloc_trim(0) gives the free pages of every arena
// back.
#include "allocator.h"

#include <malloc.h>

namespace dpmix {

namespace {

Napi::Value AllocatorStats(const Napi::CallbackInfo &info) {
  const struct mallinfo2 m = mallinfo2();
  Napi::Object out = Napi::Object::New(info.Env());
  // Bytes handed out and not freed: small chunks from the arenas, large ones mmapped on their own.
  out.Set("inUseBytes", Napi::Number::New(info.Env(), static_cast<double>(m.uordblks + m.hblkhd)));
  // Bytes freed but kept by the arenas.
  out.Set("freeBytes", Napi::Number::New(info.Env(), static_cast<double>(m.fordblks)));
  // Everything the arenas took from the kernel (in use and free), besides the mmapped chunks.
  out.Set("arenaBytes", Napi::Number::New(info.Env(), static_cast<double>(m.arena)));
  out.Set("mmappedBytes", Napi::Number::New(info.Env(), static_cast<double>(m.hblkhd)));
  return out;
}

Napi::Value AllocatorTrim(const Napi::CallbackInfo &info) {
  return Napi::Boolean::New(info.Env(), malloc_trim(0) != 0);
}

}  // namespace

void InitAllocator(Napi::Env env, Napi::Object exports) {
  exports.Set("allocatorStats", Napi::Function::New(env, AllocatorStats, "allocatorStats"));
  exports.Set("allocatorTrim", Napi::Function::New(env, AllocatorTrim, "allocatorTrim"));
}

}  // namespace dpmix
