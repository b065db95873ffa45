#include "tcpmode/sweeper.h"

#include <system_error>

namespace ff::router {

TcpModeSweeper::~TcpModeSweeper() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

bool TcpModeSweeper::Start(std::vector<StreamLook> looks) {
  if (!thread_.joinable()) {
    try {
      thread_ = std::thread([this] { Run(); });
    } catch (const std::system_error&) {
      return false;
    }
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    next_ = std::move(looks);
    pending_ = true;
  }
  cv_.notify_one();
  return true;
}

void TcpModeSweeper::Run() {
  for (;;) {
    std::vector<StreamLook> looks;
    {
      std::unique_lock<std::mutex> g(mu_);
      cv_.wait(g, [this] { return stop_ || pending_; });
      if (stop_) return;
      looks = std::move(next_);
      pending_ = false;
    }
    for (StreamLook& l : looks) {
      if (stop_) return;
      if (l.ns != nullptr) l.answer = probe_.Look(*l.ns, l.tuple);
    }
    done_(std::move(looks));
  }
}

}  // namespace ff::router
