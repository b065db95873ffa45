// Small RAII owners for file descriptors and memory mappings, plus the few system-call
// helpers every freeflow component shares (memfd segments, SCM_RIGHTS messages).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace ff {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

class Mapping {
 public:
  Mapping() = default;
  Mapping(void* addr, size_t len) : addr_(addr), len_(len) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  Mapping(Mapping&& o) noexcept
      : addr_(std::exchange(o.addr_, nullptr)), len_(std::exchange(o.len_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      reset();
      addr_ = std::exchange(o.addr_, nullptr);
      len_ = std::exchange(o.len_, 0);
    }
    return *this;
  }
  ~Mapping() { reset(); }
  void reset();
  void* get() const { return addr_; }
  size_t size() const { return len_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(addr_);
  }

 private:
  void* addr_ = nullptr;
  size_t len_ = 0;
};

// Error convention of core (and of the router and the library inside): functions return 0
// or a positive errno value; they never set errno for their caller.

// Creates a sealed-size memfd of `size` bytes.
int CreateSegment(const char* name, size_t size, UniqueFd* out);
// Maps `size` bytes of `fd` shared.
int MapSegment(int fd, size_t size, bool writable, Mapping* out);
// Maps `size` bytes of a segment another process handed over, after checking it with
// SealedAtLeast (EINVAL when it fails).
int MapPeerSegment(int fd, size_t size, bool writable, Mapping* out);
// Size of the object behind fd.
int SegmentSize(int fd, uint64_t* size);
// True when `fd` is a file of tmpfs of at least `bytes` bytes opened read-only through a
// read-only mount: no holder of `fd` can write, shrink or punch it, and a reopen of it
// through /proc/self/fd fails with EROFS, root or not; only holders of a read-write
// descriptor of it (the router that made it, and the router that takes over from it) can.
bool ReadOnlyView(int fd, uint64_t bytes);
// True when `fd` is a table the router made and shares read-only (an MR table, TCP mode's
// pod list and claims tables) that holds at least `bytes` bytes and that no holder of `fd`
// can shrink: a memfd sealed against shrinking (SealedAtLeast; the router also seals it
// against writes), or a ReadOnlyView. Only the router's tables may be checked this way: a
// segment a pod made must pass SealedAtLeast, since a pod can keep a read-write descriptor
// of a file it made.
bool RouterTableAtLeast(int fd, uint64_t bytes);
// Maps `size` bytes of a router's table read-only after RouterTableAtLeast (EINVAL when it
// fails).
int MapRouterTable(int fd, size_t size, Mapping* out);
// True when `fd` is a memfd sealed against shrinking that holds at least `bytes` bytes:
// one that another process handed over and can never make smaller under a mapping of it
// (which would turn a later access into SIGBUS). Check before mapping a peer's memfd.
bool SealedAtLeast(int fd, uint64_t bytes);
// True when the memfd behind `fd` refuses new writable mappings (F_SEAL_WRITE or
// F_SEAL_FUTURE_WRITE): a mapping of it can only be read.
bool SealedReadOnly(int fd);
// Forbids new writable mappings of the memfd behind `fd` (mappings made before keep their
// rights): what the holders of `fd`, or of any reopened copy of it, can only read.
int SealReadOnly(int fd);
// Closes the seal set of the memfd behind `fd` (F_SEAL_SEAL): the router does it before it
// hands a QP, SRQ or notify segment to any process but its owner. No holder can then seal it
// against writes (which would keep every later peer from mapping it), and its owner can tell
// that it left the process (SealsFrozen), so that it never reuses it for another QP. 0 when
// the set is closed (already, or now), else a positive errno.
int FreezeSeals(int fd);
// True when the seal set of the memfd behind `fd` is closed (FreezeSeals), or when its seals
// cannot be read.
bool SealsFrozen(int fd);

// Wake sockets. A process that sleeps on an fd another process must be able to wake owns
// the receiving end of a Unix datagram socket pair and hands out the sending end. A waker
// sends with MSG_DONTWAIT, a per-call flag: unlike an eventfd write (whose O_NONBLOCK lives
// on the shared open file description), no holder of either end can make it block. A full
// queue means a wake is already pending, so a failed send loses nothing.
int CreateWakePair(UniqueFd* rx, UniqueFd* tx, bool rx_nonblocking);
// Sends one wake; never blocks, never raises SIGPIPE; errors are ignored (see above).
void SendWake(int tx);
// Takes every pending wake off `rx` without blocking; returns how many there were.
int DrainWakes(int rx);
// Waits for a wake on `rx` and takes it with those already queued behind it, in one system
// call, as a blocking read of a real completion channel would wait: EAGAIN at once when
// `rx` is non-blocking, EINTR when a signal handler without SA_RESTART interrupts it. 0, or
// a positive errno.
int WaitForWakes(int rx);
// True when `fd` is the sending end of a wake socket (a Unix datagram socket).
bool IsWakeSocket(int fd);

// Sends one datagram with optional descriptors (EMSGSIZE when it went out short).
int SendWithFds(int sock, const void* buf, size_t len, const int* fds, int nfds, int flags = 0);
// Receives one datagram and up to `max_fds` descriptors (owned by the caller on success);
// *len is its length, 0 on orderly shutdown. A truncated datagram or descriptor list is an
// error (EMSGSIZE) and any received descriptors are closed.
int RecvWithFds(int sock, void* buf, size_t cap, UniqueFd* fds, int max_fds, int* nfds, size_t* len,
                int flags = 0);

}  // namespace ff
