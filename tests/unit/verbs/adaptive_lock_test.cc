// The context lock (verbs/src/base/objects.h, AdaptiveLock): mutual exclusion, and a waiter that
// sleeps instead of spinning while the holder is away (the event thread holds the lock across
// router round trips; a spinning waiter took the CPU the holder needed).
#include <gtest/gtest.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "base/objects.h"

namespace fftest {
namespace {

double ThreadCpuMs() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

TEST(AdaptiveLockTest, ExcludesAcrossThreads) {
  ff::verbs::AdaptiveLock lock;
  long counter = 0;  // plain: a lost update shows up as a wrong sum
  constexpr int kThreads = 4;
  constexpr int kRounds = 50000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        std::lock_guard<ff::verbs::AdaptiveLock> g(lock);
        ++counter;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, static_cast<long>(kThreads) * kRounds);
}

// The holder keeps the lock for 200 ms (as across a router round trip, asleep); the waiter
// must spend almost none of that on the CPU, get the lock once it is given back, and find
// its errno as it left it.
TEST(AdaptiveLockTest, AWaiterSleepsWhileTheHolderIsAway) {
  ff::verbs::AdaptiveLock lock;
  std::atomic<bool> held{false};
  std::thread holder([&] {
    std::lock_guard<ff::verbs::AdaptiveLock> g(lock);
    held.store(true);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  });
  for (int i = 0; i < 2000 && !held.load(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(held.load());
  errno = ERANGE;
  const double cpu0 = ThreadCpuMs();
  const auto t0 = std::chrono::steady_clock::now();
  lock.lock();
  const double waited_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const double cpu_ms = ThreadCpuMs() - cpu0;
  lock.unlock();
  holder.join();
  EXPECT_EQ(errno, ERANGE);
  EXPECT_GT(waited_ms, 100.0) << "the lock was taken while held";
  EXPECT_LT(cpu_ms, 20.0) << "the waiter spun for " << cpu_ms << " ms of " << waited_ms;
}

}  // namespace
}  // namespace fftest
