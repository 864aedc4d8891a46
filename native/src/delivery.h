// Delivery of upcalls to the one JavaScript handler: handler(name, args, done).
//
// `done(status, result)` answers libpmix exactly once; if JavaScript drops it unanswered, the
// garbage collector's finalizer answers PMIX_ERROR so no client waits forever. After
// PMIx_server_finalize nothing calls back into libpmix any more.
#pragma once

#include <napi.h>
#include <pmix_server.h>

#include <string>
#include <vector>

#include "upcall.h"

namespace dpmix {
namespace delivery {

void SetHandler(Napi::Function handler, std::vector<std::string> immediate);
void ResetHandler();
void MarkFinalized();
// False once libpmix is finalized: callbacks into it are no longer allowed.
bool CanCallBack();
// Whether `name` ("upcall" or "upcall.op") is answered at once and only told to JavaScript.
bool IsImmediate(const char *name);

// Hands the upcall to JavaScript; the result is what the module function returns to libpmix.
// On failure the upcall is dropped without calling back (libpmix learns from the result).
pmix_status_t Post(Upcall *upcall);

}  // namespace delivery
}  // namespace dpmix
