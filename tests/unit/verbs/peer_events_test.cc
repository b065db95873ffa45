// A peer that dies or closes its QP, and a router that goes away: error completions and
// asynchronous events, never a hang.
#include <gtest/gtest.h>
#include <poll.h>

#include <cstring>
#include <thread>

#include "pod.h"

namespace fftest {
namespace {

using ff::proto::EventType;

constexpr uint32_t kPeerQpn = 0x500;

struct Linked {
  ibv_qp* qp;
  std::unique_ptr<SameNodePeer> peer;
};

Linked SameNodeQp(Pod& pod) {
  Linked l{pod.CreateQp(), std::make_unique<SameNodePeer>(kPeerQpn, IBV_QPT_RC, 4096)};
  if (l.qp == nullptr) return l;
  pod.router.AnswerSameNode(l.qp->qp_num, l.peer.get());
  EXPECT_EQ(pod.Connect(l.qp, kPeerQpn), 0);
  return l;
}

ibv_qp* RouterQp(Pod& pod, ProxySegment** proxy) {
  ibv_qp* qp = pod.CreateQp();
  if (qp == nullptr) return nullptr;
  *proxy = pod.router.AnswerThroughRouter(qp->qp_num, 0x900, IBV_QPT_RC);
  EXPECT_EQ(pod.Connect(qp, 0x900), 0);
  return qp;
}

// Waits for the next async event of `type`; fails the test when another one or none comes.
void ExpectAsync(Pod& pod, ibv_event_type type, ibv_qp* qp = nullptr) {
  ibv_async_event e{};
  ASSERT_EQ(NextAsyncEvent(pod.ctx, &e), 0) << "no async event";
  EXPECT_EQ(e.event_type, type);
  if (qp != nullptr) {
    EXPECT_EQ(e.element.qp, qp);
  }
}

TEST(PeerEvents, PeerGoneFailsQueuedWorkWithRetryExceededAndRaisesQpFatal) {
  Pod pod;
  Linked l = SameNodeQp(pod);
  ASSERT_NE(l.qp, nullptr);
  Buffer buf(pod.pd, 64);
  ASSERT_EQ(PostRecv(l.qp, buf.Sge(0, 64), 9), 0);
  ASSERT_EQ(PostSend(l.qp, IBV_WR_SEND, buf.Sge(0, 8), 1), 0);  // no receive: waits (RNR)
  ASSERT_EQ(PostSend(l.qp, IBV_WR_SEND, buf.Sge(0, 8), 2), 0);
  EXPECT_TRUE(PollFew(pod.cq, 20).empty());
  pod.router.SendEvent(EventType::kPeerGone, l.qp->qp_num);
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 3);
  ASSERT_EQ(wcs.size(), 3u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wcs[2].wr_id, 9u);
  EXPECT_EQ(wcs[2].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(StateOf(l.qp), IBV_QPS_ERR);
  ExpectAsync(pod, IBV_EVENT_QP_FATAL, l.qp);
}

TEST(PeerEvents, PeerGoneKeepsTheOutcomesTheRouterAlreadyWrote) {
  Pod pod;
  ProxySegment* proxy = nullptr;
  ibv_qp* qp = RouterQp(pod, &proxy);
  ASSERT_NE(qp, nullptr);
  Buffer buf(pod.pd, 64);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE, buf.Sge(0, 64), 1, 0x1000, 1), 0);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE, buf.Sge(0, 64), 2, 0x1000, 1), 0);
  pod.router.Respond(proxy, 0, IBV_WC_SUCCESS);
  pod.router.SendEvent(EventType::kPeerGone, qp->qp_num);
  // The news is in before the first poll, which must still take the answer that came first.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[1].wr_id, 2u);
  EXPECT_EQ(wcs[1].status, IBV_WC_RETRY_EXC_ERR);
  ExpectAsync(pod, IBV_EVENT_QP_FATAL, qp);
}

