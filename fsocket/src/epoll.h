// epoll over streams (docs/tcp-mode.md). The library shadows every epoll set it sees made:
// a stream is registered with the kernel for its bells, FIN and reset only (level
// triggered, the library's own cookie as its data), and its readiness — level or edge
// triggered, one-shot — is computed from its rings at each epoll_wait.
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "sock.h"

namespace ff::fsocket {

struct Watch {
  int fd = -1;
  uint32_t events = 0;  // what the program asked (EPOLLET, EPOLLONESHOT included)
  epoll_data_t data{};
  Ref stream;                             // empty for a descriptor that is not a stream (yet)
  bool fresh = true;                      // nothing reported since ADD/MOD
  bool disabled = false;                  // EPOLLONESHOT fired
  uint64_t seen_tail = 0, seen_head = 0;  // edge triggered: what was last reported
  uint32_t seen_mask = 0;
  uint64_t reported_in = 0;  // the look (EpollShadow::looks) that last reported it
};

class EpollShadow {
 public:
  explicit EpollShadow(int epfd) : epfd_(epfd) {}
  int epfd() const { return epfd_; }
  std::mutex mu;
  std::unordered_map<int, std::unique_ptr<Watch>> watches;  // by descriptor
  std::unordered_set<uintptr_t> cookies;  // the stream watches, as the kernel's data for them
  std::atomic<size_t> streams{0};         // how many
  uint64_t looks = 0;                     // epoll_wait passes, under mu: one report a pass

  // Watch `w` (in `watches`) now has a stream / loses it.
  void Counted(Watch* w) {
    cookies.insert(reinterpret_cast<uintptr_t>(w));
    streams.store(cookies.size());
  }
  void Uncounted(Watch* w) {
    cookies.erase(reinterpret_cast<uintptr_t>(w));
    streams.store(cookies.size());
  }

 private:
  int epfd_;
};

// A stream was made on `fd` (connect, accept): registrations of `fd` made before become
// stream registrations.
void EpollStreamCreated(int fd, Sock* s);
// The last descriptor of stream `s` in this process is closing (`fd` still open).
void EpollForget(int fd, Sock* s);
// Epoll set `e` is gone (its last descriptor closed): forgets its shadow.
void EpollShadowGone(Sock* e);

}  // namespace ff::fsocket
