#include "epoll.h"

#include <poll.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <cerrno>

#include "bells.h"
#include "exports.h"
#include "freeflow/clock.h"
#include "freeflow/tunables.h"
#include "real.h"
#include "router_link.h"
#include "spin.h"
#include "stream.h"

namespace ff::fsocket {
namespace {

static_assert(POLLIN == EPOLLIN && POLLOUT == EPOLLOUT && POLLERR == EPOLLERR &&
              POLLHUP == EPOLLHUP && POLLRDHUP == EPOLLRDHUP && POLLPRI == EPOLLPRI);

constexpr uint32_t kModeBits = EPOLLET | EPOLLONESHOT | EPOLLEXCLUSIVE | EPOLLWAKEUP;

// Every shadowed epoll set of the process.
std::mutex& ShadowsMu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::vector<Sock*>& Shadows() {
  static auto* v = new std::vector<Sock*>;
  return *v;
}

// What the kernel is asked for a stream: its bells, FIN and reset, edge triggered (each
// arrival once: a FIN would otherwise wake every wait); while it connects, also the
// connect's end.
epoll_event KernelEvent(Watch* w) {
  epoll_event k{};
  k.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
  if (w->stream->state.load() != StreamState::kOpen) k.events |= EPOLLOUT;
  k.data.u64 = reinterpret_cast<uintptr_t>(w);
  return k;
}

// A stream's bell (bells.h) is registered beside its socket, level triggered, with the
// watch's cookie and this bit (a Watch is aligned, so a cookie never has it).
constexpr uint64_t kBellCookie = 1;
static_assert(alignof(Watch) > 1);

Watch* FindCookie(EpollShadow& sh, uint64_t cookie, bool* bell) {
  *bell = (cookie & kBellCookie) != 0;
  cookie &= ~kBellCookie;
  if (sh.cookies.count(static_cast<uintptr_t>(cookie)) == 0) return nullptr;
  return reinterpret_cast<Watch*>(static_cast<uintptr_t>(cookie));
}

// Adds / removes the bell of watch `w`'s stream, when it has one, to / from the set.
void AddBell(EpollShadow& sh, Watch& w) {
  const int bell = w.stream->bell.load(std::memory_order_relaxed);
  if (bell < 0 || Restricted()) return;
  epoll_event k{};
  k.events = EPOLLIN;
  k.data.u64 = reinterpret_cast<uintptr_t>(&w) | kBellCookie;
  // EEXIST: the same stream is watched under another descriptor of the set, whose
  // registration of the bell serves both (a wait looks at every stream).
  (void)real::epoll_ctl(sh.epfd(), EPOLL_CTL_ADD, bell, &k);
}
void RemoveBell(EpollShadow& sh, Watch& w) {
  const int bell = w.stream ? w.stream->bell.load(std::memory_order_relaxed) : -1;
  if (bell >= 0) (void)real::epoll_ctl(sh.epfd(), EPOLL_CTL_DEL, bell, nullptr);
}

// What to report for a stream watch now (0: nothing), and remember it for edge triggering.
uint32_t Report(Watch& w) {
  Sock& s = *w.stream;
  if (w.disabled || s.state.load() != StreamState::kOpen) return 0;
  const uint32_t want = (w.events & ~kModeBits) | EPOLLERR | EPOLLHUP;
  const uint32_t ready = static_cast<uint16_t>(StreamReadiness(s)) & want;
  if (ready == 0) return 0;
  uint32_t out = ready;
  const uint64_t tail = s.rx->tail.load(std::memory_order_acquire);
  const uint64_t head = s.tx->head.load(std::memory_order_acquire);
  if (w.events & EPOLLET) {
    // Edge triggered: new bytes, new room, or a state that was not there at the last report.
    out = 0;
    const bool rdhup_new = (ready & EPOLLRDHUP) && !(w.seen_mask & EPOLLRDHUP);
    if ((ready & EPOLLIN) && (w.fresh || tail != w.seen_tail || rdhup_new))
      out |= ready & (EPOLLIN | EPOLLRDHUP);
    if ((ready & EPOLLOUT) && (w.fresh || head != w.seen_head || !(w.seen_mask & EPOLLOUT)))
      out |= EPOLLOUT;
    out |= ready & ~w.seen_mask & (EPOLLERR | EPOLLHUP);
    if (out == 0) return 0;
    out |= ready & (EPOLLERR | EPOLLHUP);
  }
  w.fresh = false;
  w.seen_tail = tail;
  w.seen_head = head;
  w.seen_mask = ready;
  if (w.events & EPOLLONESHOT) w.disabled = true;
  return out;
}

// Moves the program's registration of `w` to a stream registration in the kernel.
void Convert(EpollShadow& sh, Watch& w) {
  epoll_event k = KernelEvent(&w);
  (void)real::epoll_ctl(sh.epfd(), EPOLL_CTL_MOD, w.fd, &k);
  if (w.stream->state.load() == StreamState::kOpen) AddBell(sh, w);
}

}  // namespace

void EpollStreamCreated(int fd, Sock* s) {
  std::lock_guard all(ShadowsMu());
  for (Sock* e : Shadows()) {
    EpollShadow& sh = *e->shadow;
    std::lock_guard lock(sh.mu);
    auto it = sh.watches.find(fd);
    if (it == sh.watches.end() || it->second->stream) continue;
    it->second->stream = Share(s);
    it->second->fresh = true;
    sh.Counted(it->second.get());
    Convert(sh, *it->second);
  }
}

void EpollForget(int fd, Sock* s) {
  std::lock_guard all(ShadowsMu());
  for (Sock* e : Shadows()) {
    EpollShadow& sh = *e->shadow;
    std::lock_guard lock(sh.mu);
    auto it = sh.watches.find(fd);
    if (it == sh.watches.end() || it->second->stream.get() != s) continue;
    (void)real::epoll_ctl(sh.epfd(), EPOLL_CTL_DEL, fd, nullptr);
    RemoveBell(sh, *it->second);
    sh.Uncounted(it->second.get());
    sh.watches.erase(it);
  }
}

void EpollShadowGone(Sock* e) {
  std::lock_guard all(ShadowsMu());
  auto& v = Shadows();
  v.erase(std::remove(v.begin(), v.end(), e), v.end());
}

namespace {

void AddShadow(int epfd) {
  Ref e = NewSock(Kind::kEpoll);
  e->shadow = std::make_unique<EpollShadow>(epfd);
  {
    std::lock_guard all(ShadowsMu());
    Shadows().push_back(e.get());
  }
  Ref old = Install(epfd, e.get());
}

int Ctl(EpollShadow& sh, int op, int fd, epoll_event* ev) {
  std::lock_guard lock(sh.mu);
  auto it = sh.watches.find(fd);
  Watch* w = it != sh.watches.end() ? it->second.get() : nullptr;
  Ref s = Lookup(fd);
  if (s && s->kind != Kind::kStream) s = Ref();
  if (op == EPOLL_CTL_DEL) {
    const int rc = real::epoll_ctl(sh.epfd(), op, fd, ev);
    if (rc == 0 && w != nullptr) {
      RemoveBell(sh, *w);
      sh.Uncounted(w);
      sh.watches.erase(it);
    }
    return rc;
  }
  if (ev == nullptr) return real::epoll_ctl(sh.epfd(), op, fd, ev);
  auto fresh = std::make_unique<Watch>();
  Watch* target = op == EPOLL_CTL_ADD ? fresh.get() : w;
  if (target == nullptr || (!s && !target->stream)) {  // not a stream: the kernel's alone
    const int rc = real::epoll_ctl(sh.epfd(), op, fd, ev);
    if (rc == 0 && op == EPOLL_CTL_ADD) {
      fresh->fd = fd;
      fresh->events = ev->events;
      fresh->data = ev->data;
      sh.watches[fd] = std::move(fresh);
    } else if (rc == 0 && w != nullptr) {
      w->events = ev->events;
      w->data = ev->data;
    }
    return rc;
  }
  const bool was_stream = static_cast<bool>(target->stream);
  if (!target->stream) target->stream = std::move(s);
  target->fd = fd;
  target->events = ev->events & ~EPOLLEXCLUSIVE;
  target->data = ev->data;
  target->fresh = true;
  target->disabled = false;
  epoll_event k = KernelEvent(target);
  const int rc = real::epoll_ctl(sh.epfd(), op, fd, &k);
  if (rc != 0) {
    if (op == EPOLL_CTL_MOD && !was_stream) target->stream = Ref();
    return rc;
  }
  if (op == EPOLL_CTL_ADD) sh.watches[fd] = std::move(fresh);
  sh.Counted(target);
  if (!was_stream && target->stream->state.load() == StreamState::kOpen) AddBell(sh, *target);
  return 0;
}

// One pass over the stream watches: reported events go to evs[*n...max). A watch reported
// earlier in the same look (sh.looks) is not reported twice.
void Scan(EpollShadow& sh, epoll_event* evs, int max, int* n) {
  for (auto& [fd, w] : sh.watches) {
    if (*n >= max) return;
    if (!w->stream || w->reported_in == sh.looks) continue;
    if (const uint32_t m = Report(*w)) {
      evs[(*n)++] = epoll_event{m, w->data};
      w->reported_in = sh.looks;
    }
  }
}

// Takes the kernel's events in evs[from, from+got): a program's registration passes as it
// is; a stream's cookie means bells, FIN or reset (drained here, reported by the next Scan)
// or the end of its connect. Returns how many program events remain, packed at evs[from].
int TakeKernelEvents(EpollShadow& sh, epoll_event* evs, int from, int got) {
  int kept = 0;
  for (int i = from; i < from + got; ++i) {
    bool bell = false;
    Watch* w = FindCookie(sh, evs[i].data.u64, &bell);
    if (w == nullptr) {
      evs[from + kept++] = evs[i];
      continue;
    }
    Sock& s = *w->stream;
    if (bell) {
      DrainBell(s);
      continue;
    }
    if (s.state.load() != StreamState::kOpen) {
      if (StreamConnected(s, w->fd)) {
        Convert(sh, *w);
      } else if (!w->disabled) {  // the connect failed: the kernel's word is the news
        evs[from + kept++] =
            epoll_event{evs[i].events & (w->events | EPOLLERR | EPOLLHUP), w->data};
      }
      continue;
    }
    StreamDrain(s, w->fd);
  }
  return kept;
}

void ArmAll(EpollShadow& sh) {
  for (auto& [fd, w] : sh.watches)
    if (w->stream && !w->disabled) StreamArm(*w->stream, static_cast<short>(w->events));
}

// One look: streams from their rings, the rest from the kernel (waiting up to timeout_ms).
int Look(EpollShadow& sh, epoll_event* evs, int max, int timeout_ms, const sigset_t* mask) {
  int n = 0;
  {
    std::lock_guard lock(sh.mu);
    ++sh.looks;
    Scan(sh, evs, max, &n);
  }
  if (n >= max) return n;
  const int got = real::epoll_pwait(sh.epfd(), evs + n, max - n, n > 0 ? 0 : timeout_ms, mask);
  if (got < 0) return n > 0 ? n : -1;
  std::lock_guard lock(sh.mu);
  n += TakeKernelEvents(sh, evs, n, got);
  if (got > 0) Scan(sh, evs, max, &n);  // drained streams may have news
  return n;
}

int Wait(EpollShadow& sh, epoll_event* evs, int max, int timeout_ms, const sigset_t* mask) {
  const uint64_t start = ff::MonotonicNs();
  const bool spin = timeout_ms != 0 && SpinWorthIt(start);
  int n = 0;
  // A look that may not wait looks once; a wait that will not spin goes straight to its
  // sleep (the look there returns at once when anything is ready): one system call fewer.
  if (spin || timeout_ms == 0) {
    n = Look(sh, evs, max, 0, mask);
    if (n != 0 || timeout_ms == 0) return n;
  }
  const uint64_t spin_ns = !spin ? 0
                           : timeout_ms < 0
                               ? ff::kStreamSpinNs
                               : std::min<uint64_t>(ff::kStreamSpinNs, timeout_ms * 1'000'000ull);
  uint64_t next_look = start + ff::kKernelLookNs;
  for (uint64_t now = ff::MonotonicNs(); now - start < spin_ns; now = ff::MonotonicNs()) {
    if (now >= next_look) {
      n = Look(sh, evs, max, 0, mask);
      next_look = now + ff::kKernelLookNs;
    } else {
      std::lock_guard lock(sh.mu);
      ++sh.looks;
      Scan(sh, evs, max, &n);
    }
    if (n != 0) {
      if (n > 0) SpinResult(true);
      return n;
    }
    SpinStep(now - start);
  }
  if (spin) SpinResult(false);
  for (;;) {
    {
      std::lock_guard lock(sh.mu);
      ArmAll(sh);
    }
    int left = -1;
    if (timeout_ms >= 0) {
      const uint64_t spent_ms = (ff::MonotonicNs() - start) / 1'000'000;
      if (spent_ms >= static_cast<uint64_t>(timeout_ms)) return Look(sh, evs, max, 0, mask);
      left = static_cast<int>(timeout_ms - spent_ms);
    }
    if (left < 0 || left > ff::kStreamMaxSleepMs) left = ff::kStreamMaxSleepMs;
    if ((n = Look(sh, evs, max, left, mask)) != 0) return n;
  }
}

Ref ShadowOf(int epfd) {
  Ref e = Lookup(epfd);
  if (e && e->kind != Kind::kEpoll) return Ref();
  return e;
}

}  // namespace
}  // namespace ff::fsocket

