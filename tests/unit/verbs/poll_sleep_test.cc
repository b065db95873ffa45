// When an empty poll_cq may sleep on the router's wake word: only on a CQ whose every source
// of completions is fed by the router. main.cc sets the longest sleep to 300 ms.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "base/objects.h"
#include "freeflow/tunables.h"
#include "pod.h"

namespace fftest {
namespace {

using std::chrono::milliseconds;

constexpr auto kWait = milliseconds(300);  // FFV_REMOTE_WAIT_US in main.cc

milliseconds Elapsed(Clock::time_point since) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - since);
}

// How long `polls` empty polls of `cq` take.
milliseconds TimePolls(ibv_cq* cq, int polls) {
  const auto start = Clock::now();
  EXPECT_TRUE(PollFew(cq, polls).empty());
  return Elapsed(start);
}

// A QP of `pod` connected to `peer`, a process of this node (nullptr on failure).
ibv_qp* SameNodeQp(Pod& pod, SameNodePeer& peer, const QpOptions& o = {}) {
  ibv_qp* qp = pod.CreateQp(o);
  if (qp == nullptr) return nullptr;
  pod.router.AnswerSameNode(qp->qp_num, &peer);
  return pod.Connect(qp, 0x500, o) == 0 ? qp : nullptr;
}

ibv_qp* RouterLinkedQp(Pod& pod, const QpOptions& o = {}) {
  ibv_qp* qp = pod.CreateQp(o);
  if (qp == nullptr) return nullptr;
  pod.router.AnswerThroughRouter(qp->qp_num, 0x900, IBV_QPT_RC);
  EXPECT_EQ(pod.Connect(qp, 0x900, o), 0);
  return qp;
}

TEST(PollSleep, EmptyPollOnARouterFedCqSleepsUntilTheWaitRunsOut) {
  Pod pod;
  ASSERT_NE(RouterLinkedQp(pod), nullptr);
  EXPECT_GE(TimePolls(pod.cq, 1), kWait - milliseconds(50));
}

TEST(PollSleep, ARouterFedPollWakesWhenTheRouterRingsTheWakeWord) {
  Pod pod;
  ibv_qp* qp = RouterLinkedQp(pod);
  ASSERT_NE(qp, nullptr);
  Buffer buf(pod.pd, 64);
  ASSERT_EQ(PostRecv(qp, buf.Sge(0, 64), 3), 0);
  std::vector<ibv_wc> got;
  Clock::time_point returned;
  std::thread poller([&] {
    got = PollN(pod.cq, 1);
    returned = Clock::now();
  });
  ff::NotifySlot* wake = pod.router.pod_notify() + ff::proto::kWakeSlot;
  const auto deadline = Clock::now() + kWaitLimit;
  while (wake->armed.load() == 0 && Clock::now() < deadline) std::this_thread::yield();
  ASSERT_EQ(wake->armed.load(), 1u) << "poll_cq never armed the wake word";
  std::this_thread::sleep_for(milliseconds(20));  // let it fall asleep
  const auto rung = Clock::now();
  pod.router.DeliverSend(qp->qp_num, 0x900, "hello", 5);
  pod.router.WakePod();
  poller.join();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 3u);
  EXPECT_EQ(got[0].byte_len, 5u);
  EXPECT_LT(returned - rung, milliseconds(150)) << "slept through the wake word";
  EXPECT_EQ(std::memcmp(buf.data(), "hello", 5), 0);
}

TEST(PollSleep, APendingSendOnARouterLinkLetsItsSendCqSleep) {
  Pod pod;
  QpOptions o;
  o.send_cq = pod.NewCq();
  ibv_qp* qp = RouterLinkedQp(pod, o);
  ASSERT_NE(qp, nullptr);
  Buffer buf(pod.pd, 64);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE, buf.Sge(0, 64), 1, 0x1000, 1), 0);
  EXPECT_GE(TimePolls(o.send_cq, 1), kWait - milliseconds(50));
}

TEST(PollSleep, ASameNodeCqNeverSleeps) {
  Pod pod;
  SameNodePeer peer(0x500, IBV_QPT_RC, 4096);
  ibv_qp* qp = SameNodeQp(pod, peer);
  ASSERT_NE(qp, nullptr);
  EXPECT_LT(TimePolls(pod.cq, 200), milliseconds(100));
  EXPECT_EQ((pod.router.pod_notify() + ff::proto::kWakeSlot)->armed.load(), 0u);
}

TEST(PollSleep, AUdReceiveQpOnTheCqKeepsItAwake) {
  Pod pod;
  ASSERT_NE(RouterLinkedQp(pod), nullptr);
  QpOptions ud;
  ud.type = IBV_QPT_UD;
  ASSERT_NE(pod.CreateQp(ud), nullptr);
  EXPECT_LT(TimePolls(pod.cq, 50), milliseconds(100));
}

