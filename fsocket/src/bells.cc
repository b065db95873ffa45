#include "bells.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "freeflow/stream_segment.h"
#include "freeflow/tunables.h"
#include "real.h"

namespace ff::fsocket {
namespace {

// Where bells go and how many a process keeps, from RLIMIT_NOFILE's soft limit at the first
// bell: at most an eighth of it (and kMaxBellFds), at numbers from kBellFdFloor, or from as
// far below the limit as the budget needs when the limit is lower. A program then meets
// them only once it holds nearly as many descriptors as its limit allows.
struct Placement {
  int floor = 0;
  int budget = 0;
};
const Placement& Place() {
  static const Placement p = [] {
    Placement out;
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < 64) return out;
    const rlim_t soft = std::min<rlim_t>(rl.rlim_cur, 1u << 30);
    out.budget = static_cast<int>(std::min<rlim_t>(soft / 8, ff::kMaxBellFds));
    out.floor = static_cast<int>(std::min<rlim_t>(soft - out.budget, ff::kBellFdFloor));
    return out;
  }();
  return p;
}

// The bells the process holds: descriptor -> its stream. Every descriptor in it is at least
// Place().floor, so a close below that needs no look.
std::mutex& Mu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::unordered_map<int, Sock*>& Held() {
  static auto* m = new std::unordered_map<int, Sock*>;
  return *m;
}
std::atomic<int> g_held{0};

// Moves `fd` to a number of the bells' range: the new descriptor, or -1 (no room).
int MoveHigh(ff::UniqueFd fd) {
  const Placement& p = Place();
  if (p.budget <= 0 || !fd) return -1;
  const int high = real::fcntl_int(fd.get(), F_DUPFD_CLOEXEC, p.floor);
  (void)real::close(fd.release());  // not through close(): Mu() is held
  return high;
}

// Forgets descriptor `fd` as the bell of its stream (Mu() held); true when it was one.
bool ForgetLocked(int fd) {
  auto it = Held().find(fd);
  if (it == Held().end()) return false;
  int expected = fd;
  it->second->bell.compare_exchange_strong(expected, -1);
  Held().erase(it);
  g_held.fetch_sub(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

void AdoptBell(Sock& s, ff::UniqueFd bell) {
  s.bell.store(-1);
  s.bell_hung.store(false);
  const Placement& p = Place();
  std::lock_guard lock(Mu());
  if (g_held.load(std::memory_order_relaxed) + 1 > p.budget) return;  // kernel bells
  const int b = MoveHigh(std::move(bell));
  if (b < 0) return;
  Held()[b] = &s;
  g_held.fetch_add(1, std::memory_order_relaxed);
  s.bell.store(b);
}

void CloseBell(Sock& s) {
  std::lock_guard lock(Mu());
  const int fd = s.bell.exchange(-1);
  if (fd < 0) return;
  auto it = Held().find(fd);
  if (it != Held().end() && it->second == &s) {
    Held().erase(it);
    g_held.fetch_sub(1, std::memory_order_relaxed);
  }
  (void)real::close(fd);
}

int WaitableBell(const Sock& s) {
  if (Restricted() || s.bell_hung.load(std::memory_order_relaxed)) return -1;
  return s.bell.load(std::memory_order_relaxed);
}

uint32_t ArmValue(const Sock& s) { return WaitableBell(s) < 0 ? ff::kArmKernel : ff::kArmBell; }

bool RingBell(Sock& s, char b) {
  if (Restricted()) return false;  // its filter may allow nothing but write(2)
  const int fd = s.bell.load(std::memory_order_relaxed);
  if (fd < 0) return false;
  if (real::send(fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1) return true;
  // Full: the sleeper has bells it has not taken, and wakes for them.
  return errno == EAGAIN || errno == EWOULDBLOCK;
}

void DrainBell(Sock& s) {
  const int fd = s.bell.load(std::memory_order_relaxed);
  if (fd < 0) return;
  char buf[256];
  for (int round = 0; round < 16; ++round) {
    const ssize_t n = real::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) {
      s.bell_hung.store(true, std::memory_order_relaxed);
      return;
    }
    if (n < static_cast<ssize_t>(sizeof(buf)) && !(n < 0 && errno == EINTR)) return;
  }
}

bool MaybeBell(int fd) {
  return g_held.load(std::memory_order_relaxed) != 0 && fd >= Place().floor;
}

void DisownBell(int fd) {
  if (!MaybeBell(fd)) return;
  std::lock_guard lock(Mu());
  ForgetLocked(fd);
}

void DisownBellsIn(int lo, int hi) {
  if (g_held.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard lock(Mu());
  std::vector<int> in;
  for (const auto& [fd, s] : Held())
    if (fd >= lo && (hi < 0 || fd <= hi)) in.push_back(fd);
  for (int fd : in) ForgetLocked(fd);
}

int BellFdsHeld() { return g_held.load(); }

void BellsPrepareFork() { Mu().lock(); }
void BellsAfterFork() { Mu().unlock(); }

}  // namespace ff::fsocket
