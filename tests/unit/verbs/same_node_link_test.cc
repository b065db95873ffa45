// A QP whose peer is a process on this node (played by the test): SENDs become records in
// the peer's ring after claiming its receive credits, and RDMA operations go straight to the
// peer's memory after checking its MR table.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <regex>
#include <string>

#include "datapath/send_waits.h"
#include "pod.h"

namespace fftest {
namespace {

constexpr uint32_t kPeerQpn = 0x500;
constexpr uint64_t kPeerAddr = 0x7000000000;  // where the peer's MR lives in its process
constexpr uint64_t kMrOffset = 4096;          // ... and where in its region
constexpr uint32_t kAllRemote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

class SameNodeLink : public ::testing::Test {
 protected:
  ibv_qp* Up(const QpOptions& o = {}) {
    if (o.type != IBV_QPT_RC) peer = std::make_unique<SameNodePeer>(kPeerQpn, o.type, 1 << 16);
    ibv_qp* q = pod.CreateQp(o);
    if (q == nullptr) return nullptr;
    pod.router.AnswerSameNode(q->qp_num, peer.get());
    EXPECT_EQ(pod.Connect(q, kPeerQpn, o), 0);
    return q;
  }
  void SetUp() override {
    peer->header()->min_rnr_timer.store(1);  // 10 us between RNR retries
    peer->header()->qp_access.store(kAllRemote);
  }
  char* PeerMemory(uint64_t addr) {
    return peer->region.as<char>() + kMrOffset + (addr - kPeerAddr);
  }

  Pod pod;
  std::unique_ptr<SameNodePeer> peer =
      std::make_unique<SameNodePeer>(kPeerQpn, IBV_QPT_RC, 1 << 20);
};

TEST_F(SameNodeLink, SendIsARecordInThePeersRingAndTakesOneCredit) {
  ibv_qp* qp = Up();
  peer->PostCredits(1);
  Buffer buf(pod.pd, 100);
  std::memset(buf.data(), 'x', 100);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND_WITH_IMM, buf.Sge(0, 100), 1), 0);
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(peer->Claimed(), 1u);
  ff::RecordHeader h;
  std::vector<char> payload;
  ASSERT_TRUE(peer->NextRecord(&h, &payload));
  EXPECT_EQ(h.kind, ff::kRecSend);
  EXPECT_EQ(h.flags, ff::kRecFirst | ff::kRecLast | ff::kRecImm);
  EXPECT_EQ(h.msg_len, 100u);
  EXPECT_EQ(h.src_qpn, qp->qp_num);
  EXPECT_EQ(h.imm, htonl(0xabcd));
  EXPECT_EQ(payload, std::vector<char>(100, 'x'));
  EXPECT_FALSE(peer->NextRecord(&h, &payload));
}

TEST_F(SameNodeLink, LongSendIsFragmentedAtMaxFragment) {
  ibv_qp* qp = Up();
  peer->PostCredits(1);
  const uint32_t len = 2 * ff::kMaxFragment + 5;
  Buffer buf(pod.pd, len);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, len), 1), 0);
  ASSERT_EQ(PollN(pod.cq, 1).size(), 1u);
  ff::RecordHeader h;
  std::vector<char> payload;
  const uint8_t flags[] = {ff::kRecFirst, 0, ff::kRecLast};
  for (uint8_t f : flags) {
    ASSERT_TRUE(peer->NextRecord(&h, &payload));
    EXPECT_EQ(h.flags, f);
  }
  EXPECT_EQ(payload.size(), 5u);
  EXPECT_EQ(peer->Claimed(), 1u) << "one message, one credit";
}

TEST_F(SameNodeLink, RcSendWithoutAReceiveFailsOnceRnrRetriesAreSpent) {
  QpOptions o;
  o.rnr_retry = 1;
  ibv_qp* qp = Up(o);
  Buffer buf(pod.pd, 8);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 8), 1), 0);
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
  EXPECT_EQ(StateOf(qp), IBV_QPS_ERR);
  ff::RecordHeader h;
  std::vector<char> payload;
  EXPECT_FALSE(peer->NextRecord(&h, &payload));
}

