// Many UD senders and one UD receiver, through the real library and routers, on one node and
// across nodes. A UD QP of a real HCA hears any number of senders; freeflow gives each
// sender a ring of the receiver's (kUdRingsPerQp of them), and a new sender takes the ring
// held longest. The sender that lost it must link again when it next sends, or everything
// it sends from then on is lost while its sends complete successfully. And a sender whose
// destination went away must keep completing its sends (dropped, as on a fabric), never
// block on a ring nobody reads.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "freeflow/tunables.h"
#include "log_capture.h"
#include "pods.h"
#include "ud_qp.h"

namespace ff::cluster_test {
namespace {

constexpr uint32_t kQkey = 0x11111111;
constexpr uint32_t kGrh = 40;          // a UD receive starts with the GRH
constexpr uint32_t kSlot = 256;        // bytes of each receive buffer
constexpr size_t kRecvBase = 1 << 16;  // receive buffers live above the send payloads

struct Datagram {
  uint32_t sender;  // index of the sending QP
  uint32_t round;
};

class UdFanInTest : public ClusterTest {
 protected:
  // A UD QP of `pod` on its CQ, ready to send and receive.
  static ibv_qp* UdQp(Pod& pod, uint32_t max_recv = 64) {
    ibv_qp_init_attr init{};
    init.send_cq = pod.cq;
    init.recv_cq = pod.cq;
    init.qp_type = IBV_QPT_UD;
    init.sq_sig_all = 1;
    init.cap = {64, max_recv, 1, 1, 0};
    ibv_qp* qp = ibv_create_qp(pod.pd, &init);
    if (qp == nullptr) return nullptr;
    return fftest::UdQpToRts(qp, kQkey) == 0 ? qp : nullptr;
  }

  // An address handle for the pod at `ip`.
  static ibv_ah* AhFor(Pod& from, uint32_t ip) {
    ibv_ah_attr attr{};
    attr.is_global = 1;
    attr.port_num = 1;
    attr.grh.sgid_index = 1;
    Ipv4MappedGid(ip, attr.grh.dgid.raw);
    return ibv_create_ah(from.pd, &attr);
  }

  // Posts receive `slot` of `pod` on `qp` (wr_id: the slot).
  static int PostRecv(Pod& pod, ibv_qp* qp, uint32_t slot) {
    return pod.PostRecv(slot, kRecvBase + slot * kSlot, kSlot, qp);
  }

  // Sends `d` from `qp` of `pod` to QP `qpn` behind `ah` (payload at `offset` of its buffer).
  static int Send(Pod& pod, ibv_qp* qp, ibv_ah* ah, uint32_t qpn, const Datagram& d,
                  size_t offset) {
    std::memcpy(pod.buf + offset, &d, sizeof(d));
    ibv_sge sge{reinterpret_cast<uintptr_t>(pod.buf + offset), sizeof(d), pod.mr->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.wr.ud = {ah, qpn, kQkey};
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, &wr, &bad);
  }

