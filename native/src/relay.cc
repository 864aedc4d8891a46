// A byte relay between admitted PMIx peers and libpmix's loopback listener, on a thread of its
// own, so that after the gate (src/pmix/gate.ts) has read and admitted a handshake no message
// passes through JavaScript. It copies bytes and decides nothing.
//
// relayStart(fd, port, first) takes a duplicate of the peer's socket `fd` (the caller then closes
// its own), connects to 127.0.0.1:port, writes `first` (the handshake) and from then on copies
// both ways until either side ends, when both are closed. relayPorts() lists the local ports of
// its connections to libpmix; relayCloseAll() ends every relay.
#include "relay.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dpmix {

namespace {

constexpr size_t kBuf = 64 * 1024;

// One direction: bytes read from `from` not yet written to `to`.
struct Flow {
  std::vector<char> buf = std::vector<char>(kBuf);
  size_t off = 0, len = 0;
};

struct Pair {
  int a = -1;  // the peer
  int b = -1;  // libpmix
  int localPort = 0;
  Flow ab, ba;
};

std::mutex g_mutex;                                 // guards g_pending, g_ports, g_close_all
std::vector<std::unique_ptr<Pair>> g_pending;       // handed over, not yet in the loop
std::map<int, int> g_ports;                         // b fd -> local port, for relayPorts
bool g_close_all = false;
int g_epoll = -1;
int g_wake = -1;
bool g_started = false;

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

void Watch(int fd, uint32_t events, bool add) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  epoll_ctl(g_epoll, add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &ev);
}

// What each side waits for: to read while its outgoing buffer is empty, to write while the
// buffer towards it is not.
void Rearm(Pair& p) {
  Watch(p.a, (p.ab.len == 0 ? EPOLLIN | EPOLLRDHUP : 0) | (p.ba.len > 0 ? EPOLLOUT : 0), false);
  Watch(p.b, (p.ba.len == 0 ? EPOLLIN | EPOLLRDHUP : 0) | (p.ab.len > 0 ? EPOLLOUT : 0), false);
}

// Writes what `f` holds to `to`; false when `to` failed.
bool Drain(Flow& f, int to) {
  while (f.len > 0) {
    ssize_t n = send(to, f.buf.data() + f.off, f.len, MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    f.off += static_cast<size_t>(n);
    f.len -= static_cast<size_t>(n);
  }
  f.off = 0;
  return true;
}

// Reads once from `from` into `f` and writes it on; false when either side ended or failed.
bool Pump(Flow& f, int from, int to) {
  if (f.len > 0) return true;
  ssize_t n = recv(from, f.buf.data(), kBuf, 0);
  if (n == 0) return false;
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  f.off = 0;
  f.len = static_cast<size_t>(n);
  return Drain(f, to);
}

void Loop() {
  std::map<int, Pair*> byFd;
  std::vector<std::unique_ptr<Pair>> pairs;
  auto end = [&](Pair* p) {
    epoll_ctl(g_epoll, EPOLL_CTL_DEL, p->a, nullptr);
    epoll_ctl(g_epoll, EPOLL_CTL_DEL, p->b, nullptr);
    byFd.erase(p->a);
    byFd.erase(p->b);
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_ports.erase(p->b);
    }
    close(p->a);
    close(p->b);
    for (auto it = pairs.begin(); it != pairs.end(); ++it)
      if (it->get() == p) {
        pairs.erase(it);
        break;
      }
  };
  epoll_event events[64];
  for (;;) {
    int n = epoll_wait(g_epoll, events, 64, -1);
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == g_wake) {
        uint64_t v;
        if (read(g_wake, &v, sizeof v) < 0) { /* nothing to read */ }
        std::vector<std::unique_ptr<Pair>> fresh;
        bool closeAll;
        {
          std::lock_guard<std::mutex> lock(g_mutex);
          fresh.swap(g_pending);
          closeAll = g_close_all;
          g_close_all = false;
        }
        for (auto& p : fresh) {
          byFd[p->a] = p.get();
          byFd[p->b] = p.get();
          Watch(p->a, EPOLLIN | EPOLLRDHUP, true);
          Watch(p->b, EPOLLIN | EPOLLRDHUP, true);
          pairs.push_back(std::move(p));
        }
        if (closeAll) {
          while (!pairs.empty()) end(pairs.back().get());
        }
        continue;
      }
      auto it = byFd.find(fd);
      if (it == byFd.end()) continue;
      Pair* p = it->second;
      uint32_t ev = events[i].events;
      bool ok = !(ev & (EPOLLHUP | EPOLLERR));
      if (ok && (ev & EPOLLOUT)) ok = fd == p->a ? Drain(p->ba, p->a) : Drain(p->ab, p->b);
      if (ok && (ev & (EPOLLIN | EPOLLRDHUP))) {
        ok = fd == p->a ? Pump(p->ab, p->a, p->b) : Pump(p->ba, p->b, p->a);
      }
      if (!ok) {
        end(p);
        continue;
      }
      Rearm(*p);
    }
  }
}

