#include "stream.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <climits>

#include "bells.h"
#include "freeflow/clock.h"
#include "freeflow/protocol.h"
#include "freeflow/tunables.h"
#include "log.h"
#include "real.h"
#include "spin.h"

namespace ff::fsocket {
namespace {

inline void CpuRelax() { __builtin_ia32_pause(); }

size_t IovTotal(const iovec* iov, int n) {
  size_t t = 0;
  for (int i = 0; i < n; ++i) {
    if (iov[i].iov_len > SSIZE_MAX - t) return SSIZE_MAX;
    t += iov[i].iov_len;
  }
  return t;
}

// Copies `n` bytes between the ring (at stream position `pos`) and the iovec array (from
// byte `off` of it), in the direction `to_ring` says.
void Copy(uint8_t* ring, uint32_t size, uint64_t pos, const iovec* iov, int iovcnt, size_t off,
          size_t n, bool to_ring) {
  int i = 0;
  while (i < iovcnt && off >= iov[i].iov_len) off -= iov[i++].iov_len;
  while (n > 0 && i < iovcnt) {
    const uint32_t at = static_cast<uint32_t>(pos & (size - 1));
    size_t chunk = std::min({n, iov[i].iov_len - off, static_cast<size_t>(size - at)});
    uint8_t* user = static_cast<uint8_t*>(iov[i].iov_base) + off;
    if (to_ring) {
      std::memcpy(ring + at, user, chunk);
    } else {
      std::memcpy(user, ring + at, chunk);
    }
    pos += chunk;
    n -= chunk;
    off += chunk;
    if (off == iov[i].iov_len) {
      ++i;
      off = 0;
    }
  }
}

// 0, or why the kernel would not send it (EPIPE once the peer reset the connection).
int Bell(int fd, char b) {
  // A restricted process may only write(2): a bell there never blocks in practice (one per
  // arming, the send buffer holds thousands) but raises SIGPIPE once the peer reset.
  if (Restricted()) return real::write(fd, &b, 1) == 1 ? 0 : errno;
  return real::send(fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1 ? 0 : errno;
}

// Wakes a sleeper that armed its word with `armed`: on its bell when it asked for that and
// this end can, else on the kernel connection.
void Ring(Sock& s, int fd, uint32_t armed, char b) {
  if (armed == ff::kArmBell && RingBell(s, b)) return;
  Bell(fd, b);
}

// After producing: a consumer that said it sleeps gets one bell.
void DataBell(Sock& s, int fd) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (s.tx->rd_armed.load(std::memory_order_relaxed) == 0) return;
  if (const uint32_t armed = s.tx->rd_armed.exchange(0, std::memory_order_acq_rel))
    Ring(s, fd, armed, ff::kBellData);
}

// After consuming: a producer that waits for room gets one bell.
void SpaceBell(Sock& s, int fd) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (s.rx->wr_armed.load(std::memory_order_relaxed) == 0) return;
  if (const uint32_t armed = s.rx->wr_armed.exchange(0, std::memory_order_acq_rel))
    Ring(s, fd, armed, ff::kBellSpace);
}

// Bytes readable, or UINT64_MAX when the peer broke the ring's indices.
uint64_t Unread(const Sock& s) {
  const uint64_t head = s.rx->head.load(std::memory_order_relaxed);
  const uint64_t tail = s.rx->tail.load(std::memory_order_acquire);
  const uint64_t d = tail - head;
  return d > s.ring_bytes ? UINT64_MAX : d;
}
uint64_t Room(const Sock& s) {
  const uint64_t tail = s.tx->tail.load(std::memory_order_relaxed);
  const uint64_t head = s.tx->head.load(std::memory_order_acquire);
  const uint64_t d = tail - head;
  return d > s.ring_bytes ? UINT64_MAX : s.ring_bytes - d;
}

// The connection is over: a broken ring or a byte that is no bell.
void Fail(Sock& s, int fd, const char* why) {
  if (s.dead.exchange(true)) return;
  LogError("TCP-mode connection on descriptor %d reset: %s", fd, why);
  s.error.store(ECONNRESET);
  (void)real::shutdown(fd, SHUT_RDWR);
}

// Takes up to `want` bytes into iov (from byte `off`): bytes, or -1 for a broken ring.
ssize_t Take(Sock& s, int fd, const iovec* iov, int iovcnt, size_t off, size_t want, int flags) {
  if (LockRecv(s) != 0) return -1;
  const uint64_t head = s.rx->head.load(std::memory_order_relaxed);
  const uint64_t avail = s.rx->tail.load(std::memory_order_acquire) - head;
  if (avail > s.ring_bytes) {
    UnlockRecv(s);
    return -1;
  }
  const size_t n = static_cast<size_t>(std::min<uint64_t>(avail, want));
  if (n > 0 && !(flags & MSG_TRUNC))
    Copy(s.rx_data, s.ring_bytes, head, iov, iovcnt, off, n, false);
  const bool consume = n > 0 && !(flags & MSG_PEEK);
  if (consume) s.rx->head.store(head + n, std::memory_order_release);
  UnlockRecv(s);
  if (consume) SpaceBell(s, fd);
  return static_cast<ssize_t>(n);
}

// Puts up to `want` bytes of iov (from byte `off`) into the ring: bytes, or -1.
ssize_t Give(Sock& s, int fd, const iovec* iov, int iovcnt, size_t off, size_t want) {
  if (LockSend(s) != 0) return -1;
  const uint64_t tail = s.tx->tail.load(std::memory_order_relaxed);
  const uint64_t used = tail - s.tx->head.load(std::memory_order_acquire);
  if (used > s.ring_bytes) {
    UnlockSend(s);
    return -1;
  }
  const size_t n = static_cast<size_t>(std::min<uint64_t>(s.ring_bytes - used, want));
  if (n > 0) {
    Copy(s.tx_data, s.ring_bytes, tail, iov, iovcnt, off, n, true);
    s.tx->tail.store(tail + n, std::memory_order_release);
  }
  UnlockSend(s);
  if (n > 0) DataBell(s, fd);
  return static_cast<ssize_t>(n);
}

// O_NONBLOCK as this process set it: read when the stream was made (NoteFlags), followed
// through fcntl(F_SETFL) and ioctl(FIONBIO). A system call a wait would otherwise pay each
// time; another process sharing the socket (fork) that changes the flag is not seen.
bool NonBlocking(Sock& s, int flags) {
  if (flags & MSG_DONTWAIT) return true;
  return s.nonblock.load(std::memory_order_relaxed);
}

// SO_RCVTIMEO / SO_SNDTIMEO in milliseconds (rounded up), -1 for none (and in restricted
// processes, which cannot ask).
int AskTimeoutMs(int fd, int opt) {
  if (Restricted()) return -1;
  timeval tv{};
  socklen_t len = sizeof(tv);
  if (real::getsockopt(fd, SOL_SOCKET, opt, &tv, &len) != 0) return -1;
  if (tv.tv_sec == 0 && tv.tv_usec == 0) return -1;
  const long long ms = tv.tv_sec * 1000ll + (tv.tv_usec + 999) / 1000;
  return static_cast<int>(std::min<long long>(ms, INT_MAX));
}

// The same, asked once and kept until the program sets the option again (setsockopt).
int SocketTimeoutMs(Sock& s, int fd, int opt) {
  std::atomic<int>& known = opt == SO_RCVTIMEO ? s.rcv_timeout_ms : s.snd_timeout_ms;
  int ms = known.load(std::memory_order_relaxed);
  if (ms == kTimeoutUnknown) {
    ms = AskTimeoutMs(fd, opt);
    known.store(ms, std::memory_order_relaxed);
  }
  return ms;
}

struct WaiterCount {
  explicit WaiterCount(Sock& s) : s_(s) { s_.waiters.fetch_add(1); }
  ~WaiterCount() { s_.waiters.fetch_sub(1); }
  Sock& s_;
};

// Waits until the stream can be read (for_read) or written, or has news (a FIN, a reset):
// spins kStreamSpinNs, then sleeps in the kernel until a bell. 0, EAGAIN (timeout), EINTR.
int Wait(Sock& s, int fd, bool for_read, int timeout_ms) {
  auto ready = [&] {
    if (s.dead.load() || s.error.load() != 0) return true;
    if (for_read) return s.eof.load() || s.rd_shut.load() || Unread(s) != 0;
    return Room(s) != 0;
  };
  const uint64_t start = ff::MonotonicNs();
  const uint64_t spin_ns = SpinWorthIt(start) ? ff::kStreamSpinNs : 0;
  for (uint64_t spun = 0; spun < spin_ns; spun = ff::MonotonicNs() - start) {
    if (ready()) {
      SpinResult(true);
      return 0;
    }
    SpinStep(spun);
  }
  if (spin_ns != 0) SpinResult(false);
  const uint64_t deadline = timeout_ms >= 0 ? start + timeout_ms * 1'000'000ull : 0;
  WaiterCount count(s);
  // Whether the kernel socket may hold news (FIN, reset, bells rung there): drained only
  // then, before the first sleep for a writer (which waits for no POLLIN of it) and after a
  // sleep that saw it readable.
  bool kernel_news = !for_read;
  for (;;) {
    StreamArm(s, for_read ? POLLIN : POLLOUT);
    if (ready()) return 0;
    if (kernel_news) {
      StreamDrain(s, fd);
      kernel_news = false;
      if (ready()) return 0;
    }
    // After the peer's FIN the kernel socket is always readable: a writer waiting for room
    // then looks every millisecond instead. A peer that closed answers a byte with a reset
    // (the bell is then refused), which ends the wait as data would on TCP.
    const bool after_fin = !for_read && s.eof.load();
    if (after_fin && Bell(fd, ff::kBellData) == EPIPE) s.dead.store(true);
    if (ready()) return 0;
    int t = -1;
    if (deadline != 0) {
      const uint64_t now = ff::MonotonicNs();
      if (now >= deadline) return EAGAIN;
      t = static_cast<int>((deadline - now + 999'999) / 1'000'000);
    }
    // Another thread of this process may take the bell meant for this one.
    if ((after_fin || s.waiters.load() > 1) && (t < 0 || t > 1)) t = 1;
    if (t < 0 || t > ff::kStreamMaxSleepMs) t = ff::kStreamMaxSleepMs;
    // The kernel socket (FIN, reset, bells rung there) and, when it has one, this end's bell.
    const int bell = WaitableBell(s);
    pollfd p[2] = {{fd, static_cast<short>(after_fin ? 0 : POLLIN), 0}, {bell, POLLIN, 0}};
    const int rc = real::poll(p, bell >= 0 ? 2 : 1, t);
    if (rc < 0 && errno == EINTR && (timeout_ms >= 0 || !RestartAfterSignal())) return EINTR;
    if (rc > 0 && bell >= 0 && p[1].revents != 0) DrainBell(s);
    // The kernel socket's news; after the peer's FIN (events 0) only a reset shows there.
    kernel_news = after_fin || (rc > 0 && p[0].revents != 0);
  }
}

// A stream whose connect is under way: 0 once it is open; EAGAIN, EINTR; or -1 when the
// kernel connection failed (the caller lets the kernel report it).
int AwaitConnected(Sock& s, int fd, int flags) {
  for (;;) {
    if (StreamConnected(s, fd)) return 0;
    pollfd p{fd, POLLOUT, 0};
    const int n = real::poll(&p, 1, 0);
    if (n > 0 && !StreamConnected(s, fd)) return -1;
    if (n > 0) return 0;
    if (NonBlocking(s, flags)) return EAGAIN;
    if (real::poll(&p, 1, -1) < 0 && errno == EINTR && !RestartAfterSignal()) return EINTR;
  }
}

ssize_t Failed(int e) {
  errno = e;
  return -1;
}

// The error of a connect that failed under way, as the kernel reports it once.
ssize_t KernelFailure(int fd) {
  int e = 0;
  socklen_t len = sizeof(e);
  if (real::getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0 || e == 0) e = ENOTCONN;
  return Failed(e);
}

}  // namespace

int AttachStream(Sock& s, int segment_fd, int side_fd, ff::UniqueFd bell, uint32_t role,
                 uint32_t ring_bytes) {
  if (!ff::ValidStreamRingBytes(ring_bytes) ||
      (role != ff::proto::kStreamClient && role != ff::proto::kStreamServer))
    return EPROTO;
  if (ff::MapPeerSegment(segment_fd, ff::StreamSegmentBytes(ring_bytes), true, &s.seg) != 0 ||
      ff::MapPeerSegment(side_fd, ff::kStreamSideBytes, true, &s.side) != 0)
    return EPROTO;
  auto* base = s.seg.as<uint8_t>();
  const uint32_t out = role == ff::proto::kStreamClient ? 0 : 1;
  s.ring_bytes = ring_bytes;
  s.tx = reinterpret_cast<ff::StreamRingHeader*>(base + out * ff::kStreamRingHeaderStride);
  s.rx = reinterpret_cast<ff::StreamRingHeader*>(base + (1 - out) * ff::kStreamRingHeaderStride);
  s.tx_data = base + ff::StreamRingData(ring_bytes, out);
  s.rx_data = base + ff::StreamRingData(ring_bytes, 1 - out);
  s.locks = s.side.as<SideLocks>();
  AdoptBell(s, std::move(bell));
  return 0;
}

void NoteFlags(Sock& s, int fd) {
  const int fl = real::fcntl_int(fd, F_GETFL, 0);
  if (fl >= 0) s.nonblock.store((fl & O_NONBLOCK) != 0);
}

namespace {

bool KernelQuiet(const Sock& s) {
  return ff::MonotonicNs() - s.kernel_quiet_ns.load(std::memory_order_relaxed) < ff::kKernelQuietNs;
}

ssize_t Receive(Sock& s, int fd, const iovec* iov, int iovcnt, int flags) {
  if (flags & MSG_OOB) return Failed(EINVAL);  // no urgent data ever arrives
  if (flags & MSG_ERRQUEUE) return Failed(EAGAIN);
  if (s.state.load() != StreamState::kOpen) {
    const int rc = AwaitConnected(s, fd, flags);
    if (rc < 0) return KernelFailure(fd);
    if (rc > 0) return Failed(rc);
  }
  const size_t total = IovTotal(iov, iovcnt);
  if (total == 0) return 0;
  const bool waitall = (flags & MSG_WAITALL) && !(flags & MSG_PEEK);
  size_t got = 0;
  int timeout = -2;  // not asked yet
  for (;;) {
    if (s.rd_shut.load()) return static_cast<ssize_t>(got);
    const ssize_t n = Take(s, fd, iov, iovcnt, got, total - got, flags);
    if (n < 0) Fail(s, fd, "the peer broke the ring's indices");
    if (n > 0) got += n;
    if (got == total || (got > 0 && !waitall)) return static_cast<ssize_t>(got);
    const bool nonblocking = NonBlocking(s, flags);
    if (n <= 0) {
      if (const int e = s.error.exchange(0)) return got > 0 ? static_cast<ssize_t>(got) : Failed(e);
      if (s.eof.load() || s.dead.load()) return static_cast<ssize_t>(got);
      // A call that returns now must know of a FIN or a reset the kernel holds; one that
      // waits learns of them there (the kernel socket is part of every sleep, and a wait
      // drains it when the kernel reports it). An event loop reads until EAGAIN and then
      // waits: a look at a connection this process found empty just before (the read that
      // took the data, the wait) is a system call that finds nothing.
      if (nonblocking && !KernelQuiet(s)) {
        StreamDrain(s, fd);
        if (s.eof.load() || s.error.load() != 0 || Unread(s) != 0) continue;
      }
    }
    if (nonblocking) return got > 0 ? static_cast<ssize_t>(got) : Failed(EAGAIN);
    if (timeout == -2) timeout = SocketTimeoutMs(s, fd, SO_RCVTIMEO);
    if (const int rc = Wait(s, fd, true, timeout))
      return got > 0 ? static_cast<ssize_t>(got) : Failed(rc);
  }
}

ssize_t SendFailed(int e, int flags) {
  if (e == EPIPE && !(flags & MSG_NOSIGNAL)) ::raise(SIGPIPE);
  return Failed(e);
}

ssize_t Send(Sock& s, int fd, const iovec* iov, int iovcnt, int flags) {
  if (flags & MSG_OOB) return Failed(EOPNOTSUPP);  // urgent data: see docs/tcp-mode.md
  if (s.state.load() != StreamState::kOpen) {
    const int rc = AwaitConnected(s, fd, flags);
    if (rc < 0) return KernelFailure(fd);
    if (rc > 0) return Failed(rc);
  }
  if (s.wr_shut.load()) return SendFailed(EPIPE, flags);
  if (s.eof.load()) {
    // After the peer's FIN a write succeeds, as on TCP, but a peer that closed answers its
    // byte with a reset: the kernel then refuses this bell, and the write fails.
    StreamDrain(s, fd);
    const int e = Bell(fd, ff::kBellData);
    if (e == EPIPE || e == ECONNRESET) {
      s.dead.store(true);
      return SendFailed(EPIPE, flags);
    }
  }
  if (const int e = s.error.exchange(0)) return SendFailed(e, flags);
  if (s.dead.load()) return SendFailed(EPIPE, flags);
  const size_t total = IovTotal(iov, iovcnt);
  size_t sent = 0;
  int timeout = -2;
  while (sent < total) {
    const ssize_t n = Give(s, fd, iov, iovcnt, sent, total - sent);
    if (n < 0) {
      Fail(s, fd, "the peer broke the ring's indices");
      return sent > 0 ? static_cast<ssize_t>(sent) : SendFailed(s.error.exchange(0), flags);
    }
    sent += n;
    if (sent == total) break;
    StreamDrain(s, fd);
    if (s.dead.load() || s.error.load() != 0) {
      if (sent > 0) return static_cast<ssize_t>(sent);
      const int e = s.error.exchange(0);
      return SendFailed(e != 0 ? e : EPIPE, flags);
    }
    if (Room(s) != 0) continue;
    if (NonBlocking(s, flags)) return sent > 0 ? static_cast<ssize_t>(sent) : Failed(EAGAIN);
    if (timeout == -2) timeout = SocketTimeoutMs(s, fd, SO_SNDTIMEO);
    if (const int rc = Wait(s, fd, false, timeout))
      return sent > 0 ? static_cast<ssize_t>(sent) : Failed(rc);
  }
  return static_cast<ssize_t>(sent);
}

// A call that moved `n` bytes on a stream this process dialed counts as an exchange
// (dial_policy.h judges by them), up to the count that makes it long: streams this process
// accepted, and long ones, pay no locked add on their data path.
ssize_t CountExchange(Sock& s, ssize_t n) {
  if (n > 0 && s.dialed && s.exchanges.load(std::memory_order_relaxed) < ff::kShortStreamExchanges)
    s.exchanges.fetch_add(1, std::memory_order_relaxed);
  return n;
}

}  // namespace

ssize_t StreamRecv(Sock& s, int fd, const iovec* iov, int iovcnt, int flags) {
  return CountExchange(s, Receive(s, fd, iov, iovcnt, flags));
}

ssize_t StreamSend(Sock& s, int fd, const iovec* iov, int iovcnt, int flags) {
  return CountExchange(s, Send(s, fd, iov, iovcnt, flags));
}

short StreamReadiness(Sock& s) {
  if (s.state.load() != StreamState::kOpen) return 0;
  short m = 0;
  const uint64_t unread = Unread(s);
  const bool dead = s.dead.load() || unread == UINT64_MAX;
  if (unread != 0 || s.eof.load() || s.rd_shut.load()) m |= POLLIN | POLLRDNORM;
  if (s.eof.load()) m |= POLLRDHUP;
  const uint64_t room = Room(s);
  if ((room != 0 && room != UINT64_MAX) || s.wr_shut.load()) m |= POLLOUT | POLLWRNORM;
  if (s.eof.load() && s.wr_shut.load()) m |= POLLHUP;
  if (dead || s.error.load() != 0) m |= POLLIN | POLLRDNORM | POLLRDHUP | POLLHUP | POLLOUT;
  if (s.error.load() != 0) m |= POLLERR;
  return m;
}

void StreamArm(Sock& s, short events) {
  if (s.state.load() != StreamState::kOpen) return;
  const uint32_t how = ArmValue(s);
  if (events & POLLIN) s.rx->rd_armed.store(how, std::memory_order_relaxed);
  // Room is waited for only when there is none, as TCP signals write space only to a
  // writer that found its buffer full: a wait that asks POLLOUT with room to spare returns
  // at once (level) or has seen it (edge), and a bell at each of the peer's reads would
  // wake it for nothing (every epoll watch of EPOLLIN | EPOLLOUT slept armed for both). The
  // caller looks at the rings after this: room made before the word was set is seen there.
  if ((events & POLLOUT) && Room(s) == 0) s.tx->wr_armed.store(how, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

namespace {

// What a restricted process reads off its kernel socket: read(2) only after poll(2) said
// there is something, under the pod's drain lock so that no other reader empties it between
// the two (a read on a blocking socket would then wait). 0 when there is nothing.
ssize_t RestrictedTake(int fd, char* buf, size_t len) {
  pollfd p{fd, POLLIN, 0};
  if (real::poll(&p, 1, 0) <= 0) {
    errno = EAGAIN;
    return -1;
  }
  return real::read(fd, buf, len);
}

ssize_t TakeBells(int fd, char* buf, size_t len) {
  if (!Restricted()) return real::recv(fd, buf, len, MSG_DONTWAIT);
  return RestrictedTake(fd, buf, len);
}

}  // namespace

void StreamDrain(Sock& s, int fd) {
  const bool restricted = Restricted();
  if (restricted && LockDrain(s) != 0) return;
  DrainLocked(s, fd);
  if (restricted) UnlockDrain(s);
}

void DrainLocked(Sock& s, int fd) {
  char buf[256];
  for (int round = 0; round < 64; ++round) {
    const ssize_t n = TakeBells(fd, buf, sizeof(buf));
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        if (buf[i] != ff::kBellData && buf[i] != ff::kBellSpace)
          return Fail(s, fd, "the peer sent bytes outside the stream segment");
      }
      continue;
    }
    if (n == 0) {
      s.eof.store(true);
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      s.kernel_quiet_ns.store(ff::MonotonicNs(), std::memory_order_relaxed);
    } else {
      s.error.store(errno);
      s.dead.store(true);
    }
    return;
  }
}

void StreamOpened(Sock& s, int fd) {
  StreamState connecting = StreamState::kConnecting;
  if (!s.state.compare_exchange_strong(connecting, StreamState::kOpen)) return;
  // Our handshake's last ACK may have been dropped by a listener whose accept queue was full
  // (a server with a small backlog, under a burst of connects: socat's is 5). Kernel TCP
  // recovers with the client's first data, which carries the ACK and is retransmitted until
  // the server has room; a stream's data goes through the segment, and its kernel connection
  // would stay silent, the connection never accepted, the client waiting for ever. So the
  // kernel connection carries one bell, which the peer's library takes as it takes any
  // (StreamDrain) and its TCP retransmits until the connection is accepted; a server that
  // gave the connection up answers it with a reset, which ends the stream as it would end a
  // kernel TCP client's connection.
  if (const int e = Bell(fd, ff::kBellData); e == EPIPE || e == ECONNRESET) s.dead.store(true);
}

bool StreamConnected(Sock& s, int fd) {
  if (s.state.load() == StreamState::kOpen) return true;
  sockaddr_storage a;
  socklen_t len = sizeof(a);
  if (real::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return false;
  StreamOpened(s, fd);
  return true;
}

uint64_t StreamUnread(Sock& s) {
  if (s.state.load() != StreamState::kOpen) return 0;
  const uint64_t n = Unread(s);
  return n == UINT64_MAX ? 0 : n;
}

uint64_t StreamUnsent(Sock& s) {
  if (s.state.load() != StreamState::kOpen) return 0;
  const uint64_t room = Room(s);
  return room == UINT64_MAX ? 0 : s.ring_bytes - room;
}

void StreamShutdown(Sock& s, int how) {
  if (how == SHUT_RD || how == SHUT_RDWR) s.rd_shut.store(true);
  if (how == SHUT_WR || how == SHUT_RDWR) s.wr_shut.store(true);
}

void StreamRelease(Sock& s, int fd) {
  // Bells are taken, armed words left as they are: another process of the pod may share the
  // socket and sleep on them (it looks again within kStreamMaxSleepMs should this take its
  // bell). A bell that comes after the last close brings a reset, as data to a closed TCP
  // socket does.
  if (s.state.load() == StreamState::kOpen) StreamDrain(s, fd);
}

void TagStream(int fd, Sock& s) {
  int nodelay = 0;
  socklen_t len = sizeof(nodelay);
  if (real::getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &len) == 0)
    s.app_nodelay.store(nodelay != 0);
  const unsigned tag = kStreamTag;
  (void)real::setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &tag, sizeof(tag));
  const int on = 1;
  (void)real::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
}

bool IsTaggedStream(int fd) {
  unsigned v = 0;
  socklen_t len = sizeof(v);
  return real::getsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, &len) == 0 && v == kStreamTag;
}

void SpinStep(uint64_t spun_ns) {
  if (spun_ns < ff::kStreamPauseOnlyNs || Restricted()) {
    for (int i = 0; i < 16; ++i) CpuRelax();
  } else {
    ::sched_yield();
  }
}

bool RestartAfterSignal() {
  if (Restricted()) return false;  // cannot ask: EINTR, which every caller must handle anyway
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction sa;
    if (real::sigaction(sig, nullptr, &sa) != 0) continue;
    if (!(sa.sa_flags & SA_SIGINFO) && (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN))
      continue;
    if (!(sa.sa_flags & SA_RESTART)) return false;
  }
  return true;
}

}  // namespace ff::fsocket
