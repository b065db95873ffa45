#include "base/acceptor.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace ff::router {

int Acceptor::Start(EventLoop& loop, int fd, int burst, std::string what,
                    OnConnection on_connection) {
  loop_ = &loop;
  fd_ = fd;
  burst_ = burst;
  what_ = std::move(what);
  on_connection_ = std::move(on_connection);
  watch_ = loop.Watch(fd, EPOLLIN, [this](uint32_t) { Accept(); });
  return watch_ != 0 ? 0 : errno;
}

void Acceptor::Stop() {
  if (loop_ != nullptr) loop_->Unwatch(watch_);
  watch_ = 0;
}

void Acceptor::Accept() {
  for (int i = 0; i < burst_; ++i) {
    UniqueFd c(::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (c) {
      on_connection_(std::move(c));
      continue;
    }
    const int err = errno;
    // EAGAIN, or a client that left before we took it: nothing is left queued.
    if (err != EMFILE && err != ENFILE && err != ENOBUFS && err != ENOMEM) return;
    loop_->Modify(watch_, 0);
    paused_ = true;
    uint64_t held_back = 0;
    if (log_.Allow(&held_back)) {
      spdlog::error(
          "{}: out of resources ({}); new connections wait until some are freed ({} more "
          "pauses since the last line)",
          what_, std::strerror(err), held_back);
    }
    return;
  }
}

void Acceptor::Resume() {
  if (!paused_ || watch_ == 0) return;
  paused_ = false;
  loop_->Modify(watch_, EPOLLIN);
}

}  // namespace ff::router
