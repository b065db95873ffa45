#include "base/host_folder.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <vector>

namespace ff::router {
namespace {

constexpr const char* kLibraryName = "libffverbs.so";
constexpr const char* kSocketLibraryName = "libfsocket.so";
constexpr size_t kCopyChunk = 64 * 1024;

std::string Why(const std::string& what, int err) { return what + ": " + std::strerror(err); }

std::string Octal(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

// A name only this process uses for what it is about to put in place (the lock keeps other
// routers away, the folder's mode keeps pods and other users away).
std::string TemporaryName(const std::string& final_name) {
  return "." + final_name + ".tmp." + std::to_string(::getpid());
}

// Copies exactly `size` bytes of `from` into `to`. 0 or an errno value.
int CopyBytes(int from, int to, off_t size) {
  std::vector<char> buf(kCopyChunk);
  for (off_t done = 0; done < size;) {
    const ssize_t n = ::read(from, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : EIO;  // the source shrank under us
    for (ssize_t put = 0; put < n;) {
      const ssize_t w = ::write(to, buf.data() + put, static_cast<size_t>(n - put));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return w < 0 ? errno : EIO;
      put += w;
    }
    done += n;
  }
  return 0;
}

}  // namespace

HostFolder::~HostFolder() {
  struct stat st {};
  const std::string sock = name_ + ".sock";
  if (socket_ino_ != 0 && ::fstatat(folder_.get(), sock.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
      S_ISSOCK(st.st_mode) && st.st_ino == socket_ino_)
    ::unlinkat(folder_.get(), sock.c_str(), 0);
  if (alive_) ::unlinkat(folder_.get(), (name_ + ".alive").c_str(), 0);  // not beating now
}

int HostFolder::Beat() {
  if (!alive_) {
    const std::string entry = name_ + ".alive";
    const int flags = O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK;
    alive_.reset(::openat(folder_.get(), entry.c_str(), flags, 0644));
    if (!alive_ && errno == ELOOP && ::unlinkat(folder_.get(), entry.c_str(), 0) == 0)
      alive_.reset(::openat(folder_.get(), entry.c_str(), flags, 0644));  // a link: replaced
    if (!alive_) return errno;
  }
  return ::futimens(alive_.get(), nullptr) == 0 ? 0 : errno;
}

bool HostFolder::Take(const std::string& dir, const std::string& name,
                      const std::string& library_source, std::string* error) {
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') {
    *error = "--name must be a plain file name, got '" + name + "'";
    return false;
  }
  dir_ = dir;
  name_ = name;
  if (!OpenFolder(dir, error) || !TakeLock(error)) return false;
  if (const int rc = Beat()) {
    *error = Why("cannot create the heartbeat " + alive_path(), rc);
    return false;
  }
  return library_source.empty() || InstallLibrary(library_source, kLibraryName, error);
}

bool HostFolder::Adopt(UniqueFd lock, ino_t socket_ino, const std::string& library_source,
                       std::string* error) {
  lock_ = std::move(lock);
  socket_ino_ = socket_ino;
  held_by_another_ = false;
  if (const int rc = Beat()) {
    *error = Why("cannot create the heartbeat " + alive_path(), rc);
    return false;
  }
  return library_source.empty() || InstallLibrary(library_source, kLibraryName, error);
}

bool HostFolder::OpenFolder(const std::string& dir, std::string* error) {
  folder_.reset(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (!folder_) {
    const int err = errno;  // O_DIRECTORY|O_NOFOLLOW fails on a link with ENOTDIR or ELOOP
    *error = ::lstat(dir.c_str(), &st) == 0 && S_ISLNK(st.st_mode)
                 ? "--dir " + dir + " is a symbolic link; give the folder itself"
                 : Why("--dir " + dir + " is not a directory (create it, or mount the host folder)",
                       err);
    return false;
  }
  if (::fstat(folder_.get(), &st) != 0) {
    *error = Why("cannot stat --dir " + dir, errno);
    return false;
  }
  // Whoever can write the folder decides what every later pod loads and connects to.
  if (st.st_uid != ::geteuid()) {
    *error = "--dir " + dir + " belongs to uid " + std::to_string(st.st_uid) +
             ", not to the router's user (uid " + std::to_string(::geteuid()) +
             "); whoever owns it can replace what pods load";
    return false;
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    *error = "--dir " + dir + " (mode " + Octal(st.st_mode) +
             ") is writable by group or others, who could replace what pods load; "
             "chmod go-w it";
    return false;
  }
  if (::faccessat(folder_.get(), ".", W_OK, AT_EACCESS) != 0) {
    *error = Why("--dir " + dir + " is not writable", errno);
    return false;
  }
  return true;
}

// One router per socket name and folder. Not a lock file: a pod can open and flock() any
// file it sees, even on a read-only mount, and so keep a restarted router from starting.
// Instead an abstract Unix socket named after the folder and the name, which exists only in
// the router's network namespace (pods live in others), plus a connect() to the socket
// itself, for a router serving the same folder from another namespace.
bool HostFolder::TakeLock(std::string* error) {
  held_by_another_ = false;
  struct stat st {};
  if (::fstat(folder_.get(), &st) != 0) {
    *error = Why("cannot stat --dir " + dir_, errno);
    return false;
  }
  char tag[64];
  std::snprintf(tag, sizeof(tag), "freeflow-router/%llx:%llx/",
                static_cast<unsigned long long>(st.st_dev),
                static_cast<unsigned long long>(st.st_ino));
  const std::string abstract = tag + name_;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t len = std::min(abstract.size(), sizeof(addr.sun_path) - 1);
  std::memcpy(addr.sun_path + 1, abstract.data(), len);  // sun_path[0] == 0: abstract
  lock_.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  const auto addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + len);
  if (!lock_ || ::bind(lock_.get(), reinterpret_cast<sockaddr*>(&addr), addr_len) != 0) {
    held_by_another_ = errno == EADDRINUSE;
    *error = held_by_another_ ? "another router already serves " + socket_path()
                              : Why("cannot take the router's lock", errno);
    return false;
  }
  if (SocketAnswers()) {
    lock_.reset();
    *error = "another router already serves " + socket_path() + " (from another namespace)";
    return false;
  }
  return true;
}

// True when something accepts connections on the folder's socket (only one who can write
// the folder can have put it there). A stale socket refuses; anything but a socket is not
// connected to, so a link cannot send the router to another program's socket.
bool HostFolder::SocketAnswers() const {
  const std::string name = name_ + ".sock";
  struct stat st {};
  if (::fstatat(folder_.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
      !S_ISSOCK(st.st_mode))
    return false;
  const std::string path = ThroughFolder(name);
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd probe(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!probe) return false;
  const int rc = ::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  return rc == 0 || errno == EAGAIN;  // EAGAIN: a router with a full backlog
}

bool HostFolder::InstallSocketLibrary(const std::string& source, std::string* error) {
  return InstallLibrary(source, kSocketLibraryName, error);
}

bool HostFolder::InstallLibrary(const std::string& source, const char* name, std::string* error) {
  const std::string target = dir_ + "/" + name;
  const std::string tmp = TemporaryName(name);
  const auto fail = [&](const std::string& what, int err) {
    *error = "cannot install the library " + source + " as " + target + ": " + Why(what, err);
    ::unlinkat(folder_.get(), tmp.c_str(), 0);
    return false;
  };
  UniqueFd in(::open(source.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (!in || ::fstat(in.get(), &st) != 0) return fail("cannot open it", errno);
  if (!S_ISREG(st.st_mode)) return fail("it is not a regular file", EINVAL);
  // A leftover of a router that died mid-install: unlinkat() removes the entry itself, never
  // what a link points to; O_EXCL|O_NOFOLLOW then refuse anything that appears meanwhile.
  ::unlinkat(folder_.get(), tmp.c_str(), 0);
  UniqueFd out(::openat(folder_.get(), tmp.c_str(),
                        O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!out) return fail("cannot create " + tmp, errno);
  if (const int rc = CopyBytes(in.get(), out.get(), st.st_size)) return fail("copy", rc);
  if (::fchmod(out.get(), 0755) != 0 || ::fsync(out.get()) != 0) return fail("sync", errno);
  // rename() swaps the file atomically (a link at the target is replaced, not followed):
  // pods that already mapped the old library keep their copy, new pods get the new one.
  if (::renameat(folder_.get(), tmp.c_str(), folder_.get(), name) != 0)
    return fail("rename", errno);
  ::fsync(folder_.get());
  return true;
}

std::string HostFolder::ThroughFolder(const std::string& entry) const {
  return "/proc/self/fd/" + std::to_string(folder_.get()) + "/" + entry;
}

bool HostFolder::BindSocket(UniqueFd* out, std::string* error) {
  const std::string final_name = name_ + ".sock";
  const std::string tmp = TemporaryName(final_name);
  const std::string bind_path = ThroughFolder(tmp);
  sockaddr_un addr{};
  if (socket_path().size() >= sizeof(addr.sun_path) || bind_path.size() >= sizeof(addr.sun_path)) {
    *error = "socket path " + socket_path() + " is longer than a Unix socket allows";
    return false;
  }
  // Replace only a socket (a dead router's): anything else there is refused.
  struct stat st {};
  if (::fstatat(folder_.get(), final_name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
      !S_ISSOCK(st.st_mode)) {
    *error = socket_path() + " exists and is not a socket; remove it";
    return false;
  }
  UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!sock) {
    *error = Why("socket", errno);
    return false;
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, bind_path.c_str(), bind_path.size() + 1);
  ::unlinkat(folder_.get(), tmp.c_str(), 0);  // a leftover of a router that died here
  // bind() creates the entry itself (it fails on anything already there, links included),
  // so the chmod below and the rename act on this router's socket only.
  if (::bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::fchmodat(folder_.get(), tmp.c_str(), 0666, 0) != 0 ||  // pods run as any user
      ::renameat(folder_.get(), tmp.c_str(), folder_.get(), final_name.c_str()) != 0 ||
      ::fstatat(folder_.get(), final_name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    *error = Why("cannot put the socket in place at " + socket_path(), errno);
    ::unlinkat(folder_.get(), tmp.c_str(), 0);
    return false;
  }
  socket_ino_ = st.st_ino;
  *out = std::move(sock);
  return true;
}

}  // namespace ff::router
