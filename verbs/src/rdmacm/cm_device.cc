// Opening and closing /dev/infiniband/rdma_cm (cm_device.h): the open family serves exactly
// that path while this process has a router session, and the calls that release a
// descriptor number (close, dup2, dup3, close_range, closefrom) forget a channel whose
// number they release, so that a reused number is never taken for one. Every other call
// goes to libc's function (the next definition, freeflow/preload/interpose.h) after one compare.
//
// Not seen: dup()/fcntl(F_DUPFD) of a channel (the copy is a plain socket to the router;
// nothing known does it) and closes inside libc or by raw system call; a number such a
// close released is recognised as reused when it is next used (cmtable::Find compares the
// socket's inode).
#include "rdmacm/cm_device.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdarg>
#include <cstring>
#include <memory>

#include "base/exports.h"
#include "files/virtual_files.h"
#include "freeflow/preload/interpose.h"
#include "rdmacm/cm_channel.h"
#include "session/session.h"

namespace ff::verbs {
namespace {

std::atomic<bool> g_test_override{false};
std::atomic<Session*> g_test_session{nullptr};

// The session a new channel opens on: the process-wide one, replaced first when its router
// was lost (the program opens a new channel after DEVICE_REMOVAL). nullptr when this process
// never had one (`*had` false) or its router is not back.
Session* CmSession(bool* had) {
  if (g_test_override.load(std::memory_order_acquire)) {
    Session* s = g_test_session.load(std::memory_order_acquire);
    *had = s != nullptr;
    return s;
  }
  return LiveProcessSession(had);
}

bool IsDevicePath(const char* path) {
  return path != nullptr && std::strcmp(path, kCmDevicePath) == 0;
}

// One channel: the program's end of a socketpair in *out, the router's end handed over.
int OpenChannel(Session* s, int flags, int* out) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) return errno;
  UniqueFd mine(pair[0]), theirs(pair[1]);
  if ((flags & O_CLOEXEC) == 0 && ::fcntl(mine.get(), F_SETFD, 0) != 0) return errno;
  if ((flags & O_NONBLOCK) != 0 && ::fcntl(mine.get(), F_SETFL, O_NONBLOCK) != 0) return errno;
  ff::proto::CmOpenChannel req{};
  req.channel = s->next_id.fetch_add(1);
  const int fd = theirs.get();
  ff::proto::Response resp{};
  const int rc = s->Call(&req, sizeof(req), &fd, 1, &resp);
  if (rc != 0) {
    LogError("cannot open an rdma_cm channel at the router %s: %s", s->name.c_str(),
             std::strerror(rc));
    return rc == ENOTCONN ? ENODEV : rc;
  }
  auto ch = std::make_shared<CmChannel>();
  ch->session = s;
  ch->id = req.channel;
  ch->router_end = std::move(theirs);  // for the events the library writes (cm_commands.cc)
  *out = mine.release();
  s->on_router_lost.store(&cmtable::ShutDownChannelsOf, std::memory_order_release);
  cmtable::AddChannel(*out, std::move(ch));
  LogDebug("rdma_cm channel %u on descriptor %d", req.channel, *out);
  return 0;
}

// The open family's answer for `path`: true when it is the device and this process has a
// router (then *result is the descriptor or -1 with errno set), false to pass it through.
bool ServeOpen(const char* path, int flags, int* result) {
  if (!IsDevicePath(path)) return false;
  bool had = false;
  Session* s = CmSession(&had);
  if (s == nullptr && !had) return false;
  if (s == nullptr) {  // the device went with the router
    errno = ENODEV;
    *result = -1;
    return true;
  }
  int fd = -1;
  const int rc = Guarded([&] { return OpenChannel(s, flags, &fd); });
  if (rc != 0) {
    errno = rc;
    *result = -1;
  } else {
    *result = fd;
  }
  return true;
}

