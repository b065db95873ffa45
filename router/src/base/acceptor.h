// The accept loop of a listening socket that does not spin when the process runs out of
// descriptors (or kernel memory). accept() then fails with EMFILE/ENFILE (ENOBUFS/ENOMEM)
// while the connection stays queued, so a level-triggered listener would wake the loop again
// at once, forever. Instead the acceptor stops watching the listener (one log line) until
// Resume(): its owner calls that when it closed descriptors, and on its timer, so a client
// waits in the backlog instead of being dropped.
// Threading: the loop's thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "base/event_loop.h"
#include "base/quotas.h"
#include "freeflow/fd.h"

namespace ff::router {

class Acceptor {
 public:
  using OnConnection = std::function<void(UniqueFd)>;
  // Watches listening socket `fd` (not owned), taking up to `burst` connections a turn.
  // `what` names the listener in the log. Returns 0 or an errno value.
  int Start(EventLoop& loop, int fd, int burst, std::string what, OnConnection on_connection);
  void Stop();
  // Watches the listener again if it was paused.
  void Resume();
  bool paused() const { return paused_; }

 private:
  void Accept();

  EventLoop* loop_ = nullptr;
  int fd_ = -1;
  int burst_ = 1;
  std::string what_;
  OnConnection on_connection_;
  EventLoop::WatchId watch_ = 0;
  bool paused_ = false;
  LogLimiter log_;
};

}  // namespace ff::router
