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
// Maps `size` bytes of a segment another process handed over, after checking that the
// object behind `fd` is at least that large (EINVAL when it is smaller).
int MapPeerSegment(int fd, size_t size, bool writable, Mapping* out);
// Size of the object behind fd.
int SegmentSize(int fd, uint64_t* size);
// True when the object behind fd holds at least `bytes` bytes.
bool SegmentAtLeast(int fd, uint64_t bytes);

// Sends one datagram with optional descriptors (EMSGSIZE when it went out short).
int SendWithFds(int sock, const void* buf, size_t len, const int* fds, int nfds, int flags = 0);
// Receives one datagram and up to `max_fds` descriptors (owned by the caller on success);
// *len is its length, 0 on orderly shutdown. A truncated datagram or descriptor list is an
// error (EMSGSIZE) and any received descriptors are closed.
int RecvWithFds(int sock, void* buf, size_t cap, UniqueFd* fds, int max_fds, int* nfds, size_t* len,
                int flags = 0);

}  // namespace ff