TEST_F(SameNodeLink, RcSendWaitsForAReceiveWhileRetriesRemain) {
  ibv_qp* qp = Up();  // rnr_retry 7: forever
  Buffer buf(pod.pd, 8);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 8), 1), 0);
  EXPECT_TRUE(PollFew(pod.cq, 200).empty());
  peer->PostCredits(1);
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
}

TEST_F(SameNodeLink, UcSendWithoutAReceiveIsDropped) {
  QpOptions o;
  o.type = IBV_QPT_UC;
  ibv_qp* qp = Up(o);
  Buffer buf(pod.pd, 8);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 8), 1), 0);
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  ff::RecordHeader h;
  std::vector<char> payload;
  EXPECT_FALSE(peer->NextRecord(&h, &payload));
  EXPECT_EQ(StateOf(qp), IBV_QPS_RTS);
}

// A datagram claims no credit (the UD QP's header is shared by all its senders): it goes
// into the ring whether or not the receiver posted a receive, which takes one for it or
// drops it, and carries its Q_Key.
TEST_F(SameNodeLink, UdSendLeavesItsDatagramToTheReceiverAndCarriesItsQkey) {
  QpOptions o;
  o.type = IBV_QPT_UD;
  ibv_qp* qp = Up(o);
  Buffer buf(pod.pd, 8);
  ibv_ah* ah = pod.NewAh();
  ASSERT_EQ(PostUdSend(qp, ah, buf.Sge(0, 8), 1, kPeerQpn, 0x2222), 0);
  ASSERT_EQ(PollN(pod.cq, 1).size(), 1u);
  ff::RecordHeader h;
  std::vector<char> payload;
  ASSERT_TRUE(peer->NextRecord(&h, &payload));
  EXPECT_EQ(h.qkey, 0x2222u);
  EXPECT_EQ(h.flags & (ff::kRecFirst | ff::kRecLast), ff::kRecFirst | ff::kRecLast);
}

TEST_F(SameNodeLink, WriteReadAndAtomicsReachThePeersMemory) {
  ibv_qp* qp = Up();
  const uint32_t rkey = peer->AddMr(3, kPeerAddr, kMrOffset, 1 << 16, kAllRemote);
  Buffer buf(pod.pd, 4096);
  std::memset(buf.data(), 'w', 100);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE, buf.Sge(0, 100), 1, kPeerAddr + 8, rkey), 0);
  std::memset(PeerMemory(kPeerAddr + 512), 'r', 100);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_READ, buf.Sge(1024, 100), 2, kPeerAddr + 512, rkey), 0);
  const uint64_t ten = 10;
  std::memcpy(PeerMemory(kPeerAddr + 2048), &ten, 8);
  ASSERT_EQ(PostAtomic(qp, IBV_WR_ATOMIC_FETCH_AND_ADD, buf.Sge(2048, 8), 3, kPeerAddr + 2048, rkey,
                       5, 0),
            0);
  ASSERT_EQ(PostAtomic(qp, IBV_WR_ATOMIC_CMP_AND_SWP, buf.Sge(2056, 8), 4, kPeerAddr + 2048, rkey,
                       15, 99),
            0);
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 4);
  ASSERT_EQ(wcs.size(), 4u);
  for (const ibv_wc& wc : wcs) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc.wr_id;
  EXPECT_EQ(std::memcmp(PeerMemory(kPeerAddr + 8), buf.data(), 100), 0);
  EXPECT_EQ(std::memcmp(buf.data() + 1024, std::vector<char>(100, 'r').data(), 100), 0);
  uint64_t fetched = 0, swapped = 0, now = 0;
  std::memcpy(&fetched, buf.data() + 2048, 8);
  std::memcpy(&swapped, buf.data() + 2056, 8);
  std::memcpy(&now, PeerMemory(kPeerAddr + 2048), 8);
  EXPECT_EQ(fetched, 10u);
  EXPECT_EQ(swapped, 15u);
  EXPECT_EQ(now, 99u);
}