TEST(PollSleep, AQueuedSameNodeSendKeepsEveryCqOfTheContextAwake) {
  Pod pod;
  ASSERT_NE(RouterLinkedQp(pod), nullptr);
  SameNodePeer peer(0x500, IBV_QPT_RC, 4096);
  QpOptions local;
  local.send_cq = local.recv_cq = pod.NewCq();
  ibv_qp* qp = SameNodeQp(pod, peer, local);
  ASSERT_NE(qp, nullptr);
  Buffer buf(pod.pd, 8);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 8), 1), 0);  // no receive: it waits
  EXPECT_LT(TimePolls(pod.cq, 50), milliseconds(100));
  peer.PostCredits(1);
  EXPECT_TRUE(PollFew(pod.cq, 1).empty());
  EXPECT_EQ(peer.Claimed(), 1u) << "polls of the other CQ advance the context's sends";
  EXPECT_EQ(PollN(local.send_cq, 1).size(), 1u);
}

TEST(PollSleep, ACqWithoutConnectedQpsDoesNotSleep) {
  Pod pod;
  ASSERT_NE(pod.CreateQp(), nullptr);  // INIT: nothing can arrive, nothing to sleep for
  EXPECT_LT(TimePolls(pod.cq, 50), milliseconds(100));
}

// On one node a peer process moves the data with its own CPU, which may be this one: a CQ
// no router feeds that stays empty longer than kYieldAfterEmptyNs gives the CPU away every
// kEmptyPollsPerCheck polls from then on; a poll that finds a completion ends the streak.
TEST(PollSleep, ASameNodeCqEmptyForLongYieldsTheCpuNowAndThen) {
  Pod pod;
  SameNodePeer peer(0x500, IBV_QPT_RC, 4096);
  ibv_qp* qp = SameNodeQp(pod, peer);
  ASSERT_NE(qp, nullptr);
  const ff::verbs::Cq* cq = ff::verbs::ToCq(pod.cq);
  constexpr int kEvery = static_cast<int>(ff::kEmptyPollsPerCheck);
  const auto long_enough = std::chrono::nanoseconds(ff::kYieldAfterEmptyNs);
  // A short streak (what a latency loop sees while its peer answers) does not yield.
  const auto start = Clock::now();
  EXPECT_TRUE(PollFew(pod.cq, 4 * kEvery).empty());
  if (Clock::now() - start < long_enough / 2) {
    EXPECT_EQ(cq->yields, 0u);
  }
  // A long one does, every kEvery polls.
  std::this_thread::sleep_for(long_enough);
  EXPECT_TRUE(PollFew(pod.cq, kEvery).empty());
  const uint64_t yields = cq->yields;
  EXPECT_GE(yields, 1u);
  EXPECT_TRUE(PollFew(pod.cq, 3 * kEvery).empty());
  EXPECT_EQ(cq->yields, yields + 3);
  // A completion ends the streak: the next one starts short again.
  peer.PostCredits(1);
  Buffer buf(pod.pd, 8);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 8), 1), 0);
  ASSERT_EQ(PollN(pod.cq, 1).size(), 1u);
  const auto restart = Clock::now();
  EXPECT_TRUE(PollFew(pod.cq, 4 * kEvery).empty());
  if (Clock::now() - restart < long_enough / 2) {
    EXPECT_EQ(cq->yields, yields + 3) << "a streak that a completion ended went on";
  }
}

// What the yield is for: a thread spinning on such a CQ and a busy thread on the same CPU.
// Without yields the scheduler gives each about half; with them the busy one gets most.
TEST(PollSleep, ASpinningPollerLetsABusyThreadOnItsCpuRun) {
  Pod pod;
  SameNodePeer peer(0x500, IBV_QPT_RC, 4096);
  ibv_qp* qp = SameNodeQp(pod, peer);
  ASSERT_NE(qp, nullptr);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu(), &one);
  std::atomic<bool> stop{false};
  auto thread_cpu_ms = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
  };
  double poller_ms = 0, busy_ms = 0;
  std::thread poller([&] {
    pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
    ibv_wc wc;
    while (!stop.load(std::memory_order_relaxed)) ibv_poll_cq(pod.cq, 1, &wc);
    poller_ms = thread_cpu_ms();
  });
  std::thread busy([&] {
    pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
    volatile uint64_t x = 0;
    while (!stop.load(std::memory_order_relaxed)) x = x + 1;
    busy_ms = thread_cpu_ms();
  });
  std::this_thread::sleep_for(milliseconds(400));
  stop = true;
  poller.join();
  busy.join();
  EXPECT_GT(busy_ms, 3 * poller_ms) << "busy " << busy_ms << " ms, poller " << poller_ms << " ms";
}

}  // namespace
}  // namespace fftest
