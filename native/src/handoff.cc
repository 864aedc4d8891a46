// libpmix's listener, and the hand-off of admitted connections to it: the native side of the gate
// (src/pmix/gate.ts). It moves file descriptors and decides nothing.
//
// libpmix 5.0.x always listens on TCP (src/mca/ptl/base/ptl_base_listener.c, setup_listener),
// where any local user can reach it and, with one handshake, wedge it. It accepts on whatever
// file descriptor its listening event carries (connection_event_handler: accept(incoming_sd)),
// reads the handshake with plain blocking recv, and validates a "native" credential from the
// handshake itself for its TCP protocol (psec_native.c, validate_cred: PMIX_PROTOCOL_V2), not from
// the socket. So:
//
// - secureListener(port, path): on libpmix's progress thread, the TCP listener's descriptor is
//   replaced (dup3) by a UNIX listening socket at `path`, in a directory only this uid can enter,
//   and re-registered in libevent's epoll set as it was (events and data read from
//   /proc/self/fdinfo). The TCP port is closed; libpmix accepts only what this process hands it.
// - handOff(fd, handshake, tag): takes a duplicate of an admitted peer's socket. A thread of its
//   own connects to the UNIX listener (from an abstract address, by which it later tells the
//   descriptor libpmix accepted) and writes the handshake; when libpmix's answer arrives, libpmix
//   has accepted, validated and registered the connection in one callback on its progress thread
//   (ptl_base_connection_hdlr.c: _cnct_complete for a client, process_cbfunc for a tool, each
//   ending with the connection's events added). Then, on that thread again, the descriptor libpmix
//   accepted is replaced by the peer's own socket, what libpmix had written is passed on, and from
//   then on libpmix reads and writes the peer directly: nothing relays its messages. Whatever
//   this cannot do (no such descriptor, no epoll entry) falls back to relaying the two sockets.
// - closeStrangers(): shuts down connections on the UNIX listener that did not come from here and
//   whose handshake libpmix is still reading (libpmix makes a socket non-blocking once it is done).
// - closePeers(tag): shuts down the connections handed off under `tag` (a namespace) that are
//   still open; libpmix then sees them end as it would a client that went away.
#include "handoff.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pmix.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace dpmix {

namespace {

constexpr size_t kBuf = 64 * 1024;
// A handed-off connection that libpmix has not answered within this time is dropped.
constexpr int64_t kAnswerMs = 60'000;
// An event handler id that names no handler: deregistering it is a no-op on the progress thread.
constexpr size_t kNoHandler = SIZE_MAX - 8;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- on libpmix's progress thread ------------------------------------------------------------

struct ProgressJob {
  std::function<void()> fn;
};

void ProgressTrampoline(pmix_status_t, void *cbdata) {
  auto *job = static_cast<ProgressJob *>(cbdata);
  job->fn();
  delete job;
}

// Runs `fn` on libpmix's progress thread, between two of its callbacks. PMIx_Deregister_event_handler
// shifts to that thread, finds no handler and calls back there; false when libpmix is not running.
bool OnProgressThread(std::function<void()> fn) {
  auto *job = new ProgressJob{std::move(fn)};
  if (PMIx_Deregister_event_handler(kNoHandler, ProgressTrampoline, job) != PMIX_SUCCESS) {
    delete job;
    return false;
  }
  return true;
}

// ---- descriptors of this process -------------------------------------------------------------

template <typename Visit>
void ForEachFd(Visit visit) {
  DIR *dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (dirent *e = readdir(dir)) {
    char *end = nullptr;
    long fd = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || e->d_name[0] == '\0' || fd == dirfd(dir)) continue;
    if (!visit(static_cast<int>(fd))) break;
  }
  closedir(dir);
}

// A UNIX socket's address: a path, or an abstract name (a NUL, then bytes that all count).
std::string UnixName(const sockaddr_un &a, socklen_t len) {
  const size_t off = offsetof(sockaddr_un, sun_path);
  if (a.sun_family != AF_UNIX || len <= off) return {};
  if (a.sun_path[0] == '\0') return std::string(a.sun_path, len - off);
  return std::string(a.sun_path, strnlen(a.sun_path, len - off));
}

