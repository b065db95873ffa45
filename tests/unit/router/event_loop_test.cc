// The router's loop stays awake a while after answering a pod (EventLoop::StayAwake,
// --spin-us), then sleeps again; a turn stops taking events once its budget is spent.
#include "base/event_loop.h"

#include <gtest/gtest.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "freeflow/clock.h"
#include "freeflow/fd.h"
#include "freeflow/tunables.h"
#include "harness.h"

namespace ff::router::test {
namespace {

using std::chrono::milliseconds;

// Posts a task to `loop` after `after` unless cancelled first (ends a wait that should not
// have happened, and shows one that should).
class LatePost {
 public:
  LatePost(EventLoop& loop, milliseconds after, std::atomic<bool>* ran)
      : thread_([this, &loop, after, ran] {
          std::unique_lock<std::mutex> g(mu_);
          if (cv_.wait_for(g, after, [this] { return cancelled_; })) return;
          loop.Post([ran] { ran->store(true); });
        }) {}
  ~LatePost() {
    {
      std::lock_guard<std::mutex> g(mu_);
      cancelled_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool cancelled_ = false;
  std::thread thread_;
};

TEST(EventLoopTest, WhileAwakeATurnThatWouldWaitReturnsAtOnce) {
  EventLoop loop;
  ASSERT_EQ(loop.Init(), 0);
  std::atomic<bool> posted{false};
  LatePost guard(loop, milliseconds(5000), &posted);  // what ends a wait, should one start
  loop.StayAwake(60'000'000'000ull);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(loop.RunOnce(-1), 0) << "turn " << i << " waited";
  EXPECT_FALSE(posted.load()) << "a turn waited for the late post";
}

TEST(EventLoopTest, OnceTheWindowPassedATurnWaitsForAnEventAgain) {
  EventLoop loop;
  ASSERT_EQ(loop.Init(), 0);
  {
    std::atomic<bool> posted{false};
    LatePost guard(loop, milliseconds(5000), &posted);
    loop.StayAwake(100'000'000);
    EXPECT_EQ(loop.RunOnce(-1), 0);  // inside the window
    EXPECT_FALSE(posted.load());
  }
  std::this_thread::sleep_for(milliseconds(110));
  std::atomic<bool> posted{false};
  LatePost post(loop, milliseconds(50), &posted);
  EXPECT_GE(loop.RunOnce(-1), 1);
  EXPECT_TRUE(posted.load()) << "the turn returned before the post woke it";
}

// A shorter window opened inside a longer one (--spin-us after --cm-spin-us) leaves it.
TEST(EventLoopTest, AShorterWindowDoesNotCutALongerOneShort) {
  EventLoop loop;
  ASSERT_EQ(loop.Init(), 0);
  std::atomic<bool> posted{false};
  LatePost guard(loop, milliseconds(5000), &posted);
  loop.StayAwake(60'000'000'000ull);
  loop.StayAwake(1'000);
  std::this_thread::sleep_for(milliseconds(5));  // past the shorter one
  EXPECT_EQ(loop.RunOnce(-1), 0) << "the turn waited";
  EXPECT_FALSE(posted.load());
}

TEST(EventLoopTest, AZeroWindowKeepsNothingAwake) {
  EventLoop loop;
  ASSERT_EQ(loop.Init(), 0);
  loop.StayAwake(0);
  std::atomic<bool> posted{false};
  LatePost post(loop, milliseconds(50), &posted);
  EXPECT_GE(loop.RunOnce(-1), 1);
  EXPECT_TRUE(posted.load());
}

// A turn whose events take long stops at its budget: the events left are taken by the
// next turns (the watches are level-triggered), none is lost, and each waited at most the
// budget and one event's work.
TEST(EventLoopTest, ATurnStopsTakingEventsOnceItsBudgetIsSpent) {
  EventLoop loop;
  ASSERT_EQ(loop.Init(), 0);
  constexpr int kFds = 5;
  std::vector<UniqueFd> fds;
  std::vector<int> calls(kFds, 0);
  for (int i = 0; i < kFds; ++i) {
    fds.emplace_back(::eventfd(1, EFD_NONBLOCK | EFD_CLOEXEC));  // readable from the start
    ASSERT_TRUE(fds.back());
    const int fd = fds.back().get();
    ASSERT_NE(loop.Watch(fd, EPOLLIN,
                         [&calls, i, fd](uint32_t) {
                           ++calls[i];
                           uint64_t v = 0;
                           EXPECT_EQ(::read(fd, &v, sizeof(v)), 8);
                           const uint64_t until = MonotonicNs() + 2 * kLoopTurnBudgetNs;
                           while (MonotonicNs() < until) {
                           }
                         }),
              0u);
  }
  // Each event outlasts the budget: every turn takes exactly one, and after kFds turns
  // each was taken once.
  int taken = 0;
  for (int turn = 1; turn <= kFds; ++turn) {
    EXPECT_EQ(loop.RunOnce(0), kFds - taken) << "epoll reports every event not taken yet";
    const int now = std::accumulate(calls.begin(), calls.end(), 0);
    EXPECT_EQ(now, taken + 1) << "turn " << turn;
    taken = now;
  }
  for (int i = 0; i < kFds; ++i) EXPECT_EQ(calls[i], 1) << "event " << i;
}

// A watch that stays ready turn after turn and spends the budget each time (a listener under
// a flood) does not keep the events behind it out: an event a spent budget left runs first
// in the next turn, although epoll reports the busy watch ahead of it again.
TEST(EventLoopTest, AnEventLeftByASpentBudgetRunsFirstInTheNextTurn) {
  EventLoop loop;
  ASSERT_EQ(loop.Init(), 0);
  UniqueFd busy(::eventfd(1, EFD_NONBLOCK | EFD_CLOEXEC));  // never read: always ready
  ASSERT_TRUE(busy);
  int busy_calls = 0;
  ASSERT_NE(loop.Watch(busy.get(), EPOLLIN,
                       [&](uint32_t) {
                         ++busy_calls;
                         const uint64_t until = MonotonicNs() + 2 * kLoopTurnBudgetNs;
                         while (MonotonicNs() < until) {
                         }
                       }),
            0u);
  ASSERT_EQ(loop.RunOnce(0), 1);  // the busy watch alone: first in epoll's ready list
  UniqueFd other(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  ASSERT_TRUE(other);
  int other_calls = 0;
  ASSERT_NE(loop.Watch(other.get(), EPOLLIN,
                       [&](uint32_t what) {
                         ++other_calls;
                         EXPECT_TRUE(what & EPOLLIN);
                         uint64_t v = 0;
                         EXPECT_EQ(::read(other.get(), &v, sizeof(v)), 8);
                       }),
            0u);
  const uint64_t one = 1;
  ASSERT_EQ(::write(other.get(), &one, sizeof(one)), 8);
  EXPECT_EQ(loop.RunOnce(0), 2);  // the busy watch, then the other: left by the budget
  EXPECT_EQ(other_calls, 0);
  loop.RunOnce(0);
  EXPECT_EQ(other_calls, 1) << "the event the budget left waited behind the busy watch again";
  for (int turn = 0; turn < 3; ++turn) loop.RunOnce(0);
  EXPECT_EQ(other_calls, 1) << "an event taken is not run again";
  EXPECT_GE(busy_calls, 4);
}

// CPU time the router's thread spends over `requests` pod requests `gap` apart.
uint64_t CpuForRequests(TestRouter& router, RawPod& pod, int requests, milliseconds gap) {
  const uint64_t before = router.CpuNs();
  for (int i = 0; i < requests; ++i) {
    pod.CreateCq(static_cast<uint32_t>(100 + i));
    std::this_thread::sleep_for(gap);
  }
  return router.CpuNs() - before;
}

TEST(RouterSpinTest, AfterAnsweringAPodTheRouterPollsForSpinUsThenSleeps) {
  TestRouter::Options o;
  o.spin_us = 10'000;  // the longest --spin-us allows
  TestRouter router(o);
  RawPod pod(router, Ip("10.0.0.1"));
  ASSERT_EQ(pod.Hello(), 0);
  std::this_thread::sleep_for(milliseconds(50));  // the HELLO's window passes
  // Five requests 30 ms apart: five windows of 10 ms of polling. On a loaded machine the
  // thread may get only part of a CPU while it polls, hence the low bar.
  const uint64_t busy = CpuForRequests(router, pod, 5, milliseconds(30));
  EXPECT_GE(busy, 15'000'000u) << "the router slept right after answering";
  // Idle again: the router sleeps. Its last window may have begun late (its thread waited
  // for a CPU before it answered, as under ctest -j2 on two vCPUs), so the idle reading
  // starts once any window has surely ended: 7.5 ms of a late window counted as idle once.
  std::this_thread::sleep_for(milliseconds(50));
  const uint64_t before = router.CpuNs();
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_LT(router.CpuNs() - before, 5'000'000u) << "the router kept polling with nobody asking";
}

TEST(RouterSpinTest, WithSpinUsZeroTheRouterSleepsRightAfterAnswering) {
  TestRouter::Options o;
  o.spin_us = 0;
  TestRouter router(o);
  RawPod pod(router, Ip("10.0.0.1"));
  ASSERT_EQ(pod.Hello(), 0);
  EXPECT_LT(CpuForRequests(router, pod, 5, milliseconds(30)), 5'000'000u);
}

}  // namespace
}  // namespace ff::router::test
