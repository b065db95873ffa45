// Answers for the device node (device_files.h): libc's stat and access families, interposed
// by the preloaded library. Every call goes to the real function first (libc's, found with
// dlsym(RTLD_NEXT) on first use); only a failure with ENOENT for exactly the served path
// turns into the answer, with errno as it was before the call. Everything else, errno
// included, is the real function's, so a real node mounted into the pod always wins.
//
// Which names: UCX 1.13's libucs and libuct_ib import stat@GLIBC_2.33 and access; programs
// built against glibc < 2.33 call __xstat, __lxstat and __fxstatat instead of stat, lstat and
// fstatat; others may use the 64-bit names, statx, faccessat or euidaccess/eaccess. A path
// is matched as a string: a relative path, or another spelling of the same file, is passed
// through. Calls inside libc (realpath, ...) and raw system calls are not seen; nothing
// known to check the node makes them.
#include "device_files.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "exports.h"

namespace ffv {
namespace {

// uverbs0's numbers on Linux (IB_UVERBS_MAJOR, IB_UVERBS_BASE_MINOR), readable and
// writable by everyone, as udev makes it.
constexpr unsigned kMajor = 231;
constexpr unsigned kMinor = 192;
constexpr mode_t kMode = S_IFCHR | 0666;
constexpr unsigned kBlockSize = 4096;

// The served path; a replaced one is never freed (a concurrent call may still read it).
std::atomic<const char*> g_node{nullptr};

bool IsNode(const char* path) {
  const char* node = g_node.load(std::memory_order_acquire);
  return node != nullptr && path != nullptr && std::strcmp(path, node) == 0;
}

// Calls the next definition of the symbol after this library, looked up once into `slot`
// (a race only looks it up twice); -1 with ENOSYS when there is none.
template <typename Fn, typename... Args>
int CallReal(std::atomic<Fn>& slot, const char* name, Args... args) {
  Fn fn = slot.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, name));
    if (fn == nullptr) {
      errno = ENOSYS;
      return -1;
    }
    slot.store(fn, std::memory_order_release);
  }
  return fn(args...);
}

// The real call; when it failed with ENOENT for the served path, `answer()` instead, with
// errno restored first (answer sets it only when it fails too).
template <typename Fn, typename Answer, typename... Args>
int Serve(std::atomic<Fn>& slot, const char* name, const char* path, Answer answer, Args... args) {
  const int saved = errno;
  const int rc = CallReal(slot, name, args...);
  if (rc == 0 || errno != ENOENT || !IsNode(path)) return rc;
  errno = saved;
  return answer();
}

template <typename StatT>
int FillStat(StatT* st) {
  if (st == nullptr) {
    errno = EFAULT;
    return -1;
  }
  std::memset(st, 0, sizeof(*st));
  st->st_mode = kMode;
  st->st_nlink = 1;
  st->st_rdev = makedev(kMajor, kMinor);
  st->st_blksize = kBlockSize;
  return 0;
}

int FillStatx(struct statx* sx) {
  if (sx == nullptr) {
    errno = EFAULT;
    return -1;
  }
  std::memset(sx, 0, sizeof(*sx));
  sx->stx_mask = STATX_BASIC_STATS;
  sx->stx_blksize = kBlockSize;
  sx->stx_nlink = 1;
  sx->stx_mode = kMode;
  sx->stx_rdev_major = kMajor;
  sx->stx_rdev_minor = kMinor;
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
  char* copy = ::strdup(path.c_str());
  if (copy == nullptr) {
    LogError("cannot serve the device node %s: out of memory", path.c_str());
    return;
  }
  g_node.store(copy, std::memory_order_release);
}

void StopServingDeviceNode() { g_node.store(nullptr, std::memory_order_release); }

}  // namespace ffv

using ffv::FillStat;
using ffv::FillStatx;
using ffv::Serve;

// One interposer per libc name; those of one signature are made by one macro. Each keeps its
// own slot for libc's function. (Template arguments cannot carry libc's nonnull attributes,
// hence the spelled-out pointer types.)
#define FFV_PATH_STAT(name, stat_t)                                         \
  FFV_EXPORT int name(const char* path, struct stat_t* buf) noexcept {      \
    static std::atomic<int (*)(const char*, struct stat_t*)> real{nullptr}; \
    return Serve(                                                           \
        real, #name, path, [&] { return FillStat(buf); }, path, buf);       \
  }
#define FFV_VERSIONED_STAT(name, stat_t)                                         \
  FFV_EXPORT int name(int ver, const char* path, struct stat_t* buf) noexcept {  \
    static std::atomic<int (*)(int, const char*, struct stat_t*)> real{nullptr}; \
    return Serve(                                                                \
        real, #name, path, [&] { return FillStat(buf); }, ver, path, buf);       \
  }
#define FFV_AT_STAT(name, stat_t)                                                            \
  FFV_EXPORT int name(int dirfd, const char* path, struct stat_t* buf, int flags) noexcept { \
    static std::atomic<int (*)(int, const char*, struct stat_t*, int)> real{nullptr};        \
    return Serve(                                                                            \
        real, #name, path, [&] { return FillStat(buf); }, dirfd, path, buf, flags);          \
  }
#define FFV_VERSIONED_AT_STAT(name, stat_t)                                                \
  FFV_EXPORT int name(int ver, int dirfd, const char* path, struct stat_t* buf,            \
                      int flags) noexcept {                                                \
    static std::atomic<int (*)(int, int, const char*, struct stat_t*, int)> real{nullptr}; \
    return Serve(                                                                          \
        real, #name, path, [&] { return FillStat(buf); }, ver, dirfd, path, buf, flags);   \
  }
#define FFV_PATH_ACCESS(name)                                              \
  FFV_EXPORT int name(const char* path, int mode) noexcept {               \
    static std::atomic<int (*)(const char*, int)> real{nullptr};           \
    return Serve(                                                          \
        real, #name, path, [&] { return ffv::Access(mode); }, path, mode); \
  }

extern "C" {

FFV_PATH_STAT(stat, stat)
FFV_PATH_STAT(stat64, stat64)
FFV_PATH_STAT(lstat, stat)
FFV_PATH_STAT(lstat64, stat64)
FFV_VERSIONED_STAT(__xstat, stat)
FFV_VERSIONED_STAT(__xstat64, stat64)
FFV_VERSIONED_STAT(__lxstat, stat)
FFV_VERSIONED_STAT(__lxstat64, stat64)
FFV_AT_STAT(fstatat, stat)
FFV_AT_STAT(fstatat64, stat64)
FFV_VERSIONED_AT_STAT(__fxstatat, stat)
FFV_VERSIONED_AT_STAT(__fxstatat64, stat64)
FFV_PATH_ACCESS(access)
FFV_PATH_ACCESS(euidaccess)
FFV_PATH_ACCESS(eaccess)

FFV_EXPORT int statx(int dirfd, const char* path, int flags, unsigned int mask,
                     struct statx* buf) noexcept {
  static std::atomic<int (*)(int, const char*, int, unsigned int, struct statx*)> real{nullptr};
  return Serve(
      real, "statx", path, [&] { return FillStatx(buf); }, dirfd, path, flags, mask, buf);
}

FFV_EXPORT int faccessat(int dirfd, const char* path, int mode, int flags) noexcept {
  static std::atomic<int (*)(int, const char*, int, int)> real{nullptr};
  return Serve(
      real, "faccessat", path, [&] { return ffv::Access(mode); }, dirfd, path, mode, flags);
}

}  // extern "C"
