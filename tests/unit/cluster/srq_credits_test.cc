// An SRQ shared by a victim's RC QP and its UD QP (issue 37, attack 5). Resolving a UD
// destination needs no consent, and the router used to hand every UD sender the SRQ's
// segment writable: raising its claimed counter left the victim's RC peers without credits
// for good (RNR retries exceeded), and a datagram written without claiming took a receive an
// RC peer had been promised, so that peer's SEND was dropped while it completed. Same-node
// RC peers of the SRQ's other QPs were handed it too, and could do the same. Now no sender
// gets the SRQ: each claims on its QP's header and the receiver claims each message on the
// SRQ when it takes it; an RC message with no receive left waits (shm_layout.h, SrqSegment).
// Both ways: the victim's RC peer on the same node or across nodes; the attacker, a raw
// pod, always on the victim's node.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cstring>
#include <string>
#include <thread>

#include "freeflow/tunables.h"
#include "pods.h"
#include "ud_qp.h"

namespace ff::cluster_test {
namespace {

using ff::test::RawLink;
using ff::test::RawQp;

constexpr uint32_t kQkey = 0x5151;
constexpr uint32_t kSlot = 256;        // bytes of each receive buffer of b
constexpr size_t kRecvBase = 1 << 16;  // b's receive buffers, above a's send payloads

class SrqCreditsTest : public ClusterTest {
 protected:
  void SetUp() override {
    ibv_srq_init_attr sa{};
    sa.attr.max_wr = 64;
    sa.attr.max_sge = 1;
    srq = ibv_create_srq(b->pd, &sa);
    ASSERT_NE(srq, nullptr);
    // The UD QP first: the library drains its CQ's QPs in that order, so a datagram that
    // took a receive would take it before the RC peer's SEND.
    ud = NewQp(*b, IBV_QPT_UD, srq);
    rc = NewQp(*b, IBV_QPT_RC, srq);
    ASSERT_NE(rc, nullptr);
    ASSERT_NE(ud, nullptr);
    ASSERT_EQ(b->ConnectQp(rc, *a, a->qp->qp_num), 0);
    ASSERT_EQ(a->ConnectQp(a->qp, *b, rc->qp_num), 0);
    ASSERT_EQ(fftest::UdQpToRts(ud, kQkey), 0);
  }
  void TearDown() override {
    if (ah != nullptr) ibv_destroy_ah(ah);
    if (sender != nullptr) ibv_destroy_qp(sender);
    if (ud != nullptr) ibv_destroy_qp(ud);
    if (rc != nullptr) ibv_destroy_qp(rc);
    if (srq != nullptr) ibv_destroy_srq(srq);
  }

  // A QP of `pod` on its CQ (every send signaled), on `srq` when given; the caller destroys
  // it (before the SRQ).
  static ibv_qp* NewQp(Pod& pod, ibv_qp_type type, ibv_srq* srq = nullptr) {
    ibv_qp_init_attr init{};
    init.send_cq = pod.cq;
    init.recv_cq = pod.cq;
    init.srq = srq;
    init.qp_type = type;
    init.sq_sig_all = 1;
    init.cap = {16, srq != nullptr ? 0u : 16u, 1, 1, 0};
    return ibv_create_qp(pod.pd, &init);
  }

  // Posts receives `first`..`first + n - 1` on the SRQ (wr_id: the slot).
  int PostSrqRecvs(uint32_t first, uint32_t n) {
    for (uint32_t slot = first; slot < first + n; ++slot) {
      ibv_sge sge{reinterpret_cast<uintptr_t>(b->buf + kRecvBase + slot * kSlot), kSlot,
                  b->mr->lkey};
      ibv_recv_wr wr{};
      wr.wr_id = slot;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      ibv_recv_wr* bad = nullptr;
      if (const int rc = ibv_post_srq_recv(srq, &wr, &bad)) return rc;
    }
    return 0;
  }

