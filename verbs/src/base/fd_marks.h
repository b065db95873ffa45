// Descriptor numbers the library marked as its own (rdma_cm channels, RDMA netlink sockets),
// so that an interposer on a call every program makes (write, close, send, ...) tells any
// other descriptor apart with one load and one compare, never a system call. Below
// ff::kCmFastFds each number has a byte; above it, a count says whether any is marked at all.
// A marked number may since name another file: its owner then checks the file's identity.
// Constant-initialised, so interposers may use one before main and after static destructors.
#pragma once

#include <atomic>
#include <cstdint>

#include "freeflow/tunables.h"

namespace ff::verbs {

class FdMarks {
 public:
  // False means `fd` is not one of the marked descriptors.
  bool Maybe(int fd) const {
    if (static_cast<unsigned>(fd) < static_cast<unsigned>(ff::kCmFastFds))
      return marks_[fd].load(std::memory_order_relaxed) != 0;
    return fd >= 0 && high_.load(std::memory_order_relaxed) != 0;
  }
  void Set(int fd, bool on) {
    if (static_cast<unsigned>(fd) < static_cast<unsigned>(ff::kCmFastFds)) {
      marks_[fd].store(on ? 1 : 0, std::memory_order_relaxed);
    } else {
      high_.fetch_add(on ? 1 : -1, std::memory_order_relaxed);
    }
  }

 private:
  std::atomic<uint8_t> marks_[ff::kCmFastFds] = {};
  std::atomic<int> high_{0};
};

}  // namespace ff::verbs
