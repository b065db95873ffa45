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
std::atomic<size_t> g_shadows{0};  // how many (a close looks only when there are)

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

// A stream's bell (bells.h) is registered level triggered, with its stream's address and
// this bit as data (a Watch and a Sock are aligned, so a watch's cookie never has it).
constexpr uint64_t kBellCookie = 1;
static_assert(alignof(Watch) > 1 && alignof(Sock) > 1);

// Whose a kernel event is.
enum class Owner { kProgram, kGone, kWatch, kBell };
Owner OwnerOf(EpollShadow& sh, uint64_t data, Watch** w, Sock** s, BellReg** b) {
  if (data & kBellCookie) {
    auto it = sh.bells.find(reinterpret_cast<Sock*>(static_cast<uintptr_t>(data & ~kBellCookie)));
    if (it == sh.bells.end()) return Owner::kProgram;
    *s = it->first;
    *b = &it->second;
    return it->second.users > 0 && it->second.fd >= 0 ? Owner::kBell : Owner::kGone;
  }
  const auto cookie = static_cast<uintptr_t>(data);
  if (sh.cookies.count(cookie) != 0) {
    *w = reinterpret_cast<Watch*>(cookie);
    return Owner::kWatch;
  }
  return sh.known.count(cookie) != 0 ? Owner::kGone : Owner::kProgram;
}

// Takes stream `s`'s bell out of the set: the descriptor is still the bell's (a program
// that closed it took it out with it).
void UnregisterBell(EpollShadow& sh, Sock& s, BellReg& r) {
  if (r.fd >= 0 && s.bell.load(std::memory_order_relaxed) == r.fd)
    (void)real::epoll_ctl(sh.epfd(), EPOLL_CTL_DEL, r.fd, nullptr);
  r.fd = -1;
}

// Counts watch `w` among its stream's bell users, registering the bell for the first.
void AddBell(EpollShadow& sh, Watch& w) {
  if (w.belled) return;
  w.belled = true;
  Sock& s = *w.stream;
  BellReg& r = sh.bells[&s];
  if (r.users++ > 0) return;
  const int bell = WaitableBell(s);
  if (bell < 0) return;
  epoll_event k{};
  k.events = EPOLLIN;
  k.data.u64 = reinterpret_cast<uintptr_t>(&s) | kBellCookie;
  if (real::epoll_ctl(sh.epfd(), EPOLL_CTL_ADD, bell, &k) == 0) r.fd = bell;
}
void RemoveBell(EpollShadow& sh, Watch& w) {
  if (!w.belled) return;
  w.belled = false;
  auto it = sh.bells.find(w.stream.get());
  if (it == sh.bells.end() || --it->second.users > 0) return;
  UnregisterBell(sh, *it->first, it->second);
}

Watch* NewWatch(EpollShadow& sh) {
  if (!sh.spare.empty()) {
    Watch* w = sh.spare.back();
    sh.spare.pop_back();
    return w;
  }
  sh.owned.push_back(std::make_unique<Watch>());
  Watch* w = sh.owned.back().get();
  sh.known.insert(reinterpret_cast<uintptr_t>(w));
  return w;
}

// Returns watch `w` (not in `watches`) to the spares, its stream's reference dropped.
void FreeWatch(EpollShadow& sh, Watch* w) {
  RemoveBell(sh, *w);
  if (w->stream) sh.Uncounted(w);
  *w = Watch{};
  sh.spare.push_back(w);
}

// Forgets watch `w` of `watches`; `kernel`: its descriptor is still registered there.
void DropWatch(EpollShadow& sh, Watch* w, bool kernel) {
  if (kernel && w->stream) (void)real::epoll_ctl(sh.epfd(), EPOLL_CTL_DEL, w->fd, nullptr);
  sh.watches.erase(w->fd);
  sh.tracked.store(sh.watches.size(), std::memory_order_release);
  FreeWatch(sh, w);
}