TEST(PeerEvents, PeerClosedKeepsReceivesAndFailsLaterSends) {
  Pod pod;
  Linked l = SameNodeQp(pod);
  ASSERT_NE(l.qp, nullptr);
  Buffer buf(pod.pd, 64);
  ASSERT_EQ(PostRecv(l.qp, buf.Sge(0, 64), 9), 0);
  pod.router.DeliverSend(l.qp->qp_num, kPeerQpn, "bye", 3);  // sent just before it closed
  pod.router.SendEvent(EventType::kPeerClosed, l.qp->qp_num);
  std::vector<ibv_wc> wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 9u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(buf.data(), "bye", 3), 0);
  ASSERT_EQ(PostRecv(l.qp, buf.Sge(0, 64), 10), 0);
  EXPECT_TRUE(PollFew(pod.cq, 20).empty()) << "a close must not flush posted receives";
  EXPECT_EQ(StateOf(l.qp), IBV_QPS_RTS);

  ASSERT_EQ(PostSend(l.qp, IBV_WR_SEND, buf.Sge(0, 8), 1), 0);
  wcs = PollN(pod.cq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(wcs[1].wr_id, 10u);  // the send's error moved the QP to ERR
  EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR);
}

TEST(PeerEvents, RouterGoneFailsEveryQpAndRaisesDeviceFatal) {
  Pod pod;
  Linked local = SameNodeQp(pod);
  ProxySegment* proxy = nullptr;
  ibv_qp* remote = RouterQp(pod, &proxy);
  ASSERT_NE(local.qp, nullptr);
  ASSERT_NE(remote, nullptr);
  Buffer buf(pod.pd, 64);
  ASSERT_EQ(PostSend(local.qp, IBV_WR_SEND, buf.Sge(0, 8), 1), 0);  // waits for a receive
  ASSERT_EQ(PostSend(remote, IBV_WR_RDMA_WRITE, buf.Sge(0, 8), 2, 0x1000, 1), 0);  // in flight
  pod.router.Close();
  ExpectAsync(pod, IBV_EVENT_DEVICE_FATAL);
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  for (const ibv_wc& wc : wcs) EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << wc.wr_id;
  EXPECT_EQ(StateOf(local.qp), IBV_QPS_ERR);
  EXPECT_EQ(StateOf(remote), IBV_QPS_ERR);
  errno = 0;
  EXPECT_EQ(ibv_create_cq(pod.ctx, 4, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, ENOTCONN);
}

TEST(PeerEvents, ShutdownFailsEveryQpLikeALostRouter) {
  Pod pod;
  Linked l = SameNodeQp(pod);
  ASSERT_NE(l.qp, nullptr);
  Buffer buf(pod.pd, 64);
  ASSERT_EQ(PostSend(l.qp, IBV_WR_SEND, buf.Sge(0, 8), 1), 0);
  pod.router.SendEvent(EventType::kShutdown, 0);
  ExpectAsync(pod, IBV_EVENT_DEVICE_FATAL);
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR);
}

TEST(PeerEvents, EventsForUnknownQpsOrOfUnknownTypesChangeNothing) {
  Pod pod;
  Linked l = SameNodeQp(pod);
  ASSERT_NE(l.qp, nullptr);
  pod.router.SendEvent(EventType::kPeerGone, l.qp->qp_num + 1000);
  pod.router.SendEvent(static_cast<EventType>(99), l.qp->qp_num);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the event thread read them
  l.peer->PostCredits(1);
  Buffer buf(pod.pd, 8);
  ASSERT_EQ(PostSend(l.qp, IBV_WR_SEND, buf.Sge(0, 8), 1), 0);
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(StateOf(l.qp), IBV_QPS_RTS);
}

// How long the pod's default QPs (QpOptions: timeout 14, retry_cnt 7) retry a peer that does
// not answer: 4.096 us << 14 per try, eight tries.
constexpr auto kRetryBudget = std::chrono::nanoseconds((uint64_t{4096} << 14) * 8);

