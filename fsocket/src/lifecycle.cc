// The interposers that make, find and end accelerated connections: connect, listen,
// accept, close and the dup family (docs/tcp-mode.md).
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "bells.h"
#include "dial_policy.h"
#include "epoll.h"
#include "exports.h"
#include "log.h"
#include "real.h"
#include "router_link.h"
#include "sock.h"
#include "stream.h"

namespace ff::fsocket {
namespace {

// Keeps errno across the library's own calls on a path that succeeds for the program.
struct SavedErrno {
  int e = errno;
  ~SavedErrno() { errno = e; }
};

// A TCP socket of either family: an AF_INET6 socket reaches pods through IPv4-mapped
// addresses (a dual-stack listener, a client that connects to ::ffff:a.b.c.d).
bool IsTcp(int fd) {
  int v = 0;
  socklen_t len = sizeof(v);
  if (real::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &len) != 0 || (v != AF_INET && v != AF_INET6))
    return false;
  len = sizeof(v);
  if (real::getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &len) != 0 || v != SOCK_STREAM) return false;
  len = sizeof(v);
  return real::getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &v, &len) == 0 && v == IPPROTO_TCP;
}

// An address as IPv4 (network order in sin_addr and sin_port): AF_INET as it is, AF_INET6
// when IPv4-mapped; the unspecified address of either family as INADDR_ANY.
bool AsV4(const sockaddr_storage& a, sockaddr_in* out) {
  *out = sockaddr_in{};
  out->sin_family = AF_INET;
  if (a.ss_family == AF_INET) {
    std::memcpy(out, &a, sizeof(*out));
    return true;
  }
  if (a.ss_family != AF_INET6) return false;
  sockaddr_in6 a6;
  std::memcpy(&a6, &a, sizeof(a6));
  out->sin_port = a6.sin6_port;
  if (IN6_IS_ADDR_UNSPECIFIED(&a6.sin6_addr)) return true;
  if (!IN6_IS_ADDR_V4MAPPED(&a6.sin6_addr)) return false;
  std::memcpy(&out->sin_addr, &a6.sin6_addr.s6_addr[12], 4);
  return true;
}

bool LocalAddress(int fd, sockaddr_in* a) {
  sockaddr_storage st{};
  socklen_t len = sizeof(st);
  return real::getsockname(fd, reinterpret_cast<sockaddr*>(&st), &len) == 0 && AsV4(st, a);
}

bool PeerAddress(int fd, sockaddr_in* a) {
  sockaddr_storage st{};
  socklen_t len = sizeof(st);
  return real::getpeername(fd, reinterpret_cast<sockaddr*>(&st), &len) == 0 && AsV4(st, a);
}

// Binds `fd` to this pod's address, port 0, in the socket's own family.
bool BindToOwn(int fd, uint32_t own) {
  sockaddr_storage st{};
  socklen_t len = sizeof(st);
  if (real::getsockname(fd, reinterpret_cast<sockaddr*>(&st), &len) != 0) return false;
  if (st.ss_family == AF_INET) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(own);
    return real::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  sockaddr_in6 a6{};
  a6.sin6_family = AF_INET6;
  a6.sin6_addr.s6_addr[10] = a6.sin6_addr.s6_addr[11] = 0xff;
  const uint32_t net = htonl(own);
  std::memcpy(&a6.sin6_addr.s6_addr[12], &net, 4);
  return real::bind(fd, reinterpret_cast<sockaddr*>(&a6), sizeof(a6)) == 0;
}

// Maps what a SockConnect or SockClaim answered into a new stream Sock.
Ref StreamFromReply(const ff::proto::Response& r, ff::UniqueFd* fds, int nfds) {
  if (nfds != 3) return Ref();
  Ref s = NewSock(Kind::kStream);
  if (AttachStream(*s, fds[0].get(), fds[1].get(), std::move(fds[2]), r.u.sock.role,
                   r.u.sock.ring_bytes) != 0) {
    LogError("the router's stream segment is not what it said: kernel TCP for this connection");
    return Ref();
  }
  return s;
}

