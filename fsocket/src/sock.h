// What libfsocket knows about a descriptor: nothing (kernel TCP, a file, anything else), an
// accelerated stream (a connection whose bytes move through a stream segment), a listener it
// registered with the router, or an epoll set it shadows. One Sock per open file description
// of this process, shared by every descriptor dup() made of it.
//
// The descriptor table is lock-free for readers: every interposer looks its descriptor up on
// each call. Socks are type-stable (kept in a pool, never freed), so a lookup may take a
// reference on a Sock that is being recycled, notices, and tries again.
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "freeflow/fd.h"
#include "freeflow/stream_segment.h"

namespace ff::fsocket {

class EpollShadow;

inline constexpr int kTimeoutUnknown = -2;

enum class Kind : uint8_t { kFree, kStream, kListener, kEpoll };
enum class StreamState : uint8_t { kConnecting, kOpen };

// The locks of one end of a connection, in that end's side memfd (only its pod maps it):
// robust and process-shared, because forked processes and threads may share the socket.
struct SideLocks {
  std::atomic<uint32_t> init;  // 0: fresh, 1: being set up, 2: ready
  uint32_t reserved;
  pthread_mutex_t send_mu;
  pthread_mutex_t recv_mu;
  pthread_mutex_t
      drain_mu;  // restricted processes: between looking at the kernel socket and reading it
};
// Shared by the processes of one pod that hold the socket (fork, exec): part of the ABI.
static_assert(offsetof(SideLocks, init) == 0 && offsetof(SideLocks, send_mu) == 8 &&
              sizeof(SideLocks) <= ff::kStreamSideBytes);

struct Sock {
  std::atomic<int32_t> refs{0};  // one per descriptor slot, one per Ref held
  Kind kind = Kind::kFree;

  // kStream
  ff::Mapping seg, side;
  uint32_t ring_bytes = 0;
  ff::StreamRingHeader* tx = nullptr;  // the ring this end produces into
  ff::StreamRingHeader* rx = nullptr;  // the ring it consumes
  uint8_t* tx_data = nullptr;
  uint8_t* rx_data = nullptr;
  SideLocks* locks = nullptr;
  // This end's side of the connection's bell pair (bells.h), or -1.
  std::atomic<int> bell{-1};
  // The bell's other side is closed (the peer end is gone): nothing will ring it again, and
  // a wait on it would end at once, every time.
  std::atomic<bool> bell_hung{false};
  std::atomic<StreamState> state{StreamState::kOpen};
  std::atomic<bool> eof{false};       // the peer's FIN was read from the kernel
  std::atomic<bool> rd_shut{false};   // shutdown(SHUT_RD) here
  std::atomic<bool> wr_shut{false};   // shutdown(SHUT_WR) here
  std::atomic<int> error{0};          // an error to report once (ECONNRESET, a protocol error)
  std::atomic<bool> dead{false};      // reset: the connection is over in both directions
  // When this process last found the kernel connection empty (MonotonicNs): a non-blocking
  // read that finds the ring empty within kKernelQuietNs of it does not look again.
  std::atomic<uint64_t> kernel_quiet_ns{0};
  std::atomic<int> waiters{0};        // threads of this process sleeping on the socket
  std::atomic<bool> nonblock{false};  // O_NONBLOCK as this process last set or saw it
  // SO_RCVTIMEO / SO_SNDTIMEO in ms (-1: none), or kTimeoutUnknown until a wait asks.
  std::atomic<int> rcv_timeout_ms{kTimeoutUnknown}, snd_timeout_ms{kTimeoutUnknown};
  // TCP_NODELAY as the program set it; the kernel connection keeps it on (TagStream).
  std::atomic<bool> app_nodelay{false};
  // The connection as the router's record names it from this end (SockClosed at the last
  // close): the other end's address (network order) and port, this end's port.
  uint32_t peer_ip_net = 0;
  uint16_t local_port = 0, peer_port = 0;
  // This process dialed it (connect; dial_policy.h); as the look after the kernel's turn
  // at its destination when `look`.
  bool dialed = false;
  bool look = false;
  // The calls of this process that moved bytes on it, both ways (StreamRecv, StreamSend),
  // counted while it is `dialed` and up to kShortStreamExchanges.
  std::atomic<uint64_t> exchanges{0};

  // kListener
  uint16_t port = 0;
  pid_t registered_by = 0;     // the process whose session registered the port
  uint64_t registered_in = 0;  // ... and which of its sessions (SessionGeneration)

  // kEpoll
  std::unique_ptr<EpollShadow> shadow;
};

// A counted reference to a live Sock.
class Ref {
 public:
  Ref() = default;
  explicit Ref(Sock* s) : s_(s) {}
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  Ref(Ref&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  Ref& operator=(Ref&& o) noexcept;
  ~Ref();
  Sock* get() const { return s_; }
  Sock* operator->() const { return s_; }
  Sock& operator*() const { return *s_; }
  explicit operator bool() const { return s_ != nullptr; }
  Sock* release() {
    Sock* s = s_;
    s_ = nullptr;
    return s;
  }

 private:
  Sock* s_ = nullptr;
};

// A fresh Sock of `kind` with one reference (the caller's).
Ref NewSock(Kind kind);
// Another reference to a Sock the caller holds one on.
Ref Share(Sock* s);
// The Sock behind `fd`, or an empty Ref. Cheap: one load when there is none.
Ref Lookup(int fd);
// Makes `fd` refer to `s` (taking a reference of its own) and returns what it referred to.
Ref Install(int fd, Sock* s);
// Forgets `fd` (it was closed) and returns what it referred to.
Ref Detach(int fd);
// Whether connect() may still make `fd` a stream: a TCP socket this process made with
// socket(2) (or inherited unconnected) that has not been through connect() yet. Only then
// do epoll sets follow the program's registrations of it (epoll.h); a socket this process
// did not see made is not made a stream while any epoll set is shadowed, since a set may
// hold it without the library knowing what the program asked. Cleared by connect() and
// before the number is closed or replaced. Lock-free: one load when asked.
void SetMayBecomeStream(int fd, bool may);
bool MayBecomeStream(int fd);
// SetMayBecomeStream(fd, false) for every fd in [lo, hi] (hi < 0: no end).
void SettleRange(int lo, int hi);
// True when any descriptor names a Sock of kind `k` (quick check for the poll family).
bool AnyOfKind(Kind k);
// The descriptors in [lo, hi] that name a Sock (for close_range and closefrom).
std::vector<int> SlotsIn(int lo, int hi);

// Locks of one end: 0, or EIO when the lock is unusable (its memory was damaged).
int LockSend(Sock& s);
int LockRecv(Sock& s);
int LockDrain(Sock& s);
void UnlockSend(Sock& s);
void UnlockRecv(Sock& s);
void UnlockDrain(Sock& s);

// A process that confined itself with seccomp (OpenSSH's pre-authentication child allows
// little beyond read, write and poll) is restricted: from then on the data path makes no
// other system call on a stream. Set by the prctl/seccomp interposers; never cleared (a
// filter cannot be removed).
bool Restricted();
void SetRestricted();

// fork support: the pool's lock across fork().
void SockPrepareFork();
void SockParentAfterFork();
void SockChildAfterFork();

}  // namespace ff::fsocket