// A requester learns that its peer is gone only when its retries run out. Reporting it at
// once races every program that stops polling when its own count is reached: its peer's last
// sends, already answered, must complete first (ibv_srq_pingpong failed so across nodes).
TEST(PeerEvents, ASendToAClosedPeerFailsOnlyOnceTheRetryBudgetIsSpent) {
  Pod pod;
  Linked l = SameNodeQp(pod);
  ASSERT_NE(l.qp, nullptr);
  Buffer buf(pod.pd, 64);
  pod.router.SendEvent(EventType::kPeerClosed, l.qp->qp_num);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the event thread read it
  const auto start = Clock::now();
  ASSERT_EQ(PostSend(l.qp, IBV_WR_SEND, buf.Sge(0, 8), 1), 0);
  ASSERT_EQ(PostSend(l.qp, IBV_WR_SEND, buf.Sge(0, 8), 2), 0);
  EXPECT_TRUE(PollFew(l.qp->send_cq, 20).empty()) << "the error came before any retry";
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 2);
  const auto took = Clock::now() - start;
  ExpectFailedThenFlushed(wcs, 1, 2);
  EXPECT_GE(took, kRetryBudget);
  EXPECT_EQ(StateOf(l.qp), IBV_QPS_ERR);
}

// The router's "that QP is gone" answer waits as long, while answers that came before it
// complete at once, in order.
TEST(PeerEvents, TheRoutersPeerGoneAnswerCompletesAfterTheRetryBudget) {
  Pod pod;
  ProxySegment* proxy = nullptr;
  ibv_qp* qp = RouterQp(pod, &proxy);
  ASSERT_NE(qp, nullptr);
  Buffer buf(pod.pd, 64);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE, buf.Sge(0, 64), 1, 0x1000, 1), 0);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE, buf.Sge(0, 64), 2, 0x1000, 1), 0);
  const auto start = Clock::now();
  pod.router.Respond(proxy, 0, IBV_WC_SUCCESS);
  pod.router.Respond(proxy, 1, IBV_WC_RETRY_EXC_ERR);
  std::vector<ibv_wc> wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE, buf.Sge(0, 64), 3, 0x1000, 1), 0);
  wcs = PollN(pod.cq, 2);
  const auto took = Clock::now() - start;
  ExpectFailedThenFlushed(wcs, 2, 3);  // 3, posted after the failure, never ran
  EXPECT_GE(took, kRetryBudget);
}

// A program asleep on its completion channel is woken when the held error completes: nobody
// else will call the library.
TEST(PeerEvents, AHeldPeerErrorWakesTheCompletionChannel) {
  Pod pod;
  ibv_comp_channel* ch = pod.NewChannel();
  ASSERT_NE(ch, nullptr);
  ibv_cq* cq = pod.NewCq(16, ch);
  ASSERT_NE(cq, nullptr);
  SameNodePeer peer(kPeerQpn, IBV_QPT_RC, 4096);
  QpOptions o;
  o.send_cq = cq;
  o.recv_cq = cq;
  ibv_qp* qp = pod.CreateQp(o);
  ASSERT_NE(qp, nullptr);
  pod.router.AnswerSameNode(qp->qp_num, &peer);
  ASSERT_EQ(pod.Connect(qp, kPeerQpn, o), 0);
  pod.router.SendEvent(EventType::kPeerClosed, qp->qp_num);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Buffer buf(pod.pd, 64);
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 8), 1), 0);
  pollfd p{ch->fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, static_cast<int>(kWaitLimit / std::chrono::milliseconds(1))), 1)
      << "the channel never fired";
  ibv_cq* fired = nullptr;
  void* cq_context = nullptr;
  ASSERT_EQ(ibv_get_cq_event(ch, &fired, &cq_context), 0);
  EXPECT_EQ(fired, cq);
  ibv_ack_cq_events(cq, 1);
  ibv_wc wc{};
  ASSERT_EQ(ibv_poll_cq(cq, 1, &wc), 1);
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR);
}

}  // namespace
}  // namespace fftest
