#include "real.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "freeflow/preload/interpose.h"

namespace ff::fsocket::real {

void* Next(const char* name) { return ff::preload::Next(name); }

// One forwarding function per name: -1 with ENOSYS when libc has none (never on glibc).
#define FFS_ARGS(...) __VA_ARGS__
#define FFS_REAL(ret, name, params, args)                     \
  ret name params {                                           \
    using Fn = ret(*) params;                                 \
    static std::atomic<Fn> slot{};                            \
    return ff::preload::CallNext(slot, #name, FFS_ARGS args); \
  }

FFS_REAL(int, socket, (int domain, int type, int protocol), (domain, type, protocol))
FFS_REAL(int, connect, (int fd, const sockaddr* addr, socklen_t len), (fd, addr, len))
FFS_REAL(int, bind, (int fd, const sockaddr* addr, socklen_t len), (fd, addr, len))
FFS_REAL(int, listen, (int fd, int backlog), (fd, backlog))
FFS_REAL(int, accept4, (int fd, sockaddr* addr, socklen_t* len, int flags), (fd, addr, len, flags))
FFS_REAL(int, close, (int fd), (fd))
FFS_REAL(int, dup, (int fd), (fd))
FFS_REAL(int, dup2, (int fd, int fd2), (fd, fd2))
FFS_REAL(int, dup3, (int fd, int fd2, int flags), (fd, fd2, flags))
FFS_REAL(int, shutdown, (int fd, int how), (fd, how))
FFS_REAL(ssize_t, recv, (int fd, void* buf, size_t len, int flags), (fd, buf, len, flags))
FFS_REAL(ssize_t, send, (int fd, const void* buf, size_t len, int flags), (fd, buf, len, flags))
FFS_REAL(ssize_t, read, (int fd, void* buf, size_t len), (fd, buf, len))
FFS_REAL(ssize_t, write, (int fd, const void* buf, size_t len), (fd, buf, len))
FFS_REAL(int, poll, (pollfd * fds, nfds_t n, int timeout), (fds, n, timeout))
FFS_REAL(int, ppoll, (pollfd * fds, nfds_t n, const timespec* timeout, const sigset_t* mask),
         (fds, n, timeout, mask))
FFS_REAL(int, epoll_ctl, (int epfd, int op, int fd, epoll_event* ev), (epfd, op, fd, ev))
FFS_REAL(int, epoll_wait, (int epfd, epoll_event* evs, int max, int timeout),
         (epfd, evs, max, timeout))
FFS_REAL(int, epoll_pwait, (int epfd, epoll_event* evs, int max, int timeout, const sigset_t* mask),
         (epfd, evs, max, timeout, mask))
FFS_REAL(int, getsockopt, (int fd, int level, int name, void* val, socklen_t* len),
         (fd, level, name, val, len))
FFS_REAL(int, setsockopt, (int fd, int level, int name, const void* val, socklen_t len),
         (fd, level, name, val, len))
FFS_REAL(int, getsockname, (int fd, sockaddr* addr, socklen_t* len), (fd, addr, len))
FFS_REAL(int, getpeername, (int fd, sockaddr* addr, socklen_t* len), (fd, addr, len))
FFS_REAL(int, sigaction, (int sig, const struct sigaction* act, struct sigaction* old),
         (sig, act, old))

#undef FFS_REAL
#undef FFS_ARGS

// fcntl is variadic; the commands the library passes on take an int (or nothing).
int fcntl_int(int fd, int cmd, int arg) {
  static std::atomic<int (*)(int, int, ...)> slot{};
  auto fn = ff::preload::ResolveNext(slot, "fcntl");
  if (fn == nullptr) return static_cast<int>(::syscall(SYS_fcntl, fd, cmd, arg));
  return fn(fd, cmd, arg);
}

}  // namespace ff::fsocket::real
