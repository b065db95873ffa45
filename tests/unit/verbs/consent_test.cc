// Consent: the router gives an RC/UC QP a ring of its peer only once the peer named it.
// Until then it answers ConnectQp "ask again" (EINPROGRESS): RTR still succeeds, as on a real
// fabric, and the first work request asks again until the QP's retry budget is spent.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>

#include "freeflow/tunables.h"
#include "pod.h"

namespace fftest {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;

constexpr uint32_t kPeerQpn = 0x500;

class Consent : public ::testing::Test {
 protected:
  // A QP at RTS whose connect the router answered EINPROGRESS.
  ibv_qp* UpWithoutConsent(const QpOptions& o = {}) {
    ibv_qp* qp = pod.CreateQp(o);
    if (qp == nullptr) return nullptr;
    pod.router.AnswerSameNode(qp->qp_num, &peer);
    pod.router.WithholdConsent(qp->qp_num, true);
    EXPECT_EQ(pod.Connect(qp, kPeerQpn, o), 0) << "RTR must succeed before the peer consents";
    EXPECT_EQ(StateOf(qp), IBV_QPS_RTS);
    EXPECT_EQ(pod.router.connect_count(qp->qp_num), 1);
    return qp;
  }

  Pod pod;
  SameNodePeer peer{kPeerQpn, IBV_QPT_RC, 4096};
};

TEST_F(Consent, ASendWaitsForThePeerToConsentAndThenGoes) {
  ibv_qp* qp = UpWithoutConsent();
  ASSERT_NE(qp, nullptr);
  peer.PostCredits(2);
  Buffer buf(pod.pd, 64);
  std::memset(buf.data(), 'c', 64);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 64), 1), 0);
  // Polls drive the retries: the router is asked again, and nothing completes meanwhile.
  const auto until = Clock::now() + milliseconds(100);
  while (Clock::now() < until) EXPECT_TRUE(PollFew(pod.cq, 1).empty());
  EXPECT_GE(pod.router.connect_count(qp->qp_num), 3) << "the connect was not asked again";
  ff::RecordHeader h;
  std::vector<char> payload;
  EXPECT_FALSE(peer.NextRecord(&h, &payload)) << "sent before the peer consented";

  pod.router.WithholdConsent(qp->qp_num, false);
  std::vector<ibv_wc> wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  ASSERT_TRUE(peer.NextRecord(&h, &payload));
  EXPECT_EQ(h.src_qpn, qp->qp_num);
  EXPECT_EQ(std::string(payload.begin(), payload.end()), std::string(64, 'c'));

  // Connected now: the next send needs no more asking.
  const int asked = pod.router.connect_count(qp->qp_num);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 8), 2), 0);
  wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(pod.router.connect_count(qp->qp_num), asked);
  EXPECT_EQ(StateOf(qp), IBV_QPS_RTS);
}

// timeout 1, retry_cnt 1 is microseconds of retries on a real fabric; the library gives a
// peer at least kConsentMinWaitNs to name us, and then not much more.
TEST_F(Consent, ASendToAPeerThatNeverConsentsFailsWithRetryExceededAfterTheLeastWait) {
  QpOptions o;
  o.timeout = 1;
  o.retry_cnt = 1;
  ibv_qp* qp = UpWithoutConsent(o);
  ASSERT_NE(qp, nullptr);
  peer.PostCredits(1);
  Buffer buf(pod.pd, 64);
  const auto start = Clock::now();
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 64), 7), 0);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 64), 8), 0);
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 2);
  const auto took = Clock::now() - start;
  ExpectFailedThenFlushed(wcs, 7, 8);
  EXPECT_GE(took, nanoseconds(ff::kConsentMinWaitNs)) << "gave up before the least wait";
  EXPECT_LT(took, nanoseconds(ff::kConsentMinWaitNs) + milliseconds(700));
  EXPECT_EQ(StateOf(qp), IBV_QPS_ERR);
  EXPECT_GE(pod.router.connect_count(qp->qp_num), 3);
  ff::RecordHeader h;
  std::vector<char> payload;
  EXPECT_FALSE(peer.NextRecord(&h, &payload));
  EXPECT_EQ(peer.Claimed(), 0u);
}

// The peer QP went away before this QP ever needed it (ibv_srq_pingpong's client may finish
// without one of its QPs' answers, and destroy that QP): the router refuses at once, but a
// real requester learns it only when its retries run out, and the program may well have
// stopped polling by then. The error must not come sooner.
TEST_F(Consent, AConnectRefusedBecauseThePeerIsGoneFailsAfterTheRetryBudget) {
  ibv_qp* qp = UpWithoutConsent();  // timeout 14, retry_cnt 7: 537 ms of retries
  ASSERT_NE(qp, nullptr);
  pod.router.ForgetAnswer(qp->qp_num);
  Buffer buf(pod.pd, 64);
  const auto start = Clock::now();
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 64), 7), 0);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 64), 8), 0);
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 2);
  const auto took = Clock::now() - start;
  ExpectFailedThenFlushed(wcs, 7, 8);
  EXPECT_GE(took, nanoseconds((uint64_t{4096} << 14) * 8)) << "failed before the retry budget";
  EXPECT_EQ(StateOf(qp), IBV_QPS_ERR);
}

}  // namespace
}  // namespace fftest
