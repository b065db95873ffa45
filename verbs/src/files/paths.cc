// The path calls of the virtual tree (virtual_files.h) besides open, stat and access:
// readlink, realpath, fopen, the extended attributes, and a working directory inside the tree
// (shell scripts such as ibstatus `cd` into /sys/class/infiniband and glob there). Each asks
// libc first; the tree answers only where libc found nothing.
//
// The working directory inside the tree is the library's: the process's real one stays where
// it was, so a program started from there (exec) starts in the real one.
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/exports.h"
#include "files/virtual_files.h"
#include "freeflow/preload/interpose.h"

namespace ff::verbs::vfs {
namespace {

// The tree's answer for a path call that failed with `err`: `found(hit)` when the tree has
// the path, -1 with the tree's errno when the walk failed inside it, else the real failure.
template <typename R, typename Found>
R OrTree(int err, int saved, int dirfd, const char* path, bool follow, R failed, Found found) {
  Hit hit;
  int fail = 0;
  const Answer a = Lookup(err, dirfd, path, follow, &hit, &fail);
  if (a == Answer::kNotOurs) {
    errno = err;
    return failed;
  }
  if (a == Answer::kFailed) {
    errno = fail;
    return failed;
  }
  errno = saved;
  return found(hit);
}

ssize_t ReadLink(const Hit& hit, char* buf, size_t size) {
  const Node& n = *hit.found.node;
  if (n.kind != Kind::kLink) {
    errno = EINVAL;
    return -1;
  }
  const size_t len = n.data.size() < size ? n.data.size() : size;
  std::memcpy(buf, n.data.data(), len);
  return static_cast<ssize_t>(len);
}

// fopen's mode as open flags (glibc's letters: r w a, '+', 'e' close-on-exec, 'x' exclusive).
int FlagsOf(const char* mode) {
  int flags = 0;
  switch (mode[0]) {
    case 'r':
      flags = O_RDONLY;
      break;
    case 'w':
      flags = O_WRONLY | O_CREAT | O_TRUNC;
      break;
    case 'a':
      flags = O_WRONLY | O_CREAT | O_APPEND;
      break;
    default:
      return -1;
  }
  for (const char* c = mode + 1; *c != '\0' && *c != ','; ++c) {
    if (*c == '+') flags = (flags & ~O_ACCMODE) | O_RDWR;
    if (*c == 'e') flags |= O_CLOEXEC;
    if (*c == 'x') flags |= O_EXCL;
  }
  return flags;
}

template <typename Fn>
FILE* Fopen(std::atomic<Fn>& real, const char* name, const char* path, const char* mode) {
  const PathArg p(AT_FDCWD, path);
  const int saved = errno;
  FILE* f = ff::preload::CallNext(real, name, p.path(), mode);
  if (f != nullptr || mode == nullptr) return f;
  const int err = errno;
  const int flags = FlagsOf(mode);
  int fd = -1;
  if (flags < 0 || !TryOpen(err, AT_FDCWD, p.path(), flags, &fd)) {
    errno = err;
    return nullptr;
  }
  if (fd < 0) return nullptr;
  f = ::fdopen(fd, mode);
  if (f == nullptr) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return nullptr;
  }
  errno = saved;
  return f;
}

// getxattr and lgetxattr: sysfs attributes carry no extended attributes.
template <typename Fn>
ssize_t GetXattr(std::atomic<Fn>& real, const char* fn, bool follow, const char* path,
                 const char* name, void* value, size_t size) {
  const PathArg p(AT_FDCWD, path);
  const int saved = errno;
  const ssize_t n = ff::preload::CallNext(real, fn, p.path(), name, value, size);
  if (n >= 0) return n;
  return OrTree<ssize_t>(errno, saved, AT_FDCWD, p.path(), follow, n, [](const Hit&) {
    errno = ENODATA;
    return ssize_t{-1};
  });
}

template <typename Fn>
ssize_t ListXattr(std::atomic<Fn>& real, const char* fn, bool follow, const char* path, char* list,
                  size_t size) {
  const PathArg p(AT_FDCWD, path);
  const int saved = errno;
  const ssize_t n = ff::preload::CallNext(real, fn, p.path(), list, size);
  if (n >= 0) return n;
  return OrTree<ssize_t>(errno, saved, AT_FDCWD, p.path(), follow, n,
                         [](const Hit&) { return ssize_t{0}; });
}

}  // namespace
}  // namespace ff::verbs::vfs

namespace vfs = ff::verbs::vfs;

