// epoll over streams (docs/tcp-mode.md). The library shadows every epoll set it sees made:
// a stream's socket is registered with the kernel for FIN, reset and bells rung there (the
// library's own cookie as its data), its bell beside it, and its readiness — level or edge
// triggered, one-shot — is computed from its rings at each epoll_wait.
//
// A descriptor closed without EPOLL_CTL_DEL leaves the kernel's set by itself (when it was
// the file's last); the library forgets its watch at the close (EpollClosing), and treats a
// watch still there when its number comes back (a close it did not see: fclose, a raw
// system call) as gone. Watches are kept for reuse while their set lives, so a kernel event
// that names one dropped a moment ago (another thread's wait) still names a Watch, and is
// recognized as the library's, never handed to the program.
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
  bool belled = false;       // counted in its stream's BellReg
};

// A stream's bell in one set: registered once however many watches the stream has there
// (dup), with the stream's address and kBellCookie as its data.
struct BellReg {
  int fd = -1;    // the descriptor registered, or -1 (none, hung up, or given up)
  int users = 0;  // watches of the stream in the set (kept at 0: a Sock is never freed)
};

class EpollShadow {
 public:
  explicit EpollShadow(int epfd) : epfd_(epfd) {}
  int epfd() const { return epfd_; }
  std::mutex mu;
  std::unordered_map<int, Watch*> watches;  // by descriptor
  std::atomic<size_t> tracked{0};           // watches.size(), read without mu
  std::unordered_set<uintptr_t> cookies;    // the stream watches, as the kernel's data for them
  std::atomic<size_t> streams{0};           // how many
  std::atomic<bool> had_streams{false};     // ever any: kernel events may be the library's
  std::atomic<int> sleepers{0};             // threads that may be asleep in the kernel on it
  uint64_t looks = 0;                       // epoll_wait passes, under mu: one report a pass
  std::unordered_map<Sock*, BellReg> bells;
  std::vector<std::unique_ptr<Watch>> owned;  // every Watch the set had (see above)
  std::vector<Watch*> spare;                  // ... of which these are free
  std::unordered_set<uintptr_t> known;        // ... and their addresses

  // Watch `w` (in `watches`) now has a stream / loses it.
  void Counted(Watch* w) {
    cookies.insert(reinterpret_cast<uintptr_t>(w));
    had_streams.store(true);
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
// connect() left `fd` to the kernel: a registration of it made while it might have become a
// stream is the kernel's alone from now on (its watch is forgotten).
void EpollKernelSocket(int fd);
// The program is closing descriptors [lo, hi] (hi < 0: no end), still open: their watches
// are forgotten (a stream's registrations taken out of the kernel's set).
void EpollClosing(int lo, int hi);
// False when no epoll set is shadowed (a quick test).
bool EpollShadowsExist();
// Epoll set `e` is gone (its last descriptor closed): forgets its shadow.
void EpollShadowGone(Sock* e);

}  // namespace ff::fsocket
