// The one clock freeflow's components time things with.
#pragma once

#include <time.h>

#include <cstdint>

namespace ff {

// CLOCK_MONOTONIC in nanoseconds (vDSO: no system call).
inline uint64_t MonotonicNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace ff
