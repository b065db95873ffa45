#include "freeflow/fd.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "freeflow/tunables.h"

namespace ff {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) {
    const int saved = errno;
    ::close(fd_);
    errno = saved;
  }
  fd_ = fd;
}

void Mapping::reset() {
  if (addr_ != nullptr) {
    const int saved = errno;
    ::munmap(addr_, len_);
    errno = saved;
  }
  addr_ = nullptr;
  len_ = 0;
}

int CreateSegment(const char* name, size_t size, UniqueFd* out) {
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return errno;
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) return errno;
  // Peers map the segment at this size: forbid shrinking it under them (SIGBUS).
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) return errno;
  *out = std::move(fd);
  return 0;
}

int MapSegment(int fd, size_t size, bool writable, Mapping* out) {
  const int prot = PROT_READ | (writable ? PROT_WRITE : 0);
  void* p = ::mmap(nullptr, size, prot, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return errno;
  *out = Mapping(p, size);
  return 0;
}

int MapPeerSegment(int fd, size_t size, bool writable, Mapping* out) {
  if (!SealedAtLeast(fd, size)) return EINVAL;
  return MapSegment(fd, size, writable, out);
}

bool SealedAtLeast(int fd, uint64_t bytes) {
  // The seal first: once it is there the size can only grow, so the check below holds.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) return false;
  uint64_t have = 0;
  return SegmentSize(fd, &have) == 0 && have >= bytes;
}

bool RouterTableAtLeast(int fd, uint64_t bytes) {
  return SealedAtLeast(fd, bytes) || ReadOnlyView(fd, bytes);
}

bool ReadOnlyView(int fd, uint64_t bytes) {
  struct stat st {};
  struct statfs fs {};
  struct statvfs vfs {};
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && (flags & O_ACCMODE) == O_RDONLY && ::fstat(fd, &st) == 0 &&
         S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) >= bytes &&
         ::fstatfs(fd, &fs) == 0 && fs.f_type == TMPFS_MAGIC && ::fstatvfs(fd, &vfs) == 0 &&
         (vfs.f_flag & ST_RDONLY) != 0;
}

int MapRouterTable(int fd, size_t size, Mapping* out) {
  if (!RouterTableAtLeast(fd, size)) return EINVAL;
  return MapSegment(fd, size, false, out);
}

bool SealedReadOnly(int fd) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  return seals >= 0 && (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0;
}

int SealReadOnly(int fd) { return ::fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) == 0 ? 0 : errno; }

int FreezeSeals(int fd) {
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL) == 0) return 0;
  const int rc = errno;
  return rc == EPERM && SealsFrozen(fd) ? 0 : rc;
}

bool SealsFrozen(int fd) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  return seals < 0 || (seals & F_SEAL_SEAL) != 0;
}

int CreateWakePair(UniqueFd* rx, UniqueFd* tx, bool rx_nonblocking) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv) != 0) return errno;
  rx->reset(sv[0]);
  tx->reset(sv[1]);
  // Both ends non-blocking where it matters: the sender always passes MSG_DONTWAIT anyway.
  if (rx_nonblocking && ::fcntl(sv[0], F_SETFL, O_NONBLOCK) != 0) return errno;
  return ::fcntl(sv[1], F_SETFL, O_NONBLOCK) == 0 ? 0 : errno;
}

void SendWake(int tx) {
  const char one = 1;
  [[maybe_unused]] ssize_t n = ::send(tx, &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

int DrainWakes(int rx) {
  char buf[16];
  int n = 0;
  // Bounded: wakers are at most a queue's worth ahead, and more only means more wakes.
  for (int i = 0; i < kMaxWakeDrain; ++i) {
    const ssize_t r = ::recv(rx, buf, sizeof(buf), MSG_DONTWAIT);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    ++n;
  }
  return n;
}

int WaitForWakes(int rx) {
  constexpr int kBatch = 16;
  char bytes[kBatch];
  iovec iov[kBatch];
  mmsghdr msgs[kBatch] = {};
  for (int i = 0; i < kBatch; ++i) {
    iov[i] = iovec{&bytes[i], 1};
    msgs[i].msg_hdr.msg_iov = &iov[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
  }
  // MSG_WAITFORONE: blocks for the first datagram only; the rest are taken if present.
  if (::recvmmsg(rx, msgs, kBatch, MSG_WAITFORONE, nullptr) < 0) return errno;
  return 0;
}

bool IsWakeSocket(int fd) {
  int domain = 0;
  int type = 0;
  socklen_t dl = sizeof(domain);
  socklen_t tl = sizeof(type);
  return ::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &dl) == 0 &&
         ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 && domain == AF_UNIX &&
         type == SOCK_DGRAM;
}

int SegmentSize(int fd, uint64_t* size) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno;
  *size = static_cast<uint64_t>(st.st_size);
  return 0;
}

int SendWithFds(int sock, const void* buf, size_t len, const int* fds, int nfds, int flags) {
  struct iovec iov {
    const_cast<void*>(buf), len
  };
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 16)];
  if (nfds > 16) return EINVAL;
  if (nfds > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  for (;;) {
    const ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL | flags);
    if (n >= 0) return n == static_cast<ssize_t>(len) ? 0 : EMSGSIZE;
    if (errno != EINTR) return errno;
  }
}

int RecvWithFds(int sock, void* buf, size_t cap, UniqueFd* fds, int max_fds, int* nfds, size_t* len,
                int flags) {
  struct iovec iov {
    buf, cap
  };
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 16)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  for (;;) {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | flags);
    if (n >= 0) break;
    if (errno != EINTR) return errno;
  }
  int got = 0;
  bool overflow = false;
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const int count = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    for (int i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (got < max_fds) {
        fds[got++].reset(fd);
      } else {
        ::close(fd);
        overflow = true;
      }
    }
  }
  *nfds = got;
  if (overflow || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    for (int i = 0; i < got; ++i) fds[i].reset();
    *nfds = 0;
    return EMSGSIZE;
  }
  *len = static_cast<size_t>(n);
  return 0;
}

}  // namespace ff
