#include "spin.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "freeflow/clock.h"
#include "freeflow/tunables.h"
#include "real.h"
#include "sock.h"

namespace ff::fsocket {
namespace {

// Reads a small text file whole (without the program's interposed open and close: the
// library's own descriptors never reach the program's bookkeeping). 0 bytes on failure.
size_t ReadSmall(const char* path, char* buf, size_t cap) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const ssize_t n = ::pread(fd, buf, cap - 1, 0);
  (void)real::close(fd);
  const size_t got = n > 0 ? static_cast<size_t>(n) : 0;
  buf[got] = '\0';
  return got;
}

int UsableCpus() {
  static const int cpus = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    int n = ::sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
    if (n <= 0) n = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
    char buf[128];
    if (ReadSmall("/sys/fs/cgroup/cpu.max", buf, sizeof(buf)) > 0) {
      const int quota = CpusOfQuota(buf);
      if (quota > 0) n = std::min(n, quota);
    }
    return std::max(n, 1);
  }();
  return cpus;
}

std::atomic<uint64_t> g_checked_ns{0};
std::atomic<bool> g_spin{true};  // what /proc/loadavg said last
std::atomic<uint32_t> g_score{kSpinScoreMax};
std::atomic<uint32_t> g_waits{0};

// The spin score's say: spin when spins pay, and now and then when they have not.
bool ScoreAllows() {
  if (g_score.load(std::memory_order_relaxed) >= kSpinScoreFloor) return true;
  return g_waits.fetch_add(1, std::memory_order_relaxed) % kSpinProbeEvery == 0;
}

}  // namespace

bool SpinDecision(int runnable, int cpus) { return runnable >= 0 && runnable <= cpus; }

int CpusOfQuota(const char* cpu_max) {
  if (std::strncmp(cpu_max, "max", 3) == 0) return 0;
  char* end = nullptr;
  const long long quota = std::strtoll(cpu_max, &end, 10);
  if (end == cpu_max || quota <= 0) return 0;
  const long long period = std::strtoll(end, nullptr, 10);
  if (period <= 0) return 0;
  return static_cast<int>(std::min<long long>((quota + period - 1) / period, 1 << 20));
}

int RunnableOfLoadavg(const char* text) {
  const char* slash = std::strchr(text, '/');
  if (slash == nullptr) return -1;
  const char* start = slash;
  while (start > text && start[-1] >= '0' && start[-1] <= '9') --start;
  if (start == slash) return -1;
  return std::atoi(start);
}

uint32_t NextSpinScore(uint32_t score, bool came) {
  score = std::min(score, kSpinScoreMax);
  return came ? score + (kSpinScoreMax - score + 7) / 8 : score - (score + 7) / 8;
}

void SpinResult(bool came) {
  const uint32_t s = g_score.load(std::memory_order_relaxed);
  // Lost updates between threads only blur the average.
  g_score.store(NextSpinScore(s, came), std::memory_order_relaxed);
}

bool SpinWorthIt(uint64_t now) {
  // A process confined by seccomp may not open files: it keeps the last look.
  if (Restricted()) return g_spin.load(std::memory_order_relaxed) && ScoreAllows();
  const uint64_t last = g_checked_ns.load(std::memory_order_relaxed);
  uint64_t expected = last;
  if (now - last >= ff::kSpinCheckNs &&
      g_checked_ns.compare_exchange_strong(expected, now, std::memory_order_relaxed)) {
    char buf[128];
    if (ReadSmall("/proc/loadavg", buf, sizeof(buf)) > 0) {
      const int runnable = RunnableOfLoadavg(buf);
      if (runnable >= 0)
        g_spin.store(SpinDecision(runnable, UsableCpus()), std::memory_order_relaxed);
    }
  }
  return g_spin.load(std::memory_order_relaxed) && ScoreAllows();
}

}  // namespace ff::fsocket