std::string LocalUnixName(int fd) {
  sockaddr_un a{};
  socklen_t len = sizeof a;
  if (getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) != 0) return {};
  return UnixName(a, len);
}

std::string PeerUnixName(int fd) {
  sockaddr_un a{};
  socklen_t len = sizeof a;
  if (getpeername(fd, reinterpret_cast<sockaddr *>(&a), &len) != 0) return {};
  return UnixName(a, len);
}

// The entry for `fd` in the epoll set `epfd`, as /proc/self/fdinfo shows it.
bool EpollEntry(int epfd, int fd, epoll_event *out) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/fdinfo/%d", epfd);
  FILE *f = std::fopen(path, "re");
  if (!f) return false;
  char line[256];
  bool found = false;
  while (std::fgets(line, sizeof line, f)) {
    int tfd = -1;
    unsigned events = 0;
    unsigned long long data = 0;
    if (std::sscanf(line, "tfd: %d events: %x data: %llx", &tfd, &events, &data) == 3 && tfd == fd) {
      out->events = events;
      out->data.u64 = data;
      found = true;
      break;
    }
  }
  std::fclose(f);
  return found;
}

// The epoll set that watches `fd` (libevent's, for libpmix's listener), or -1.
int EpollWatching(int fd) {
  int found = -1;
  ForEachFd([&](int cand) {
    char link[64], target[64];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", cand);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) return true;
    target[n] = '\0';
    if (std::strcmp(target, "anon_inode:[eventpoll]") != 0) return true;
    epoll_event ev{};
    if (!EpollEntry(cand, fd, &ev)) return true;
    found = cand;
    return false;
  });
  return found;
}

// Replaces what `fd` refers to by `with` in the epoll set `epfd`, keeping its entry `ev` (events
// and data, as EpollEntry read them). `with` stays open; the old file is closed unless something
// else holds it.
bool Replace(int epfd, int fd, int with, epoll_event ev) {
  // Deleted first: were the old file still held elsewhere (a child that inherited it), its
  // entry would otherwise stay and keep reporting under this descriptor number.
  if (epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr) != 0) return false;
  if (dup3(with, fd, O_CLOEXEC) < 0) return false;
  if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0 && errno != EEXIST) return false;
  return true;
}

// ---- the listener ----------------------------------------------------------------------------

std::mutex g_mutex;                // guards what follows, and the hand-off queues
std::string g_path;                // the UNIX listener libpmix accepts on
int g_epoll_pmix = -1;             // libevent's epoll set on libpmix's progress thread
std::set<std::string> g_inflight;  // names of this process's connections being handed off
uint64_t g_next_name = 0;          // with g_name_key, what names them

// ---- the hand-off thread ---------------------------------------------------------------------

struct Flow {
  std::vector<char> buf;
  size_t off = 0;
};

struct Conn {
  int s = -1;  // the peer's socket (our duplicate)
  int c = -1;  // our connection to libpmix's listener
  std::string name;
  std::string tag;
  enum { kSending, kWaiting, kSwapping, kRelaying } state = kSending;
  int64_t deadline = 0;
  Flow toPmix, toPeer;  // bytes not yet written: the handshake, then the relay's
  bool peerEof = false, pmixEof = false;
};

struct Outcome {
  Conn *conn;
  bool handedOff;
};

std::vector<std::unique_ptr<Conn>> g_fresh;  // queued by handOff
std::vector<Outcome> g_outcomes;             // swaps done on the progress thread
bool g_close_all = false;
int g_epoll = -1;
int g_wake = -1;
bool g_started = false;

std::atomic<uint64_t> g_handed{0}, g_relayed{0}, g_refused{0}, g_dropped{0};

// Connections handed off, by tag: the descriptor libpmix reads and the socket's inode (the
// descriptor number may be another file's once libpmix has closed it).
struct HandedOff {
  int fd;
  ino_t ino;
};
std::multimap<std::string, HandedOff> g_handed_by_tag;  // guarded by g_mutex

void Wake() {
  uint64_t one = 1;
  if (write(g_wake, &one, sizeof one) < 0) { /* the loop is woken already */
  }
}

