// Answers for the device nodes (device_files.h): libc's stat and access families, interposed
// by the preloaded library. Every call goes to the real function first (libc's, found with
// dlsym(RTLD_NEXT) on first use); only a failure with ENOENT for exactly a served path
// turns into the answer, with errno as it was before the call. Everything else, errno
// included, is the real function's, so a real node mounted into the pod always wins.
//
// Which names: UCX 1.13's libucs and libuct_ib import stat@GLIBC_2.33 and access; programs
// built against glibc < 2.33 call __xstat, __lxstat and __fxstatat instead of stat, lstat and
// fstatat; others may use the 64-bit names, statx, faccessat or euidaccess/eaccess. A path
// is matched as a string: a relative path, or another spelling of the same file, is passed
// through. Calls inside libc (realpath, ...) and raw system calls are not seen; nothing
// known to check the node makes them.
//
// The same interposers answer for the virtual tree (files/virtual_files.h, the device's
// sysfs view) where libc finds nothing there, the path made absolute first while the
// working directory is inside the tree.
//
// The fstat family (fstat, fstat64, __fxstat, __fxstat64, and fstatat/statx with
// AT_EMPTY_PATH and "") answers for an open rdma_cm descriptor (cm_device.h) as for that
// character device: librdmacm checks S_ISCHR after it opens the device.
#include "rdmacm/device_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/exports.h"
#include "files/virtual_files.h"
#include "freeflow/preload/interpose.h"
#include "rdmacm/cm_device.h"

namespace ff::verbs {
namespace {

// A served node's numbers: uverbs0's on Linux (IB_UVERBS_MAJOR, IB_UVERBS_BASE_MINOR), and
// rdma_cm's (cm_device.h). Both readable and writable by everyone, as udev makes them.
struct Node {
  unsigned major;
  unsigned minor;
};
constexpr Node kUverbsNode{231, 192};
constexpr Node kCmNode{kCmMajor, kCmMinor};
constexpr mode_t kMode = S_IFCHR | 0666;
constexpr unsigned kBlockSize = 4096;

// The served uverbs path; a replaced one is never freed (a concurrent call may still read it).
std::atomic<const char*> g_node{nullptr};
std::atomic<bool> g_cm_node{false};

const Node* NodeAt(const char* path) {
  if (path == nullptr) return nullptr;
  const char* node = g_node.load(std::memory_order_acquire);
  if (node != nullptr && std::strcmp(path, node) == 0) return &kUverbsNode;
  if (g_cm_node.load(std::memory_order_acquire) && std::strcmp(path, kCmDevicePath) == 0)
    return &kCmNode;
  return nullptr;
}

// fstatat/statx of the descriptor itself (AT_EMPTY_PATH with "").
bool IsEmptyPath(const char* path, int flags) {
  return (flags & AT_EMPTY_PATH) != 0 && path != nullptr && path[0] == '\0';
}

// ... of an rdma_cm descriptor.
bool IsCmEmptyPath(int dirfd, const char* path, int flags) {
  return IsEmptyPath(path, flags) && IsCmFd(dirfd);
}

// The real call; when it failed with ENOENT for a served path, `answer(node)` instead, with
// errno restored first (answer sets it only when it fails too). Then the virtual tree's
// answer, `tree(err, &result)` (files/virtual_files.h), where it has the path.
template <typename Fn, typename Answer, typename Tree, typename... Args>
int Serve(std::atomic<Fn>& slot, const char* name, const char* path, Answer answer, Tree tree,
          Args... args) {
  const int saved = errno;
  const int rc = ff::preload::CallNext(slot, name, args...);
  if (rc == 0) return rc;
  const int err = errno;
  const Node* node = err == ENOENT ? NodeAt(path) : nullptr;
  errno = saved;
  if (node != nullptr) return answer(*node);
  int result = -1;
  if (tree(err, &result)) return result;
  errno = err;
  return rc;
}

template <typename StatT>
int FillStat(StatT* st, const Node& node) {
  if (st == nullptr) {
    errno = EFAULT;
    return -1;
  }
  std::memset(st, 0, sizeof(*st));
  st->st_mode = kMode;
  st->st_nlink = 1;
  st->st_rdev = makedev(node.major, node.minor);
  st->st_blksize = kBlockSize;
  return 0;
}

int FillStatx(struct statx* sx, const Node& node) {
  if (sx == nullptr) {
    errno = EFAULT;
    return -1;
  }
  std::memset(sx, 0, sizeof(*sx));
  sx->stx_mask = STATX_BASIC_STATS;
  sx->stx_blksize = kBlockSize;
  sx->stx_nlink = 1;
  sx->stx_mode = kMode;
  sx->stx_rdev_major = node.major;
  sx->stx_rdev_minor = node.minor;
  return 0;
}

// Mode 0666: reading, writing and existence are granted, execution is not (not even to
// root, which needs one execute bit).
int Access(int mode) {
  if ((mode & X_OK) != 0) {
    errno = EACCES;
    return -1;
  }
  return 0;
}

}  // namespace

std::string DeviceNodePath(const char* dev_name) {
  return std::string("/dev/infiniband/") + dev_name;
}

void ServeDeviceNode(const std::string& path) {
  // Served already (a session that replaced one whose router was lost): nothing to replace.
  const char* now = g_node.load(std::memory_order_acquire);
  if (now != nullptr && path == now) return;
  char* copy = ::strdup(path.c_str());
  if (copy == nullptr) {
    LogError("cannot serve the device node %s: out of memory", path.c_str());
    return;
  }
  g_node.store(copy, std::memory_order_release);
}

void ServeCmNode() { g_cm_node.store(true, std::memory_order_release); }

void StopServingDeviceNode() {
  g_node.store(nullptr, std::memory_order_release);
  g_cm_node.store(false, std::memory_order_release);
}

}  // namespace ff::verbs