// open's mode argument is there only when the flags ask to create a file.
mode_t ModeArg(int flags, va_list ap) {
  const bool creates = (flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE;
  return creates ? static_cast<mode_t>(va_arg(ap, int)) : 0;
}

// Runs the real call that may release descriptor numbers [first, last] with the table
// locked, and forgets the channels there when it did (`released`), and the other kinds'
// marks there (an RDMA netlink socket's number, views/netlink_socket.cc, no longer costs
// whatever takes it next an fstat per send).
template <typename Call, typename Released>
auto Releasing(unsigned first, unsigned last, Call call, Released released) {
  cmtable::Lock();
  const auto rc = call();
  if (released(rc)) {
    cmtable::ForgetRangeLocked(first, last);
    g_library_fds.ClearLow(first, last, FdKind::kNetlink);
  }
  cmtable::Unlock();
  return rc;
}

// dup2/dup3 onto `newfd`: what the library had there is replaced when the call succeeds.
template <typename Call>
int Replacing(int newfd, Call call) {
  if (__builtin_expect(!MaybeLibraryFd(newfd), 1)) return call();
  const unsigned n = static_cast<unsigned>(newfd);
  return Releasing(n, n, call, [](int rc) { return rc >= 0; });
}

}  // namespace

bool IsCmFd(int fd) { return MaybeCmFd(fd) && cmtable::Find(fd) != nullptr; }

void UseCmSession(Session* s) {
  g_test_session.store(s, std::memory_order_release);
  g_test_override.store(true, std::memory_order_release);
}

void UseProcessCmSession() { g_test_override.store(false, std::memory_order_release); }

void LockCmTable() { cmtable::Lock(); }
void UnlockCmTable() { cmtable::Unlock(); }
void ForgetCmChannelsInChild() { cmtable::ForgetInChild(); }

}  // namespace ff::verbs

using ff::verbs::MaybeCmFd;

// The open family: one interposer per name, each with its own slot for libc's function.
// `params` is the parameter list (naming `path_arg`, `dirfd_arg` and `flags`), `dirfd` the
// directory argument, the rest the arguments to pass on; the variadic ones pass the mode on
// too. Where libc finds nothing, the virtual tree answers (files/virtual_files.h).
using OpenFn = int (*)(const char*, int, ...);
using OpenAtFn = int (*)(int, const char*, int, ...);
using Open2Fn = int (*)(const char*, int);
using OpenAt2Fn = int (*)(int, const char*, int);
#define FFV_OPEN_BODY(dirfd_arg, call)                                          \
  const ff::verbs::vfs::PathArg p(dirfd_arg, path_arg);                         \
  const char* const path = p.path();                                            \
  [[maybe_unused]] const int dirfd = p.dirfd();                                 \
  int fd;                                                                       \
  if (ff::verbs::ServeOpen(path, flags, &fd)) return fd;                        \
  const int saved = errno;                                                      \
  fd = call;                                                                    \
  if (fd >= 0) return fd;                                                       \
  const int err = errno;                                                        \
  errno = saved;                                                                \
  int served;                                                                   \
  if (ff::verbs::vfs::TryOpen(err, dirfd, path, flags, &served)) return served; \
  errno = err;                                                                  \
  return fd;