template <typename Req>
Ref AskForStream(uint32_t peer_ip_net, uint16_t local_port, uint16_t peer_port) {
  Req req{};
  req.peer_ip = peer_ip_net;
  req.local_port = local_port;
  req.peer_port = peer_port;
  ff::proto::Response r{};
  ff::UniqueFd fds[3];
  int status = 0, nfds = 0;
  if (RouterCall(&req, sizeof(req), &status, &r, fds, 3, &nfds) != 0 || status != 0) return Ref();
  Ref s = StreamFromReply(r, fds, nfds);
  if (s) {
    s->peer_ip_net = peer_ip_net;
    s->local_port = local_port;
    s->peer_port = peer_port;
  }
  return s;
}

// A socket that has not started a connection: a program that calls connect() again on one
// whose connect is under way or done (ab does, to learn how a non-blocking connect ended)
// must not have it made a stream now — the server took it as kernel TCP.
bool Unconnected(int fd) {
  tcp_info ti{};
  socklen_t len = sizeof(ti);
  return real::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 && ti.tcpi_state == TCP_CLOSE;
}

// Before the kernel connect to a pod address: the stream, when the router says the other
// end is a pod of this node listening with libfsocket. The socket is bound first (to this
// pod's address, port 0, when it is not bound yet) so that the router knows the four-tuple
// before the server can accept it.
Ref PrepareConnect(int fd, const sockaddr_in& dst) {
  if (Lookup(fd) || !IsTcp(fd) || !Unconnected(fd)) return Ref();
  const uint32_t own = OwnAddress();
  if (own == 0) return Ref();
  sockaddr_in local{};
  if (!LocalAddress(fd, &local)) return Ref();
  if (local.sin_addr.s_addr != INADDR_ANY && ntohl(local.sin_addr.s_addr) != own) return Ref();
  if (local.sin_port == 0 && (!BindToOwn(fd, own) || !LocalAddress(fd, &local))) return Ref();
  return AskForStream<ff::proto::SockConnect>(dst.sin_addr.s_addr, ntohs(local.sin_port),
                                              ntohs(dst.sin_port));
}

// This process closed its last descriptor of stream `s`: the router drops the record once
// both ends said so (a hint; a process without a session of its own, or confined to read,
// write and poll, says nothing, and the router's sweep finds the connection gone instead).
void TellClosed(const Sock& s) {
  if (s.local_port == 0 || Restricted()) return;
  ff::proto::SockClosed req{};
  req.peer_ip = s.peer_ip_net;
  req.local_port = s.local_port;
  req.peer_port = s.peer_port;
  (void)RouterPost(&req, sizeof(req));
}

void ReleaseRecord(int fd, const sockaddr_in& dst) {
  sockaddr_in local{};
  if (!LocalAddress(fd, &local)) return;
  ff::proto::SockRelease req{};
  req.peer_ip = dst.sin_addr.s_addr;
  req.local_port = ntohs(local.sin_port);
  req.peer_port = ntohs(dst.sin_port);
  (void)RouterPost(&req, sizeof(req));
}

// Registers listening socket `fd` (bound to `port`) with the router: a listener Sock, or
// an empty Ref when the router is not there.
Ref RegisterListener(uint16_t port) {
  ff::proto::SockListen req{};
  req.port = port;
  ff::proto::Response r{};
  int status = 0;
  if (RouterCall(&req, sizeof(req), &status, &r, nullptr, 0, nullptr) != 0 || status != 0)
    return Ref();
  Ref l = NewSock(Kind::kListener);
  l->port = port;
  l->registered_by = ProcessId();
  l->registered_in = SessionGeneration();
  return l;
}

void Unregister(Sock& l) {
  if (l.registered_by != ProcessId()) return;  // another process's session holds it
  ff::proto::SockUnlisten req{};
  req.port = l.port;
  (void)RouterPost(&req, sizeof(req));
}

// A listening socket on this pod's address (or any address) that TCP mode can serve.
bool ListenerPort(int fd, uint16_t* port) {
  sockaddr_in local{};
  if (!IsTcp(fd) || !LocalAddress(fd, &local)) return false;
  if (local.sin_addr.s_addr != INADDR_ANY && ntohl(local.sin_addr.s_addr) != OwnAddress())
    return false;
  *port = ntohs(local.sin_port);
  return *port != 0;
}

// A connection with a pod address the router's pod list does not hold (another node, a pod
// without the library) cannot be accelerated: no need to ask.
bool MayAccelerate(const sockaddr_in& peer) {
  return ListedPod(ntohl(peer.sin_addr.s_addr)) != ff::PodListed::kNo;
}

