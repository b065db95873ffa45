#include "base/event_loop.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "freeflow/clock.h"

namespace ff::router {

int EventLoop::Init() {
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_) return errno;
  wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_) return errno;
  wake_id_ = Watch(wake_.get(), EPOLLIN, [this](uint32_t) { Drain(); });
  return wake_id_ != 0 ? 0 : EINVAL;
}

EventLoop::WatchId EventLoop::Watch(int fd, uint32_t events, Callback cb) {
  const WatchId id = next_id_++;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = id;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return 0;
  watched_.emplace(id, Watched{fd, std::move(cb), true});
  return id;
}

void EventLoop::Modify(WatchId id, uint32_t events) {
  auto it = watched_.find(id);
  if (it == watched_.end() || !it->second.live) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = id;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, it->second.fd, &ev);
}

void EventLoop::Unwatch(WatchId id) {
  auto it = watched_.find(id);
  if (it == watched_.end() || !it->second.live) return;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second.fd, nullptr);
  // The callback may be the one running now: it is destroyed after the turn.
  it->second.live = false;
  unwatched_.push_back(id);
}

void EventLoop::Defer(std::function<void()> fn) { deferred_.push_back(std::move(fn)); }

void EventLoop::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> g(posted_mu_);
    posted_.push_back(std::move(fn));
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
}

void EventLoop::Stop() {
  stopped_ = 1;
  Wake();
}

void EventLoop::Wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
}

void EventLoop::Drain() {
  uint64_t v;
  [[maybe_unused]] ssize_t n = ::read(wake_.get(), &v, sizeof(v));
  std::vector<std::function<void()>> work;
  {
    std::lock_guard<std::mutex> g(posted_mu_);
    work.swap(posted_);
  }
  for (auto& fn : work) fn();
}

void EventLoop::RunDeferred() {
  // Deferred work may defer more; it all runs in this turn, in order.
  while (!deferred_.empty()) {
    std::function<void()> fn = std::move(deferred_.front());
    deferred_.pop_front();
    fn();
  }
  for (WatchId id : unwatched_) watched_.erase(id);
  unwatched_.clear();
}

void EventLoop::StayAwake(uint64_t ns) {
  if (ns != 0) awake_until_ns_ = std::max(awake_until_ns_, MonotonicNs() + ns);
}

bool EventLoop::Awake() {
  if (MonotonicNs() < awake_until_ns_) return true;
  awake_until_ns_ = 0;  // no clock reads until the next StayAwake
  return false;
}

void EventLoop::RemovePoller(Poller* p) {
  pollers_.erase(std::remove(pollers_.begin(), pollers_.end(), p), pollers_.end());
}

int EventLoop::RunOnce(int timeout_ms) {
  epoll_event events[kEpollBatch];
  for (Poller* p : pollers_) p->Poll();
  if (!deferred_.empty() || !carried_.empty() ||
      (timeout_ms != 0 && awake_until_ns_ != 0 && Awake()))
    timeout_ms = 0;
  // Armed only now, after the work the polls above deferred or answered: a poller's writer
  // that publishes after Arm() looked rings a descriptor, one that published before is seen.
  bool armed = false;
  if (timeout_ms != 0 && !pollers_.empty()) {
    armed = true;
    for (Poller* p : pollers_)
      if (p->Arm()) timeout_ms = 0;
  }
  NoteWork(MonotonicNs());
  const int n = ::epoll_wait(epoll_.get(), events, kEpollBatch, timeout_ms);
  woke_ns_ = MonotonicNs();
  woke_busy_ = n > 0 || !carried_.empty();
  if (armed)
    for (Poller* p : pollers_) p->Disarm();
  Gather(events, n);
  for (size_t i = 0; i < turn_.size(); ++i) {
    // A turn's budget spent (a burst: many sessions ending at once, each tearing down its
    // QPs and regions), the events left run first in the next turn, which takes them at
    // once. Not left to epoll: it reports what it reported before behind what it did not,
    // so a watch that stays ready (a listener under a flood) would come first every turn
    // and those behind it never. An event waits for at most the budget and one event's work.
    if (i > 0 && MonotonicNs() - woke_ns_ > kLoopTurnBudgetNs) {
      carried_.assign(turn_.begin() + static_cast<std::ptrdiff_t>(i), turn_.end());
      break;
    }
    auto it = watched_.find(turn_[i].id);
    if (it == watched_.end() || !it->second.live) continue;
    it->second.cb(turn_[i].what);
  }
  RunDeferred();
  return n > 0 ? n : 0;
}

void EventLoop::Gather(const epoll_event* events, int n) {
  turn_.swap(carried_);
  carried_.clear();
  const size_t carried = turn_.size();
  for (int i = 0; i < n; ++i) {
    // Copies: epoll_event is packed on x86-64, and a reference to its 8-byte `data` (what
    // find() would take) is misaligned.
    const Ready r{events[i].data.u64, events[i].events};
    const auto end = turn_.begin() + static_cast<std::ptrdiff_t>(carried);
    const auto same =
        std::find_if(turn_.begin(), end, [&](const Ready& c) { return c.id == r.id; });
    if (same != end) {
      same->what |= r.what;
    } else {
      turn_.push_back(r);
    }
  }
}

void EventLoop::NoteWork(uint64_t now) {
  if (woke_ns_ == 0) return;  // the first turn: no stretch before it
  const uint64_t ns = now - woke_ns_;
  load_.busy_ns += ns;
  if (!woke_busy_) return;  // a poll that found nothing: not a stretch an event waited in
  ++load_.turns;
  load_.turn_ns += ns;
  for (size_t i = 0; i < kTurnBuckets.size(); ++i)
    if (ns <= kTurnBuckets[i]) ++load_.le[i];
}

int Timer::Start(EventLoop& loop, std::function<void()> on_expiry) {
  fd_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (!fd_) return errno;
  const int fd = fd_.get();
  const auto id = loop.Watch(fd, EPOLLIN, [fd, cb = std::move(on_expiry)](uint32_t) {
    uint64_t v;
    [[maybe_unused]] ssize_t n = ::read(fd, &v, sizeof(v));
    cb();
  });
  return id != 0 ? 0 : EINVAL;
}

void Timer::Arm(uint64_t after_ns) {
  itimerspec t{};
  after_ns = after_ns == 0 ? 1 : after_ns;
  t.it_value.tv_sec = static_cast<time_t>(after_ns / 1'000'000'000ull);
  t.it_value.tv_nsec = static_cast<long>(after_ns % 1'000'000'000ull);
  ::timerfd_settime(fd_.get(), 0, &t, nullptr);
}

}  // namespace ff::router