extern "C" {

FFV_EXPORT ssize_t readlink(const char* path, char* buf, size_t size) noexcept {
  static std::atomic<ssize_t (*)(const char*, char*, size_t)> real{nullptr};
  const vfs::PathArg p(AT_FDCWD, path);
  const int saved = errno;
  const ssize_t n = ff::preload::CallNext(real, "readlink", p.path(), buf, size);
  if (n >= 0) return n;
  return vfs::OrTree<ssize_t>(errno, saved, AT_FDCWD, p.path(), false, n,
                              [&](const vfs::Hit& h) { return vfs::ReadLink(h, buf, size); });
}

FFV_EXPORT ssize_t readlinkat(int dirfd, const char* path, char* buf, size_t size) noexcept {
  static std::atomic<ssize_t (*)(int, const char*, char*, size_t)> real{nullptr};
  const vfs::PathArg p(dirfd, path);
  const int saved = errno;
  const ssize_t n = ff::preload::CallNext(real, "readlinkat", p.dirfd(), p.path(), buf, size);
  if (n >= 0) return n;
  return vfs::OrTree<ssize_t>(errno, saved, p.dirfd(), p.path(), false, n,
                              [&](const vfs::Hit& h) { return vfs::ReadLink(h, buf, size); });
}

FFV_EXPORT char* realpath(const char* path, char* resolved) noexcept {
  static std::atomic<char* (*)(const char*, char*)> real{nullptr};
  const vfs::PathArg p(AT_FDCWD, path);
  const int saved = errno;
  char* r = ff::preload::CallNext(real, "realpath", p.path(), resolved);
  if (r != nullptr) return r;
  return vfs::OrTree<char*>(errno, saved, AT_FDCWD, p.path(), true, nullptr,
                            [&](const vfs::Hit& h) -> char* {
                              const std::string& canonical = h.found.path;
                              if (resolved == nullptr) return ::strdup(canonical.c_str());
                              if (canonical.size() >= PATH_MAX) {
                                errno = ENAMETOOLONG;
                                return nullptr;
                              }
                              std::memcpy(resolved, canonical.c_str(), canonical.size() + 1);
                              return resolved;
                            });
}

FFV_EXPORT char* canonicalize_file_name(const char* path) noexcept {
  return realpath(path, nullptr);
}

FFV_EXPORT FILE* fopen(const char* path, const char* mode) {
  static std::atomic<FILE* (*)(const char*, const char*)> real{nullptr};
  return vfs::Fopen(real, "fopen", path, mode);
}

FFV_EXPORT FILE* fopen64(const char* path, const char* mode) {
  static std::atomic<FILE* (*)(const char*, const char*)> real{nullptr};
  return vfs::Fopen(real, "fopen64", path, mode);
}

FFV_EXPORT int chdir(const char* path) noexcept {
  static std::atomic<int (*)(const char*)> real{nullptr};
  const vfs::PathArg p(AT_FDCWD, path);
  const int saved = errno;
  const int rc = ff::preload::CallNext(real, "chdir", p.path());
  if (rc == 0) {
    vfs::ClearVirtualCwd();
    return 0;
  }
  return vfs::OrTree<int>(errno, saved, AT_FDCWD, p.path(), true, rc, [](const vfs::Hit& h) {
    if (h.found.node->kind != vfs::Kind::kDir) {
      errno = ENOTDIR;
      return -1;
    }
    vfs::SetVirtualCwd(h);
    return 0;
  });
}

FFV_EXPORT int fchdir(int fd) noexcept {
  static std::atomic<int (*)(int)> real{nullptr};
  vfs::Hit dir;
  if (vfs::DirOfFd(fd, &dir)) {
    vfs::SetVirtualCwd(dir);
    return 0;
  }
  const int rc = ff::preload::CallNext(real, "fchdir", fd);
  if (rc == 0) vfs::ClearVirtualCwd();
  return rc;
}

FFV_EXPORT char* getcwd(char* buf, size_t size) noexcept {
  static std::atomic<char* (*)(char*, size_t)> real{nullptr};
  std::string cwd;
  if (!vfs::VirtualCwd(&cwd)) return ff::preload::CallNext(real, "getcwd", buf, size);
  if (buf == nullptr) {  // glibc's extension: a buffer of `size`, or as large as needed if 0
    if (size != 0 && size <= cwd.size()) {
      errno = ERANGE;
      return nullptr;
    }
    char* out = static_cast<char*>(std::malloc(size != 0 ? size : cwd.size() + 1));
    if (out == nullptr) {
      errno = ENOMEM;
      return nullptr;
    }
    std::memcpy(out, cwd.c_str(), cwd.size() + 1);
    return out;
  }
  if (size == 0) {
    errno = EINVAL;
    return nullptr;
  }
  if (size <= cwd.size()) {
    errno = ERANGE;
    return nullptr;
  }
  std::memcpy(buf, cwd.c_str(), cwd.size() + 1);
  return buf;
}

FFV_EXPORT ssize_t getxattr(const char* path, const char* name, void* value, size_t size) noexcept {
  static std::atomic<ssize_t (*)(const char*, const char*, void*, size_t)> real{nullptr};
  return vfs::GetXattr(real, "getxattr", true, path, name, value, size);
}

FFV_EXPORT ssize_t lgetxattr(const char* path, const char* name, void* value,
                             size_t size) noexcept {
  static std::atomic<ssize_t (*)(const char*, const char*, void*, size_t)> real{nullptr};
  return vfs::GetXattr(real, "lgetxattr", false, path, name, value, size);
}

FFV_EXPORT ssize_t listxattr(const char* path, char* list, size_t size) noexcept {
  static std::atomic<ssize_t (*)(const char*, char*, size_t)> real{nullptr};
  return vfs::ListXattr(real, "listxattr", true, path, list, size);
}

FFV_EXPORT ssize_t llistxattr(const char* path, char* list, size_t size) noexcept {
  static std::atomic<ssize_t (*)(const char*, char*, size_t)> real{nullptr};
  return vfs::ListXattr(real, "llistxattr", false, path, list, size);
}

}  // extern "C"