using namespace ff::fsocket;

extern "C" {

FFS_EXPORT int epoll_create1(int flags) {
  static auto next = reinterpret_cast<int (*)(int)>(real::Next("epoll_create1"));
  const int fd = next(flags);
  if (fd >= 0 && GetConfig().enabled) AddShadow(fd);
  return fd;
}

FFS_EXPORT int epoll_create(int size) {
  if (size <= 0) {
    errno = EINVAL;
    return -1;
  }
  return epoll_create1(0);
}

FFS_EXPORT int epoll_ctl(int epfd, int op, int fd, epoll_event* ev) {
  Ref e = ShadowOf(epfd);
  if (!e) return real::epoll_ctl(epfd, op, fd, ev);
  return Ctl(*e->shadow, op, fd, ev);
}

FFS_EXPORT int epoll_pwait(int epfd, epoll_event* evs, int max, int timeout, const sigset_t* m) {
  Ref e = ShadowOf(epfd);
  if (!e || max <= 0 || e->shadow->streams == 0)
    return real::epoll_pwait(epfd, evs, max, timeout, m);
  return Wait(*e->shadow, evs, max, timeout, m);
}

FFS_EXPORT int epoll_wait(int epfd, epoll_event* evs, int max, int timeout) {
  return epoll_pwait(epfd, evs, max, timeout, nullptr);
}

FFS_EXPORT int epoll_pwait2(int epfd, epoll_event* evs, int max, const timespec* t,
                            const sigset_t* m) {
  int ms = -1;
  if (t != nullptr) {
    if (t->tv_sec < 0 || t->tv_nsec < 0 || t->tv_nsec >= 1'000'000'000) {
      errno = EINVAL;
      return -1;
    }
    const long long total = t->tv_sec * 1000ll + (t->tv_nsec + 999'999) / 1'000'000;
    ms = static_cast<int>(std::min<long long>(total, INT32_MAX));
  }
  Ref e = ShadowOf(epfd);
  if (!e || max <= 0 || e->shadow->streams == 0) {
    static auto next =
        reinterpret_cast<int (*)(int, epoll_event*, int, const timespec*, const sigset_t*)>(
            real::Next("epoll_pwait2"));
    if (next == nullptr) return real::epoll_pwait(epfd, evs, max, ms, m);
    return next(epfd, evs, max, t, m);
  }
  return Wait(*e->shadow, evs, max, ms, m);
}

}  // extern "C"
