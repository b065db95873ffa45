// Work requests that wait in the library on one node, and a program that, having posted
// them, calls the library no more (it spins on memory its peer writes, or sleeps on its
// completion channel). An HCA advances its send queue on its own: the peer's ring filling,
// a receive not posted yet (RNR retries) or a peer that has not accepted the connection
// yet only delay what was posted. Here the library's event thread must do it (issue 12).
//
// After the posts, pod a makes no verbs call until the outcome was seen: the test reads b's
// memory, lets b (which may call) poll, or waits on a's completion channel descriptor.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "base/objects.h"
#include "marker_fixture.h"

namespace ff::cluster_test {
namespace {

constexpr char kMarker = 0x6b;

class IdleSenderTest : public MarkerTest {
 protected:
  void PostMarker(uint64_t wr_id) { MarkerTest::PostMarker(wr_id, kMarker); }
};

// b's inbound ring (512 KiB: 256 receives x 2 KiB) holds about 31 SENDs of 16 KiB: the
// rest, and the marker WRITE behind them, wait in a's send queue. b takes the messages in
// (poll_cq frees the ring); a must send the rest and the marker by itself.
TEST_P(IdleSenderTest, SendsThatWaitedForRoomInThePeersRingLeaveWithoutAnotherCall) {
  ConnectBoth();
  constexpr uint32_t kSends = 64, kBytes = 16384;
  static_assert(kSends * kBytes > ff::kRcRingBytes);
  for (uint32_t i = 0; i < kSends; ++i) ASSERT_EQ(b->PostRecv(100 + i, 0, kBytes), 0);
  for (uint32_t i = 0; i < kSends; ++i) ASSERT_EQ(a->Post(IBV_WR_SEND, i, 0, kBytes), 0);
  PostMarker(kSends);
  ASSERT_GT(Unexecuted(*a), 1u) << "the test needs WQEs waiting in the library";
  const auto got = b->Poll(kSends);
  EXPECT_EQ(got.size(), kSends) << Unexecuted(*a) << " WQEs never left a's library";
  EXPECT_TRUE(Arrives(kMarkerOffset, kMarker)) << Unexecuted(*a) << " WQEs never left";
  const auto sent = a->Poll(kSends + 1);
  ASSERT_EQ(sent.size(), kSends + 1);
  for (const ibv_wc& wc : sent) EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

// An RC SEND finds no receive posted: a real requester retries after each RNR NAK until
// one is. b posts its receive later; a calls nothing, and the message arrives.
TEST_P(IdleSenderTest, ASendThatFoundNoReceiveArrivesOnceOneIsPostedWithoutAnotherCall) {
  ConnectBoth();
  std::memcpy(a->buf, "late receive", 12);
  ASSERT_EQ(a->Post(IBV_WR_SEND, 1, 0, 12), 0);
  ASSERT_EQ(Unexecuted(*a), 1u) << "the SEND must wait for a receive";
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(b->PostRecv(7, 4096, 64), 0);
  const auto got = b->Poll(1);
  ASSERT_EQ(got.size(), 1u) << Unexecuted(*a) << " WQE never left a's library";
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].byte_len, 12u);
  EXPECT_EQ(std::memcmp(b->buf + 4096, "late receive", 12), 0);
}

// a is at RTS before b named it (the router answered a's connect EINPROGRESS): its WRITE
// waits for b's consent. b connects later; the router tells a's event thread (kPeerNamed),
// and the WRITE must land although a calls nothing.
TEST_P(IdleSenderTest, AWriteThatWaitedForThePeerToConnectLandsWithoutAnotherCall) {
  ASSERT_EQ(a->ConnectTo(*b), 0);
  std::memset(a->buf, 0x3c, 4096);
  ASSERT_EQ(a->Post(IBV_WR_RDMA_WRITE, 1, 0, 4096, b.get(), 8192), 0);
  PostMarker(2);
  ASSERT_EQ(Unexecuted(*a), 2u) << "the WRITEs must wait for b";
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(b->ConnectTo(*a), 0);
  EXPECT_TRUE(Arrives(kMarkerOffset, kMarker)) << Unexecuted(*a) << " WQEs never left";
  EXPECT_EQ(b->buf[8192], 0x3c);
  EXPECT_EQ(b->buf[8192 + 4095], 0x3c);
}

// A SEND that finds no receive fails with IBV_WC_RNR_RETRY_EXC_ERR once its RNR retries
// (rnr_retry 2, b's min_rnr_timer 10 us) are spent, as on an HCA, even though a calls
// nothing: a program asleep on its completion channel is woken with the error.
TEST_P(IdleSenderTest, TheRnrDeadlineFailsTheSendWithoutAnotherCall) {
  Pod x(*a_router, Ip("10.1.0.9"), /*with_channel=*/true);
  ibv_qp* bq = b->NewQp();
  ASSERT_NE(bq, nullptr);
  ASSERT_EQ(b->ConnectQp(bq, x, x.qp->qp_num), 0);
  ASSERT_EQ(x.ConnectQp(x.qp, *b, bq->qp_num, /*rnr_retry=*/2), 0);
  ASSERT_EQ(ibv_req_notify_cq(x.cq, 0), 0);
  ASSERT_EQ(x.Post(IBV_WR_SEND, 9, 0, 8), 0);
  ASSERT_EQ(Unexecuted(x), 1u) << "the SEND must wait for a receive";
  // Asleep on the channel's descriptor (it may also wake without an event: a peer linked
  // up), until the SEND is no longer queued, 5 s at most.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (Unexecuted(x) != 0 && std::chrono::steady_clock::now() < end) {
    pollfd p{x.channel->fd, POLLIN, 0};
    ::poll(&p, 1, 10);
  }
  ASSERT_EQ(Unexecuted(x), 0u) << "the RNR deadline passed unseen without a call";
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(x.channel, &ev_cq, &ev_ctx), 0);
  ibv_ack_cq_events(ev_cq, 1);
  const auto wc = x.Poll(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
  EXPECT_EQ(wc[0].wr_id, 9u);
}

// One node only: across nodes the router advances such requests (waiting_sends_test.cc,
// and the peer's router executes RNR retries).
INSTANTIATE_TEST_SUITE_P(Nodes, IdleSenderTest, ::testing::Values(false),
                         [](const ::testing::TestParamInfo<bool>&) { return "OnOneNode"; });

}  // namespace
}  // namespace ff::cluster_test
