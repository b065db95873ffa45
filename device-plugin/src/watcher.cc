#include "watcher.h"

#include <errno.h>
#include <fmt/format.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

namespace ff::dp {

InotifyWatcher::InotifyWatcher() { fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC); }

InotifyWatcher::~InotifyWatcher() {
  if (fd_ >= 0) ::close(fd_);
}

bool InotifyWatcher::watch(const std::string& dir, std::string* error) {
  if (fd_ < 0) {
    *error = "inotify is unavailable";
    return false;
  }
  int wd = ::inotify_add_watch(
      fd_, dir.c_str(),
      IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF);
  if (wd < 0) {
    *error = fmt::format("cannot watch {}: {}", dir, strerror(errno));
    return false;
  }
  dirs_[wd] = dir;
  return true;
}

bool InotifyWatcher::watching(const std::string& dir) const {
  for (const auto& [wd, d] : dirs_)
    if (d == dir) return true;
  return false;
}

std::vector<DirEvent> InotifyWatcher::read_events() {
  std::vector<DirEvent> out;
  alignas(inotify_event) char buf[8192];
  // Bounded: at most 64 reads per call; the rest stays queued for next time.
  for (int round = 0; round < 64; ++round) {
    ssize_t n = ::read(fd_, buf, sizeof(buf));
    if (n <= 0) break;
    for (ssize_t off = 0; off < n;) {
      auto* ev = reinterpret_cast<inotify_event*>(buf + off);
      off += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
      if (ev->mask & IN_Q_OVERFLOW) {
        out.push_back({DirEvent::Kind::kOverflow, "", ""});
        continue;
      }
      auto it = dirs_.find(ev->wd);
      if (it == dirs_.end()) continue;
      const std::string dir = it->second;
      if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED)) {
        if (ev->mask & IN_IGNORED) dirs_.erase(it);
        out.push_back({DirEvent::Kind::kDirGone, dir, ""});
        continue;
      }
      std::string name = ev->len ? std::string(ev->name) : "";
      if (ev->mask & (IN_CREATE | IN_MOVED_TO))
        out.push_back({DirEvent::Kind::kCreated, dir, name});
      if (ev->mask & (IN_DELETE | IN_MOVED_FROM))
        out.push_back({DirEvent::Kind::kDeleted, dir, name});
    }
  }
  return out;
}

}  // namespace ff::dp