void Wake() {
  uint64_t one = 1;
  if (write(g_wake, &one, sizeof one) < 0) { /* the loop is woken already */ }
}

void Start() {
  if (g_started) return;
  g_epoll = epoll_create1(EPOLL_CLOEXEC);
  g_wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  Watch(g_wake, EPOLLIN, true);
  std::thread(Loop).detach();
  g_started = true;
}

Napi::Value RelayStart(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 3 || !info[0].IsNumber() || !info[1].IsNumber() || !info[2].IsBuffer())
    throw Napi::TypeError::New(env, "relayStart(fd, port, first)");
  int fd = info[0].As<Napi::Number>().Int32Value();
  int port = info[1].As<Napi::Number>().Int32Value();
  Napi::Buffer<char> first = info[2].As<Napi::Buffer<char>>();
  int a = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (a < 0) throw Napi::Error::New(env, std::string("relayStart: dup: ") + strerror(errno));
  int b = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // Loopback: connect and a write of a few hundred bytes complete at once.
  if (b < 0 || connect(b, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    std::string why = strerror(errno);
    close(a);
    if (b >= 0) close(b);
    throw Napi::Error::New(env, "relayStart: connect to libpmix: " + why);
  }
  size_t done = 0;
  while (done < first.Length()) {
    ssize_t n = send(b, first.Data() + done, first.Length() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string why = strerror(errno);
      close(a);
      close(b);
      throw Napi::Error::New(env, "relayStart: write to libpmix: " + why);
    }
    done += static_cast<size_t>(n);
  }
  int one = 1;
  setsockopt(a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(b, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  SetNonBlocking(a);
  SetNonBlocking(b);
  sockaddr_in local{};
  socklen_t ll = sizeof local;
  getsockname(b, reinterpret_cast<sockaddr*>(&local), &ll);
  auto p = std::make_unique<Pair>();
  p->a = a;
  p->b = b;
  p->localPort = ntohs(local.sin_port);
  int localPort = p->localPort;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    Start();
    g_ports[b] = localPort;
    g_pending.push_back(std::move(p));
  }
  Wake();
  return Napi::Number::New(env, localPort);
}

Napi::Value RelayPorts(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Array out = Napi::Array::New(env);
  std::lock_guard<std::mutex> lock(g_mutex);
  uint32_t i = 0;
  for (const auto& [fd, port] : g_ports) out.Set(i++, Napi::Number::New(env, port));
  return out;
}

Napi::Value RelayCloseAll(const Napi::CallbackInfo& info) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_started) {
    g_close_all = true;
    Wake();
  }
  return info.Env().Undefined();
}

}  // namespace

void InitRelay(Napi::Env env, Napi::Object exports) {
  exports.Set("relayStart", Napi::Function::New(env, RelayStart, "relayStart"));
  exports.Set("relayPorts", Napi::Function::New(env, RelayPorts, "relayPorts"));
  exports.Set("relayCloseAll", Napi::Function::New(env, RelayCloseAll, "relayCloseAll"));
}

}  // namespace dpmix