// What to report for a stream watch now (0: nothing), and remember it for edge triggering.
uint32_t Report(Watch& w) {
  Sock& s = *w.stream;
  if (w.disabled || s.state.load() != StreamState::kOpen) return 0;
  const uint32_t want = (w.events & ~kModeBits) | EPOLLERR | EPOLLHUP;
  // The indices first, the readiness after: bytes that land in between are reported now and
  // once more later, never remembered as seen without a report (an edge lost until the
  // peer's next bytes: gRPC's calls waited out a whole sleep, 50 ms, a few times a second).
  const uint64_t tail = s.rx->tail.load(std::memory_order_acquire);
  const uint64_t head = s.tx->head.load(std::memory_order_acquire);
  const uint32_t all = static_cast<uint16_t>(StreamReadiness(s));
  const uint32_t ready = all & want;
  if (ready == 0) return 0;
  uint32_t out = ready;
  if (w.events & EPOLLET) {
    // Edge triggered: new bytes, new room, or a state that was not there at the last report.
    // The peer's end is an EPOLLIN edge whether or not the program asked for EPOLLRDHUP (the
    // kernel's FIN wakes the reader): seen_mask holds every state, not only those asked.
    out = 0;
    const bool rdhup_new = (all & EPOLLRDHUP) && !(w.seen_mask & EPOLLRDHUP);
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
  w.seen_mask = all;
  if (w.events & EPOLLONESHOT) w.disabled = true;
  return out;
}

// Stream watch `w` was just counted in `sh`. A thread already asleep in the kernel on the
// set did not arm the stream (it went to sleep before the stream was there, or straight to
// the kernel when the set had no stream), so nothing would wake it for the stream's bytes
// until its sleep ends (seconds, for a program's own timeout). The stream's socket is
// registered again with EPOLLOUT: it is writable, so the kernel wakes a sleeper at once,
// with the library's cookie, which the wait passes over before it arms every stream.
void Kick(EpollShadow& sh, Watch& w) {
  if (sh.sleepers.load() == 0) return;
  epoll_event k = KernelEvent(&w);
  k.events |= EPOLLOUT;
  (void)real::epoll_ctl(sh.epfd(), EPOLL_CTL_MOD, w.fd, &k);
}

// Moves the program's registration of `w` to a stream registration in the kernel; false
// when the kernel has none for it (its descriptor was closed behind the library's back).
bool Convert(EpollShadow& sh, Watch& w) {
  epoll_event k = KernelEvent(&w);
  if (real::epoll_ctl(sh.epfd(), EPOLL_CTL_MOD, w.fd, &k) != 0) return false;
  if (w.stream->state.load() == StreamState::kOpen) AddBell(sh, w);
  Kick(sh, w);
  return true;
}

}  // namespace

void EpollStreamCreated(int fd, Sock* s) {
  std::lock_guard all(ShadowsMu());
  for (Sock* e : Shadows()) {
    EpollShadow& sh = *e->shadow;
    std::lock_guard lock(sh.mu);
    auto it = sh.watches.find(fd);
    if (it == sh.watches.end() || it->second->stream) continue;
    Watch* w = it->second;
    w->stream = Share(s);
    w->fresh = true;
    sh.Counted(w);
    if (!Convert(sh, *w)) DropWatch(sh, w, false);
  }
}

bool EpollShadowsExist() { return g_shadows.load(std::memory_order_relaxed) != 0; }

namespace {

// fn(shadow) under its lock, for every shadowed set that follows a descriptor.
template <typename Fn>
void ForEachFollowing(Fn fn) {
  if (!EpollShadowsExist()) return;
  std::lock_guard all(ShadowsMu());
  for (Sock* e : Shadows()) {
    EpollShadow& sh = *e->shadow;
    if (sh.tracked.load(std::memory_order_acquire) == 0) continue;
    std::lock_guard lock(sh.mu);
    fn(sh);
  }
}

}  // namespace

void EpollKernelSocket(int fd) {
  ForEachFollowing([fd](EpollShadow& sh) {
    if (auto it = sh.watches.find(fd); it != sh.watches.end() && !it->second->stream)
      DropWatch(sh, it->second, false);
  });
}

void EpollClosing(int lo, int hi) {
  ForEachFollowing([lo, hi](EpollShadow& sh) {
    if (lo == hi) {
      if (auto it = sh.watches.find(lo); it != sh.watches.end()) DropWatch(sh, it->second, true);
      return;
    }
    std::vector<Watch*> in;
    for (const auto& [fd, w] : sh.watches)
      if (fd >= lo && (hi < 0 || fd <= hi)) in.push_back(w);
    for (Watch* w : in) DropWatch(sh, w, true);
  });
}

