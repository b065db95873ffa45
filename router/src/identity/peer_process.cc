#include "identity/peer_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "freeflow/tunables.h"
#include "identity/netns_probe.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

namespace ff::router {
namespace {

std::string Why(const std::string& what, int err) { return what + ": " + std::strerror(err); }

int PidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// Signal 0 through the pidfd: succeeds while the process has not been reaped, that is while
// its pid cannot have been handed to another process.
bool Alive(int pidfd) { return ::syscall(SYS_pidfd_send_signal, pidfd, 0, nullptr, 0) == 0; }

// The UNIX_DIAG_PEER attribute of one sock_diag answer, or 0.
ino_t PeerAttribute(const nlmsghdr* h) {
  if (h->nlmsg_len < NLMSG_LENGTH(sizeof(unix_diag_msg))) return 0;
  const auto* a = reinterpret_cast<const rtattr*>(static_cast<const char*>(NLMSG_DATA(h)) +
                                                  NLMSG_ALIGN(sizeof(unix_diag_msg)));
  int len = static_cast<int>(h->nlmsg_len - NLMSG_LENGTH(sizeof(unix_diag_msg)));
  for (; RTA_OK(a, len); a = RTA_NEXT(a, len)) {
    if (a->rta_type == UNIX_DIAG_PEER && RTA_PAYLOAD(a) >= sizeof(uint32_t)) {
      uint32_t ino = 0;
      std::memcpy(&ino, RTA_DATA(a), sizeof(ino));
      return ino;
    }
  }
  return 0;
}

// True when process `pid` has the socket `inode` among its descriptors. readlink() names a
// descriptor without touching the file behind it, so a descriptor on a hung file system
// cannot stall the router; at most kMaxPeerFdScan descriptors are looked at.
bool HoldsSocket(pid_t pid, ino_t inode, std::string* error) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    *error = Why("cannot list the client's descriptors in " + dir, errno);
    return false;
  }
  const std::string want = "socket:[" + std::to_string(inode) + "]";
  bool found = false;
  size_t seen = 0;
  for (dirent* e = ::readdir(d); e != nullptr && !found && seen < kMaxPeerFdScan;
       e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    ++seen;
    char target[64];
    const ssize_t n = ::readlinkat(::dirfd(d), e->d_name, target, sizeof(target));
    found = n > 0 && std::string_view(target, static_cast<size_t>(n)) == want;
  }
  ::closedir(d);
  if (!found) {
    *error = "process " + std::to_string(pid) +
             " does not hold the other end of the connection (its pid was reused?)";
  }
  return found;
}

// Pins the process behind the pid of SO_PEERCRED (no SO_PEERPIDFD): see the header.
bool PinByPid(int sock, PeerProcess* out, std::string* error) {
  UniqueFd pidfd(PidfdOpen(out->pid));
  if (!pidfd) {
    *error = errno == ENOSYS ? std::string(
                                   "this kernel has neither SO_PEERPIDFD nor pidfd_open "
                                   "(Linux >= 5.3): clients cannot be identified safely")
                             : Why("cannot open the client's process", errno);
    return false;
  }
  const ino_t peer = PeerSocketInode(sock, error);
  if (peer == 0 || !HoldsSocket(out->pid, peer, error)) return false;
  const std::string ns = "/proc/" + std::to_string(out->pid) + "/ns/net";
  out->netns.reset(::open(ns.c_str(), O_RDONLY | O_CLOEXEC));
  if (!out->netns) {
    *error = Why("cannot open " + ns, errno);
    return false;
  }
  if (!Alive(pidfd.get())) {
    *error = "the client's process exited while it was being identified";
    return false;
  }
  out->pidfd = std::move(pidfd);
  return true;
}

}  // namespace

ino_t PeerSocketInode(int sock, std::string* error) {
  struct stat st {};
  if (::fstat(sock, &st) != 0) {
    *error = Why("cannot stat the client's socket", errno);
    return 0;
  }
  UniqueFd nl = OpenNetlink(NETLINK_SOCK_DIAG, "a sock_diag socket", error);
  if (!nl) return 0;
  struct {
    nlmsghdr h;
    unix_diag_req r;
  } q{};
  q.h.nlmsg_len = sizeof(q);
  q.h.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  q.h.nlmsg_flags = NLM_F_REQUEST;
  q.r.sdiag_family = AF_UNIX;
  q.r.udiag_ino = static_cast<uint32_t>(st.st_ino);
  q.r.udiag_show = UDIAG_SHOW_PEER;
  q.r.udiag_cookie[0] = q.r.udiag_cookie[1] = ~0u;  // no cookie: look up by inode
  alignas(nlmsghdr) char buf[4096];
  ssize_t n = ::send(nl.get(), &q, sizeof(q), 0);
  if (n == static_cast<ssize_t>(sizeof(q))) n = ::recv(nl.get(), buf, sizeof(buf), 0);
  if (n <= 0) {
    *error = Why("sock_diag does not answer (is unix_diag available?)", n < 0 ? errno : EIO);
    return 0;
  }
  const auto* h = reinterpret_cast<const nlmsghdr*>(buf);
  int len = static_cast<int>(n);
  for (; NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
    if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY) {
      if (const ino_t peer = PeerAttribute(h)) return peer;
    }
  }
  *error = "sock_diag does not name the other end of the client's connection";
  return 0;
}

bool FindPeerProcess(int sock, bool use_peer_pidfd, PeerProcess* out, std::string* error) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    *error = Why("cannot read the client's credentials", errno);
    return false;
  }
  if (cred.pid <= 0) {
    *error = "the client's process is not visible in the router's pid namespace";
    return false;
  }
  out->pid = cred.pid;
  if (!use_peer_pidfd) return PinByPid(sock, out, error);
  int pidfd = -1;
  len = sizeof(pidfd);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) == 0 && pidfd >= 0) {
    out->pidfd.reset(pidfd);
    return true;
  }
  if (errno == ENOPROTOOPT) return PinByPid(sock, out, error);  // Linux < 6.5
  *error = Why("cannot read the client's pidfd", errno);
  return false;
}

}  // namespace ff::router
