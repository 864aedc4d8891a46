#include "pmi/engine.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>

namespace dpmix::pmi {

namespace {

// A client that keeps sending without reading its replies stops being read from: at most this
// many frames wait on JavaScript or their turn (connection.ts), and this much output.
constexpr int kMaxInFlight = 64;
constexpr int kResumeBelow = 8;
constexpr size_t kMaxOut = 4 * 1024 * 1024;
constexpr size_t kReadChunk = 64 * 1024;
// Lazy events (a finished fence) wait for the next urgent one, up to this many.
constexpr size_t kMaxLazy = 4096;

bool Pmi1Ordered(const Frame &f) {
  return f.kind == Frame::kLine || f.kind == Frame::kBlock || (f.kind == Frame::kError && f.wire != 2);
}

const char *PhaseName(Phase p) {
  switch (p) {
    case Phase::kBound:
      return "bound";
    case Phase::kFinalized:
      return "finalized";
    case Phase::kAborted:
      return "aborted";
  }
  return "bound";
}

const char *FrameKindName(Frame::Kind k) {
  switch (k) {
    case Frame::kLine:
      return "line";
    case Frame::kBlock:
      return "block";
    case Frame::kPmi2:
      return "pmi2";
    case Frame::kError:
      return "error";
  }
  return "line";
}

}  // namespace

void DeliverBatch(Napi::Env env, Napi::Function callback, const std::vector<Event> &events);

Napi::String Latin1(Napi::Env env, std::string_view s) {
  napi_value v;
  NAPI_THROW_IF_FAILED(env, napi_create_string_latin1(env, s.data(), s.size(), &v), Napi::String());
  return Napi::String(env, v);
}

std::string FromLatin1(Napi::Value v) {
  Napi::Env env = v.Env();
  size_t len = 0;
  NAPI_THROW_IF_FAILED(env, napi_get_value_string_latin1(env, v, nullptr, 0, &len), std::string());
  std::string s(len, '\0');
  NAPI_THROW_IF_FAILED(env, napi_get_value_string_latin1(env, v, s.data(), len + 1, &len), std::string());
  s.resize(len);
  return s;
}

void DeliverEvents(Napi::Env env, Napi::Function callback, OutboxRef *ref, void *) {
  if (env == nullptr || ref == nullptr) return;
  Outbox *outbox = ref->get();
  std::vector<Event> events;
  {
    std::lock_guard<std::mutex> lock(outbox->mutex);
    events.swap(outbox->events);
    outbox->scheduled = false;
  }
  if (events.empty()) return;
  // Nothing may escape into the thread-safe function's caller: a throw there ends the process.
  try {
    DeliverBatch(env, callback, events);
  } catch (const Napi::Error &e) {
    // The callback threw: it becomes the process's uncaught exception, as any callback's would
    // (unless the environment is going away, when there is no one left to tell).
    bool pending = false;
    if (!e.IsEmpty() && napi_is_exception_pending(env, &pending) == napi_ok && !pending) napi_throw(env, e.Value());
  }
}

void DeliverBatch(Napi::Env env, Napi::Function callback, const std::vector<Event> &events) {
  Napi::HandleScope scope(env);
  Napi::Array out = Napi::Array::New(env, events.size());
  uint32_t i = 0;
  for (const Event &ev : events) {
    Napi::Object o = Napi::Object::New(env);
    switch (ev.kind) {
      case Event::kFrame:
        o.Set("type", "frame");
        o.Set("conn", static_cast<double>(ev.conn));
        o.Set("seq", static_cast<double>(ev.seq));
        o.Set("kind", FrameKindName(ev.frame));
        o.Set("text", Latin1(env, ev.text));
        o.Set("wire", ev.wire);
        o.Set("fatal", ev.fatal);
        o.Set("phase", PhaseName(ev.phase));
        o.Set("escapes", ev.escapes);
        o.Set("fullinitDue", ev.fullinitDue);
        break;
      case Event::kClosed:
        o.Set("type", "closed");
        o.Set("conn", static_cast<double>(ev.conn));
        o.Set("phase", PhaseName(ev.phase));
        o.Set("reason", Latin1(env, ev.text));
        break;
      case Event::kFence:
        o.Set("type", "fence");
        o.Set("job", static_cast<double>(ev.job));
        o.Set("seconds", ev.seconds);
        o.Set("outcome", ev.outcome);
        break;
      case Event::kTrace:
        o.Set("type", "trace");
        o.Set("conn", static_cast<double>(ev.conn));
        o.Set("dir", ev.dir);
        o.Set("text", Latin1(env, ev.text));
        break;
    }
    out.Set(i++, o);
  }
  callback.Call({out});
}

Engine::Engine(Napi::Env env, Napi::Function onEvents, bool trace)
    : outbox_(std::make_shared<Outbox>()), trace_(trace) {
  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  wake_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_ < 0 || wake_ < 0) {
    throw Napi::Error::New(env, std::string("PMI engine: ") + strerror(errno));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;
  epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &ev);
  tsfn_ = Tsfn::New(env, onEvents, "dask-pmix-pmi-engine", 0, 1, new OutboxRef(outbox_),
                    [](Napi::Env, void *, OutboxRef *o) {
                      {
                        std::lock_guard<std::mutex> lock((*o)->mutex);
                        (*o)->finalized = true;
                      }
                      delete o;
                    });
  // Idle, the engine does not keep the process alive; with connections it does (Ref).
  tsfn_.Unref(env);
  thread_ = std::thread([this] { Loop(); });
}