// Each work request carried out is counted in the session's traffic ledger, by kind, in a
// slot of the link's own keyed by the peer's address and the placement (same node); one that
// fails is not.
TEST_F(SameNodeLink, WorkRequestsCarriedOutAreCountedInTheTrafficLedger) {
  ibv_qp* qp = Up();
  const uint32_t rkey = peer->AddMr(3, kPeerAddr, kMrOffset, 1 << 16, kAllRemote);
  Buffer buf(pod.pd, 4096);
  peer->PostCredits(2);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 100), 1), 0);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND_WITH_IMM, buf.Sge(0, 20), 2), 0);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE, buf.Sge(0, 300), 3, kPeerAddr + 8, rkey), 0);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_READ, buf.Sge(1024, 400), 4, kPeerAddr + 512, rkey), 0);
  ASSERT_EQ(PostAtomic(qp, IBV_WR_ATOMIC_FETCH_AND_ADD, buf.Sge(2048, 8), 5, kPeerAddr + 2048, rkey,
                       5, 0),
            0);
  ASSERT_EQ(PollN(pod.cq, 5).size(), 5u);
  ff::TrafficSlot slot;
  uint32_t used = 0;
  ASSERT_TRUE(pod.router.TrafficSlot(ff::kTrafficPlacements, &slot, &used));
  EXPECT_EQ(used, ff::kTrafficPlacements + 1);
  EXPECT_EQ(slot.peer_ip.load(), 0x0af40002u);
  EXPECT_EQ(slot.placement.load(), static_cast<uint32_t>(ff::TrafficPlacement::kSameNode));
  const auto counts = [&](ff::TrafficKind k) {
    const ff::TrafficCount& c = slot.counts[static_cast<uint32_t>(k)];
    return std::pair<uint64_t, uint64_t>(c.ops.load(), c.bytes.load());
  };
  EXPECT_EQ(counts(ff::TrafficKind::kSend), std::make_pair(uint64_t{2}, uint64_t{120}));
  EXPECT_EQ(counts(ff::TrafficKind::kWrite), std::make_pair(uint64_t{1}, uint64_t{300}));
  EXPECT_EQ(counts(ff::TrafficKind::kRead), std::make_pair(uint64_t{1}, uint64_t{400}));
  EXPECT_EQ(counts(ff::TrafficKind::kAtomic), std::make_pair(uint64_t{1}, uint64_t{8}));
  // A WRITE the peer refuses (an unknown key) is not carried out.
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE, buf.Sge(0, 300), 6, kPeerAddr, rkey + 1), 0);
  ASSERT_EQ(PollN(pod.cq, 1).size(), 1u);
  ASSERT_TRUE(pod.router.TrafficSlot(ff::kTrafficPlacements, &slot));
  EXPECT_EQ(counts(ff::TrafficKind::kWrite), std::make_pair(uint64_t{1}, uint64_t{300}));
}

// A second QP to the same peer counts in a slot of its own (each link writes its slot alone),
// and a QP made after the first one went reuses its slot, so counts never change key.
TEST_F(SameNodeLink, EachLinkCountsInASlotOfItsOwnAndAFreedSlotIsReusedForTheSamePeer) {
  ibv_qp* first = Up();
  ASSERT_NE(Up(), nullptr);
  uint32_t used = 0;
  ff::TrafficSlot slot;
  ASSERT_TRUE(pod.router.TrafficSlot(0, &slot, &used));
  EXPECT_EQ(used, ff::kTrafficPlacements + 2);
  ASSERT_EQ(pod.DestroyQp(first), 0);
  ibv_qp* third = Up();
  ASSERT_NE(third, nullptr);
  ASSERT_TRUE(pod.router.TrafficSlot(0, &slot, &used));
  EXPECT_EQ(used, ff::kTrafficPlacements + 2);
}

struct AccessCase {
  const char* what;
  uint32_t mr_access;
  uint32_t qp_access;
  bool bad_key;
  uint64_t offset;
  ibv_wr_opcode op;
};