// Sends what `f` holds to `fd`; false when `fd` failed.
bool Drain(Flow &f, int fd) {
  while (f.off < f.buf.size()) {
    ssize_t n = send(fd, f.buf.data() + f.off, f.buf.size() - f.off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    f.off += static_cast<size_t>(n);
  }
  f.buf.clear();
  f.off = 0;
  return true;
}

// Tells a peer that could not be handed over to connect again (PMIX_ERR_TEMP_UNAVAILABLE, on
// which libpmix's client retries: see src/pmix/gate.ts).
void AskToRetry(int s) {
  uint32_t status = htonl(static_cast<uint32_t>(-1367));
  if (send(s, &status, sizeof status, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) { /* it has gone */
  }
}

// A name for our end of a connection to libpmix's listener, so that the descriptor libpmix
// accepts can be told by its peer's name: abstract (no file to make and remove), and not to be
// guessed by another process (that could take it first).
std::string NextName() {
  static const uint64_t key = [] {
    uint64_t k = 0;
    if (getrandom(&k, sizeof k, 0) != sizeof k)
      k = static_cast<uint64_t>(NowMs()) ^ (static_cast<uint64_t>(getpid()) << 32);
    return k;
  }();
  char buf[80];
  std::lock_guard<std::mutex> lock(g_mutex);
  int n = std::snprintf(buf, sizeof buf, "%cdask-pmix-gate-%d-%016llx-%llu", '\0', static_cast<int>(getpid()),
                        static_cast<unsigned long long>(key), static_cast<unsigned long long>(g_next_name++));
  return std::string(buf, static_cast<size_t>(n));
}

// Opens our connection to libpmix's listener for `conn`; false (errno set) when it cannot.
bool Open(Conn *conn, const std::string &listener) {
  sockaddr_un to{}, self{};
  if (listener.empty() || listener.size() >= sizeof to.sun_path || conn->name.size() > sizeof self.sun_path) {
    errno = ENAMETOOLONG;
    return false;
  }
  to.sun_family = self.sun_family = AF_UNIX;
  std::memcpy(to.sun_path, listener.data(), listener.size());
  std::memcpy(self.sun_path, conn->name.data(), conn->name.size());
  conn->c = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  return conn->c >= 0 &&
         bind(conn->c, reinterpret_cast<sockaddr *>(&self),
              static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + conn->name.size())) == 0 &&
         connect(conn->c, reinterpret_cast<sockaddr *>(&to), sizeof to) == 0;
}

// Reads what `from` has into `f` (only when `f` is empty); false at its end or on an error.
bool Fill(Flow &f, int from) {
  if (!f.buf.empty()) return true;
  f.buf.resize(kBuf);
  ssize_t n = recv(from, f.buf.data(), kBuf, MSG_DONTWAIT);
  if (n <= 0) {
    f.buf.clear();
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
  }
  f.buf.resize(static_cast<size_t>(n));
  return true;
}

// The descriptor libpmix accepted for our connection `name`, or -1.
int AcceptedFor(const std::string &listener, const std::string &name) {
  int found = -1;
  ForEachFd([&](int fd) {
    if (LocalUnixName(fd) != listener || PeerUnixName(fd) != name) return true;
    found = fd;
    return false;
  });
  return found;
}

// On the progress thread: gives libpmix the peer's socket in place of `accepted`, with what
// libpmix wrote to it so far passed on first. Leaves everything as it was when it cannot.
bool Swap(Conn *conn, int accepted, const std::string &listener, int epfd) {
  if (epfd < 0 || LocalUnixName(accepted) != listener || PeerUnixName(accepted) != conn->name) return false;
  epoll_event ev{};
  if (!EpollEntry(epfd, accepted, &ev)) return false;
  // Everything libpmix has written: it writes nothing more while this runs on its thread.
  Flow said;
  for (;;) {
    size_t at = said.buf.size();
    said.buf.resize(at + kBuf);
    ssize_t n = recv(conn->c, said.buf.data() + at, kBuf, MSG_DONTWAIT);
    said.buf.resize(at + (n > 0 ? static_cast<size_t>(n) : 0));
    if (n <= 0) break;
  }
  if (!Replace(epfd, accepted, conn->s, ev)) {
    // Nothing changed for libpmix; the relay passes on what it said.
    conn->toPeer = std::move(said);
    return false;
  }
  struct stat st{};
  if (!conn->tag.empty() && fstat(accepted, &st) == 0) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_handed_by_tag.insert({conn->tag, {accepted, st.st_ino}});
  }
  // A fresh connection's send buffer takes a few hundred bytes at once; wait briefly otherwise,
  // since nothing libpmix writes next may overtake them.
  int64_t until = NowMs() + 1000;
  while (said.off < said.buf.size() && NowMs() < until) {
    if (!Drain(said, accepted)) break;
    if (said.off < said.buf.size()) {
      pollfd p{accepted, POLLOUT, 0};
      poll(&p, 1, 100);
    }
  }
  return true;
}