// An accepted connection is accelerated only when the router made a record for it, which the
// pod's tables show without a round trip.
bool MayBeClaimed(uint16_t port, const sockaddr_in& peer) {
  return AcceptedFrom(ntohl(peer.sin_addr.s_addr), ntohs(peer.sin_port), port) !=
         ff::PodListed::kNo;
}

void ClaimAccepted(Sock& l, int nfd, const sockaddr_in& peer) {
  Ref s;
  if (MayBeClaimed(l.port, peer))
    s = AskForStream<ff::proto::SockClaim>(peer.sin_addr.s_addr, l.port, ntohs(peer.sin_port));
  // The registration must be this process's, in its current session: one inherited (fork,
  // exec; the process that made it may be gone) or made before the router restarted is made
  // again, so that the next connections are accelerated.
  if (l.registered_by != ProcessId() || l.registered_in != SessionGeneration()) {
    if (Ref again = RegisterListener(l.port)) {
      l.registered_by = again->registered_by;
      l.registered_in = again->registered_in;
    }
  }
  if (s) {
    NoteFlags(*s, nfd);
    Install(nfd, s.get());
    TagStream(nfd, *s);
    EpollStreamCreated(nfd, s.get());
  }
}

// The program gave up descriptor `fd`, which named `s`.
void Forget(int fd, Ref slot) {
  Sock* s = slot.get();
  if (s == nullptr) return;
  // Last descriptor of it in this process: this Ref and nothing else.
  if (s->refs.load() == 1) {
    if (s->kind == Kind::kStream) {
      NoteDialedEnd(*s);
      StreamRelease(*s, fd);
      TellClosed(*s);
    }
    if (s->kind == Kind::kListener) Unregister(*s);
  }
}

// connect() decided `fd` for good without a stream: kernel TCP, whatever its outcome.
void Settle(int fd) {
  if (!MayBecomeStream(fd)) return;
  SetMayBecomeStream(fd, false);
  EpollKernelSocket(fd);
}

// dup2/dup3 are about to make `fd2` a copy of `fd`: when `fd` is open (the call will
// succeed), what `fd2` was is closed first, as close() would.
void Replacing(int fd, int fd2) {
  if (fd == fd2 || (!MaybeBell(fd2) && !EpollShadowsExist())) return;
  if (real::fcntl_int(fd, F_GETFD, 0) < 0) return;
  DisownBell(fd2);
  EpollClosing(fd2, fd2);
}

// After dup2/dup3 made `fd2` a copy of `fd`: `fd2` names what `fd` names (or nothing), and
// what it named before is given up.
void FollowDup(int fd, int fd2) {
  SetMayBecomeStream(fd2, MayBecomeStream(fd));
  Ref s = Lookup(fd);
  Ref old = s ? Install(fd2, s.get()) : Detach(fd2);
  Forget(fd2, std::move(old));
}

}  // namespace
}  // namespace ff::fsocket

using namespace ff::fsocket;