TEST_F(SameNodeLink, AccessesTheMrTableRefusesCompleteWithRemAccessErr) {
  const AccessCase cases[] = {
      {"unknown rkey", kAllRemote, kAllRemote, true, 0, IBV_WR_RDMA_WRITE},
      {"past the end of the MR", kAllRemote, kAllRemote, false, (1 << 16) - 50, IBV_WR_RDMA_WRITE},
      {"MR without remote write", IBV_ACCESS_REMOTE_READ, kAllRemote, false, 0, IBV_WR_RDMA_WRITE},
      {"MR without remote read", IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, kAllRemote,
       false, 0, IBV_WR_RDMA_READ},
      {"peer QP without remote read", kAllRemote, IBV_ACCESS_REMOTE_WRITE, false, 0,
       IBV_WR_RDMA_READ},
  };
  Buffer buf(pod.pd, 4096);
  uint32_t slot = 10;
  for (const AccessCase& c : cases) {
    SCOPED_TRACE(c.what);
    ibv_qp* qp = Up();
    peer->header()->qp_access.store(c.qp_access);
    const uint32_t rkey = peer->AddMr(slot++, kPeerAddr, kMrOffset, 1 << 16, c.mr_access);
    ASSERT_EQ(PostSend(qp, c.op, buf.Sge(0, 100), 1, kPeerAddr + c.offset,
                       c.bad_key ? rkey + 0x100 : rkey),
              0);
    const std::vector<ibv_wc> wcs = PollN(pod.cq, 1);
    ASSERT_EQ(wcs.size(), 1u);
    EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(StateOf(qp), IBV_QPS_ERR);
  }
}

// The peer shares its region for reads only (sealed; GetRegion answers writable = 0) while
// its MR table claims every remote right: the library must not write through it.
TEST_F(SameNodeLink, AReadFromARegionSharedForReadsOnlyWorksAndAWriteIntoItFails) {
  peer->ShareReadOnly();
  ibv_qp* qp = Up();
  const uint32_t rkey = peer->AddMr(3, kPeerAddr, kMrOffset, 1 << 16, kAllRemote);
  std::memset(PeerMemory(kPeerAddr), 'p', 4096);
  Buffer buf(pod.pd, 8192);
  std::memset(buf.data(), 'w', 8192);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_READ, buf.Sge(4096, 100), 1, kPeerAddr, rkey), 0);
  std::vector<ibv_wc> wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(buf.data() + 4096, PeerMemory(kPeerAddr), 100), 0);
  // The region is mapped now (and cached): a write must still be refused.
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE, buf.Sge(0, 100), 2, kPeerAddr, rkey), 0);
  wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(StateOf(qp), IBV_QPS_ERR);
  EXPECT_EQ(std::string(PeerMemory(kPeerAddr), 4096), std::string(4096, 'p'));
}

TEST_F(SameNodeLink, WritesAndAtomicsIntoARegionSharedForReadsOnlyFailBeforeAnyRead) {
  peer->ShareReadOnly();
  const uint32_t rkey = peer->AddMr(3, kPeerAddr, kMrOffset, 1 << 16, kAllRemote);
  const uint64_t ten = 10;
  std::memset(PeerMemory(kPeerAddr), 'p', 4096);
  std::memcpy(PeerMemory(kPeerAddr + 2048), &ten, 8);
  Buffer buf(pod.pd, 4096);
  std::memset(buf.data(), 'w', 4096);
  ibv_qp* qp = Up();
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE, buf.Sge(0, 100), 1, kPeerAddr, rkey), 0);
  std::vector<ibv_wc> wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
  qp = Up();
  ASSERT_EQ(PostAtomic(qp, IBV_WR_ATOMIC_FETCH_AND_ADD, buf.Sge(1024, 8), 2, kPeerAddr + 2048, rkey,
                       5, 0),
            0);
  wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
  uint64_t now = 0;
  std::memcpy(&now, PeerMemory(kPeerAddr + 2048), 8);
  EXPECT_EQ(now, 10u);
  EXPECT_EQ(std::string(PeerMemory(kPeerAddr), 100), std::string(100, 'p'));
  qp = Up();
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_READ, buf.Sge(2048, 100), 3, kPeerAddr, rkey), 0);
  wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::string(buf.data() + 2048, 100), std::string(100, 'p'));
}

TEST_F(SameNodeLink, WriteWithImmediateLeavesARecordAfterTheData) {
  ibv_qp* qp = Up();
  const uint32_t rkey = peer->AddMr(3, kPeerAddr, kMrOffset, 1 << 16, kAllRemote);
  peer->PostCredits(1);
  Buffer buf(pod.pd, 16);
  std::memset(buf.data(), 'i', 16);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE_WITH_IMM, buf.Sge(0, 16), 1, kPeerAddr, rkey), 0);
  ASSERT_EQ(PollN(pod.cq, 1).size(), 1u);
  EXPECT_EQ(std::memcmp(PeerMemory(kPeerAddr), buf.data(), 16), 0);
  ff::RecordHeader h;
  std::vector<char> payload;
  ASSERT_TRUE(peer->NextRecord(&h, &payload));
  EXPECT_EQ(h.kind, ff::kRecWriteImm);
  EXPECT_EQ(h.msg_len, 16u);
  EXPECT_EQ(h.imm, htonl(0xabcd));
  EXPECT_TRUE(payload.empty());
}