void Loop() {
  std::map<int, Conn *> byFd;
  std::vector<std::unique_ptr<Conn>> conns;
  auto watch = [&](Conn *c, int fd, uint32_t events, int op) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    epoll_ctl(g_epoll, op, fd, &ev);
    if (op == EPOLL_CTL_ADD) byFd[fd] = c;
  };
  auto unwatch = [&](int fd) {
    if (fd < 0 || !byFd.count(fd)) return;
    epoll_ctl(g_epoll, EPOLL_CTL_DEL, fd, nullptr);
    byFd.erase(fd);
  };
  auto finish = [&](Conn *c) {
    unwatch(c->s);
    unwatch(c->c);
    if (c->s >= 0) close(c->s);
    if (c->c >= 0) close(c->c);
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_inflight.erase(c->name);
    }
    for (auto it = conns.begin(); it != conns.end(); ++it)
      if (it->get() == c) {
        conns.erase(it);
        break;
      }
  };
  // What each socket of a relay waits for: to read while nothing is queued from it, to write
  // while something is queued to it.
  auto rearm = [&](Conn *c) {
    const uint32_t in = EPOLLIN | EPOLLRDHUP, out = EPOLLOUT;
    watch(c, c->s, (c->toPmix.buf.empty() && !c->peerEof ? in : 0u) | (c->toPeer.buf.empty() ? 0u : out),
          EPOLL_CTL_MOD);
    watch(c, c->c, (c->toPeer.buf.empty() && !c->pmixEof ? in : 0u) | (c->toPmix.buf.empty() ? 0u : out),
          EPOLL_CTL_MOD);
  };
  auto relay = [&](Conn *c, bool count = true) {
    c->state = Conn::kRelaying;
    if (count) g_relayed++;
    watch(c, c->s, 0, EPOLL_CTL_ADD);
    watch(c, c->c, 0, EPOLL_CTL_ADD);
    rearm(c);
  };
  auto swap = [&](Conn *c) {
    std::string listener;
    int epfd;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      listener = g_path;
      epfd = g_epoll_pmix;
    }
    int accepted = AcceptedFor(listener, c->name);
    unwatch(c->s);
    unwatch(c->c);
    c->state = Conn::kSwapping;
    if (accepted < 0) {
      // libpmix refused it and closed its side: what it said, if anything, is passed on.
      g_refused++;
      return relay(c, false);
    }
    if (epfd < 0) return relay(c);
    bool posted = OnProgressThread([c, accepted, listener, epfd] {
      bool ok = Swap(c, accepted, listener, epfd);
      std::lock_guard<std::mutex> lock(g_mutex);
      g_outcomes.push_back({c, ok});
      Wake();
    });
    if (!posted) relay(c);
  };
  epoll_event events[64];
  for (;;) {
    int64_t now = NowMs();
    int64_t next = INT64_MAX;
    for (auto &c : conns)
      if (c->state == Conn::kSending || c->state == Conn::kWaiting) next = std::min(next, c->deadline);
    int timeout = next == INT64_MAX ? -1 : static_cast<int>(std::max<int64_t>(0, next - now));
    int n = epoll_wait(g_epoll, events, 64, timeout);
    now = NowMs();
    for (size_t i = 0; i < conns.size();) {
      Conn *c = conns[i].get();
      if ((c->state == Conn::kSending || c->state == Conn::kWaiting) && c->deadline <= now) {
        g_dropped++;
        finish(c);
        continue;
      }
      ++i;
    }
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == g_wake) {
        uint64_t v;
        if (read(g_wake, &v, sizeof v) < 0) { /* nothing to read */
        }
        std::vector<std::unique_ptr<Conn>> fresh;
        std::vector<Outcome> outcomes;
        bool closeAll;
        {
          std::lock_guard<std::mutex> lock(g_mutex);
          fresh.swap(g_fresh);
          outcomes.swap(g_outcomes);
          closeAll = g_close_all;
          g_close_all = false;
        }
        std::string listener;
        {
          std::lock_guard<std::mutex> lock(g_mutex);
          listener = g_path;
        }
        for (auto &f : fresh) {
          Conn *c = f.get();
          conns.push_back(std::move(f));
          if (!Open(c, listener)) {
            // libpmix's backlog is full or its listener gone: the peer tries again later.
            AskToRetry(c->s);
            g_dropped++;
            finish(c);
            continue;
          }
          watch(c, c->c, EPOLLOUT, EPOLL_CTL_ADD);
          watch(c, c->s, EPOLLRDHUP, EPOLL_CTL_ADD);
        }
        for (const Outcome &o : outcomes) {
          if (o.handedOff) {
            g_handed++;
            finish(o.conn);
          } else {
            relay(o.conn);
          }
        }
        if (closeAll) {
          // Swaps under way finish on the progress thread; their outcome then finds nothing here.
          for (size_t k = conns.size(); k-- > 0;)
            if (conns[k]->state != Conn::kSwapping) finish(conns[k].get());
        }
        continue;
      }
      auto it = byFd.find(fd);
      if (it == byFd.end()) continue;
      Conn *c = it->second;
      uint32_t ev = events[i].events;
      if (c->state == Conn::kSending || c->state == Conn::kWaiting) {
        if (fd == c->s) {
          // The peer hung up before libpmix answered it.
          if (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) finish(c);
          continue;
        }
        if (c->state == Conn::kSending) {
          if ((ev & (EPOLLHUP | EPOLLERR)) || !Drain(c->toPmix, c->c)) {
            g_dropped++;
            finish(c);
          } else if (c->toPmix.buf.empty()) {
            c->state = Conn::kWaiting;
            watch(c, c->c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_MOD);
          }
          continue;
        }
        // libpmix answered (or closed): the connection is complete on its side.
        swap(c);
        continue;
      }
      if (c->state != Conn::kRelaying) continue;
      bool ok = !(ev & EPOLLERR);
      if (ok && (ev & EPOLLOUT)) ok = fd == c->s ? Drain(c->toPeer, c->s) : Drain(c->toPmix, c->c);
      if (ok && (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP))) {
        bool alive = fd == c->s ? Fill(c->toPmix, c->s) : Fill(c->toPeer, c->c);
        if (!alive) (fd == c->s ? c->peerEof : c->pmixEof) = true;
        if (!c->toPmix.buf.empty()) ok = Drain(c->toPmix, c->c);
        if (ok && !c->toPeer.buf.empty()) ok = Drain(c->toPeer, c->s);
      }
      // Either side's end ends both, once what it said before is passed on.
      bool done = !ok || ((c->peerEof || c->pmixEof) && c->toPmix.buf.empty() && c->toPeer.buf.empty());
      if (done) {
        finish(c);
        continue;
      }
      rearm(c);
    }
  }
}

