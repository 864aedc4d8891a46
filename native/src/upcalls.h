// The server module: every upcall of pmix_server_module_t, delivered to one JavaScript handler.
//
// On libpmix's progress thread an upcall copies its arguments, posts itself to the JavaScript
// thread and returns at once. There the handler is called as handler(name, args, done); `done`
// (status, result) calls libpmix's callback exactly once, with buffers that stay alive until
// libpmix's release function runs. Upcalls the handler does not take are left out of the module,
// so libpmix itself answers PMIX_ERR_NOT_SUPPORTED for them.
#pragma once

#include <napi.h>
#include <pmix_server.h>

#include <string>
#include <vector>

namespace dpmix {
namespace upcalls {

// The JavaScript names of all upcalls, in pmix_server_module_t order.
const std::vector<std::string> &Names();

// Fills `module` with the upcalls named in `handled` and remembers `handler`. Upcalls named in
// `immediate` (supported: "group.destruct") reach the handler as notifications while libpmix is
// answered PMIX_OPERATION_SUCCEEDED at once. Throws a TypeError naming an unknown upcall.
void Install(Napi::Env env, Napi::Function handler, const std::vector<std::string> &handled,
             const std::vector<std::string> &immediate, pmix_server_module_t *module);
// Registers the "localEvent" handler, if JavaScript takes it, for the events libpmix raises
// inside the server when a client is lost. Call once PMIx_server_init has succeeded.
pmix_status_t RegisterLocalEvents();
// Forgets the handler; upcalls still in flight are answered with an error, or not at all once
// libpmix is finalized.
void Uninstall();
// Set once PMIx_server_finalize has run: callbacks into libpmix are no longer allowed.
void MarkFinalized();

}  // namespace upcalls
}  // namespace dpmix