// Without stop() (the process is exiting): the thread ends, the thread-safe function is left to
// Node's teardown.
Engine::~Engine() { Stop(false); }

void Engine::Stop(bool release) {
  if (stopped_.exchange(true)) return;
  Post([this] { running_ = false; });
  if (thread_.joinable()) thread_.join();
  for (auto &[id, c] : conns_) close(c->fd);
  conns_.clear();
  jobs_.clear();
  close(epoll_);
  close(wake_);
  bool finalized;
  {
    std::lock_guard<std::mutex> lock(outbox_->mutex);
    finalized = outbox_->finalized;
  }
  if (release && !finalized) tsfn_.Release();
}

void Engine::Ref(Napi::Env env, bool ref) {
  if (stopped_) return;
  if (ref)
    tsfn_.Ref(env);
  else
    tsfn_.Unref(env);
}

void Engine::Post(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    work_.push_back(std::move(work));
  }
  uint64_t one = 1;
  ssize_t w = write(wake_, &one, sizeof one);
  (void)w;
}

double Engine::Now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---- called from JavaScript -------------------------------------------------------------------

uint64_t Engine::CreateJob(JobSpec spec) {
  uint64_t id = nextJob_++;
  auto job = std::make_shared<Job>(std::move(spec));
  Post([this, id, job] {
    jobs_[id] = job;
    if (job->spec().timeoutMs > 0) deadlines_ = true;
  });
  return id;
}

void Engine::RankGone(uint64_t job, int rank, std::string message) {
  Post([this, job, rank, message = std::move(message)] {
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return;
    for (FenceEnd &end : it->second->RankGone(rank, message, Now())) Answer(end, job);
  });
}

void Engine::CloseJob(uint64_t job, std::string message) {
  Post([this, job, message = std::move(message)] {
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return;
    std::vector<Waiter> nodeWaiters;
    for (FenceEnd &end : it->second->Close(message, Now(), &nodeWaiters)) Answer(end, job);
    for (const Waiter &w : nodeWaiters) AnswerNode(w, nullptr, &message);
  });
}

void Engine::ReleaseJob(uint64_t job, std::string message) {
  Post([this, job, message = std::move(message)] {
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return;
    it->second->Release(message);
    // Connections still open keep the job until they close.
    jobs_.erase(it);
  });
}

void Engine::Adopt(int fd, uint64_t id, uint64_t job, int rank, ConnState state, std::string leftover) {
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) throw std::runtime_error(std::string("PMI engine: cannot take the connection: ") + strerror(errno));
  fcntl(own, F_SETFL, fcntl(own, F_GETFL) | O_NONBLOCK);
  Post([this, own, id, job, rank, state, leftover = std::move(leftover)] {
    auto c = std::make_unique<Conn>();
    c->id = id;
    c->fd = own;
    c->jobId = job;
    auto it = jobs_.find(job);
    if (it != jobs_.end()) c->job = it->second;
    c->rank = rank;
    c->state = state;
    if (!c->job) {
      // Released in between: nothing to serve; JavaScript answers what it can.
      JobSpec none;
      none.jobId = "(released)";
      none.size = rank + 1;
      c->job = std::make_shared<Job>(std::move(none));
      c->job->Release("the job has ended and been released");
    }
    Conn &ref = *c;
    conns_[id] = std::move(c);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    epoll_ctl(epoll_, EPOLL_CTL_ADD, own, &ev);
    ref.armed = EPOLLIN;
    ref.framer.Skip(state.skipLine, state.skipBytes);
    if (!leftover.empty()) {
      ref.framer.Append(leftover.data(), leftover.size());
      Pump(ref);
    }
  });
}

void Engine::Reply(uint64_t conn, uint64_t seq, std::optional<std::string> text, bool close) {
  Post([this, conn, seq, text = std::move(text), close]() mutable {
    Conn *c = Find(conn);
    if (!c) return;
    c->inFlight--;
    if (text) Send(*c, std::move(*text));
    if (close) {
      c->closing = true;
      c->hangup = true;
      Flush(*c);
      return;
    }
    if (c->pmi1Blocked && c->pmi1Seq == seq) Unblock(*c);
    Flush(*c);
  });
}