void Start() {
  if (g_started) return;
  g_epoll = epoll_create1(EPOLL_CLOEXEC);
  g_wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = g_wake;
  epoll_ctl(g_epoll, EPOLL_CTL_ADD, g_wake, &ev);
  std::thread(Loop).detach();
  g_started = true;
}

bool MakeAddress(const std::string &path, sockaddr_un *a) {
  if (path.size() >= sizeof a->sun_path) return false;
  std::memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  std::memcpy(a->sun_path, path.data(), path.size());
  return true;
}

std::string Dirname(const std::string &path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// ---- JavaScript ------------------------------------------------------------------------------

// secureListener(port, path): see the top of this file. Waits (at most 5 s) for the progress thread.
Napi::Value SecureListener(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsNumber() || !info[1].IsString())
    throw Napi::TypeError::New(env, "secureListener(port, path)");
  int port = info[0].As<Napi::Number>().Int32Value();
  std::string path = info[1].As<Napi::String>().Utf8Value();
  struct stat st{};
  std::string dir = Dirname(path);
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0)
    throw Napi::Error::New(env,
                           "secureListener: " + dir + " must be a directory of this user's, closed to others (0700)");
  sockaddr_un addr{};
  if (!MakeAddress(path, &addr)) throw Napi::Error::New(env, "secureListener: the socket path is too long: " + path);

  // libpmix's TCP listener: bound to `port`, listening.
  int tcp = -1;
  ForEachFd([&](int fd) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len) != 0 || ss.ss_family != AF_INET) return true;
    if (ntohs(reinterpret_cast<sockaddr_in &>(ss).sin_port) != port) return true;
    int listening = 0;
    socklen_t ol = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ol) != 0 || !listening) return true;
    tcp = fd;
    return false;
  });
  if (tcp < 0) throw Napi::Error::New(env, "secureListener: libpmix does not listen on port " + std::to_string(port));

  int u = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  unlink(path.c_str());
  if (u < 0 || bind(u, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0 || listen(u, SOMAXCONN) != 0) {
    std::string why = strerror(errno);
    if (u >= 0) close(u);
    throw Napi::Error::New(env, "secureListener: cannot listen on " + path + ": " + why);
  }

  struct Result {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    std::string error;
    int epfd = -1;
  };
  auto result = std::make_shared<Result>();
  bool posted = OnProgressThread([result, tcp, u] {
    std::string error;
    int epfd = EpollWatching(tcp);
    if (epfd < 0) {
      error = "libevent's epoll set does not watch libpmix's listener";
    } else {
      // No connection reaches the TCP port any more, even if something else holds it.
      shutdown(tcp, SHUT_RDWR);
      epoll_event ev{};
      if (!EpollEntry(epfd, tcp, &ev) || !Replace(epfd, tcp, u, ev))
        error = std::string("cannot put the UNIX listener in its place: ") + strerror(errno);
    }
    std::lock_guard<std::mutex> lock(result->m);
    result->error = error;
    result->epfd = epfd;
    result->done = true;
    result->cv.notify_all();
  });
  if (!posted) {
    close(u);
    throw Napi::Error::New(env, "secureListener: libpmix is not running");
  }
  std::unique_lock<std::mutex> lock(result->m);
  if (!result->cv.wait_for(lock, std::chrono::seconds(5), [&] { return result->done; })) {
    // The job still runs later and uses `u`, which it then owns.
    throw Napi::Error::New(env, "secureListener: libpmix's progress thread did not answer within 5 s");
  }
  close(u);
  if (!result->error.empty()) throw Napi::Error::New(env, "secureListener: " + result->error);
  {
    std::lock_guard<std::mutex> g(g_mutex);
    g_path = path;
    g_epoll_pmix = result->epfd;
  }
  return env.Undefined();
}