#define FFV_OPEN(name, fn_t, dirfd_arg, params, ...)                                \
  FFV_EXPORT int name params {                                                      \
    va_list ap;                                                                     \
    va_start(ap, flags);                                                            \
    const mode_t mode = ff::verbs::ModeArg(flags, ap);                              \
    va_end(ap);                                                                     \
    static std::atomic<fn_t> real{nullptr};                                         \
    FFV_OPEN_BODY(dirfd_arg, ff::preload::CallNext(real, #name, __VA_ARGS__, mode)) \
  }
// The fortified entry points (_FORTIFY_SOURCE with flags the compiler cannot see).
#define FFV_OPEN_2(name, fn_t, dirfd_arg, params, ...)                        \
  FFV_EXPORT int name params {                                                \
    static std::atomic<fn_t> real{nullptr};                                   \
    FFV_OPEN_BODY(dirfd_arg, ff::preload::CallNext(real, #name, __VA_ARGS__)) \
  }

extern "C" {

FFV_OPEN(open, OpenFn, AT_FDCWD, (const char* path_arg, int flags, ...), path, flags)
FFV_OPEN(open64, OpenFn, AT_FDCWD, (const char* path_arg, int flags, ...), path, flags)
FFV_OPEN(openat, OpenAtFn, dirfd_arg, (int dirfd_arg, const char* path_arg, int flags, ...), dirfd,
         path, flags)
FFV_OPEN(openat64, OpenAtFn, dirfd_arg, (int dirfd_arg, const char* path_arg, int flags, ...),
         dirfd, path, flags)
FFV_OPEN_2(__open_2, Open2Fn, AT_FDCWD, (const char* path_arg, int flags), path, flags)
FFV_OPEN_2(__open64_2, Open2Fn, AT_FDCWD, (const char* path_arg, int flags), path, flags)
FFV_OPEN_2(__openat_2, OpenAt2Fn, dirfd_arg, (int dirfd_arg, const char* path_arg, int flags),
           dirfd, path, flags)
FFV_OPEN_2(__openat64_2, OpenAt2Fn, dirfd_arg, (int dirfd_arg, const char* path_arg, int flags),
           dirfd, path, flags)

FFV_EXPORT ssize_t write(int fd, const void* buf, size_t count) {
  ssize_t result;
  if (__builtin_expect(MaybeCmFd(fd), 0) && ff::verbs::CmWrite(fd, buf, count, &result))
    return result;
  static std::atomic<ssize_t (*)(int, const void*, size_t)> real{nullptr};
  return ff::preload::CallNext(real, "write", fd, buf, count);
}

// Linux releases the number even when close fails (EINTR, EIO), unless it was not open.
FFV_EXPORT int close(int fd) {
  static std::atomic<int (*)(int)> real{nullptr};
  if (__builtin_expect(!ff::verbs::MaybeLibraryFd(fd), 1))
    return ff::preload::CallNext(real, "close", fd);
  const unsigned n = static_cast<unsigned>(fd);
  return ff::verbs::Releasing(
      n, n, [&] { return ff::preload::CallNext(real, "close", fd); },
      [](int rc) { return rc == 0 || errno != EBADF; });
}

FFV_EXPORT int dup2(int oldfd, int newfd) {
  static std::atomic<int (*)(int, int)> real{nullptr};
  if (oldfd == newfd) return ff::preload::CallNext(real, "dup2", oldfd, newfd);  // replaces nothing
  return ff::verbs::Replacing(newfd,
                              [&] { return ff::preload::CallNext(real, "dup2", oldfd, newfd); });
}

FFV_EXPORT int dup3(int oldfd, int newfd, int flags) {
  static std::atomic<int (*)(int, int, int)> real{nullptr};
  return ff::verbs::Replacing(
      newfd, [&] { return ff::preload::CallNext(real, "dup3", oldfd, newfd, flags); });
}

// CLOSE_RANGE_CLOEXEC only marks the descriptors; the others close them.
FFV_EXPORT int close_range(unsigned int first, unsigned int last, int flags) {
  static std::atomic<int (*)(unsigned int, unsigned int, int)> real{nullptr};
  return ff::verbs::Releasing(
      first, last, [&] { return ff::preload::CallNext(real, "close_range", first, last, flags); },
      [flags](int rc) { return rc == 0 && (flags & CLOSE_RANGE_CLOEXEC) == 0; });
}

// A libc without closefrom (before 2.34) never reaches here from a program linked against
// it; one that lacks it at run time gets the system call closefrom is made of.
FFV_EXPORT void closefrom(int lowfd) {
  static std::atomic<void (*)(int)> real{nullptr};
  void (*fn)(int) = ff::preload::ResolveNext(real, "closefrom");
  const unsigned first = lowfd < 0 ? 0 : static_cast<unsigned>(lowfd);
  ff::verbs::Releasing(
      first, ~0u,
      [&] {
        if (fn != nullptr) {
          fn(lowfd);
          return 0;
        }
        return static_cast<int>(::syscall(SYS_close_range, first, ~0u, 0));
      },
      [](int rc) { return rc == 0; });
}

}  // extern "C"
