// Whether a wait spins before it sleeps (docs/tcp-mode.md, "Waits"). Spinning turns a wake-up
// of tens of microseconds into a look at shared memory, but only when the peer has a CPU of
// its own: when runnable threads outnumber the CPUs this process may use, a spinning waiter
// takes the CPU the peer needs to answer, and every exchange gets slower. So a wait spins
// only while the machine's runnable threads (/proc/loadavg, looked at most every
// kSpinCheckNs) are no more than the CPUs the process may use (its affinity, and its
// cgroup's CPU quota when it has one).
#pragma once

namespace ff::fsocket {

bool SpinWorthIt();

// What SpinWorthIt decides from (tests): runnable threads, usable CPUs.
bool SpinDecision(int runnable, int cpus);
// The CPUs a cgroup v2 "cpu.max" text allows ("max 100000": none said, 0), rounded up.
int CpusOfQuota(const char* cpu_max);
// The runnable threads of a /proc/loadavg text ("0.1 0.2 0.3 3/99 1234": 3), or -1.
int RunnableOfLoadavg(const char* text);

}  // namespace ff::fsocket