// handOff(fd, handshake, tag): see the top of this file. The caller closes its own `fd` afterwards.
// The connection to libpmix is made on the hand-off thread; a peer it fails for is asked to retry.
Napi::Value HandOff(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (info.Length() < 3 || !info[0].IsNumber() || !info[1].IsBuffer() || !info[2].IsString())
    throw Napi::TypeError::New(env, "handOff(fd, handshake, tag)");
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_path.empty()) throw Napi::Error::New(env, "handOff: libpmix's listener has not been secured");
  }
  int fd = info[0].As<Napi::Number>().Int32Value();
  Napi::Buffer<char> first = info[1].As<Napi::Buffer<char>>();
  auto conn = std::make_unique<Conn>();
  conn->s = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (conn->s < 0) throw Napi::Error::New(env, std::string("handOff: dup: ") + strerror(errno));
  fcntl(conn->s, F_SETFL, fcntl(conn->s, F_GETFL) | O_NONBLOCK);
  conn->name = NextName();
  conn->tag = info[2].As<Napi::String>().Utf8Value();
  conn->toPmix.buf.assign(first.Data(), first.Data() + first.Length());
  conn->deadline = NowMs() + kAnswerMs;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    Start();
    g_inflight.insert(conn->name);
    g_fresh.push_back(std::move(conn));
  }
  Wake();
  return env.Undefined();
}

