// Directory watcher (inotify) used to notice kubelet restarts within
// milliseconds instead of polling: a restarting kubelet deletes every socket
// in its folder and re-creates kubelet.sock.
//
// Not thread-safe; owned and polled by the daemon's main loop.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace ff::dp {

struct DirEvent {
  enum class Kind { kCreated, kDeleted, kDirGone, kOverflow };
  Kind kind;
  std::string dir;   // watched directory
  std::string name;  // entry name (empty for kDirGone / kOverflow)
};

class DirWatcher {
 public:
  virtual ~DirWatcher() = default;
  virtual bool watch(const std::string& dir, std::string* error) = 0;
  virtual bool watching(const std::string& dir) const = 0;
  virtual int fd() const = 0;                       // readable when events are pending
  virtual std::vector<DirEvent> read_events() = 0;  // non-blocking
};

class InotifyWatcher final : public DirWatcher {
 public:
  InotifyWatcher();
  ~InotifyWatcher() override;
  InotifyWatcher(const InotifyWatcher&) = delete;
  InotifyWatcher& operator=(const InotifyWatcher&) = delete;

  bool watch(const std::string& dir, std::string* error) override;
  bool watching(const std::string& dir) const override;
  int fd() const override { return fd_; }
  std::vector<DirEvent> read_events() override;

 private:
  int fd_ = -1;
  std::map<int, std::string> dirs_;  // watch descriptor -> directory
};

}  // namespace ff::dp
