// Whether a wait spins before it sleeps (docs/tcp-mode.md, "Waits and bells"). Spinning
// turns a wake-up of tens of microseconds into a look at shared memory, but only when the
// peer answers within the spin, which needs a CPU of its own: when runnable threads
// outnumber the CPUs, a spinning waiter takes the CPU the peer needs to answer, and every
// exchange gets slower. So a wait spins only
//   - while the machine's runnable threads (/proc/loadavg, looked at most every
//     kSpinCheckNs) are no more than the CPUs the process may use (its affinity, and its
//     cgroup's CPU quota when it has one), and
//   - while spins in this process end with what they waited for often enough: a score that
//     each spin's outcome moves (SpinResult); below kSpinScoreFloor only one wait in
//     kSpinProbeEvery spins, to learn whether spinning pays again.
#pragma once

#include <cstdint>

namespace ff::fsocket {

// `now_ns`: the caller's MonotonicNs() at the wait's start.
bool SpinWorthIt(uint64_t now_ns);
// The outcome of a spin SpinWorthIt allowed: true when what the wait waited for came during
// it.
void SpinResult(bool came);

// The score after one outcome (tests): 0..kSpinScoreMax, moving an eighth of the way.
uint32_t NextSpinScore(uint32_t score, bool came);
inline constexpr uint32_t kSpinScoreMax = 256;
inline constexpr uint32_t kSpinScoreFloor = 64;  // a quarter of spins succeed
inline constexpr uint32_t kSpinProbeEvery = 32;

// What SpinWorthIt decides from (tests): runnable threads, usable CPUs.
bool SpinDecision(int runnable, int cpus);
// The CPUs a cgroup v2 "cpu.max" text allows ("max 100000": none said, 0), rounded up.
int CpusOfQuota(const char* cpu_max);
// The runnable threads of a /proc/loadavg text ("0.1 0.2 0.3 3/99 1234": 3), or -1.
int RunnableOfLoadavg(const char* text);

}  // namespace ff::fsocket
