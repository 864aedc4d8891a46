// The one path from libpmix's progress thread to the JavaScript thread.
//
// Upcalls and completions are posted as Tasks through a thread-safe function with a non-blocking
// call, so the progress thread never waits on JavaScript. A Task that can no longer be delivered
// (the bridge is closing) is abandoned, which lets it answer libpmix without JavaScript.
#pragma once

#include <napi.h>

namespace dpmix {

class Task {
 public:
  virtual ~Task() = default;
  // Runs on the JavaScript thread.
  virtual void Run(Napi::Env env) = 0;
  // Runs instead of Run when the task cannot reach JavaScript any more (any thread).
  virtual void Abandon() {}
};

namespace bridge {

// Opens the bridge; it keeps the Node.js event loop alive until Close.
void Open(Napi::Env env);
// Closes the bridge; tasks posted afterwards are abandoned.
void Close();
bool IsOpen();
// Hands `task` to the JavaScript thread, which then owns it. Returns false when the bridge is
// closed; the caller keeps the task.
bool Post(Task *task);

}  // namespace bridge
}  // namespace dpmix
