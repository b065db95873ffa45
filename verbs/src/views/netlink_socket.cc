// An RDMA netlink socket where the kernel has none: when socket(AF_NETLINK, ...,
// NETLINK_RDMA) fails because the kernel has no RDMA stack, the program gets a Unix datagram
// socket instead, and the library plays the kernel's side of it (netlink_view.h). Each
// request a program sends is answered at once: the answer's datagrams are sent to the
// socket's own (autobound, abstract) address from a throw-away socket, so the program reads
// them with its ordinary recv calls, blocking, polling or peeking as it likes, and nothing
// stays open in the library when it closes the socket.
//
// Interposed: socket, bind and getsockname (a netlink address: family AF_NETLINK, the
// socket's port id), setsockopt at SOL_NETLINK (accepted), sendto, send and sendmsg (the
// requests), recvfrom and recvmsg (the sender's address reads as the kernel's, port id 0).
// The library's sockets are told from others by the descriptor number they were made at (a
// bit per number, base/fd_marks.h, as rdma_cm descriptors are), then by the socket file's
// identity: any other descriptor costs one load and one compare per call, never a system
// call. (An fstat per call cost every send of a process that had such a socket, the library's
// own direct-path sends included, one more system call: librdmacm opens one at start-up.)
// The close family (rdmacm/cm_device.cc) unmarks a number it releases, so a socket that
// takes the number of a closed one is not looked at either; only a number past
// ff::kCmFastFds stays looked at (by identity) once the library made a socket there. A
// dup() of one of the library's sockets is not recognised as one.
#include <fcntl.h>
#include <linux/netlink.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "base/exports.h"
#include "base/fd_marks.h"
#include "base/log.h"
#include "freeflow/preload/interpose.h"
#include "rdmacm/cm_device.h"
#include "views/device_facts.h"
#include "views/netlink_view.h"