extern "C" {

FFS_EXPORT int socket(int domain, int type, int protocol) {
  const int fd = real::socket(domain, type, protocol);
  if (fd >= 0 && (domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM &&
      (protocol == 0 || protocol == IPPROTO_TCP))
    SetMayBecomeStream(fd, true);
  return fd;
}

FFS_EXPORT int connect(int fd, const sockaddr* addr, socklen_t len) {
  // A socket an epoll set may hold without the library following it (this process did not
  // see it made) stays kernel TCP: a stream's readiness would never reach that set.
  const bool followed = MayBecomeStream(fd) || !EpollShadowsExist();
  if (!GetConfig().enabled || addr == nullptr || len < sizeof(sockaddr_in) ||
      (addr->sa_family != AF_INET && addr->sa_family != AF_INET6) ||
      len > sizeof(sockaddr_storage)) {
    Settle(fd);
    return real::connect(fd, addr, len);
  }
  sockaddr_storage st{};
  std::memcpy(&st, addr, len);
  sockaddr_in dst{};
  Ref s;
  if (AsV4(st, &dst) && InOverlay(ntohl(dst.sin_addr.s_addr))) {
    SavedErrno keep;
    const Dial dial = followed && MayAccelerate(dst) ? DialKind(dst.sin_addr.s_addr, dst.sin_port)
                                                     : Dial::kKernel;
    if (dial != Dial::kKernel) s = PrepareConnect(fd, dst);
    if (!s && dial == Dial::kLook) LookNotMade(dst.sin_addr.s_addr, dst.sin_port);
    if (s) {
      NoteDialed(*s, dial == Dial::kLook);
      s->state.store(StreamState::kConnecting);
      NoteFlags(*s, fd);
      Install(fd, s.get());
      TagStream(fd, *s);
      EpollStreamCreated(fd, s.get());
      SetMayBecomeStream(fd, false);  // after the stream is there (epoll.cc, Ctl)
    }
  }
  if (!s) Settle(fd);
  const int rc = real::connect(fd, addr, len);
  if (!s) return rc;
  const int e = errno;
  if (rc == 0) {
    StreamOpened(*s, fd);
  } else if (e != EINPROGRESS && e != EINTR) {
    Detach(fd);
    ReleaseRecord(fd, dst);
    if (s->look) LookNotMade(dst.sin_addr.s_addr, dst.sin_port);
  }
  errno = e;
  return rc;
}

FFS_EXPORT int listen(int fd, int backlog) {
  const int rc = real::listen(fd, backlog);
  if (rc != 0 || !GetConfig().enabled) return rc;
  SavedErrno keep;
  SetMayBecomeStream(fd, false);
  if (Lookup(fd)) return rc;  // listening again: a new backlog only
  uint16_t port = 0;
  if (!ListenerPort(fd, &port)) return rc;
  if (Ref l = RegisterListener(port)) Install(fd, l.get());
  return rc;
}

FFS_EXPORT int accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  Ref l = Lookup(fd);
  if (!l || l->kind != Kind::kListener) return real::accept4(fd, addr, len, flags);
  sockaddr_storage st{};
  socklen_t plen = sizeof(st);
  const int nfd = real::accept4(fd, reinterpret_cast<sockaddr*>(&st), &plen, flags);
  if (nfd < 0) return nfd;
  if (addr != nullptr && len != nullptr) {
    std::memcpy(addr, &st, std::min<socklen_t>(*len, std::min<socklen_t>(plen, sizeof(st))));
    *len = plen;
  }
  SavedErrno keep;
  sockaddr_in peer{};
  if (AsV4(st, &peer) && InOverlay(ntohl(peer.sin_addr.s_addr))) ClaimAccepted(*l, nfd, peer);
  return nfd;
}

FFS_EXPORT int accept(int fd, sockaddr* addr, socklen_t* len) { return accept4(fd, addr, len, 0); }

FFS_EXPORT int close(int fd) {
  SetMayBecomeStream(fd, false);  // before the number can be another socket's
  DisownBell(fd);
  EpollClosing(fd, fd);
  Ref slot = Detach(fd);
  if (!slot) return real::close(fd);
  Forget(fd, std::move(slot));
  return real::close(fd);
}

FFS_EXPORT int dup(int fd) {
  const int n = real::dup(fd);
  if (n >= 0) {
    SetMayBecomeStream(n, MayBecomeStream(fd));
    if (Ref s = Lookup(fd)) Install(n, s.get());
  }
  return n;
}

FFS_EXPORT int dup3(int fd, int fd2, int flags) {
  Replacing(fd, fd2);
  const int n = real::dup3(fd, fd2, flags);
  if (n >= 0) FollowDup(fd, fd2);
  return n;
}

FFS_EXPORT int dup2(int fd, int fd2) {
  Replacing(fd, fd2);
  const int n = real::dup2(fd, fd2);
  if (n >= 0 && fd != fd2) FollowDup(fd, fd2);
  return n;
}

FFS_EXPORT int fcntl(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  static auto next = reinterpret_cast<int (*)(int, int, ...)>(real::Next("fcntl"));
  const int rc = next(fd, cmd, arg);
  if (rc >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)) {
    SetMayBecomeStream(rc, MayBecomeStream(fd));
    if (Ref s = Lookup(fd)) Install(rc, s.get());
  }
  if (rc == 0 && cmd == F_SETFL) {
    if (Ref s = Lookup(fd); s && s->kind == Kind::kStream)
      s->nonblock.store((reinterpret_cast<uintptr_t>(arg) & O_NONBLOCK) != 0);
  }
  return rc;
}

FFS_EXPORT int fcntl64(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  return fcntl(fd, cmd, arg);
}