void Engine::CloseConn(uint64_t conn) {
  Post([this, conn] {
    if (Conn *c = Find(conn)) Kill(*c, "closed by the server", true);
  });
}

// ---- the engine's thread ----------------------------------------------------------------------

Engine::Conn *Engine::Find(uint64_t id) {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second.get();
}

void Engine::Emit(Event ev, bool urgent) {
  // Under the lock, so that the thread-safe function is not finalized during the call.
  std::lock_guard<std::mutex> lock(outbox_->mutex);
  if (outbox_->finalized) return;
  outbox_->events.push_back(std::move(ev));
  if (!outbox_->scheduled && (urgent || outbox_->events.size() >= kMaxLazy)) {
    outbox_->scheduled = tsfn_.NonBlockingCall() == napi_ok;
  }
}

void Engine::Trace(const Conn &c, const char *dir, std::string text) {
  Event ev;
  ev.kind = Event::kTrace;
  ev.conn = c.id;
  ev.dir = dir;
  ev.text = std::move(text);
  Emit(std::move(ev), true);
}

void Engine::Loop() {
  std::vector<epoll_event> events(256);
  while (running_) {
    int timeout = -1;
    if (deadlines_) {
      double next = 0;
      for (const auto &[id, job] : jobs_) {
        double d = job->NextDeadline();
        if (d > 0 && (next == 0 || d < next)) next = d;
      }
      if (next > 0) timeout = std::max(0, static_cast<int>(std::ceil((next - Now()) * 1000)));
    }
    int n = epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), timeout);
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < n; i++) {
      uint64_t id = events[i].data.u64;
      if (id == 0) {
        uint64_t v;
        ssize_t r = read(wake_, &v, sizeof v);
        (void)r;
        RunCommands();
        continue;
      }
      Conn *c = Find(id);
      if (!c) continue;
      uint32_t got = events[i].events;
      if (got & EPOLLOUT) Flush(*c);
      if ((c = Find(id)) && (got & (EPOLLIN | EPOLLHUP | EPOLLERR))) OnReadable(*c);
    }
    if (deadlines_) Expire();
  }
}

void Engine::RunCommands() {
  std::vector<std::function<void()>> work;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    work.swap(work_);
  }
  for (auto &w : work) w();
}

void Engine::Expire() {
  double now = Now();
  for (auto &[id, job] : jobs_) {
    for (FenceEnd &end : job->Expire(now)) Answer(end, id);
  }
}

void Engine::OnReadable(Conn &c) {
  char buf[kReadChunk];
  ssize_t n = recv(c.fd, buf, sizeof buf, 0);
  if (n == 0) {
    Kill(c, "end of stream", true);
    return;
  }
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
    Kill(c, strerror(errno), true);
    return;
  }
  c.framer.Append(buf, static_cast<size_t>(n));
  Pump(c);
}

void Engine::Pump(Conn &c) {
  const uint64_t id = c.id;
  Frame f;
  while (!c.closing && c.framer.Next(f)) {
    Handle(c, f);
    if (!Find(id)) return;
  }
  Flush(c);
}

void Engine::Handle(Conn &c, const Frame &f) {
  if (trace_) {
    std::string text;
    if (f.kind == Frame::kError) {
      text = "<framing error: " + std::string(f.text) + ">";
    } else if (f.kind == Frame::kBlock) {
      for (char ch : f.text) text += ch == '\n' ? std::string("\\n") : std::string(1, ch);
    } else {
      text = std::string(f.text);
    }
    Trace(c, "in", std::move(text));
  }
  if (Pmi1Ordered(f) && c.pmi1Blocked) {
    c.queue.push_back({f.kind, f.wire, f.fatal, std::string(f.text)});
    c.inFlight++;
    return;
  }
  Dispatch(c, f);
}

void Engine::Dispatch(Conn &c, const Frame &f) {
  Command cmd;
  switch (f.kind) {
    case Frame::kLine:
      if (c.phase == Phase::kBound && ParsePmi1(f.text, cmd) && ServePmi1(*this, c, cmd, f)) return;
      break;
    case Frame::kPmi2:
      if (c.phase == Phase::kBound && ParsePmi2(f.text, cmd) && ServePmi2(*this, c, cmd, f)) return;
      break;
    case Frame::kBlock:
    case Frame::kError:
      break;
  }
  Forward(c, f);
}