namespace ff::verbs {
namespace {

constexpr size_t kMaxSockets = 256;  // remembered at once; the oldest are forgotten first

struct NetlinkSocket {
  dev_t dev;
  uint32_t portid;
  sockaddr_un addr;  // its abstract address
  socklen_t addr_len;
  uint64_t order;
};

// Never destroyed: the interposers may run during exit, after static destructors.
std::mutex g_mu;                           // guards the two below
std::map<ino_t, NetlinkSocket>& g_sockets =  // by the socket file's inode
    *new std::map<ino_t, NetlinkSocket>;
uint64_t g_made = 0;
// Read once, when the first request came, under a lock of its own: reading opens the
// router session, whose sockets pass through the interposers below.
std::mutex g_facts_mu;
std::unique_ptr<DeviceFacts>& g_facts = *new std::unique_ptr<DeviceFacts>;

std::atomic<int (*)(int, int, int)> g_socket{nullptr};
std::atomic<int (*)(int, const sockaddr*, socklen_t)> g_bind{nullptr};
std::atomic<int (*)(int, sockaddr*, socklen_t*)> g_getsockname{nullptr};
std::atomic<ssize_t (*)(int, const void*, size_t, int, const sockaddr*, socklen_t)> g_sendto{
    nullptr};

// The library's socket behind `fd`, if it is one.
bool Find(int fd, NetlinkSocket* out) {
  if (!g_library_fds.Maybe(fd, FdKind::kNetlink)) return false;
  struct stat st {};
  if (::syscall(SYS_fstat, fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  std::lock_guard<std::mutex> l(g_mu);
  const auto it = g_sockets.find(st.st_ino);
  if (it == g_sockets.end() || it->second.dev != st.st_dev) return false;
  *out = it->second;
  return true;
}

// The port id the kernel's autobind gives: the process id first, then negative numbers.
uint32_t NextPortId() {
  static std::atomic<int32_t> next{0};
  const int32_t n = next.fetch_sub(1);
  return n == 0 ? static_cast<uint32_t>(::getpid()) : static_cast<uint32_t>(-4096 + n);
}

int MakeSocket(int type) {
  const int flags = type & (SOCK_NONBLOCK | SOCK_CLOEXEC);
  const int fd = ff::preload::CallNext(g_socket, "socket", AF_UNIX, SOCK_DGRAM | flags, 0);
  if (fd < 0) return -1;
  NetlinkSocket s{};
  s.addr.sun_family = AF_UNIX;
  s.addr_len = sizeof(s.addr);
  struct stat st {};
  if (ff::preload::CallNext(g_bind, "bind", fd, reinterpret_cast<const sockaddr*>(&s.addr),
                            static_cast<socklen_t>(sizeof(sa_family_t))) != 0 ||
      ff::preload::CallNext(g_getsockname, "getsockname", fd, reinterpret_cast<sockaddr*>(&s.addr),
                            &s.addr_len) != 0 ||
      ::syscall(SYS_fstat, fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  s.dev = st.st_dev;
  s.portid = NextPortId();
  {
    std::lock_guard<std::mutex> l(g_mu);
    s.order = ++g_made;
    if (g_sockets.size() >= kMaxSockets) {
      auto oldest = g_sockets.begin();
      for (auto it = g_sockets.begin(); it != g_sockets.end(); ++it)
        if (it->second.order < oldest->second.order) oldest = it;
      g_sockets.erase(oldest);
    }
    g_sockets[st.st_ino] = s;
  }
  // Marked under the lock the close family releases marks under: a close of this number
  // by another thread that has not released its marks yet cannot unmark it after us.
  LockCmTable();
  g_library_fds.Set(fd, FdKind::kNetlink, true);
  UnlockCmTable();
  return fd;
}

// The device's facts, read on the first request (nullptr: no device, e.g. no router; asked
// again next time).
const DeviceFacts* Facts() {
  std::lock_guard<std::mutex> l(g_facts_mu);
  if (g_facts == nullptr) {
    auto f = std::make_unique<DeviceFacts>();
    if (QueryDeviceFacts(f.get())) g_facts = std::move(f);
  }
  return g_facts.get();
}

// Answers a request sent on `s`: the datagrams go to its address.
ssize_t Serve(const NetlinkSocket& s, const void* buf, size_t len) {
  if (buf == nullptr && len != 0) {
    errno = EFAULT;
    return -1;
  }
  std::vector<std::string> answer;
  if (Guarded([&] {
        answer = AnswerNetlink(Facts(), buf, len, s.portid);
        return 0;
      }) != 0) {
    errno = ENOBUFS;
    return -1;
  }
  const int out = ff::preload::CallNext(g_socket, "socket", AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (out < 0) {
    errno = ENOBUFS;
    return -1;
  }
  for (const std::string& d : answer) {
    if (ff::preload::CallNext(g_sendto, "sendto", out, static_cast<const void*>(d.data()), d.size(),
                              MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(&s.addr),
                              s.addr_len) < 0) {
      LogDebug("an RDMA netlink answer was dropped: %s", std::strerror(errno));
      break;  // a receive queue the program does not read: the kernel drops as well
    }
  }
  ::close(out);
  return static_cast<ssize_t>(len);
}

// The kernel as the sender of what a program reads, into its buffer of `room` bytes.
void KernelAddress(sockaddr* addr, socklen_t room, socklen_t* len) {
  if (addr == nullptr || len == nullptr) return;
  sockaddr_nl nl{};
  nl.nl_family = AF_NETLINK;
  std::memcpy(addr, &nl, room < sizeof(nl) ? room : sizeof(nl));
  *len = sizeof(nl);
}

}  // namespace
}  // namespace ff::verbs

using ff::verbs::NetlinkSocket;

extern "C" {

FFV_EXPORT int socket(int domain, int type, int protocol) noexcept {
  const int saved = errno;
  const int fd = ff::preload::CallNext(ff::verbs::g_socket, "socket", domain, type, protocol);
  if (fd >= 0 || domain != AF_NETLINK || protocol != NETLINK_RDMA) return fd;
  if (errno != EPROTONOSUPPORT && errno != EAFNOSUPPORT) return fd;
  const int err = errno;
  const int ours = ff::verbs::MakeSocket(type);
  errno = ours >= 0 ? saved : err;
  return ours >= 0 ? ours : fd;
}

FFV_EXPORT int bind(int fd, const sockaddr* addr, socklen_t len) noexcept {
  NetlinkSocket s;
  if (!ff::verbs::Find(fd, &s))
    return ff::preload::CallNext(ff::verbs::g_bind, "bind", fd, addr, len);
  if (addr == nullptr || len < sizeof(sockaddr_nl) || addr->sa_family != AF_NETLINK) {
    errno = EINVAL;
    return -1;
  }
  return 0;  // the port id stays the one the socket was given, as after an autobind
}

FFV_EXPORT int getsockname(int fd, sockaddr* addr, socklen_t* len) noexcept {
  NetlinkSocket s;
  if (!ff::verbs::Find(fd, &s))
    return ff::preload::CallNext(ff::verbs::g_getsockname, "getsockname", fd, addr, len);
  if (addr == nullptr || len == nullptr) {
    errno = EFAULT;
    return -1;
  }
  sockaddr_nl nl{};
  nl.nl_family = AF_NETLINK;
  nl.nl_pid = s.portid;
  std::memcpy(addr, &nl, *len < sizeof(nl) ? *len : sizeof(nl));
  *len = sizeof(nl);
  return 0;
}

FFV_EXPORT int setsockopt(int fd, int level, int name, const void* value, socklen_t len) noexcept {
  static std::atomic<int (*)(int, int, int, const void*, socklen_t)> real{nullptr};
  NetlinkSocket s;
  if (level == SOL_NETLINK && ff::verbs::Find(fd, &s)) return 0;
  return ff::preload::CallNext(real, "setsockopt", fd, level, name, value, len);
}

FFV_EXPORT ssize_t sendto(int fd, const void* buf, size_t len, int flags, const sockaddr* to,
                          socklen_t to_len) {
  NetlinkSocket s;
  if (ff::verbs::Find(fd, &s)) return ff::verbs::Serve(s, buf, len);
  return ff::preload::CallNext(ff::verbs::g_sendto, "sendto", fd, buf, len, flags, to, to_len);
}

FFV_EXPORT ssize_t send(int fd, const void* buf, size_t len, int flags) {
  static std::atomic<ssize_t (*)(int, const void*, size_t, int)> real{nullptr};
  NetlinkSocket s;
  if (ff::verbs::Find(fd, &s)) return ff::verbs::Serve(s, buf, len);
  return ff::preload::CallNext(real, "send", fd, buf, len, flags);
}

FFV_EXPORT ssize_t sendmsg(int fd, const msghdr* msg, int flags) {
  static std::atomic<ssize_t (*)(int, const msghdr*, int)> real{nullptr};
  NetlinkSocket s;
  if (!ff::verbs::Find(fd, &s)) return ff::preload::CallNext(real, "sendmsg", fd, msg, flags);
  if (msg == nullptr || (msg->msg_iovlen != 0 && msg->msg_iov == nullptr)) {
    errno = EFAULT;
    return -1;
  }
  std::string request;
  for (size_t i = 0; i < msg->msg_iovlen; ++i)
    request.append(static_cast<const char*>(msg->msg_iov[i].iov_base), msg->msg_iov[i].iov_len);
  return ff::verbs::Serve(s, request.data(), request.size());
}

FFV_EXPORT ssize_t recvfrom(int fd, void* buf, size_t len, int flags, sockaddr* from,
                            socklen_t* from_len) {
  static std::atomic<ssize_t (*)(int, void*, size_t, int, sockaddr*, socklen_t*)> real{nullptr};
  const socklen_t room = from_len != nullptr ? *from_len : 0;
  const ssize_t n = ff::preload::CallNext(real, "recvfrom", fd, buf, len, flags, from, from_len);
  NetlinkSocket s;
  if (n >= 0 && from != nullptr && ff::verbs::Find(fd, &s))
    ff::verbs::KernelAddress(from, room, from_len);
  return n;
}

FFV_EXPORT ssize_t recvmsg(int fd, msghdr* msg, int flags) {
  static std::atomic<ssize_t (*)(int, msghdr*, int)> real{nullptr};
  const socklen_t room = msg != nullptr ? msg->msg_namelen : 0;
  const ssize_t n = ff::preload::CallNext(real, "recvmsg", fd, msg, flags);
  NetlinkSocket s;
  if (n >= 0 && msg != nullptr && msg->msg_name != nullptr && ff::verbs::Find(fd, &s))
    ff::verbs::KernelAddress(static_cast<sockaddr*>(msg->msg_name), room, &msg->msg_namelen);
  return n;
}

}  // extern "C"