void EpollShadowGone(Sock* e) {
  std::lock_guard all(ShadowsMu());
  auto& v = Shadows();
  v.erase(std::remove(v.begin(), v.end(), e), v.end());
  g_shadows.store(v.size(), std::memory_order_relaxed);
}

namespace {

void AddShadow(int epfd) {
  Ref e = NewSock(Kind::kEpoll);
  e->shadow = std::make_unique<EpollShadow>(epfd);
  {
    std::lock_guard all(ShadowsMu());
    Shadows().push_back(e.get());
    g_shadows.store(Shadows().size(), std::memory_order_relaxed);
  }
  Ref old = Install(epfd, e.get());
}

// A watch of `fd` for stream `s` (ADD).
int AddStream(EpollShadow& sh, int fd, Ref s, const epoll_event& ev, Watch* stale) {
  Watch* w = NewWatch(sh);
  w->stream = std::move(s);
  w->fd = fd;
  w->events = ev.events & ~EPOLLEXCLUSIVE;
  w->data = ev.data;
  epoll_event k = KernelEvent(w);
  if (real::epoll_ctl(sh.epfd(), EPOLL_CTL_ADD, fd, &k) != 0) {
    const int err = errno;
    FreeWatch(sh, w);
    errno = err;
    return -1;
  }
  // The kernel took it: a watch the library still had for `fd` was of a closed descriptor.
  if (stale != nullptr) DropWatch(sh, stale, false);
  sh.watches[fd] = w;
  sh.tracked.store(sh.watches.size(), std::memory_order_release);
  sh.Counted(w);
  if (w->stream->state.load() == StreamState::kOpen) AddBell(sh, *w);
  Kick(sh, *w);
  return 0;
}

// The program's own registration of `fd`, not a stream: the kernel's alone. Followed (a
// watch holding what the program asked) only while connect() may still make `fd` a stream,
// which then takes the registration over (EpollStreamCreated).
int CtlPlain(EpollShadow& sh, int op, int fd, epoll_event* ev, Watch* w) {
  const int rc = real::epoll_ctl(sh.epfd(), op, fd, ev);
  if (rc != 0) return rc;
  if (op == EPOLL_CTL_ADD) {
    if (w != nullptr) DropWatch(sh, w, false);  // stale, as in AddStream
    if (!MayBecomeStream(fd)) return 0;
    w = NewWatch(sh);
    w->fd = fd;
    sh.watches[fd] = w;
    sh.tracked.store(sh.watches.size(), std::memory_order_release);
  }
  if (w != nullptr) {
    w->events = ev->events;
    w->data = ev->data;
  }
  return 0;
}

int Ctl(EpollShadow& sh, int op, int fd, epoll_event* ev) {
  // A descriptor that is no stream and will not become one, in a set that follows none
  // (kernel TCP across nodes, files, pipes): the kernel's registration is all there is. The
  // mark is read first: connect() clears it only after the stream is installed.
  if (!MayBecomeStream(fd) && sh.tracked.load(std::memory_order_acquire) == 0) {
    Ref s = Lookup(fd);
    if (!s || s->kind != Kind::kStream) return real::epoll_ctl(sh.epfd(), op, fd, ev);
  }
  std::lock_guard lock(sh.mu);
  auto it = sh.watches.find(fd);
  Watch* w = it != sh.watches.end() ? it->second : nullptr;
  Ref s = Lookup(fd);
  if (s && s->kind != Kind::kStream) s = Ref();
  if (op == EPOLL_CTL_DEL) {
    const int rc = real::epoll_ctl(sh.epfd(), op, fd, ev);
    if (rc == 0 && w != nullptr) DropWatch(sh, w, false);
    return rc;
  }
  if (ev == nullptr) return real::epoll_ctl(sh.epfd(), op, fd, ev);
  if (op == EPOLL_CTL_ADD && s) return AddStream(sh, fd, std::move(s), *ev, w);
  if (op != EPOLL_CTL_MOD || w == nullptr || (!s && !w->stream)) return CtlPlain(sh, op, fd, ev, w);
  // MOD of a stream watch, or of a watch whose descriptor has become a stream.
  const bool was_stream = static_cast<bool>(w->stream);
  if (!was_stream) w->stream = std::move(s);
  epoll_event k = KernelEvent(w);
  if (real::epoll_ctl(sh.epfd(), op, fd, &k) != 0) {
    if (!was_stream) w->stream = Ref();
    return -1;
  }
  w->events = ev->events & ~EPOLLEXCLUSIVE;
  w->data = ev->data;
  w->fresh = true;
  w->disabled = false;
  if (!was_stream) {
    sh.Counted(w);
    if (w->stream->state.load() == StreamState::kOpen) AddBell(sh, *w);
    Kick(sh, *w);
  }
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
// is; a stream's cookie means FIN, reset or the end of its connect, a bell's that it rang
// (both drained here, reported by the next Scan); a registration the library has dropped
// since the kernel reported it is passed over. Returns how many program events remain,
// packed at evs[from].
int TakeKernelEvents(EpollShadow& sh, epoll_event* evs, int from, int got) {
  int kept = 0;
  for (int i = from; i < from + got; ++i) {
    Watch* w = nullptr;
    Sock* bs = nullptr;
    BellReg* b = nullptr;
    switch (OwnerOf(sh, evs[i].data.u64, &w, &bs, &b)) {
      case Owner::kProgram:
        evs[from + kept++] = evs[i];
        continue;
      case Owner::kGone:
        continue;
      case Owner::kBell:
        DrainBell(*bs);
        // Hung up, or no longer the stream's: out of the set, or it would wake every wait.
        if (WaitableBell(*bs) != b->fd) UnregisterBell(sh, *bs, *b);
        continue;
      case Owner::kWatch:
        break;
    }
    Sock& s = *w->stream;
    if (s.state.load() != StreamState::kOpen) {
      if (StreamConnected(s, w->fd)) {
        (void)Convert(sh, *w);
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
  // From here the thread may sleep in the kernel: a stream counted from now on kicks it.
  sh.sleepers.fetch_add(1);
  struct Awake {
    EpollShadow& sh;
    ~Awake() { sh.sleepers.fetch_sub(1); }
  } awake{sh};
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

// A wait on a shadowed set: with no stream in it, the kernel's own wait (`kernel`, the call
// the program made) unless a stream joins before it starts; a stream that joins during it
// kicks it (Kick), and the kick is passed over: the wait goes on as a stream wait.
template <typename KernelWait>
int SetWait(EpollShadow& sh, epoll_event* evs, int max, int timeout_ms, const sigset_t* mask,
            KernelWait kernel) {
  if (sh.streams.load() == 0) {
    const uint64_t start = ff::MonotonicNs();
    sh.sleepers.fetch_add(1);
    const bool alone = sh.streams.load() == 0;  // after the count: a joiner sees this thread
    int n = alone ? kernel() : 0;
    sh.sleepers.fetch_sub(1);
    if (alone) {
      if (n <= 0 || !sh.had_streams.load()) return n;
      {
        std::lock_guard lock(sh.mu);
        n = TakeKernelEvents(sh, evs, 0, n);
      }
      if (n != 0 || timeout_ms == 0) return n;
      if (timeout_ms > 0) {
        const uint64_t spent_ms = (ff::MonotonicNs() - start) / 1'000'000;
        if (spent_ms >= static_cast<uint64_t>(timeout_ms)) return 0;
        timeout_ms -= static_cast<int>(spent_ms);
      }
    }
  }
  return Wait(sh, evs, max, timeout_ms, mask);
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
  if (!e || max <= 0) return real::epoll_pwait(epfd, evs, max, timeout, m);
  return SetWait(*e->shadow, evs, max, timeout, m,
                 [&] { return real::epoll_pwait(epfd, evs, max, timeout, m); });
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
  static auto next =
      reinterpret_cast<int (*)(int, epoll_event*, int, const timespec*, const sigset_t*)>(
          real::Next("epoll_pwait2"));
  auto kernel = [&] {
    return next != nullptr ? next(epfd, evs, max, t, m) : real::epoll_pwait(epfd, evs, max, ms, m);
  };
  Ref e = ShadowOf(epfd);
  if (!e || max <= 0) return kernel();
  return SetWait(*e->shadow, evs, max, ms, m, kernel);
}

}  // extern "C"