// FFV_REPORT_WAITS: a SEND that waits for the peer's receive is the longest wait reported,
// with its QP, the number of WQEs retired and when it began.
TEST_F(SameNodeLink, TheReportOfWaitsNamesTheSendThatWaitedForAReceive) {
  using Clock = std::chrono::system_clock;
  ff::verbs::ResetSendWaitsForTest(true);
  ibv_qp* qp = Up();  // rnr_retry 7: forever
  Buffer buf(pod.pd, 8);
  const double before = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 8), 1), 0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(40);
  while (std::chrono::steady_clock::now() < until) EXPECT_TRUE(PollFew(pod.cq, 10).empty());
  peer->PostCredits(2);
  ASSERT_EQ(PollN(pod.cq, 1).size(), 1u);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 8), 2), 0);  // its credit is there already
  ASSERT_EQ(PollN(pod.cq, 1).size(), 1u);
  const double after = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  const std::string report = ff::verbs::SendWaitsReport();
  ff::verbs::ResetSendWaitsForTest(false);

  std::smatch m;
  const std::regex head(
      "the longest a send queue waited with work outstanding: ([0-9.]+) ms \\(QP (0x[0-9a-f]+); "
      "2 work requests retired\\); the longest, each from when it began \\(Unix time\\): "
      "([0-9.]+) ms from ([0-9.]+) \\(QP 0x[0-9a-f]+\\), [0-9.]+ ms from [0-9.]+ \\(QP "
      "0x[0-9a-f]+\\)$");  // both WQEs kept
  ASSERT_TRUE(std::regex_search(report, m, head)) << report;
  EXPECT_GE(std::stod(m[1]), 40.0);
  EXPECT_LT(std::stod(m[1]), 5000.0);
  EXPECT_EQ(std::stoul(m[2].str(), nullptr, 16), qp->qp_num);
  EXPECT_EQ(m[3].str(), m[1].str());
  EXPECT_GE(std::stod(m[4]), before - 0.001);  // printed in ms, truncated
  EXPECT_LE(std::stod(m[4]), after);
}

TEST(SendWaits, OnlyTheLongestAreKeptLongestFirst) {
  ff::verbs::ResetSendWaitsForTest(true);
  EXPECT_EQ(ff::verbs::SendWaitsReport(),
            "FFV_REPORT_WAITS: no send queue of this process retired a work request");
  for (uint64_t ms = 1; ms <= 20; ++ms) ff::verbs::NoteSendWait(0x100 + ms, ms * 1'000'000);
  const std::string report = ff::verbs::SendWaitsReport();
  ff::verbs::ResetSendWaitsForTest(false);
  EXPECT_NE(report.find(": 20.00 ms (QP 0x114; 20 work requests retired)"), std::string::npos)
      << report;
  std::vector<std::string> kept;
  const std::regex one("([0-9.]+) ms from [0-9]+\\.[0-9]{3} \\(QP (0x[0-9a-f]+)\\)");
  for (auto it = std::sregex_iterator(report.begin(), report.end(), one);
       it != std::sregex_iterator(); ++it)
    kept.push_back((*it)[1].str() + "@" + (*it)[2].str());
  EXPECT_EQ(kept,
            (std::vector<std::string>{"20.00@0x114", "19.00@0x113", "18.00@0x112", "17.00@0x111",
                                      "16.00@0x110", "15.00@0x10f", "14.00@0x10e", "13.00@0x10d"}));
}

