// poll, ppoll and select over descriptors some of which are streams: a stream's readiness
// comes from its rings, a kernel wait covers the rest and the bells; the wait spins
// kStreamSpinNs on the rings before it sleeps (docs/tcp-mode.md).
#include <poll.h>
#include <signal.h>
#include <sys/select.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <vector>

#include "bells.h"
#include "exports.h"
#include "freeflow/clock.h"
#include "freeflow/tunables.h"
#include "real.h"
#include "sock.h"
#include "spin.h"
#include "stream.h"

namespace ff::fsocket {
namespace {

struct PollSet {
  pollfd* fds;
  nfds_t n;
  std::vector<Ref> streams;    // per entry: the stream, or empty
  std::vector<pollfd> kernel;  // what the kernel is asked: the n entries, then bells
  std::vector<nfds_t> bell_at;  // per entry: where its stream's bell is in `kernel`, or 0
};

// Which entries are streams and what the kernel is asked for each; false when none is.
bool Classify(PollSet& p) {
  if (!AnyOfKind(Kind::kStream)) return false;
  bool any = false;
  p.streams.resize(p.n);
  p.kernel.assign(p.fds, p.fds + p.n);
  p.bell_at.assign(p.n, 0);
  for (nfds_t i = 0; i < p.n; ++i) {
    Ref s = Lookup(p.fds[i].fd);
    if (!s || s->kind != Kind::kStream) continue;
    any = true;
    // An open stream: the kernel tells bells, FIN and reset (POLLIN); readiness is ours.
    if (s->state.load() == StreamState::kOpen) p.kernel[i].events = POLLIN;
    // Its bell, which a sleeper arms for (bells.h), is looked at too.
    if (const int bell = WaitableBell(*s); bell >= 0) {
      p.bell_at[i] = p.kernel.size();
      p.kernel.push_back(pollfd{bell, POLLIN, 0});
    }
    p.streams[i] = std::move(s);
  }
  return any;
}

short StreamRevents(Sock& s, short events) {
  return StreamReadiness(s) & (events | POLLERR | POLLHUP);
}

// Fills revents from the rings for open streams and from `kernel` (when looked) for the
// rest; returns how many entries are ready.
int Collect(PollSet& p, bool looked) {
  int ready = 0;
  for (nfds_t i = 0; i < p.n; ++i) {
    Sock* s = p.streams[i].get();
    short r = 0;
    if (s != nullptr && looked && p.bell_at[i] != 0 && p.kernel[p.bell_at[i]].revents != 0) {
      pollfd& b = p.kernel[p.bell_at[i]];
      if (b.revents & POLLNVAL) b.fd = -1;  // the program closed it under this wait
      DrainBell(*s);
    }
    if (s != nullptr && looked && p.kernel[i].revents != 0) {
      if (s->state.load() != StreamState::kOpen && StreamConnected(*s, p.fds[i].fd)) {
        p.kernel[i].events = POLLIN;
      } else if (s->state.load() == StreamState::kOpen) {
        StreamDrain(*s, p.fds[i].fd);
      }
    }
    if (s != nullptr && s->state.load() == StreamState::kOpen) {
      r = StreamRevents(*s, p.fds[i].events);
    } else if (looked) {
      r = p.kernel[i].revents;
    } else {
      r = p.fds[i].revents;  // from the last kernel look
    }
    p.fds[i].revents = r;
    if (r != 0) ++ready;
  }
  return ready;
}

// ppoll only when the program gave a signal mask: poll(2) is what a seccomp-confined
// program is sure to be allowed.
int KernelLook(PollSet& p, const timespec* t, const sigset_t* mask) {
  for (auto& k : p.kernel) k.revents = 0;
  if (mask != nullptr) return real::ppoll(p.kernel.data(), p.kernel.size(), t, mask);
  int ms = -1;
  if (t != nullptr) {
    const long long total = t->tv_sec * 1000ll + (t->tv_nsec + 999'999) / 1'000'000;
    ms = static_cast<int>(std::min<long long>(total, INT_MAX));
  }
  return real::poll(p.kernel.data(), p.kernel.size(), ms);
}

// The wait: timeout_ns < 0 waits for ever. As ppoll returns.
int Wait(PollSet& p, int64_t timeout_ns, const sigset_t* mask) {
  for (nfds_t i = 0; i < p.n; ++i) p.fds[i].revents = 0;
  const uint64_t start = ff::MonotonicNs();
  const timespec zero{0, 0};
  const bool spin = timeout_ns != 0 && SpinWorthIt(start);
  // A look that may not wait looks once; a wait that will not spin goes straight to its
  // sleep, which returns at once when anything is ready: one system call fewer.
  if (spin || timeout_ns == 0) {
    if (KernelLook(p, &zero, mask) < 0) return -1;
    if (int r = Collect(p, true); r > 0 || timeout_ns == 0) return r;
  }
  const uint64_t spin_end =
      start +
      (spin ? std::min<uint64_t>(ff::kStreamSpinNs, timeout_ns < 0 ? UINT64_MAX : timeout_ns) : 0);
  uint64_t next_look = start + ff::kKernelLookNs;
  for (uint64_t now = ff::MonotonicNs(); now < spin_end; now = ff::MonotonicNs()) {
    const bool look = now >= next_look;
    if (look) {
      if (KernelLook(p, &zero, mask) < 0) return -1;
      next_look = now + ff::kKernelLookNs;
    }
    if (int r = Collect(p, look)) {
      SpinResult(true);
      return r;
    }
    SpinStep(now - start);
  }
  if (spin) SpinResult(false);
  for (;;) {
    for (nfds_t i = 0; i < p.n; ++i)
      if (p.streams[i]) StreamArm(*p.streams[i], p.fds[i].events);
    if (int r = Collect(p, false)) return r;
    uint64_t left = UINT64_MAX;
    if (timeout_ns >= 0) {
      const uint64_t elapsed = ff::MonotonicNs() - start;
      if (elapsed >= static_cast<uint64_t>(timeout_ns)) return 0;
      left = timeout_ns - elapsed;
    }
    left = std::min<uint64_t>(left, ff::kStreamMaxSleepMs * 1'000'000ull);
    // A stream past the peer's FIN is always readable in the kernel: not asked, and looked
    // at every millisecond instead.
    for (nfds_t i = 0; i < p.n; ++i) {
      Sock* s = p.streams[i].get();
      if (s == nullptr || s->state.load() != StreamState::kOpen || !s->eof.load()) continue;
      p.kernel[i].events = 0;
      left = std::min<uint64_t>(left, 1'000'000);
    }
    timespec t{};
    const timespec* tp = nullptr;
    if (left != UINT64_MAX) {
      t = {static_cast<time_t>(left / 1'000'000'000), static_cast<long>(left % 1'000'000'000)};
      tp = &t;
    }
    if (KernelLook(p, tp, mask) < 0) return -1;
    if (int r = Collect(p, true)) return r;
  }
}

int64_t MsToNs(int ms) { return ms < 0 ? -1 : static_cast<int64_t>(ms) * 1'000'000; }
int64_t TsToNs(const timespec* t) {
  if (t == nullptr) return -1;
  if (t->tv_sec < 0 || t->tv_nsec < 0 || t->tv_nsec >= 1'000'000'000) return -2;
  return static_cast<int64_t>(std::min<time_t>(t->tv_sec, INT64_MAX / 1'000'000'000 - 1)) *
             1'000'000'000 +
         t->tv_nsec;
}

}  // namespace

int PollWithStreams(pollfd* fds, nfds_t n, int64_t timeout_ns, const sigset_t* mask,
                    bool* handled) {
  // One set per thread, kept between calls: no allocation per poll once it has grown.
  thread_local PollSet p{nullptr, 0, {}, {}, {}};
  p.fds = fds;
  p.n = n;
  *handled = Classify(p);
  const int r = *handled ? Wait(p, timeout_ns, mask) : 0;
  p.streams.clear();  // the references, not the capacity
  return r;
}

}  // namespace ff::fsocket

using namespace ff::fsocket;

extern "C" {

FFS_EXPORT int poll(pollfd* fds, nfds_t n, int timeout) {
  bool handled = false;
  const int r = PollWithStreams(fds, n, MsToNs(timeout), nullptr, &handled);
  return handled ? r : real::poll(fds, n, timeout);
}

FFS_EXPORT int __poll_chk(pollfd* fds, nfds_t n, int timeout, size_t fdslen) {
  if (fdslen / sizeof(*fds) < n) __builtin_trap();
  return poll(fds, n, timeout);
}

FFS_EXPORT int ppoll(pollfd* fds, nfds_t n, const timespec* t, const sigset_t* mask) {
  const int64_t ns = TsToNs(t);
  if (ns == -2) return real::ppoll(fds, n, t, mask);  // EINVAL, from the kernel
  bool handled = false;
  const int r = PollWithStreams(fds, n, ns, mask, &handled);
  return handled ? r : real::ppoll(fds, n, t, mask);
}

FFS_EXPORT int __ppoll_chk(pollfd* fds, nfds_t n, const timespec* t, const sigset_t* mask,
                           size_t fdslen) {
  if (fdslen / sizeof(*fds) < n) __builtin_trap();
  return ppoll(fds, n, t, mask);
}

}  // extern "C"

namespace ff::fsocket {
namespace {

// select and pselect through the poll wait: -1 with errno, or how many bits are set.
// `handled` false: no stream among the descriptors, the caller asks libc.
int SelectWithStreams(int nfds, fd_set* r, fd_set* w, fd_set* x, int64_t timeout_ns,
                      const sigset_t* mask, bool* handled) {
  *handled = false;
  if (!AnyOfKind(Kind::kStream) || nfds <= 0 || nfds > FD_SETSIZE) return 0;
  std::vector<pollfd> fds;
  for (int fd = 0; fd < nfds; ++fd) {
    short ev = 0;
    if (r != nullptr && FD_ISSET(fd, r)) ev |= POLLIN;
    if (w != nullptr && FD_ISSET(fd, w)) ev |= POLLOUT;
    if (x != nullptr && FD_ISSET(fd, x)) ev |= POLLPRI;
    if (ev != 0) fds.push_back({fd, ev, 0});
  }
  const int n = PollWithStreams(fds.data(), fds.size(), timeout_ns, mask, handled);
  if (!*handled || n < 0) return n;
  for (const pollfd& p : fds) {
    if (p.revents & POLLNVAL) {
      errno = EBADF;
      return -1;
    }
  }
  int bits = 0;
  for (const pollfd& p : fds) {
    const bool rd = (p.events & POLLIN) && (p.revents & (POLLIN | POLLHUP | POLLERR));
    const bool wr = (p.events & POLLOUT) && (p.revents & (POLLOUT | POLLERR));
    const bool ex = (p.events & POLLPRI) && (p.revents & POLLPRI);
    if (r != nullptr && !rd) FD_CLR(p.fd, r);
    if (w != nullptr && !wr) FD_CLR(p.fd, w);
    if (x != nullptr && !ex) FD_CLR(p.fd, x);
    bits += rd + wr + ex;
  }
  return bits;
}

}  // namespace
}  // namespace ff::fsocket

extern "C" {

FFS_EXPORT int select(int nfds, fd_set* r, fd_set* w, fd_set* x, timeval* tv) {
  int64_t ns = -1;
  if (tv != nullptr) {
    if (tv->tv_sec < 0 || tv->tv_usec < 0 || tv->tv_usec >= 1'000'000) {
      errno = EINVAL;
      return -1;
    }
    ns = static_cast<int64_t>(tv->tv_sec) * 1'000'000'000 + tv->tv_usec * 1000;
  }
  const uint64_t start = ff::MonotonicNs();
  bool handled = false;
  const int n = SelectWithStreams(nfds, r, w, x, ns, nullptr, &handled);
  if (!handled) {
    static auto next =
        reinterpret_cast<int (*)(int, fd_set*, fd_set*, fd_set*, timeval*)>(real::Next("select"));
    return next(nfds, r, w, x, tv);
  }
  if (tv != nullptr) {  // Linux tells how much of the timeout is left
    const uint64_t spent = ff::MonotonicNs() - start;
    const int64_t left = ns > static_cast<int64_t>(spent) ? ns - static_cast<int64_t>(spent) : 0;
    tv->tv_sec = left / 1'000'000'000;
    tv->tv_usec = (left % 1'000'000'000) / 1000;
  }
  return n;
}

FFS_EXPORT int pselect(int nfds, fd_set* r, fd_set* w, fd_set* x, const timespec* t,
                       const sigset_t* mask) {
  const int64_t ns = TsToNs(t);
  bool handled = false;
  const int n = ns == -2 ? 0 : SelectWithStreams(nfds, r, w, x, ns, mask, &handled);
  if (!handled) {
    static auto next =
        reinterpret_cast<int (*)(int, fd_set*, fd_set*, fd_set*, const timespec*, const sigset_t*)>(
            real::Next("pselect"));
    return next(nfds, r, w, x, t, mask);
  }
  return n;
}

}  // extern "C"