FFS_EXPORT int shutdown(int fd, int how) {
  const int rc = real::shutdown(fd, how);
  if (rc == 0) {
    if (Ref s = Lookup(fd); s && s->kind == Kind::kStream) StreamShutdown(*s, how);
  }
  return rc;
}

FFS_EXPORT int close_range(unsigned lo, unsigned hi, int flags) {
  if (!(flags & CLOSE_RANGE_CLOEXEC)) {
    const int bottom = static_cast<int>(std::min(lo, 0x7fffffffu));
    const int top = hi > 0x7fffffffu ? -1 : static_cast<int>(hi);
    SettleRange(bottom, top);
    DisownBellsIn(bottom, top);
    EpollClosing(bottom, top);
    for (int fd : SlotsIn(bottom, top)) Forget(fd, Detach(fd));
  }
  // libc's syscall(2) itself, with every argument it reads given (this library's own
  // syscall interposer reads six).
  static auto next = reinterpret_cast<long (*)(long, ...)>(real::Next("syscall"));
  return static_cast<int>(next(SYS_close_range, static_cast<long>(lo), static_cast<long>(hi),
                               static_cast<long>(flags), 0L, 0L, 0L));
}

FFS_EXPORT void closefrom(int lo) {
  SettleRange(lo, -1);
  DisownBellsIn(lo, -1);
  EpollClosing(lo, -1);
  for (int fd : SlotsIn(lo, -1)) Forget(fd, Detach(fd));
  static auto next = reinterpret_cast<void (*)(int)>(real::Next("closefrom"));
  if (next != nullptr) next(lo);
}

}  // extern "C"

namespace ff::fsocket {

namespace {

// An inherited socket whose bytes were in a segment: the segment again, or a clean end.
void AdoptStream(int fd) {
  sockaddr_in local{}, peer{};
  Ref s;
  if (LocalAddress(fd, &local) && PeerAddress(fd, &peer))
    s = AskForStream<ff::proto::SockClaim>(peer.sin_addr.s_addr, ntohs(local.sin_port),
                                           ntohs(peer.sin_port));
  if (s) {
    NoteFlags(*s, fd);
    Install(fd, s.get());
    return;
  }
  // Its bells would read as data: end it instead, as a reset would.
  LogError(
      "descriptor %d is a TCP-mode connection the router no longer knows (restarted?): "
      "shut down",
      fd);
  (void)real::shutdown(fd, SHUT_RDWR);
}

}  // namespace

// At load (after exec): sockets this process inherited. A listening socket on this pod's
// address is registered; a connection to a pod whose record the router still has is a
// stream again. Costs one look at /proc/self/fd when there is nothing to find.
void AdoptInherited() {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return;
  std::vector<int> fds;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && fd != ::dirfd(d)) fds.push_back(static_cast<int>(fd));
  }
  ::closedir(d);
  for (int fd : fds) {
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode) || !IsTcp(fd) || Lookup(fd)) continue;
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (real::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0) continue;
    if (listening) {
      uint16_t port = 0;
      if (ListenerPort(fd, &port)) {
        if (Ref l = RegisterListener(port)) Install(fd, l.get());
      }
      continue;
    }
    if (IsTaggedStream(fd)) {
      AdoptStream(fd);
    } else if (Unconnected(fd)) {
      SetMayBecomeStream(fd, true);  // as if made here: connect() may make it a stream
    }
  }
}

}  // namespace ff::fsocket

extern "C" {

// A process that confines itself with seccomp becomes restricted (sock.h).
FFS_EXPORT int prctl(int option, ...) {
  va_list ap;
  va_start(ap, option);
  unsigned long a[4];
  for (auto& v : a) v = va_arg(ap, unsigned long);
  va_end(ap);
  if (option == PR_SET_SECCOMP) SetRestricted();
  static auto next = reinterpret_cast<int (*)(int, ...)>(real::Next("prctl"));
  return next(option, a[0], a[1], a[2], a[3]);
}

FFS_EXPORT long syscall(long number, ...) {
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (auto& v : a) v = va_arg(ap, long);
  va_end(ap);
  if (number == SYS_seccomp) SetRestricted();
  static auto next = reinterpret_cast<long (*)(long, ...)>(real::Next("syscall"));
  return next(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

}  // extern "C"
