// Serving the virtual tree (virtual_files.h): its lazy build, the answers of the open, stat
// and access families, and the directory descriptors of the tree.
//
// The tree looks like a read-only sysfs: directories 0755, files 0444 of size 4096,
// links 0777; its device number is the real /sys's, its times the build's. Opening a file
// for writing, truncating or creating one fails with EROFS, as on a container's read-only
// /sys; opening a directory for writing with EISDIR.
#include "files/virtual_files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <vector>

#include "base/log.h"

namespace ff::verbs::vfs {
namespace {

constexpr long kFileSize = 4096;  // what sysfs reports for every attribute
constexpr mode_t kDirMode = S_IFDIR | 0755;
constexpr mode_t kFileMode = S_IFREG | 0444;
constexpr mode_t kLinkMode = S_IFLNK | 0777;

// The state below is never destroyed: the interposers may run during exit, after static
// destructors (another thread's open, an atexit handler's stat).
std::atomic<Builder> g_builder{nullptr};
// The builder's roots. A replaced list is kept (a concurrent call may still read it), in a
// list of every one set, which only tests set more than once.
std::atomic<const std::vector<std::string>*> g_roots{nullptr};
std::mutex g_roots_mu;
std::vector<std::unique_ptr<const std::vector<std::string>>>& g_all_roots =
    *new std::vector<std::unique_ptr<const std::vector<std::string>>>;
std::mutex g_build_mu;  // one build at a time; guards the three below
std::shared_ptr<const Tree>& g_tree = *new std::shared_ptr<const Tree>;
dev_t g_dev = 0;
time_t g_built_at = 0;
thread_local bool t_building = false;  // a build that itself asks for a path of the tree

// The virtual working directory (PathArg).
std::mutex g_cwd_mu;
std::string& g_cwd = *new std::string;
std::atomic<bool> g_has_cwd{false};

// "/a/./b/../c" as "/a/c": the working directory is canonical, and what follows it is
// taken as written (a link of the tree followed by ".." is the one thing this gets wrong).
std::string Lexical(std::string_view path) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (start < path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view part = path.substr(start, end - start);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    start = end + 1;
  }
  std::string out;
  for (const std::string_view p : parts) {
    out += '/';
    out += p;
  }
  if (out.empty()) out = "/";
  if (path.size() > 1 && path.back() == '/' && out != "/") out += '/';
  return out;
}

// Directory descriptors. Each directory of the tree that was opened has one memory file the
// library keeps open (its template); a descriptor of the directory is a new open of that
// file, so dup, dup2 and fcntl(F_DUPFD) copies are recognised as well, by the file's
// identity. The template's own identity is checked at every use: a program that closed it
// (closefrom in a child, dup2 over it) gets a new one, and a file that took over the
// template's inode number after that is not mistaken for the directory.
struct Template {
  Hit dir;
  int fd = -1;
  dev_t dev = 0;
  ino_t ino = 0;
};
std::mutex g_fd_mu;                           // guards the map
std::map<std::string, Template>& g_templates =  // by the directory's path
    *new std::map<std::string, Template>;
std::atomic<int> g_template_count{0};

// The identity of an open descriptor, from the system call itself (the library's fstat
// interposers come back here).
bool Identity(int fd, dev_t* dev, ino_t* ino) {
  struct stat st {};
  if (::syscall(SYS_fstat, fd, &st) != 0) return false;
  *dev = st.st_dev;
  *ino = st.st_ino;
  return true;
}

// Whether `fd` is still the file of that identity.
bool Same(int fd, dev_t dev, ino_t ino) {
  dev_t d;
  ino_t i;
  return fd >= 0 && ino != 0 && Identity(fd, &d, &i) && d == dev && i == ino;
}

// Whether `path` is one of the roots or below one, after its dots (a cheap check first:
// every root is under /sys).
bool UnderRoot(const char* path) {
  const std::vector<std::string>* roots = g_roots.load(std::memory_order_acquire);
  if (roots == nullptr || std::strncmp(path, "/sys/", 5) != 0) return false;
  std::string p;
  try {
    p = Lexical(path);
  } catch (const std::bad_alloc&) {
    return false;
  }
  for (const std::string& root : *roots) {
    if (p.compare(0, root.size(), root) == 0 && (p.size() == root.size() || p[root.size()] == '/'))
      return true;
  }
  return false;
}

bool Candidate(int err, int dirfd, const char* path) {
  if (path == nullptr || (err != ENOENT && err != ENOTDIR)) return false;
  if (path[0] == '/') return UnderRoot(path);
  return dirfd >= 0 && g_template_count.load(std::memory_order_acquire) > 0;
}

template <typename StatT>
void Fill(const Node& n, StatT* st) {
  std::memset(st, 0, sizeof(*st));
  st->st_dev = g_dev;
  st->st_ino = n.ino;
  st->st_uid = 0;
  st->st_gid = 0;
  st->st_blksize = 4096;
  switch (n.kind) {
    case Kind::kDir:
      st->st_mode = kDirMode;
      st->st_nlink = 2;
      break;
    case Kind::kFile:
      st->st_mode = kFileMode;
      st->st_nlink = 1;
      st->st_size = kFileSize;
      break;
    case Kind::kLink:
      st->st_mode = kLinkMode;
      st->st_nlink = 1;
      st->st_size = static_cast<off_t>(n.data.size());
      break;
  }
  st->st_atim.tv_sec = st->st_mtim.tv_sec = st->st_ctim.tv_sec = g_built_at;
}

template <typename StatT>
bool TryStatT(int err, int dirfd, const char* path, bool follow, StatT* st, int* result) {
  Hit hit;
  int fail = 0;
  const Answer a = Lookup(err, dirfd, path, follow, &hit, &fail);
  if (a == Answer::kNotOurs) return false;
  if (a == Answer::kFailed || st == nullptr) {
    errno = a == Answer::kFailed ? fail : EFAULT;
    *result = -1;
    return true;
  }
  Fill(*hit.found.node, st);
  *result = 0;
  return true;
}

template <typename StatT>
bool FstatDirT(int fd, StatT* st) {
  Hit dir;
  if (st == nullptr || !DirOfFd(fd, &dir)) return false;
  Fill(*dir.found.node, st);
  return true;
}

// A file's content in a sealed memory file, reopened read-only through /proc so that a write
// fails as on a read-only attribute (EBADF); the sealed read-write one if /proc is missing.
int OpenFile(const Node& n, int flags) {
  const int fd = ::memfd_create("freeflow-sysfs", MFD_ALLOW_SEALING | MFD_CLOEXEC);
  if (fd < 0) return -1;
  size_t done = 0;
  while (done < n.data.size()) {
    const ssize_t w = ::write(fd, n.data.data() + done, n.data.size() - done);
    if (w <= 0) {
      const int e = w < 0 ? errno : EIO;
      ::close(fd);
      errno = e;
      return -1;
    }
    done += static_cast<size_t>(w);
  }
  ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
  char proc[48];
  std::snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
  const int keep = flags & (O_CLOEXEC | O_NONBLOCK);
  const int ro = static_cast<int>(::syscall(SYS_openat, AT_FDCWD, proc, O_RDONLY | keep));
  if (ro >= 0) {
    ::close(fd);
    return ro;
  }
  ::lseek(fd, 0, SEEK_SET);
  if ((flags & O_CLOEXEC) == 0) ::fcntl(fd, F_SETFD, 0);
  return fd;
}

}  // namespace