using ff::verbs::FillStat;
using ff::verbs::FillStatx;
using ff::verbs::IsCmEmptyPath;
using ff::verbs::Serve;

// One interposer per libc name; those of one signature are made by one macro. Each keeps its
// own slot for libc's function. (Template arguments cannot carry libc's nonnull attributes,
// hence the spelled-out pointer types.) The fd-based ones answer for an rdma_cm descriptor
// without asking libc (which would see the socket behind it), and for a directory of the
// virtual tree after asking it. A path goes through vfs::PathArg first (a relative one
// inside the tree's working directory is made absolute).
namespace vfs = ff::verbs::vfs;
#define FFV_STAT_ANSWER [&](const ff::verbs::Node& n) { return FillStat(buf, n); }
#define FFV_STAT_TREE(dirfd, follow) \
  [&](int err, int* r) { return vfs::TryStat(err, dirfd, path, follow, buf, r); }
#define FFV_ACCESS_ANSWER [&](const ff::verbs::Node&) { return ff::verbs::Access(mode); }
#define FFV_ACCESS_TREE(dirfd) \
  [&](int err, int* r) { return vfs::TryAccess(err, dirfd, path, mode, r); }
#define FFV_PATH(dirfd_arg)                  \
  const vfs::PathArg p(dirfd_arg, path_arg); \
  const char* const path = p.path();