  // a sends `n` SENDs to b's RC QP, "rc-<first + i>"; every one must reach a receive of
  // the SRQ, in order.
  void ExpectRcSendsArrive(uint32_t first, uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) {
      const std::string text = "rc-" + std::to_string(first + i);
      std::memcpy(a->buf + i * 16, text.c_str(), text.size() + 1);
      ASSERT_EQ(a->Post(IBV_WR_SEND, first + i, i * 16, static_cast<uint32_t>(text.size() + 1)), 0);
    }
    const auto sent = a->Poll(n);
    ASSERT_EQ(sent.size(), n);
    for (const ibv_wc& wc : sent)
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    const auto got = b->Poll(n);
    ASSERT_EQ(got.size(), n) << "SENDs of the RC peer were dropped";
    for (uint32_t i = 0; i < n; ++i) {
      EXPECT_EQ(got[i].status, IBV_WC_SUCCESS);
      EXPECT_EQ(got[i].qp_num, rc->qp_num) << "a receive went to a datagram";
      EXPECT_EQ(std::string(b->buf + kRecvBase + got[i].wr_id * kSlot),
                "rc-" + std::to_string(first + i));
    }
  }

  void ExpectRcSendsArriveBeside(uint32_t first, uint32_t n, uint32_t slot, uint32_t other);

  // A UD QP of a's in RTS (every send signaled) and an address handle for b's address.
  void UdSenderToB() {
    sender = NewQp(*a, IBV_QPT_UD);
    ASSERT_NE(sender, nullptr);
    ASSERT_EQ(fftest::UdQpToRts(sender, kQkey), 0);
    ibv_ah_attr ah_attr{};
    ah_attr.is_global = 1;
    ah_attr.port_num = 1;
    ah_attr.grh.sgid_index = 1;
    Ipv4MappedGid(Ip("10.2.0.1"), ah_attr.grh.dgid.raw);
    ah = ibv_create_ah(a->pd, &ah_attr);
    ASSERT_NE(ah, nullptr);
  }
  // The sender sends `text` (from a's buffer at `offset`) to b's QP `qpn`; its send completes
  // successfully, whatever the receiver makes of it.
  void SendDatagram(uint32_t qpn, uint64_t wr_id, const std::string& text, size_t offset = 0) {
    std::memcpy(a->buf + offset, text.c_str(), text.size() + 1);
    ibv_sge sge{reinterpret_cast<uintptr_t>(a->buf + offset),
                static_cast<uint32_t>(text.size() + 1), a->mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.wr.ud = {ah, qpn, kQkey};
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(sender, &wr, &bad), 0);
    const auto sent = a->Poll(1);
    ASSERT_EQ(sent.size(), 1u);
    EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
  }

  // A raw pod's link to one of b's QPs: the claimed count of the header credits it was
  // handed raised to 2^62, then 8 SENDs (with `qkey`) written without a claim, published.
  static void SpoilAndWriteUnclaimed(RawLink& link, uint32_t qkey) {
    link.seg.as<QpSegmentHeader>()->credits.claimed.store(uint64_t{1} << 62);
    for (int i = 0; i < 8; ++i) {
      RecordHeader h{};
      h.kind = kRecSend;
      h.flags = kRecFirst | kRecLast;
      h.qkey = qkey;
      h.msg_len = 4;
      ASSERT_EQ(AppendRecord(link.producer, h, "evil", 4), RingStatus::kOk);
    }
    link.producer.Publish();
  }

  ibv_qp* sender = nullptr;  // UdSenderToB's
  ibv_ah* ah = nullptr;