PathArg::PathArg(int dirfd, const char* path) : dirfd_(dirfd), path_(path) {
  if (!g_has_cwd.load(std::memory_order_acquire) || path == nullptr || path[0] == '/' ||
      path[0] == '\0' || dirfd != AT_FDCWD)
    return;
  std::string cwd;
  if (!VirtualCwd(&cwd)) return;
  try {
    abs_ = Lexical(JoinPath(cwd, path));
  } catch (const std::bad_alloc&) {
    return;
  }
  path_ = abs_.c_str();
}

void SetVirtualCwd(const Hit& dir) {
  std::lock_guard<std::mutex> l(g_cwd_mu);
  g_cwd = dir.found.path;
  g_has_cwd.store(true, std::memory_order_release);
}

void ClearVirtualCwd() {
  if (!g_has_cwd.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> l(g_cwd_mu);
  g_has_cwd.store(false, std::memory_order_release);
}

bool VirtualCwd(std::string* cwd) {
  if (!g_has_cwd.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> l(g_cwd_mu);
  if (!g_has_cwd.load(std::memory_order_relaxed)) return false;
  *cwd = g_cwd;
  return true;
}

void SetBuilder(Builder builder, std::vector<std::string> roots) {
  {
    std::lock_guard<std::mutex> l(g_roots_mu);
    g_all_roots.push_back(std::make_unique<const std::vector<std::string>>(std::move(roots)));
    g_roots.store(g_all_roots.back().get(), std::memory_order_release);
  }
  g_builder.store(builder, std::memory_order_release);
}

void ResetServed() {
  {
    std::lock_guard<std::mutex> l(g_build_mu);
    g_tree.reset();
  }
  std::lock_guard<std::mutex> l(g_fd_mu);
  for (auto& [path, t] : g_templates)
    if (Same(t.fd, t.dev, t.ino)) ::close(t.fd);
  g_templates.clear();
  g_template_count.store(0, std::memory_order_release);
}

std::shared_ptr<const Tree> Served() {
  if (t_building) return nullptr;
  std::lock_guard<std::mutex> l(g_build_mu);
  if (g_tree != nullptr) return g_tree;
  const Builder build = g_builder.load(std::memory_order_acquire);
  if (build == nullptr) return nullptr;
  t_building = true;
  std::shared_ptr<const Tree> tree;
  try {
    tree = build();
  } catch (const std::exception& e) {
    LogError("the device's sysfs view could not be built: %s", e.what());
  }
  t_building = false;
  if (tree == nullptr) return nullptr;
  struct stat sys {};
  g_dev = ::syscall(SYS_stat, "/sys", &sys) == 0 ? sys.st_dev : 0;
  g_built_at = ::time(nullptr);
  g_tree = tree;
  return g_tree;
}

Answer Lookup(int err, int dirfd, const char* path, bool follow, Hit* hit, int* fail) {
  if (!Candidate(err, dirfd, path)) return Answer::kNotOurs;
  std::string abs;
  if (path[0] == '/') {
    hit->tree = Served();
    abs = path;
  } else {
    Hit dir;
    if (!DirOfFd(dirfd, &dir)) return Answer::kNotOurs;
    hit->tree = dir.tree;
    abs = JoinPath(dir.found.path, path);
  }
  if (hit->tree == nullptr) return Answer::kNotOurs;
  int e = 0;
  std::optional<Found> found = hit->tree->Resolve(abs, follow, &e);
  if (!found) {
    // An absolute path the tree lacks is the file system's; one relative to a directory of
    // the tree can only be the tree's.
    if (e == ENOENT && path[0] == '/') return Answer::kNotOurs;
    *fail = e;
    return Answer::kFailed;
  }
  hit->found = std::move(*found);
  return Answer::kFound;
}

int OpenDirFd(const Hit& dir, bool cloexec) {
  int model;
  {
    std::lock_guard<std::mutex> l(g_fd_mu);
    Template& t = g_templates[dir.found.path];
    if (!Same(t.fd, t.dev, t.ino)) {
      const int fd = ::memfd_create("freeflow-sysfs-dir", MFD_CLOEXEC);
      if (fd < 0) return -1;
      t.dir = dir;
      t.fd = fd;
      if (!Identity(fd, &t.dev, &t.ino)) t.ino = 0;
    }
    g_template_count.store(static_cast<int>(g_templates.size()), std::memory_order_release);
    model = t.fd;
  }
  char proc[48];
  std::snprintf(proc, sizeof(proc), "/proc/self/fd/%d", model);
  const int fd =
      static_cast<int>(::syscall(SYS_openat, AT_FDCWD, proc, O_RDONLY | (cloexec ? O_CLOEXEC : 0)));
  if (fd >= 0) return fd;
  return ::fcntl(model, cloexec ? F_DUPFD_CLOEXEC : F_DUPFD, 0);  // no /proc: a copy
}

bool DirOfFd(int fd, Hit* dir) {
  if (fd < 0 || g_template_count.load(std::memory_order_acquire) == 0) return false;
  dev_t dev;
  ino_t ino;
  if (!Identity(fd, &dev, &ino)) return false;
  std::lock_guard<std::mutex> l(g_fd_mu);
  for (const auto& [path, t] : g_templates) {
    if (t.ino == ino && t.dev == dev && Same(t.fd, dev, ino)) {
      *dir = t.dir;
      return true;
    }
  }
  return false;
}

bool TryOpen(int err, int dirfd, const char* path, int flags, int* result) {
  Hit hit;
  int fail = 0;
  const Answer a = Lookup(err, dirfd, path, (flags & O_NOFOLLOW) == 0, &hit, &fail);
  if (a == Answer::kNotOurs) return false;
  *result = -1;
  if (a == Answer::kFailed) {
    errno = fail;
    return true;
  }
  const Node& n = *hit.found.node;
  const bool writes = (flags & O_ACCMODE) != O_RDONLY;
  if ((flags & O_CREAT) != 0 && (flags & O_EXCL) != 0) {
    errno = EEXIST;
  } else if (n.kind == Kind::kLink) {
    errno = ELOOP;  // O_NOFOLLOW on the link itself
  } else if (n.kind == Kind::kDir) {
    if (writes || (flags & O_CREAT) != 0) {
      errno = EISDIR;
    } else {
      *result = OpenDirFd(hit, (flags & O_CLOEXEC) != 0);
    }
  } else if ((flags & O_DIRECTORY) != 0) {
    errno = ENOTDIR;
  } else if (writes || (flags & O_TRUNC) != 0) {
    errno = EROFS;
  } else {
    *result = OpenFile(n, flags);
  }
  return true;
}

bool TryStat(int err, int dirfd, const char* path, bool follow, struct stat* st, int* result) {
  return TryStatT(err, dirfd, path, follow, st, result);
}

bool TryStat(int err, int dirfd, const char* path, bool follow, struct stat64* st, int* result) {
  return TryStatT(err, dirfd, path, follow, st, result);
}

bool TryStatx(int err, int dirfd, const char* path, int flags, struct statx* sx, int* result) {
  struct stat st {};
  if (!TryStat(err, dirfd, path, (flags & AT_SYMLINK_NOFOLLOW) == 0, &st, result)) return false;
  if (*result != 0) return true;
  if (sx == nullptr) {
    errno = EFAULT;
    *result = -1;
    return true;
  }
  std::memset(sx, 0, sizeof(*sx));
  sx->stx_mask = STATX_BASIC_STATS;
  sx->stx_blksize = static_cast<uint32_t>(st.st_blksize);
  sx->stx_nlink = static_cast<uint32_t>(st.st_nlink);
  sx->stx_mode = static_cast<uint16_t>(st.st_mode);
  sx->stx_ino = st.st_ino;
  sx->stx_size = static_cast<uint64_t>(st.st_size);
  sx->stx_atime.tv_sec = sx->stx_mtime.tv_sec = sx->stx_ctime.tv_sec = st.st_mtim.tv_sec;
  sx->stx_dev_major = major(st.st_dev);
  sx->stx_dev_minor = minor(st.st_dev);
  return true;
}

bool TryAccess(int err, int dirfd, const char* path, int mode, int* result) {
  Hit hit;
  int fail = 0;
  const Answer a = Lookup(err, dirfd, path, true, &hit, &fail);
  if (a == Answer::kNotOurs) return false;
  *result = -1;
  if (a == Answer::kFailed) {
    errno = fail;
  } else if ((mode & W_OK) != 0) {
    errno = EROFS;
  } else if ((mode & X_OK) != 0 && hit.found.node->kind != Kind::kDir) {
    errno = EACCES;
  } else {
    *result = 0;
  }
  return true;
}

bool FstatDir(int fd, struct stat* st) { return FstatDirT(fd, st); }
bool FstatDir(int fd, struct stat64* st) { return FstatDirT(fd, st); }

}  // namespace ff::verbs::vfs
