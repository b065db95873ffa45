// The router's reactor: one epoll set, callbacks per watched descriptor, work deferred to
// the end of a turn, and a stop switch that signal handlers and other threads may flip.
//
// Threading: everything except Post() and Stop() must be called on the loop's thread.
// Callbacks run on that thread, one at a time; a callback may watch and unwatch any
// descriptor, including its own: an unwatched descriptor gets no further callback, even
// for events already collected in the same turn.
#pragma once

#include <signal.h>
#include <sys/epoll.h>

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "freeflow/fd.h"
#include "freeflow/tunables.h"

namespace ff::router {

class EventLoop {
 public:
  using Callback = std::function<void(uint32_t events)>;
  using WatchId = uint64_t;  // 0 is never a valid id

  // Work that arrives in memory rather than on a descriptor (PodSessions' request rings):
  // the loop looks for it every turn, and asks before it sleeps.
  class Poller {
   public:
    virtual ~Poller() = default;
    // Serves what has arrived; every turn, before the loop waits or polls its descriptors.
    virtual void Poll() = 0;
    // The loop is about to sleep: ask the writers to wake it (they then ring a descriptor
    // the loop watches). True when work arrived meanwhile: the loop polls instead.
    virtual bool Arm() = 0;
    // The loop woke (after any Arm): the writers need not wake it.
    virtual void Disarm() = 0;
  };

  EventLoop() = default;
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Creates the epoll set and the wake-up eventfd. Returns 0 or an errno value.
  int Init();

  // Watches `fd` (not owned) for `events` (EPOLLIN, ...). Returns 0 when epoll refuses it.
  WatchId Watch(int fd, uint32_t events, Callback cb);
  void Modify(WatchId id, uint32_t events);
  void Unwatch(WatchId id);

  // Runs `fn` on this thread after the callbacks of the current turn.
  void Defer(std::function<void()> fn);
  // Thread-safe: runs `fn` on the loop's thread during its next turn.
  void Post(std::function<void()> fn);

  // One turn: waits up to `timeout_ms` (-1: until something happens) for events, runs
  // their callbacks until kLoopTurnBudgetNs is spent, then the deferred work. The events a
  // spent budget left run first in the next turn, which does not wait: ahead of watches
  // that stay ready turn after turn (a listener under a flood), which epoll would report
  // before them again. Returns the number of events epoll reported.
  int RunOnce(int timeout_ms);
  // Until `ns` from now, RunOnce polls instead of waiting (a client that was just answered
  // is likely to ask again soon; waking a sleeping router costs more than polling). A
  // window already open for longer stays as it is.
  void StayAwake(uint64_t ns);
  // The request being served leaves its client waiting for another node (an rdma_cm REQ,
  // REP or DREQ went on a node link): its answer is a round trip away, so the window that
  // follows the request would only burn CPU (PodSessions opens none then). A count, so
  // that the caller can tell whether a request noted one.
  void NoteRemoteWait() { ++remote_waits_; }
  uint64_t remote_waits() const { return remote_waits_; }
  // Adds or removes a poller (not owned; it outlives its registration).
  void AddPoller(Poller* p) { pollers_.push_back(p); }
  void RemovePoller(Poller* p);
  // Thread-safe and async-signal-safe: makes stopped() true and wakes the loop.
  void Stop();
  // Thread-safe and async-signal-safe: makes the current or next RunOnce() return.
  void Wake();
  bool stopped() const { return stopped_; }

  // How busy the loop is (metrics): the time it spent between its waits, and how long each
  // stretch of work that began with events took (what an event that arrived meanwhile
  // waited at most), counted in kTurnBuckets. The loop's thread only.
  static constexpr std::array<uint64_t, 8> kTurnBuckets = {
      10'000, 100'000, 500'000, 1'000'000, 5'000'000, 10'000'000, 100'000'000, 1'000'000'000};
  struct Load {
    uint64_t busy_ns = 0;
    uint64_t turns = 0;                              // stretches that began with events
    uint64_t turn_ns = 0;                            // their total length
    std::array<uint64_t, kTurnBuckets.size()> le{};  // of them, no longer than each bucket
  };
  const Load& load() const { return load_; }

 private:
  struct Watched {
    int fd = -1;
    Callback cb;
    bool live = true;
  };
  // An event epoll reported: the watch and what it reported.
  struct Ready {
    WatchId id;
    uint32_t what;
  };
  void RunDeferred();
  // This turn's events: those a spent budget left last turn first, then epoll's `n`, an event
  // of a watch already among them merged into it.
  void Gather(const epoll_event* events, int n);
  bool Awake();  // within a StayAwake window
  void Drain();  // the wake-up eventfd fired: take posted work
  void NoteWork(uint64_t now);  // the loop is about to wait: the stretch since it woke

  UniqueFd epoll_;
  UniqueFd wake_;
  WatchId wake_id_ = 0;
  WatchId next_id_ = 1;
  std::unordered_map<WatchId, Watched> watched_;
  std::vector<WatchId> unwatched_;  // erased after the turn that unwatched them
  std::deque<std::function<void()>> deferred_;
  std::mutex posted_mu_;
  std::vector<std::function<void()>> posted_;
  volatile sig_atomic_t stopped_ = 0;
  uint64_t awake_until_ns_ = 0;
  uint64_t remote_waits_ = 0;
  std::vector<Poller*> pollers_;
  Load load_;
  std::vector<Ready> turn_;     // this turn's events (Gather)
  std::vector<Ready> carried_;  // events the last turn's budget left, first in the next
  uint64_t woke_ns_ = 0;        // when the last wait returned
  bool woke_busy_ = false;  // it returned events
};

// A one-shot monotonic timer on a loop: Arm() (re)starts it, the callback runs once when
// it expires.
class Timer {
 public:
  // Returns 0 or an errno value.
  int Start(EventLoop& loop, std::function<void()> on_expiry);
  void Arm(uint64_t after_ns);

 private:
  UniqueFd fd_;
};

}  // namespace ff::router