  static Datagram Received(const Pod& pod, uint64_t slot) {
    Datagram d;
    std::memcpy(&d, pod.buf + kRecvBase + slot * kSlot + kGrh, sizeof(d));
    return d;
  }
};

// 24 sender QPs in pod a, one receiver QP in pod b: each round every sender sends one
// datagram, and sends it again every 20 ms until b acknowledges it (as UCX's ud transport
// does; UD may drop). Every datagram of every round must get through, from the QP it
// names, within the time limit.
TEST_P(UdFanInTest, MoreSendersThanAUdQpHasRingsAllGetThrough) {
  constexpr uint32_t kSenders = kUdRingsPerQp + 8, kRounds = 3;
  ibv_qp* receiver = UdQp(*b);
  ASSERT_NE(receiver, nullptr);
  for (uint32_t s = 0; s < 32; ++s) ASSERT_EQ(PostRecv(*b, receiver, s), 0);
  std::vector<ibv_qp*> senders;
  for (uint32_t i = 0; i < kSenders; ++i) {
    senders.push_back(UdQp(*a));
    ASSERT_NE(senders.back(), nullptr);
    ASSERT_EQ(PostRecv(*a, senders.back(), i), 0);  // for its acknowledgment
  }
  ibv_ah* to_b = AhFor(*a, Ip("10.2.0.1"));
  ibv_ah* to_a = AhFor(*b, Ip("10.1.0.1"));
  ASSERT_NE(to_b, nullptr);
  ASSERT_NE(to_a, nullptr);

  uint32_t sends = 0;
  for (uint32_t round = 0; round < kRounds; ++round) {
    std::vector<bool> acked(kSenders, false), heard(kSenders, false);
    uint32_t left = kSenders;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    auto resend_at = std::chrono::steady_clock::now();
    while (left > 0 && std::chrono::steady_clock::now() < end) {
      if (std::chrono::steady_clock::now() >= resend_at) {
        for (uint32_t i = 0; i < kSenders; ++i) {
          if (acked[i]) continue;
          ASSERT_EQ(Send(*a, senders[i], to_b, receiver->qp_num, {i, round}, i * 64), 0);
          ++sends;
        }
        resend_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
      }
      ibv_wc wc[16];
      int n = ibv_poll_cq(b->cq, 16, wc);
      ASSERT_GE(n, 0);
      for (int k = 0; k < n; ++k) {
        ASSERT_EQ(wc[k].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc[k].status);
        if (wc[k].opcode != IBV_WC_RECV) continue;
        const Datagram d = Received(*b, wc[k].wr_id);
        ASSERT_LT(d.sender, kSenders);
        EXPECT_EQ(wc[k].src_qp, senders[d.sender]->qp_num) << "from the QP it names";
        ASSERT_EQ(PostRecv(*b, receiver, static_cast<uint32_t>(wc[k].wr_id)), 0);
        if (d.round != round) continue;  // a late copy of an earlier round
        heard[d.sender] = true;
        ASSERT_EQ(Send(*b, receiver, to_a, wc[k].src_qp, d, 4096 + wc[k].wr_id * 64), 0);
      }
      n = ibv_poll_cq(a->cq, 16, wc);
      ASSERT_GE(n, 0);
      for (int k = 0; k < n; ++k) {
        ASSERT_EQ(wc[k].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc[k].status);
        if (wc[k].opcode != IBV_WC_RECV) continue;
        const Datagram d = Received(*a, wc[k].wr_id);
        ASSERT_LT(d.sender, kSenders);
        ASSERT_EQ(PostRecv(*a, senders[d.sender], static_cast<uint32_t>(wc[k].wr_id)), 0);
        if (d.round != round || acked[d.sender]) continue;
        acked[d.sender] = true;
        --left;
      }
    }
    uint32_t unheard = 0;
    for (uint32_t i = 0; i < kSenders; ++i) unheard += heard[i] ? 0 : 1;
    ASSERT_EQ(left, 0u) << "round " << round << ": " << unheard
                        << " senders were never heard, although every send completed";
  }
  std::printf("%u datagrams were sent again\n", sends - kSenders * kRounds);
  ibv_destroy_ah(to_a);
  ibv_destroy_ah(to_b);
  for (ibv_qp* q : senders) ASSERT_EQ(ibv_destroy_qp(q), 0);
  ASSERT_EQ(ibv_destroy_qp(receiver), 0);
}

// The receiver's QP is destroyed with receives it posted and never used: the sender may
// still claim them, but nobody reads the ring it would write into, nor the router's proxy
// ring across nodes. Datagrams to it complete successfully (they are lost, as on a fabric),
// far more than either ring could hold, and the library does not ask the router for a link
// to the gone QP again for each of them (a round trip each; the routers log every refusal).
TEST_P(UdFanInTest, DatagramsToADestroyedUdQpCompleteAndAreDropped) {
  constexpr uint32_t kPosted = 2048;
  static_assert(kRecvBase + kPosted * kSlot <= kBufferBytes);
  ibv_qp* receiver = UdQp(*b, kPosted);
  ibv_qp* sender = UdQp(*a);
  ASSERT_NE(receiver, nullptr);
  ASSERT_NE(sender, nullptr);
  for (uint32_t s = 0; s < kPosted; ++s) ASSERT_EQ(PostRecv(*b, receiver, s), 0);
  ibv_ah* to_b = AhFor(*a, Ip("10.2.0.1"));
  ASSERT_NE(to_b, nullptr);
  const uint32_t qpn = receiver->qp_num;
  ASSERT_EQ(Send(*a, sender, to_b, qpn, {0, 0}, 0), 0);
  ASSERT_EQ(a->Poll(1).size(), 1u);
  ASSERT_EQ(b->Poll(1).size(), 1u);
  ASSERT_EQ(ibv_destroy_qp(receiver), 0);
  const testing::LogCapture log(spdlog::level::info);
  // Each datagram takes at least 40 bytes of a ring (a record header and its 8 bytes).
  constexpr uint32_t kMore = 2 * kProxyRingBytes / 40;
  static_assert(kMore > kPosted && kMore * 40 > 2 * kUdRingBytes);
  uint32_t posted = 0, done = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (done < kMore && std::chrono::steady_clock::now() < end) {
    if (posted < kMore && posted - done < 32) {
      ASSERT_EQ(Send(*a, sender, to_b, qpn, {0, ++posted}, 0), 0);
      continue;
    }
    ibv_wc wc[16];
    const int n = ibv_poll_cq(a->cq, 16, wc);
    ASSERT_GE(n, 0);
    for (int k = 0; k < n; ++k) ASSERT_EQ(wc[k].status, IBV_WC_SUCCESS);
    done += static_cast<uint32_t>(n);
  }
  EXPECT_EQ(done, kMore) << "sends to a destroyed QP stopped completing";
  char name[16];
  std::snprintf(name, sizeof(name), "%#x", qpn);
  const int asked = log.Count({name});
  EXPECT_GE(asked, 1) << "the router never refused a link to " << name;
  EXPECT_LT(asked, 64) << "a link to the gone QP was asked for per datagram";
  ibv_destroy_ah(to_b);
  ASSERT_EQ(ibv_destroy_qp(sender), 0);
}

// Datagrams to an overlay address no pod has (the routers here have a control plane in both
// placements). The first waits in ibv_post_send for the router's resolve timeout (300 ms
// here; a pod that just started on another node may turn up), as an RC connect does; later
// ones, once the library was refused, are dropped at once (it marks its asks
// kResolveAgain), not held that long each. Each completes successfully (it is lost).
TEST_P(UdFanInTest, OnlyTheFirstDatagramToAnUnknownAddressWaitsForTheControlPlane) {
  ibv_qp* sender = UdQp(*a);
  ASSERT_NE(sender, nullptr);
  ibv_ah* nowhere = AhFor(*a, Ip("10.9.9.9"));
  ASSERT_NE(nowhere, nullptr);
  for (uint32_t i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    ASSERT_EQ(Send(*a, sender, nowhere, 0x123, {0, i}, 0), 0);
    const auto wc = a->Poll(1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    const auto took = std::chrono::steady_clock::now() - start;
    if (i == 0) {
      EXPECT_GE(took, std::chrono::milliseconds(250));
    } else {
      EXPECT_LT(took, std::chrono::milliseconds(250)) << "datagram " << i << " waited";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(3));  // past the first backoffs
  }
  ibv_destroy_ah(nowhere);
  ASSERT_EQ(ibv_destroy_qp(sender), 0);
}

INSTANTIATE_TEST_SUITE_P(Nodes, UdFanInTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "AcrossNodes" : "OneNode";
                         });

}  // namespace
}  // namespace ff::cluster_test