  ibv_srq* srq = nullptr;
  ibv_qp* rc = nullptr;
  ibv_qp* ud = nullptr;
};

// The RC peer's SENDs `first`..`first + n - 1` arrive, each once and in order, with as
// many receives posted at `slot` on as they need; what else arrives meanwhile comes from
// `other` only (a raw pod's messages, which take receives as any message does).
void SrqCreditsTest::ExpectRcSendsArriveBeside(uint32_t first, uint32_t n, uint32_t slot,
                                               uint32_t other) {
  for (uint32_t i = 0; i < n; ++i) {
    const std::string text = "rc-" + std::to_string(first + i);
    std::memcpy(a->buf + i * 16, text.c_str(), text.size() + 1);
    ASSERT_EQ(a->Post(IBV_WR_SEND, first + i, i * 16, static_cast<uint32_t>(text.size() + 1)), 0);
  }
  uint32_t next = first;
  for (int round = 0; round < 40 && next < first + n; ++round) {
    ASSERT_EQ(PostSrqRecvs(slot, 4), 0);  // RC messages that waited for a receive take them
    slot += 4;
    for (const ibv_wc& wc : b->Poll(64, std::chrono::milliseconds(100))) {
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
      if (wc.qp_num != rc->qp_num) {
        EXPECT_EQ(wc.qp_num, other) << "a receive went to a QP nobody sent to";
        continue;
      }
      EXPECT_EQ(std::string(b->buf + kRecvBase + wc.wr_id * kSlot), "rc-" + std::to_string(next))
          << "the RC peer's SENDs arrived out of order or one was lost";
      ++next;
    }
  }
  EXPECT_EQ(next, first + n) << "SENDs of the RC peer were lost";
  // A SEND that waited for a receive completes once it was received.
  const auto sent = a->Poll(n);
  ASSERT_EQ(sent.size(), n);
  for (const ibv_wc& wc : sent)
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
}

TEST_P(SrqCreditsTest, AUdSenderGetsNoSrqAndLosesNoRcPeerItsSends) {
  router::test::RawPod x(cross() ? *b_router : *a_router, Ip("10.3.0.1"));
  ASSERT_EQ(x.Hello(), 0);
  const RawQp mine = x.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  ASSERT_NE(mine.qpn, 0u);
  RawLink link = x.Connect(mine, Ip("10.2.0.1"), ud->qp_num, true);
  ASSERT_EQ(link.status, 0);
  EXPECT_EQ(link.reply.has_srq, 0u) << "a UD sender was handed the SRQ";
  ASSERT_EQ(PostSrqRecvs(0, 4), 0);
  // What it can reach, the UD QP's own credits, it spoils: that costs datagrams only. Its
  // datagrams, written without a claim before the RC peer's SENDs, take receives as any
  // datagram with the right Q_Key does (up to the 4 posted; the rest are dropped).
  ASSERT_NO_FATAL_FAILURE(SpoilAndWriteUnclaimed(link, kQkey));
  // The victim hears of the attacker's ring (an event) before it next polls.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ExpectRcSendsArriveBeside(0, 4, 4, ud->qp_num);
  // And for good, with nothing else arriving.
  ASSERT_EQ(PostSrqRecvs(40, 4), 0);
  ExpectRcSendsArrive(4, 4);
}

// A consented RC peer of another QP on the SRQ (on b's node: it maps that QP's segment;
// a's SENDs come from the same node or across nodes) is handed no SRQ either: it claims on
// its QP's header. Spoiling those credits and writing SENDs without a claim costs the
// owner's other peers nothing: its messages take receives as messages do, the RC peer's
// SENDs all arrive, in order, none lost.
TEST_P(SrqCreditsTest, AConsentedRcPeerCannotSpendOrStealAnotherPeersReceives) {
  router::test::RawPod x(cross() ? *b_router : *a_router, Ip("10.3.0.9"));  // b's node
  ASSERT_EQ(x.Hello(), 0);
  const RawQp mine = x.CreateQp(IBV_QPT_RC);
  ASSERT_NE(mine.qpn, 0u);
  ibv_qp* second = NewQp(*b, IBV_QPT_RC, srq);
  ASSERT_NE(second, nullptr);
  ASSERT_EQ(b->ConnectQp(second, Ip("10.3.0.9"), mine.qpn), 0);
  RawLink link = x.Connect(mine, Ip("10.2.0.1"), second->qp_num);
  ASSERT_EQ(link.status, 0);
  EXPECT_EQ(link.reply.has_srq, 0u) << "an RC peer was handed the SRQ";
  ASSERT_EQ(PostSrqRecvs(0, 4), 0);
  ASSERT_NO_FATAL_FAILURE(SpoilAndWriteUnclaimed(link, 0));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ExpectRcSendsArriveBeside(0, 4, 4, second->qp_num);
  // Its SENDs that found no receive yet still wait, and take receives as they come.
  ExpectRcSendsArriveBeside(4, 4, 40, second->qp_num);
  ibv_destroy_qp(second);
}

// What the receiver claims for datagrams is what UD senders see of the SRQ: an honest UD
// sender's datagrams arrive while receives are free, and are dropped at once (no receive)
// when the RC peer was promised them all.
TEST_P(SrqCreditsTest, AnHonestUdSenderReachesAUdQpOnAnSrq) {
  ASSERT_NO_FATAL_FAILURE(UdSenderToB());
  ASSERT_EQ(PostSrqRecvs(0, 2), 0);
  const auto send = [&](uint64_t wr_id) { SendDatagram(ud->qp_num, wr_id, "datagram"); };
  send(1);
  auto got = b->Poll(1);
  ASSERT_EQ(got.size(), 1u) << "the datagram did not arrive";
  EXPECT_EQ(got[0].qp_num, ud->qp_num);
  EXPECT_EQ(std::string(b->buf + kRecvBase + got[0].wr_id * kSlot + 40), "datagram");
  ExpectRcSendsArrive(0, 1);  // the other receive
  send(2);                    // none left: dropped, the send completes
  EXPECT_TRUE(b->Poll(1, std::chrono::milliseconds(100)).empty());
  // A receive posted again: the next datagram takes it (a drop costs its sender no credit
  // for good).
  ASSERT_EQ(PostSrqRecvs(2, 1), 0);
  send(3);
  got = b->Poll(1);
  ASSERT_EQ(got.size(), 1u) << "a datagram after a drop did not arrive";
  EXPECT_EQ(got[0].qp_num, ud->qp_num);
}

// A UD QP's header is mapped by every UD sender of its node. Its credits used to be what
// those senders claimed on, so one that raised the claimed count made every other sender's
// datagrams to that QP drop at their senders, for good. Datagrams now claim nothing (the
// receiver takes a receive or drops them): a raw UD sender that spoils the header and an
// honest sender (same node or across nodes) whose datagrams all still arrive.
TEST_P(SrqCreditsTest, OneUdSenderCannotStopAnotherByItsQpsCredits) {
  ibv_qp* plain = NewQp(*b, IBV_QPT_UD);  // a UD QP with a receive queue of its own
  ASSERT_NE(plain, nullptr);
  ASSERT_EQ(fftest::UdQpToRts(plain, kQkey), 0);
  router::test::RawPod x(cross() ? *b_router : *a_router, Ip("10.3.0.1"));
  ASSERT_EQ(x.Hello(), 0);
  const RawQp mine = x.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  RawLink link = x.Connect(mine, Ip("10.2.0.1"), plain->qp_num, true);
  ASSERT_EQ(link.status, 0);
  link.seg.as<QpSegmentHeader>()->credits.claimed.store(uint64_t{1} << 62);
  ASSERT_NO_FATAL_FAILURE(UdSenderToB());
  for (uint32_t i = 0; i < 4; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(b->buf + kRecvBase + i * kSlot), kSlot, b->mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_recv(plain, &wr, &bad), 0);
  }
  const auto send = [&](uint64_t i) {
    SendDatagram(plain->qp_num, i, "datagram-" + std::to_string(i), i * 16);
  };
  const auto arrives = [&](uint64_t i) {
    const auto got = b->Poll(1);
    ASSERT_EQ(got.size(), 1u) << "the honest sender's datagram " << i << " did not arrive";
    EXPECT_EQ(got[0].qp_num, plain->qp_num);
    EXPECT_EQ(std::string(b->buf + kRecvBase + got[0].wr_id * kSlot + 40),
              "datagram-" + std::to_string(i));
  };
  for (uint64_t i = 0; i < 4; ++i) {
    send(i);
    arrives(i);
  }
  // No receive left: the receiver drops the next one; a receive posted takes the one after.
  send(4);
  EXPECT_TRUE(b->Poll(1, std::chrono::milliseconds(100)).empty());
  ibv_sge sge{reinterpret_cast<uintptr_t>(b->buf + kRecvBase), kSlot, b->mr->lkey};
  ibv_recv_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_recv(plain, &wr, &bad), 0);
  send(5);
  arrives(5);
  ibv_destroy_qp(plain);
}

INSTANTIATE_TEST_SUITE_P(SameNodeAndAcrossNodes, SrqCreditsTest, ::testing::Bool());

}  // namespace
}  // namespace ff::cluster_test