void Engine::Forward(Conn &c, const Frame &f) {
  Event ev;
  ev.kind = Event::kFrame;
  ev.conn = c.id;
  ev.seq = nextSeq_++;
  ev.frame = f.kind;
  ev.wire = f.wire;
  ev.fatal = f.fatal;
  ev.text = std::string(f.text);
  ev.phase = c.phase;
  ev.escapes = c.state.escapes;
  ev.fullinitDue = c.state.fullinitDue;
  if (Pmi1Ordered(f)) {
    c.pmi1Blocked = true;
    c.pmi1Seq = ev.seq;
  }
  c.inFlight++;
  // After a fatal framing error nothing more is read; JavaScript answers and hangs up.
  if (f.fatal) c.closing = true;
  Emit(std::move(ev), true);
}

void Engine::Unblock(Conn &c) {
  const uint64_t id = c.id;
  c.pmi1Blocked = false;
  while (!c.pmi1Blocked && !c.queue.empty() && !c.closing) {
    Conn::Queued q = std::move(c.queue.front());
    c.queue.pop_front();
    c.inFlight--;
    Frame f{q.kind, q.text, q.wire, q.fatal};
    Dispatch(c, f);
    if (!Find(id)) return;
  }
}

void Engine::Send(Conn &c, std::string text) {
  if (trace_) Trace(c, "out", text);
  if (c.out.empty()) {
    c.out = std::move(text);
    c.outOff = 0;
  } else {
    c.out += text;
  }
}

void Engine::Flush(Conn &c) {
  while (c.outOff < c.out.size()) {
    ssize_t n = send(c.fd, c.out.data() + c.outOff, c.out.size() - c.outOff, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      Kill(c, strerror(errno), true);
      return;
    }
    c.outOff += static_cast<size_t>(n);
  }
  if (c.outOff == c.out.size()) {
    c.out.clear();
    c.outOff = 0;
    if (c.hangup) {
      Kill(c, "closed by the server", true);
      return;
    }
  }
  Rearm(c);
}

void Engine::Rearm(Conn &c) {
  uint32_t want = 0;
  const size_t unsent = c.out.size() - c.outOff;
  const bool backlog = c.inFlight >= kMaxInFlight || unsent > kMaxOut;
  // Reading resumes once the backlog is small again (connection.ts: RESUME_BELOW).
  const bool calm = c.inFlight < kResumeBelow && unsent <= kMaxOut / 2;
  const bool reading = (c.armed & EPOLLIN) != 0;
  if (!c.closing && (reading ? !backlog : calm)) want |= EPOLLIN;
  if (c.outOff < c.out.size()) want |= EPOLLOUT;
  if (want == c.armed) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = c.id;
  epoll_ctl(epoll_, EPOLL_CTL_MOD, c.fd, &ev);
  c.armed = want;
}

void Engine::Kill(Conn &c, const char *why, bool report) {
  const uint64_t id = c.id;
  close(c.fd);
  Event ev;
  ev.kind = Event::kClosed;
  ev.conn = id;
  ev.phase = c.phase;
  ev.text = why;
  if (trace_) Trace(c, "close", PhaseName(c.phase));
  conns_.erase(id);
  if (report) Emit(std::move(ev), true);
}

void Engine::Answer(FenceEnd &end, uint64_t job) {
  for (const Waiter &w : end.waiters) {
    Conn *c = Find(w.conn);
    if (!c) continue;
    const std::string_view thrid(w.thrid);
    if (w.pmi2) {
      Send(
          *c,
          end.error
              ? Pmi2Error("kvs-fence-response", *end.error, w.hasThrid ? &thrid : nullptr)
              : Pmi2Reply("kvs-fence-response", w.hasThrid ? &thrid : nullptr, c->state.escapes).Str("rc", "0").Done());
    } else {
      static const std::string ok = Pmi1Reply("barrier_out").Str("rc", "0").Done();
      Send(*c, end.error ? Pmi1Error("barrier_out", *end.error, true) : ok);
      Unblock(*c);
    }
    if ((c = Find(w.conn))) Flush(*c);
  }
  Event ev;
  ev.kind = Event::kFence;
  ev.job = job;
  ev.seconds = end.seconds;
  ev.outcome = end.outcome;
  Emit(std::move(ev), false);
}

void Engine::AnswerNode(const Waiter &w, const std::string *value, const std::string *error) {
  Conn *c = Find(w.conn);
  if (!c) return;
  const std::string_view thrid(w.thrid);
  const std::string_view *t = w.hasThrid ? &thrid : nullptr;
  if (error)
    Send(*c, Pmi2Error("info-getnodeattr-response", *error, t));
  else
    Send(*c, Pmi2Reply("info-getnodeattr-response", t, c->state.escapes)
                 .Str("rc", "0")
                 .Bool("found", true)
                 .Str("value", *value)
                 .Done());
  Flush(*c);
}

}  // namespace dpmix::pmi