TEST(SameNodeLoopback, SendAndWriteBetweenTwoQpsOfOneContextArrive) {
  Pod pod;
  ibv_qp* a = pod.CreateQp();
  ibv_qp* b = pod.CreateQp();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  pod.router.AnswerLoopback(a->qp_num, b->qp_num);
  pod.router.AnswerLoopback(b->qp_num, a->qp_num);
  ASSERT_EQ(pod.Connect(a, b->qp_num), 0);
  ASSERT_EQ(pod.Connect(b, a->qp_num), 0);
  Buffer src(pod.pd, 1000);
  Buffer dst(pod.pd, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  std::memset(src.data(), 's', 1000);
  ASSERT_EQ(PostRecv(b, dst.Sge(0, 1000), 7), 0);
  ASSERT_EQ(PostSend(a, IBV_WR_SEND, src.Sge(0, 1000), 1), 0);
  std::vector<ibv_wc> wcs = PollN(pod.cq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  const ibv_wc& recv = wcs[0].opcode == IBV_WC_RECV ? wcs[0] : wcs[1];
  EXPECT_EQ(recv.wr_id, 7u);
  EXPECT_EQ(recv.status, IBV_WC_SUCCESS);
  EXPECT_EQ(recv.byte_len, 1000u);
  EXPECT_EQ(recv.src_qp, a->qp_num);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 1000), 0);

  std::memset(src.data(), 'W', 1000);
  ASSERT_EQ(PostSend(a, IBV_WR_RDMA_WRITE, src.Sge(0, 1000), 2,
                     reinterpret_cast<uintptr_t>(dst.data()) + 2000, dst.mr()->rkey),
            0);
  wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(dst.data() + 2000, src.data(), 1000), 0);
}

// A delivered message leaves its receive queue for the next empty poll to warm the next
// receive's buffer (WarmNextRecv). The QP or SRQ that owned the queue may go before that
// poll: the poll must then leave the freed queue alone (the sanitized run reads it as a use
// after free). The parameter: b receives from an SRQ, which goes after b.
class WarmedReceive : public ::testing::TestWithParam<bool> {};

TEST_P(WarmedReceive, AnEmptyPollAfterTheQueueWentLeavesItAlone) {
  const bool on_srq = GetParam();
  Pod pod;
  ibv_cq* recv_cq = pod.NewCq();
  ASSERT_NE(recv_cq, nullptr);
  ibv_srq* srq = nullptr;
  if (on_srq) {
    ibv_srq_init_attr sa{};
    sa.attr.max_wr = 16;
    sa.attr.max_sge = 1;
    srq = ibv_create_srq(pod.pd, &sa);
    ASSERT_NE(srq, nullptr);
  }
  ibv_qp* a = pod.CreateQp();
  QpOptions o;
  o.recv_cq = recv_cq;
  o.srq = srq;
  ibv_qp* b = pod.CreateQp(o);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  pod.router.AnswerLoopback(a->qp_num, b->qp_num);
  pod.router.AnswerLoopback(b->qp_num, a->qp_num);
  ASSERT_EQ(pod.Connect(a, b->qp_num), 0);
  ASSERT_EQ(pod.Connect(b, a->qp_num, o), 0);
  Buffer src(pod.pd, 64);
  Buffer dst(pod.pd, 4096);
  std::memset(src.data(), 'r', 64);
  // Two receives: after the first is taken, one is left for the warm-up to look at.
  for (uint64_t id = 1; id <= 2; ++id) {
    const ibv_sge sge = dst.Sge(2048 * (id - 1), 64);
    ASSERT_EQ(on_srq ? PostSrqRecv(srq, sge, id) : PostRecv(b, sge, id), 0);
  }
  ASSERT_EQ(PostSend(a, IBV_WR_SEND, src.Sge(0, 64), 3), 0);
  // The poll that returns the receive warms nothing yet; no other poll of the context
  // comes between it and the queue's end.
  std::vector<ibv_wc> got = PollN(recv_cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 1u);
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 64), 0);
  ASSERT_EQ(pod.DestroyQp(b), 0);
  if (on_srq) {
    ASSERT_EQ(ibv_destroy_srq(srq), 0);
  }
  // Empty polls now (the receive left went with its queue): nothing of it is read.
  EXPECT_TRUE(PollFew(recv_cq, 3).empty());
  PollFew(pod.cq, 3);  // a's send, whatever became of it
}

INSTANTIATE_TEST_SUITE_P(QpAndSrq, WarmedReceive, ::testing::Bool());

}  // namespace
}  // namespace fftest