#define FFV_PATH_STAT(name, stat_t, follow)                                                       \
  FFV_EXPORT int name(const char* path_arg, struct stat_t* buf) noexcept {                        \
    FFV_PATH(AT_FDCWD)                                                                            \
    static std::atomic<int (*)(const char*, struct stat_t*)> real{nullptr};                       \
    return Serve(real, #name, path, FFV_STAT_ANSWER, FFV_STAT_TREE(AT_FDCWD, follow), path, buf); \
  }
#define FFV_VERSIONED_STAT(name, stat_t, follow)                                                 \
  FFV_EXPORT int name(int ver, const char* path_arg, struct stat_t* buf) noexcept {              \
    FFV_PATH(AT_FDCWD)                                                                           \
    static std::atomic<int (*)(int, const char*, struct stat_t*)> real{nullptr};                 \
    return Serve(real, #name, path, FFV_STAT_ANSWER, FFV_STAT_TREE(AT_FDCWD, follow), ver, path, \
                 buf);                                                                           \
  }
// fstatat(fd, "", AT_EMPTY_PATH) is fstat(fd).
#define FFV_AT_STAT_BODY(call_real)                                                        \
  if (IsCmEmptyPath(dirfd_arg, path_arg, flags)) return FillStat(buf, ff::verbs::kCmNode); \
  if (ff::verbs::IsEmptyPath(path_arg, flags)) {                                           \
    const int rc = call_real(dirfd_arg, path_arg);                                         \
    if (rc == 0) vfs::FstatDir(dirfd_arg, buf);                                            \
    return rc;                                                                             \
  }                                                                                        \
  FFV_PATH(dirfd_arg)                                                                      \
  const int dirfd = p.dirfd();                                                             \
  const bool follow = (flags & AT_SYMLINK_NOFOLLOW) == 0;
#define FFV_AT_STAT(name, stat_t)                                                               \
  FFV_EXPORT int name(int dirfd_arg, const char* path_arg, struct stat_t* buf,                  \
                      int flags) noexcept {                                                     \
    static std::atomic<int (*)(int, const char*, struct stat_t*, int)> real{nullptr};           \
    auto call_real = [&](int d, const char* q) {                                                \
      return ff::preload::CallNext(real, #name, d, q, buf, flags);                              \
    };                                                                                          \
    FFV_AT_STAT_BODY(call_real)                                                                 \
    return Serve(real, #name, path, FFV_STAT_ANSWER, FFV_STAT_TREE(dirfd, follow), dirfd, path, \
                 buf, flags);                                                                   \
  }
#define FFV_VERSIONED_AT_STAT(name, stat_t)                                                    \
  FFV_EXPORT int name(int ver, int dirfd_arg, const char* path_arg, struct stat_t* buf,        \
                      int flags) noexcept {                                                    \
    static std::atomic<int (*)(int, int, const char*, struct stat_t*, int)> real{nullptr};     \
    auto call_real = [&](int d, const char* q) {                                               \
      return ff::preload::CallNext(real, #name, ver, d, q, buf, flags);                        \
    };                                                                                         \
    FFV_AT_STAT_BODY(call_real)                                                                \
    return Serve(real, #name, path, FFV_STAT_ANSWER, FFV_STAT_TREE(dirfd, follow), ver, dirfd, \
                 path, buf, flags);                                                            \
  }
#define FFV_FD_STAT(name, stat_t)                                        \
  FFV_EXPORT int name(int fd, struct stat_t* buf) noexcept {             \
    if (ff::verbs::IsCmFd(fd)) return FillStat(buf, ff::verbs::kCmNode); \
    static std::atomic<int (*)(int, struct stat_t*)> real{nullptr};      \
    const int rc = ff::preload::CallNext(real, #name, fd, buf);          \
    if (rc == 0) vfs::FstatDir(fd, buf);                                 \
    return rc;                                                           \
  }
#define FFV_VERSIONED_FD_STAT(name, stat_t)                              \
  FFV_EXPORT int name(int ver, int fd, struct stat_t* buf) noexcept {    \
    if (ff::verbs::IsCmFd(fd)) return FillStat(buf, ff::verbs::kCmNode); \
    static std::atomic<int (*)(int, int, struct stat_t*)> real{nullptr}; \
    const int rc = ff::preload::CallNext(real, #name, ver, fd, buf);     \
    if (rc == 0) vfs::FstatDir(fd, buf);                                 \
    return rc;                                                           \
  }
#define FFV_PATH_ACCESS(name)                                                                  \
  FFV_EXPORT int name(const char* path_arg, int mode) noexcept {                               \
    FFV_PATH(AT_FDCWD)                                                                         \
    static std::atomic<int (*)(const char*, int)> real{nullptr};                               \
    return Serve(real, #name, path, FFV_ACCESS_ANSWER, FFV_ACCESS_TREE(AT_FDCWD), path, mode); \
  }

extern "C" {

FFV_PATH_STAT(stat, stat, true)
FFV_PATH_STAT(stat64, stat64, true)
FFV_PATH_STAT(lstat, stat, false)
FFV_PATH_STAT(lstat64, stat64, false)
FFV_VERSIONED_STAT(__xstat, stat, true)
FFV_VERSIONED_STAT(__xstat64, stat64, true)
FFV_VERSIONED_STAT(__lxstat, stat, false)
FFV_VERSIONED_STAT(__lxstat64, stat64, false)
FFV_AT_STAT(fstatat, stat)
FFV_AT_STAT(fstatat64, stat64)
FFV_VERSIONED_AT_STAT(__fxstatat, stat)
FFV_VERSIONED_AT_STAT(__fxstatat64, stat64)
FFV_FD_STAT(fstat, stat)
FFV_FD_STAT(fstat64, stat64)
FFV_VERSIONED_FD_STAT(__fxstat, stat)
FFV_VERSIONED_FD_STAT(__fxstat64, stat64)
FFV_PATH_ACCESS(access)
FFV_PATH_ACCESS(euidaccess)
FFV_PATH_ACCESS(eaccess)

FFV_EXPORT int statx(int dirfd_arg, const char* path_arg, int flags, unsigned int mask,
                     struct statx* buf) noexcept {
  if (IsCmEmptyPath(dirfd_arg, path_arg, flags)) return FillStatx(buf, ff::verbs::kCmNode);
  FFV_PATH(dirfd_arg)
  const int dirfd = p.dirfd();
  static std::atomic<int (*)(int, const char*, int, unsigned int, struct statx*)> real{nullptr};
  return Serve(
      real, "statx", path, [&](const ff::verbs::Node& n) { return FillStatx(buf, n); },
      [&](int err, int* r) { return vfs::TryStatx(err, dirfd, path, flags, buf, r); }, dirfd, path,
      flags, mask, buf);
}

FFV_EXPORT int faccessat(int dirfd_arg, const char* path_arg, int mode, int flags) noexcept {
  FFV_PATH(dirfd_arg)
  const int dirfd = p.dirfd();
  static std::atomic<int (*)(int, const char*, int, int)> real{nullptr};
  return Serve(real, "faccessat", path, FFV_ACCESS_ANSWER, FFV_ACCESS_TREE(dirfd), dirfd, path,
               mode, flags);
}

}  // extern "C"
