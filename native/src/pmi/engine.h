// The native PMI engine: one thread with an epoll loop that serves bound PMI connections of
// MPICH / Intel MPI jobs. JavaScript accepts a connection, checks its credential and binds it to
// a member (policy), then hands the socket over (Adopt); from then on the engine reads and
// answers the commands of MPI_Init's hot path itself (session.cc) against the job's native state
// (job.h), and passes every other frame to JavaScript whole, which answers it through Reply.
//
// Threads: JavaScript calls the public methods; they queue work for the engine's thread and
// wake it. The engine's thread owns every connection and job, and talks back through one
// thread-safe function that delivers events in batches (a frame to answer, a closed connection,
// a finished fence, a trace line).
#pragma once

#include <napi.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "pmi/codec.h"
#include "pmi/job.h"

namespace dpmix::pmi {

enum class Phase { kBound, kFinalized, kAborted };

// What the engine tells JavaScript.
struct Event {
  enum Kind { kFrame, kClosed, kFence, kTrace } kind = kFrame;
  uint64_t conn = 0;
  uint64_t job = 0;
  // kFrame: which frame, to quote in Reply.
  uint64_t seq = 0;
  Frame::Kind frame = Frame::kLine;
  int wire = 0;
  bool fatal = false;
  // kFrame: the frame's text; kTrace: the line; kClosed: why.
  std::string text;
  // kFrame, kClosed: the connection's state when the frame was read.
  Phase phase = Phase::kBound;
  bool escapes = false;
  bool fullinitDue = false;
  // kFence
  double seconds = 0;
  const char *outcome = "";
  // kTrace: in | out | close
  const char *dir = "";
};

// Events cross to JavaScript through here. The engine and the thread-safe function share it:
// Node may finalize the function first (at exit), after which the engine calls it no more.
struct Outbox {
  std::mutex mutex;
  std::vector<Event> events;
  bool scheduled = false;
  bool finalized = false;
};
using OutboxRef = std::shared_ptr<Outbox>;

// Wire bytes to and from JavaScript strings, one character per byte, as src/pmi holds them.
Napi::String Latin1(Napi::Env env, std::string_view s);
std::string FromLatin1(Napi::Value v);

// Runs on the JavaScript thread: hands the batched events to the engine's callback.
void DeliverEvents(Napi::Env env, Napi::Function callback, OutboxRef *outbox, void *unused);

struct ConnState {
  bool escapes = false;
  // Bound by the starter's initack: the PMI-2 client's own fullinit is still to come.
  bool fullinitDue = false;
  // Where the JavaScript framer left the stream: skipping the rest of a line, or bytes.
  bool skipLine = false;
  size_t skipBytes = 0;
};

class Engine {
 public:
  using Tsfn = Napi::TypedThreadSafeFunction<OutboxRef, void, DeliverEvents>;

  Engine(Napi::Env env, Napi::Function onEvents, bool trace);
  ~Engine();

  // ---- called from JavaScript ----
  uint64_t CreateJob(JobSpec spec);
  void RankGone(uint64_t job, int rank, std::string message);
  void CloseJob(uint64_t job, std::string message);
  void ReleaseJob(uint64_t job, std::string message);
  // Takes over `fd` (a duplicate is made; the caller closes its own) as connection `id`, bound to
  // `rank` of `job`, and reads `leftover` (bytes already received) first.
  void Adopt(int fd, uint64_t id, uint64_t job, int rank, ConnState state, std::string leftover);
  // JavaScript's answer to frame `seq` of `conn` (nullopt: no reply); `close` hangs up after it.
  void Reply(uint64_t conn, uint64_t seq, std::optional<std::string> text, bool close);
  // Hangs up on `conn` (it is reported closed).
  void CloseConn(uint64_t conn);
  // Ends the thread; connections still open are closed without being reported.
  void Stop(bool release = true);
  // Whether the engine keeps Node's event loop alive (while it holds connections, as sockets do).
  void Ref(Napi::Env env, bool ref);

  // ---- the engine's thread: used by session.cc ----
  struct Conn;
  void Send(Conn &c, std::string text);
  void Forward(Conn &c, const Frame &f);
  // A fence instance ended: answer its waiters.
  void Answer(FenceEnd &end, uint64_t job);
  void AnswerNode(const Waiter &w, const std::string *value, const std::string *error);
  double Now() const;

  struct Conn {
    uint64_t id = 0;
    int fd = -1;
    uint64_t jobId = 0;
    std::shared_ptr<Job> job;
    int rank = 0;
    Framer framer;
    std::string out;
    size_t outOff = 0;
    Phase phase = Phase::kBound;
    ConnState state;
    // A PMI-1 command is waiting (a barrier, or JavaScript's answer to frame pmi1Seq; 0: barrier):
    // later PMI-1 frames wait in `queue`.
    bool pmi1Blocked = false;
    uint64_t pmi1Seq = 0;
    struct Queued {
      Frame::Kind kind;
      int wire;
      bool fatal;
      std::string text;
    };
    std::deque<Queued> queue;
    // Frames with JavaScript or queued.
    int inFlight = 0;
    // Nothing more is read (a fatal framing error, or a hang-up coming).
    bool closing = false;
    // Close once the output is written.
    bool hangup = false;
    uint32_t armed = 0;
  };

 private:
  void Post(std::function<void()> work);
  void Emit(Event ev, bool urgent);
  void Loop();
  void RunCommands();
  void OnReadable(Conn &c);
  void Pump(Conn &c);
  void Handle(Conn &c, const Frame &f);
  void Dispatch(Conn &c, const Frame &f);
  void Unblock(Conn &c);
  void Flush(Conn &c);
  void Rearm(Conn &c);
  void Kill(Conn &c, const char *why, bool report);
  Conn *Find(uint64_t id);
  void Trace(const Conn &c, const char *dir, std::string text);
  void Expire();

  OutboxRef outbox_;
  Tsfn tsfn_;
  bool trace_;
  int epoll_ = -1;
  int wake_ = -1;
  std::thread thread_;
  std::atomic<bool> stopped_{false};

  std::mutex mutex_;  // guards work_
  std::vector<std::function<void()>> work_;
  std::atomic<uint64_t> nextJob_{1};

  // The engine's thread only.
  bool running_ = true;
  uint64_t nextSeq_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::unordered_map<uint64_t, std::shared_ptr<Job>> jobs_;
  bool deadlines_ = false;
};

// The commands the engine answers itself (session.cc). False: the frame goes to JavaScript.
bool ServePmi1(Engine &e, Engine::Conn &c, const Command &cmd, const Frame &f);
bool ServePmi2(Engine &e, Engine::Conn &c, const Command &cmd, const Frame &f);

void InitPmiEngine(Napi::Env env, Napi::Object exports);

}  // namespace dpmix::pmi
