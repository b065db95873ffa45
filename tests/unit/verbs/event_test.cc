// Completion events as a real channel delivers them: one event per armed CQ that got a
// completion, none for a completion already in the CQ when it was armed, none for the
// library's own housekeeping, oldest first across the CQs of a channel, and a wait that a
// signal interrupts as it interrupts a read. Programs that take one event per completion
// (perftest -e, qperf's latency tests) go out of step on any difference.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "freeflow/clock.h"
#include "pod.h"
#include "session/session.h"

namespace fftest {
namespace {

using std::chrono::milliseconds;

// The notify word that ibv_req_notify_cq(cq) armed (found by arming it; it stays armed).
ff::NotifySlot* ArmAndFindSlot(Pod& pod, ibv_cq* cq) {
  EXPECT_EQ(ibv_req_notify_cq(cq, 0), 0);
  ff::NotifySlot* slots = pod.router.pod_notify();
  for (uint32_t i = 0; i + 1 < ff::kNotifySlots; ++i) {
    if (slots[i].armed.load() != 0) return &slots[i];
  }
  ADD_FAILURE() << "req_notify_cq armed no notify word";
  return nullptr;
}

// An RC QP whose send and receive CQ is a new CQ on a new channel (*ch, *cq).
ibv_qp* QpOnChannel(Pod& pod, ibv_comp_channel** ch, ibv_cq** cq) {
  *ch = pod.NewChannel();
  *cq = pod.NewCq(16, *ch);
  QpOptions o;
  o.send_cq = *cq;
  o.recv_cq = *cq;
  return pod.CreateQp(o);
}

void MakeNonBlocking(ibv_comp_channel* ch) {
  ASSERT_EQ(::fcntl(ch->fd, F_SETFL, ::fcntl(ch->fd, F_GETFL) | O_NONBLOCK), 0);
}

// What a non-blocking ibv_get_cq_event says now: the CQ, or nullptr with errno EAGAIN.
ibv_cq* EventNow(ibv_comp_channel* ch) {
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  if (ibv_get_cq_event(ch, &cq, &context) != 0) {
    EXPECT_EQ(errno, EAGAIN);
    return nullptr;
  }
  ibv_ack_cq_events(cq, 1);
  return cq;
}

// A peer publishes a SEND into the QP's ring and fires the armed CQ (as a peer or the router
// does). The application takes the event, re-arms, then polls: the completion it finds was
// announced already and must not fire the re-armed CQ again.
TEST(Events, ACompletionTakenOutOfItsRingAfterReArmingFiresNoSecondEvent) {
  Pod pod;
  ibv_comp_channel* ch = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = QpOnChannel(pod, &ch, &cq);
  ASSERT_NE(qp, nullptr);
  SameNodePeer peer(0x500, IBV_QPT_RC, 4096);
  pod.router.AnswerSameNode(qp->qp_num, &peer);
  QpOptions o;
  o.send_cq = cq;
  o.recv_cq = cq;
  ASSERT_EQ(pod.Connect(qp, 0x500, o), 0);
  Buffer buf(pod.pd, 64);
  ASSERT_EQ(PostRecv(qp, buf.Sge(0, 64), 7), 0);
  MakeNonBlocking(ch);
  ff::NotifySlot* slot = ArmAndFindSlot(pod, cq);
  ASSERT_NE(slot, nullptr);

  pod.router.DeliverSend(qp->qp_num, 0x500, "ping", 4);
  ff::WakeIfArmed(slot, pod.router.last_channel_fd(), false);
  EXPECT_EQ(EventNow(ch), cq);
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  const std::vector<ibv_wc> wcs = PollN(cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 7u);
  EXPECT_EQ(EventNow(ch), nullptr) << "one completion raised two events";

  // The next completion raises the next event.
  ASSERT_EQ(PostRecv(qp, buf.Sge(0, 64), 8), 0);
  pod.router.DeliverSend(qp->qp_num, 0x500, "pong", 4);
  ff::WakeIfArmed(slot, pod.router.last_channel_fd(), false);
  EXPECT_EQ(EventNow(ch), cq);
  EXPECT_EQ(PollN(cq, 1).size(), 1u);
}

// Two CQs share a channel: events come in the order the CQs fired, not in the order the CQs
// were created (a program that waits for its send CQ, then its receive CQ, relies on it).
TEST(Events, TheCqsOfAChannelDeliverTheirEventsOldestFirst) {
  Pod pod;
  ibv_comp_channel* ch = pod.NewChannel();
  ibv_cq* first = pod.NewCq(16, ch);
  ibv_cq* second = pod.NewCq(16, ch);
  MakeNonBlocking(ch);
  ff::NotifySlot* a = ArmAndFindSlot(pod, first);
  ASSERT_NE(a, nullptr);
  a->armed.store(0);  // found; armed again below, after the second one was found
  ff::NotifySlot* b = ArmAndFindSlot(pod, second);
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(ibv_req_notify_cq(first, 0), 0);
  const int tx = pod.router.last_channel_fd();
  ff::WakeIfArmed(b, tx, false);
  std::this_thread::sleep_for(milliseconds(1));
  ff::WakeIfArmed(a, tx, false);
  EXPECT_EQ(EventNow(ch), second);
  EXPECT_EQ(EventNow(ch), first);
  EXPECT_EQ(EventNow(ch), nullptr);
}

// The router tells the library that a peer linked up: the library must look (a sleeper is
// woken), but the application sees no event, since no completion was added.
TEST(Events, APeerLinkingUpWakesTheChannelButRaisesNoEvent) {
  Pod pod;
  ibv_comp_channel* ch = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = QpOnChannel(pod, &ch, &cq);
  ASSERT_NE(qp, nullptr);
  MakeNonBlocking(ch);
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  pod.router.SendEvent(ff::proto::EventType::kPeerNamed, qp->qp_num);
  pollfd p{ch->fd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 2000), 1) << "the event thread did not wake the channel";
  EXPECT_EQ(EventNow(ch), nullptr) << "a peer linking up raised a completion event";
}

int g_alarms = 0;

// Arms SIGALRM `after` from now, handled with or without SA_RESTART.
void AlarmIn(milliseconds after, bool restart) {
  struct sigaction sa {};
  sa.sa_handler = [](int) { ++g_alarms; };
  sa.sa_flags = restart ? SA_RESTART : 0;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(::sigaction(SIGALRM, &sa, nullptr), 0);
  itimerval t{};
  t.it_value.tv_usec = static_cast<long>(after.count()) * 1000;
  ASSERT_EQ(::setitimer(ITIMER_REAL, &t, nullptr), 0);
}

// qperf ends a test with an alarm whose handler has no SA_RESTART and expects the blocked
// ibv_get_cq_event to return EINTR; with SA_RESTART the wait goes on until the event.
TEST(Events, ASignalInterruptsTheWaitAsItInterruptsARead) {
  Pod pod;
  ibv_comp_channel* ch = pod.NewChannel();
  ibv_cq* cq = pod.NewCq(16, ch);
  ff::NotifySlot* slot = ArmAndFindSlot(pod, cq);
  ASSERT_NE(slot, nullptr);
  ibv_cq* got = nullptr;
  void* context = nullptr;

  g_alarms = 0;
  AlarmIn(milliseconds(50), false);
  EXPECT_EQ(ibv_get_cq_event(ch, &got, &context), -1);
  EXPECT_EQ(errno, EINTR);
  EXPECT_EQ(g_alarms, 1);

  g_alarms = 0;
  AlarmIn(milliseconds(50), true);
  const int tx = pod.router.last_channel_fd();
  std::thread fire([&] {
    std::this_thread::sleep_for(milliseconds(200));
    ff::WakeIfArmed(slot, tx, false);
  });
  EXPECT_EQ(ibv_get_cq_event(ch, &got, &context), 0);
  fire.join();
  EXPECT_EQ(got, cq);
  EXPECT_EQ(g_alarms, 1);
  ibv_ack_cq_events(cq, 1);
  signal(SIGALRM, SIG_DFL);
}

// A blocking wait polls a while (FFV_SPIN_US, default 30 us) before it sleeps: an event
// that fires 15 us into the wait is taken without sleeping. Without the poll the thread is
// asleep by then (a voluntary context switch), every time. Tries until two waits took it
// awake, 400 at most: on a loaded machine (another test spinning on the other vCPU) most
// tries find the two threads not running at once (0 of 20 happened in make test).
TEST(Events, ABlockingWaitTakesAnEventThatFiresSoonWithoutSleeping) {
  ASSERT_GE(ff::verbs::AnswerSpinNs(), 30'000u) << "the default spin (FFV_SPIN_US unset) is on";
  Pod pod;
  ibv_comp_channel* ch = pod.NewChannel();
  ibv_cq* cq = pod.NewCq(16, ch);
  const int tx = pod.router.last_channel_fd();
  int without_sleep = 0;
  int attempts = 0;
  for (; attempts < 400 && without_sleep < 2; ++attempts) {
    ff::NotifySlot* slot = ArmAndFindSlot(pod, cq);
    ASSERT_NE(slot, nullptr);
    std::atomic<bool> waiting{false};
    long switches = -1;
    std::thread waiter([&] {
      rusage before{}, after{};
      ::getrusage(RUSAGE_THREAD, &before);
      ibv_cq* got = nullptr;
      void* context = nullptr;
      waiting.store(true);
      const int rc = ibv_get_cq_event(ch, &got, &context);
      ::getrusage(RUSAGE_THREAD, &after);
      if (rc == 0 && got == cq) switches = after.ru_nvcsw - before.ru_nvcsw;
    });
    while (!waiting.load()) {
    }
    const uint64_t fire_at = ff::MonotonicNs() + 15'000;
    while (ff::MonotonicNs() < fire_at) {
    }
    ff::WakeIfArmed(slot, tx, false);
    waiter.join();
    ASSERT_GE(switches, 0) << "the wait did not return the CQ";
    ibv_ack_cq_events(cq, 1);
    if (switches == 0) ++without_sleep;
  }
  EXPECT_GE(without_sleep, 2) << "of " << attempts << " waits, " << without_sleep
                              << " took the event awake";
}

// A non-blocking channel answers EAGAIN at once, as a real one does: no polling first. A
// poll would cost every call at least the spin (FFV_SPIN_US, 30 us); the median call of ten
// must cost under half of that in CPU, so one call the scheduler or ASan slowed cannot decide.
TEST(Events, ANonBlockingChannelSaysEagainWithoutPolling) {
  Pod pod;
  ibv_comp_channel* ch = pod.NewChannel();
  ibv_cq* cq = pod.NewCq(16, ch);
  ASSERT_NE(ArmAndFindSlot(pod, cq), nullptr);
  MakeNonBlocking(ch);
  std::vector<uint64_t> cpu_ns;
  for (int i = 0; i < 10; ++i) {
    timespec before{}, after{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &before);
    EXPECT_EQ(EventNow(ch), nullptr);
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &after);
    cpu_ns.push_back(static_cast<uint64_t>(after.tv_sec - before.tv_sec) * 1'000'000'000u +
                     static_cast<uint64_t>(after.tv_nsec) - static_cast<uint64_t>(before.tv_nsec));
  }
  std::sort(cpu_ns.begin(), cpu_ns.end());
  EXPECT_LT(cpu_ns[cpu_ns.size() / 2], ff::verbs::AnswerSpinNs() / 2)
      << "the median non-blocking read took " << cpu_ns[cpu_ns.size() / 2] << " ns of CPU";
}

}  // namespace
}  // namespace fftest