// handoffStats() -> {handedOff, relayed, refused, dropped}: connections given to libpmix, relayed
// because they could not be, refused by libpmix itself, and dropped (left unanswered).
Napi::Value HandoffStats(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  Napi::Object out = Napi::Object::New(env);
  out.Set("handedOff", Napi::Number::New(env, static_cast<double>(g_handed.load())));
  out.Set("relayed", Napi::Number::New(env, static_cast<double>(g_relayed.load())));
  out.Set("refused", Napi::Number::New(env, static_cast<double>(g_refused.load())));
  out.Set("dropped", Napi::Number::New(env, static_cast<double>(g_dropped.load())));
  return out;
}

// handoffCloseAll(): ends every hand-off and relay under way, and forgets the listener.
Napi::Value HandoffCloseAll(const Napi::CallbackInfo &info) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_started) {
    g_close_all = true;
    Wake();
  }
  g_path.clear();
  g_epoll_pmix = -1;
  g_handed_by_tag.clear();
  return info.Env().Undefined();
}

// closePeers(tag) -> how many connections handed off under `tag` were still open and are shut
// down; all of the tag's records are forgotten. closePeers(tag, false) only forgets them.
Napi::Value ClosePeers(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString()) throw Napi::TypeError::New(env, "closePeers(tag, shut?)");
  std::string tag = info[0].As<Napi::String>().Utf8Value();
  bool shut = info.Length() < 2 || info[1].ToBoolean().Value();
  std::vector<HandedOff> peers;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto range = g_handed_by_tag.equal_range(tag);
    for (auto it = range.first; it != range.second; ++it) peers.push_back(it->second);
    g_handed_by_tag.erase(range.first, range.second);
  }
  int closed = 0;
  for (const HandedOff &p : peers) {
    struct stat st{};
    if (!shut || fstat(p.fd, &st) != 0 || st.st_ino != p.ino || !S_ISSOCK(st.st_mode)) continue;
    if (shutdown(p.fd, SHUT_RDWR) == 0) ++closed;
  }
  return Napi::Number::New(env, closed);
}

// closeStrangers() -> number of connections shut down (see the top of this file).
Napi::Value CloseStrangers(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  std::string listener;
  std::set<std::string> ours;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    listener = g_path;
    ours = g_inflight;
  }
  int closed = 0;
  if (listener.empty()) return Napi::Number::New(env, 0);
  ForEachFd([&](int fd) {
    if (LocalUnixName(fd) != listener) return true;
    int listening = 0;
    socklen_t ol = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ol) != 0 || listening) return true;
    if (ours.count(PeerUnixName(fd))) return true;
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || (flags & O_NONBLOCK)) return true;  // handshake done: libpmix is not reading it
    if (shutdown(fd, SHUT_RDWR) == 0) ++closed;          // libpmix's blocking recv returns, it closes
    return true;
  });
  return Napi::Number::New(env, closed);
}

}  // namespace

void InitHandoff(Napi::Env env, Napi::Object exports) {
  exports.Set("secureListener", Napi::Function::New(env, SecureListener, "secureListener"));
  exports.Set("handOff", Napi::Function::New(env, HandOff, "handOff"));
  exports.Set("handoffStats", Napi::Function::New(env, HandoffStats, "handoffStats"));
  exports.Set("handoffCloseAll", Napi::Function::New(env, HandoffCloseAll, "handoffCloseAll"));
  exports.Set("closeStrangers", Napi::Function::New(env, CloseStrangers, "closeStrangers"));
  exports.Set("closePeers", Napi::Function::New(env, ClosePeers, "closePeers"));
}

}  // namespace dpmix
