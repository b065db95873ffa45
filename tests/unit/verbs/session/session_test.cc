// Several sessions in one process (as in-process tests of two pods need): their own QP
// numbers, their own routers, and the one limit they share (registered pages); and what
// opening a session does to the process (its descriptor table).
#include "session/session.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "freeflow/clock.h"
#include "freeflow/tunables.h"
#include "pod.h"

namespace fftest {
namespace {

using ff::proto::EventType;

TEST(Sessions, TwoSessionsKeepTheirQpNumbersApart) {
  Pod a;
  Pod b;
  SameNodePeer peer_a(0x500, IBV_QPT_RC, 4096);
  SameNodePeer peer_b(0x500, IBV_QPT_RC, 4096);
  ibv_qp* qa = a.CreateQp();
  ibv_qp* qb = b.CreateQp();
  ASSERT_NE(qa, nullptr);
  ASSERT_NE(qb, nullptr);
  ASSERT_EQ(qa->qp_num, qb->qp_num) << "each fake router numbers its QPs from kFirstQpn";
  a.router.AnswerSameNode(qa->qp_num, &peer_a);
  b.router.AnswerSameNode(qb->qp_num, &peer_b);
  ASSERT_EQ(a.Connect(qa, 0x500), 0);
  ASSERT_EQ(b.Connect(qb, 0x500), 0);
  Buffer buf_a(a.pd, 8);
  Buffer buf_b(b.pd, 8);
  ASSERT_EQ(PostSend(qa, IBV_WR_SEND, buf_a.Sge(0, 8), 1), 0);  // both wait for a receive
  ASSERT_EQ(PostSend(qb, IBV_WR_SEND, buf_b.Sge(0, 8), 1), 0);
  a.router.SendEvent(EventType::kPeerGone, qa->qp_num);
  const std::vector<ibv_wc> wcs = PollN(a.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_TRUE(PollFew(b.cq, 20).empty()) << "the other session's QP of the same number failed";
  EXPECT_EQ(StateOf(qb), IBV_QPS_RTS);
  peer_b.PostCredits(1);
  EXPECT_EQ(PollN(b.cq, 1).size(), 1u);
}

// Registrations with remote access; only those have a region (memory of one session).
constexpr int kRemote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

TEST(Sessions, PagesRegisteredThroughOneSessionCannotBeRegisteredThroughAnother) {
  Pod a;
  Pod b;
  Buffer buf(a.pd, 3 * 4096, kRemote);
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(b.pd, buf.data() + 4096, 100, kRemote), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(b.router.move_mr_count(), 0);
  EXPECT_EQ(b.router.regions_received(), 0);
  EXPECT_EQ(a.router.move_mr_count(), 0) << "a's registration was moved for b";
  Buffer other(b.pd, 4096, kRemote);  // pages of its own are fine
  EXPECT_NE(other.mr(), nullptr);
  // Without remote access there is no region to share, so nothing to conflict with.
  ibv_mr* local = ibv_reg_mr(b.pd, buf.data() + 4096, 100, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(local, nullptr);
  EXPECT_EQ(a.router.move_mr_count(), 0);
  EXPECT_EQ(ibv_dereg_mr(local), 0);
}

TEST(Sessions, OverlappingRegistrationsOfOneSessionMergeIntoOneRegion) {
  Pod pod;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* area =
      ::mmap(nullptr, 6 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(area, MAP_FAILED);
  char* p = static_cast<char*>(area);
  ibv_mr* head = ibv_reg_mr(pod.pd, p, 4 * page, kRemote);
  ibv_mr* tail = ibv_reg_mr(pod.pd, p + 3 * page, 2 * page, kRemote);
  ASSERT_NE(head, nullptr);
  ASSERT_NE(tail, nullptr);
  EXPECT_EQ(pod.router.move_mr_count(), 1) << "the first registration moves to the merged region";
  EXPECT_EQ(pod.router.mr_entry(head->lkey)->region.load(), pod.router.last_moved_region());
  EXPECT_EQ(pod.router.mr_entry(tail->lkey)->region.load(), pod.router.last_moved_region());
  EXPECT_EQ(pod.router.mr_entry(head->lkey)->region_offset.load(), 0u);
  EXPECT_EQ(pod.router.mr_entry(tail->lkey)->region_offset.load(), 3 * page);
  EXPECT_EQ(ibv_dereg_mr(tail), 0);
  EXPECT_EQ(ibv_dereg_mr(head), 0);
  ::munmap(area, 6 * page);
}

TEST(Sessions, OverlappingRegistrationsInsideOneBufferShareItsRegion) {
  Pod pod;
  Buffer buf(pod.pd, 4 * 4096, kRemote);
  ibv_mr* inner = ibv_reg_mr(pod.pd, buf.data() + 100, 4096, kRemote);
  ASSERT_NE(inner, nullptr);
  EXPECT_EQ(pod.router.move_mr_count(), 0);
  EXPECT_EQ(pod.router.regions_received(), 1);
  EXPECT_NE(pod.router.mr_entry(buf.lkey())->region.load(), ff::proto::kNoRegion);
  EXPECT_EQ(pod.router.mr_entry(inner->lkey)->region.load(),
            pod.router.mr_entry(buf.lkey())->region.load());
  EXPECT_EQ(ibv_dereg_mr(inner), 0);
}

TEST(Sessions, ARefusedHelloIsReportedAsItsErrno) {
  FakeRouter router;
  router.RefuseHello(EACCES, "no overlay address");
  int error = 0;
  EXPECT_EQ(ff::verbs::OpenSession(router.TakePodEnd(), "refusing router", &error), nullptr);
  EXPECT_EQ(error, EACCES);
}

TEST(Sessions, OpenSessionOnAMissingSocketFails) {
  int error = 0;
  EXPECT_EQ(ff::verbs::OpenSession("/nonexistent-freeflow-dir/ffrouter.sock", &error), nullptr);
  EXPECT_EQ(error, ENOENT);
}

TEST(Sessions, OpenSessionConnectsToARouterSocketPath) {
  ListeningRouter router;
  int error = 0;
  ff::verbs::Session* s = ff::verbs::OpenSession(router.path(), &error);
  EXPECT_NE(router.Accepted(), nullptr);
  ASSERT_NE(s, nullptr) << std::strerror(error);
  EXPECT_EQ(s->node, "fake-node");
  ibv_context* ctx = ff::verbs::OpenContext(s);
  ASSERT_NE(ctx, nullptr);
  ibv_device_attr attr{};
  EXPECT_EQ(ibv_query_device(ctx, &attr), 0);
  EXPECT_STREQ(ibv_get_device_name(ctx->device), "freeflow0");
  EXPECT_EQ(ibv_close_device(ctx), 0);
  ff::verbs::CloseSession(s);
}

TEST(Sessions, ClosingSessionsEndsTheirEventThreadsPromptly) {
  const auto start = Clock::now();
  for (int i = 0; i < 20; ++i) {
    Pod pod;
    ASSERT_NE(pod.ctx, nullptr);
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
}

// How many descriptors this process's table holds now (FDSize in /proc/self/status).
size_t DescriptorTableSize() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("FDSize:", 0) == 0) return std::stoul(line.substr(7));
  }
  return 0;
}

// A session grows its process's descriptor table when it opens, not when the data path
// receives descriptors later with the program's threads running (docs/verbs-library.md,
// "The descriptor table"). In a fresh process (the death test runs the body in a new
// execution of this binary), whose table is the kernel's smallest.
TEST(Sessions, OpeningASessionSizesTheDescriptorTableForWhatComesLater) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  const size_t want = std::min<rlim_t>(limit.rlim_cur, ff::kReservedDescriptors);
  ASSERT_GT(want, 64u) << "a soft RLIMIT_NOFILE this low leaves nothing to reserve";
  EXPECT_EXIT(
      {
        const size_t before = DescriptorTableSize();
        Pod pod;
        const size_t after = DescriptorTableSize();
        std::fprintf(stderr, "descriptor table: %zu before the session, %zu after\n", before,
                     after);
        std::_Exit(pod.ctx != nullptr && before < want && after >= want ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// A thread awaiting the router polls a while before it sleeps (ff::verbs::SpinForAnswer).
TEST(AnswerSpin, PollingStopsAtTheFirstAnswer) {
  int calls = 0;
  EXPECT_EQ(ff::verbs::SpinForAnswer(nullptr, [&] { return ++calls < 3 ? EAGAIN : 0; }), 0);
  EXPECT_EQ(calls, 3);
}

TEST(AnswerSpin, AnErrorEndsThePollingAtOnce) {
  int calls = 0;
  EXPECT_EQ(ff::verbs::SpinForAnswer(nullptr,
                                     [&] {
                                       ++calls;
                                       return EBADF;
                                     }),
            EBADF);
  EXPECT_EQ(calls, 1);
}

TEST(AnswerSpin, WithNothingToTakeItPollsForTheBudgetThenLetsTheCallerSleep) {
  ASSERT_GT(ff::verbs::AnswerSpinNs(), 0u) << "the default spin (FFV_SPIN_US unset) is on";
  int most = 0;  // a thread preempted past the budget after one try polled once: 20 tries
  for (int attempt = 0; attempt < 20 && most <= 1; ++attempt) {
    int calls = 0;
    const uint64_t start = ff::MonotonicNs();
    EXPECT_EQ(ff::verbs::SpinForAnswer(nullptr,
                                       [&] {
                                         ++calls;
                                         return EAGAIN;
                                       }),
              EAGAIN);
    EXPECT_GE(ff::MonotonicNs() - start, ff::verbs::AnswerSpinNs());
    most = std::max(most, calls);
  }
  EXPECT_GT(most, 1);
}

// Keeps the calling thread on one CPU while it lives (and puts its old mask back).
class OnOneCpu {
 public:
  OnOneCpu() {
    CPU_ZERO(&old_);
    if (::sched_getaffinity(0, sizeof(old_), &old_) != 0) return;
    cpu_set_t one;
    CPU_ZERO(&one);
    cpu_ = ::sched_getcpu();
    CPU_SET(cpu_, &one);
    pinned_ = ::sched_setaffinity(0, sizeof(one), &one) == 0;
  }
  ~OnOneCpu() {
    if (pinned_) ::sched_setaffinity(0, sizeof(old_), &old_);
  }
  bool pinned() const { return pinned_; }
  int cpu() const { return cpu_; }

 private:
  cpu_set_t old_;
  int cpu_ = -1;
  bool pinned_ = false;
};

// A thread on the CPU where its router last ran does not poll for the answer: there, its
// polling would only keep the router from giving it.
TEST(AnswerSpin, NoPollingOnTheCpuTheRouterRunsOn) {
  OnOneCpu pin;
  ASSERT_TRUE(pin.pinned());
  ff::RequestRingControl control;
  control.router_cpu.store(static_cast<uint32_t>(pin.cpu()) + 1);
  int calls = 0;
  EXPECT_EQ(ff::verbs::SpinForAnswer(&control,
                                     [&] {
                                       ++calls;
                                       return EAGAIN;
                                     }),
            EAGAIN);
  EXPECT_EQ(calls, 1) << "it polled beside its router";
}

// A router elsewhere (or not known yet: 0) leaves the polling as it is. A spin is 30 us: a
// thread preempted for longer after its first try (ASan's slower code beside another test
// on two CPUs) polled once, as a spin beside the router does; so a spin that polled again in
// any of 20 tries shows the polling goes on, and one beside the router never does that.
TEST(AnswerSpin, PollingGoesOnWhileTheRouterRunsElsewhere) {
  OnOneCpu pin;
  ASSERT_TRUE(pin.pinned());
  for (const uint32_t shown : {0u, static_cast<uint32_t>(pin.cpu()) + 2}) {
    ff::RequestRingControl control;
    control.router_cpu.store(shown);
    EXPECT_FALSE(ff::verbs::RouterOnThisCpu(&control)) << "router_cpu " << shown;
    int most = 0;
    for (int attempt = 0; attempt < 20 && most <= 1; ++attempt) {
      int calls = 0;
      const uint64_t start = ff::MonotonicNs();
      EXPECT_EQ(ff::verbs::SpinForAnswer(&control,
                                         [&] {
                                           ++calls;
                                           return EAGAIN;
                                         }),
                EAGAIN);
      EXPECT_GE(ff::MonotonicNs() - start, ff::verbs::AnswerSpinNs()) << "router_cpu " << shown;
      most = std::max(most, calls);
    }
    EXPECT_GT(most, 1) << "router_cpu " << shown;
  }
}

}  // namespace
}  // namespace fftest
