// What Node's net module cannot do with a socket, for the gate and the PMI listener.
//
// - tcpKeepAlive(fd, idleMs, intervalMs, count, userTimeoutMs): keepalive probes after `idleMs`
//   of silence, every `intervalMs`, the connection dropped after `count` unanswered; and
//   TCP_USER_TIMEOUT, which also drops it when data sent stays unacknowledged that long (keepalive
//   alone never fires while unacknowledged data is being retransmitted). A host lost without a FIN
//   is so noticed in bounded time, by whoever reads the socket (libpmix, or the PMI server).
// - peerUid(localAddress, localPort, remoteAddress, remotePort): the uid that owns the other end
//   of a TCP connection when that end is a socket of this host (and network namespace), from the
//   kernel's socket table (NETLINK_SOCK_DIAG, one exact lookup); -1 when no such socket is on
//   this host, -2 when it is but no process holds it any more (closed: an orphan or TIME_WAIT, for
//   which the kernel reports uid 0, so that figure says nothing of its owner), -3 when the kernel
//   could not be asked.
// - unixPeerUid(fd): the uid of the process that connected a UNIX socket (SO_PEERCRED, recorded
//   by the kernel at connect, whatever the peer did since); -1 if it cannot be read.
#include "tcp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace dpmix {

namespace {

Napi::Value TcpKeepAlive(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  for (size_t i = 0; i < 5; ++i)
    if (info.Length() <= i || !info[i].IsNumber())
      throw Napi::TypeError::New(env, "tcpKeepAlive(fd, idleMs, intervalMs, count, userTimeoutMs)");
  int fd = info[0].As<Napi::Number>().Int32Value();
  int idle = std::max(1, (info[1].As<Napi::Number>().Int32Value() + 999) / 1000);
  int interval = std::max(1, (info[2].As<Napi::Number>().Int32Value() + 999) / 1000);
  int count = std::max(1, info[3].As<Napi::Number>().Int32Value());
  unsigned userTimeout = info[4].As<Napi::Number>().Uint32Value();
  int on = 1;
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &userTimeout, sizeof userTimeout) != 0) {
    throw Napi::Error::New(env, std::string("tcpKeepAlive: ") + strerror(errno));
  }
  return env.Undefined();
}

bool ParseAddress(const std::string &text, int *family, unsigned char out[16]) {
  std::memset(out, 0, 16);
  std::string t = text;
  if (t.rfind("::ffff:", 0) == 0 && t.find('.') != std::string::npos) t = t.substr(7);  // IPv4-mapped
  if (inet_pton(AF_INET, t.c_str(), out) == 1) {
    *family = AF_INET;
    return true;
  }
  if (inet_pton(AF_INET6, t.c_str(), out) == 1) {
    *family = AF_INET6;
    return true;
  }
  return false;
}

Napi::Value PeerUid(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (info.Length() < 4 || !info[0].IsString() || !info[1].IsNumber() || !info[2].IsString() || !info[3].IsNumber())
    throw Napi::TypeError::New(env, "peerUid(localAddress, localPort, remoteAddress, remotePort)");
  int lf = 0, rf = 0;
  unsigned char local[16], remote[16];
  if (!ParseAddress(info[0].As<Napi::String>().Utf8Value(), &lf, local) ||
      !ParseAddress(info[2].As<Napi::String>().Utf8Value(), &rf, remote) || lf != rf)
    return Napi::Number::New(env, -1);
  int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (nl < 0) return Napi::Number::New(env, -3);
  timeval tv{0, 200 * 1000};
  setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  struct {
    nlmsghdr nlh;
    inet_diag_req_v2 req;
  } msg{};
  msg.nlh.nlmsg_len = sizeof msg;
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST;  // one exact lookup, not a dump
  msg.req.sdiag_family = static_cast<__u8>(lf);
  msg.req.sdiag_protocol = IPPROTO_TCP;
  msg.req.idiag_states = ~0u;
  // The socket asked about is the peer's: its source is our remote end.
  msg.req.id.idiag_sport = htons(static_cast<uint16_t>(info[3].As<Napi::Number>().Int32Value()));
  msg.req.id.idiag_dport = htons(static_cast<uint16_t>(info[1].As<Napi::Number>().Int32Value()));
  std::memcpy(msg.req.id.idiag_src, remote, 16);
  std::memcpy(msg.req.id.idiag_dst, local, 16);
  msg.req.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  int uid = -3;
  if (sendto(nl, &msg, sizeof msg, 0, reinterpret_cast<sockaddr *>(&kernel), sizeof kernel) ==
      static_cast<ssize_t>(sizeof msg)) {
    alignas(nlmsghdr) char buf[4096];
    ssize_t n = recv(nl, buf, sizeof buf, 0);
    for (auto *h = reinterpret_cast<nlmsghdr *>(buf); n > 0 && NLMSG_OK(h, static_cast<unsigned>(n));
         h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_type == NLMSG_ERROR) {
        // ENOENT: no such socket here; anything else: the lookup itself failed.
        auto *e = static_cast<nlmsgerr *>(NLMSG_DATA(h));
        if (e->error == -ENOENT) uid = -1;
        break;
      }
      if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY) break;
      auto *m = static_cast<inet_diag_msg *>(NLMSG_DATA(h));
      // No inode: the socket is no process's any more (closed), and its uid reads as 0.
      uid = m->idiag_inode == 0 ? -2 : static_cast<int>(m->idiag_uid);
      break;
    }
  }
  close(nl);
  return Napi::Number::New(env, uid);
}

Napi::Value UnixPeerUid(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsNumber()) throw Napi::TypeError::New(env, "unixPeerUid(fd)");
  int fd = info[0].As<Napi::Number>().Int32Value();
  sockaddr_un self{};
  socklen_t sl = sizeof self;
  ucred cred{};
  socklen_t cl = sizeof cred;
  if (getsockname(fd, reinterpret_cast<sockaddr *>(&self), &sl) != 0 || self.sun_family != AF_UNIX ||
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cl != sizeof cred)
    return Napi::Number::New(env, -1);
  return Napi::Number::New(env, static_cast<double>(cred.uid));
}

}  // namespace

void InitTcp(Napi::Env env, Napi::Object exports) {
  exports.Set("tcpKeepAlive", Napi::Function::New(env, TcpKeepAlive, "tcpKeepAlive"));
  exports.Set("peerUid", Napi::Function::New(env, PeerUid, "peerUid"));
  exports.Set("unixPeerUid", Napi::Function::New(env, UnixPeerUid, "unixPeerUid"));
}

}  // namespace dpmix
