// Descriptor numbers the library marked as its own (rdma_cm channels, RDMA netlink sockets),
// so that an interposer on a call every program makes (write, close, send, ...) tells any
// other descriptor apart with one load and one compare, never a system call. Below
// ff::kCmFastFds each number has a byte, a bit per kind; above it, a count per kind says
// whether any is marked at all. A marked number may since name another file: its owner then
// checks the file's identity. One table for every kind, so the close family (rdmacm/
// cm_device.cc), which releases the marks of whatever a number was, pays one load.
// Constant-initialised, so interposers may use one before main and after static destructors.
#pragma once

#include <atomic>
#include <cstdint>

#include "freeflow/tunables.h"

namespace ff::verbs {

enum class FdKind : uint8_t { kCmChannel = 1, kNetlink = 2 };

class FdMarks {
 public:
  // False means `fd` is not marked as any kind.
  bool Maybe(int fd) const {
    if (static_cast<unsigned>(fd) < static_cast<unsigned>(ff::kCmFastFds))
      return marks_[fd].load(std::memory_order_relaxed) != 0;
    return fd >= 0 && (high_[0].load(std::memory_order_relaxed) != 0 ||
                       high_[1].load(std::memory_order_relaxed) != 0);
  }
  // False means `fd` is not marked as `kind`.
  bool Maybe(int fd, FdKind kind) const {
    if (static_cast<unsigned>(fd) < static_cast<unsigned>(ff::kCmFastFds))
      return (marks_[fd].load(std::memory_order_relaxed) & Bit(kind)) != 0;
    return fd >= 0 && high_[Slot(kind)].load(std::memory_order_relaxed) != 0;
  }
  // Above kCmFastFds, every Set(on) must be matched by one Set(off) of the same kind, or
  // the kind's count never returns to zero (slower, never wrong).
  void Set(int fd, FdKind kind, bool on) {
    if (static_cast<unsigned>(fd) < static_cast<unsigned>(ff::kCmFastFds)) {
      if (on) {
        marks_[fd].fetch_or(Bit(kind), std::memory_order_relaxed);
      } else {
        marks_[fd].fetch_and(static_cast<uint8_t>(~Bit(kind)), std::memory_order_relaxed);
      }
    } else if (fd >= 0) {
      high_[Slot(kind)].fetch_add(on ? 1 : -1, std::memory_order_relaxed);
    }
  }
  // Unmarks `kind` at the numbers [first, last] below kCmFastFds (a count above it cannot
  // tell which number it counted).
  void ClearLow(unsigned first, unsigned last, FdKind kind) {
    const unsigned end = last < static_cast<unsigned>(ff::kCmFastFds) - 1
                             ? last
                             : static_cast<unsigned>(ff::kCmFastFds) - 1;
    for (unsigned fd = first; fd <= end; ++fd)
      if (Maybe(static_cast<int>(fd), kind)) Set(static_cast<int>(fd), kind, false);
  }

 private:
  static constexpr uint8_t Bit(FdKind kind) { return static_cast<uint8_t>(kind); }
  static constexpr int Slot(FdKind kind) { return kind == FdKind::kCmChannel ? 0 : 1; }

  std::atomic<uint8_t> marks_[ff::kCmFastFds] = {};
  std::atomic<int> high_[2] = {};
};

// The process's marks (fd_marks.cc).
extern FdMarks g_library_fds;

}  // namespace ff::verbs
