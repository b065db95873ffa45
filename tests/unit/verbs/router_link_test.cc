// A QP whose peer is on another node: what the library writes into the router's proxy ring
// for each kind of work request, and how the router's responses complete them.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>

#include "pod.h"

namespace fftest {
namespace {

constexpr uint32_t kPeerQpn = 0x900;
constexpr uint32_t kFrag = ff::kMaxFragment;

void Fill(char* p, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>(seed + i * 7);
}

std::vector<char> Joined(const std::vector<Request>& reqs) {
  std::vector<char> all;
  for (const Request& r : reqs) all.insert(all.end(), r.data.begin(), r.data.end());
  return all;
}

class RouterLink : public ::testing::Test {
 protected:
  void Up(const QpOptions& o = {}) {
    qp = pod.CreateQp(o);
    ASSERT_NE(qp, nullptr);
    proxy = pod.router.AnswerThroughRouter(qp->qp_num, kPeerQpn, IBV_QPT_RC);
    ASSERT_EQ(pod.Connect(qp, kPeerQpn, o), 0);
  }
  void SetUp() override { Up(); }

  Pod pod;
  ibv_qp* qp = nullptr;
  ProxySegment* proxy = nullptr;
};

TEST_F(RouterLink, SendIsFragmentedIntoRequestsNamingItsWorkRequest) {
  QpOptions o;
  o.rnr_retry = 5;
  Up(o);
  const uint32_t len = 3 * kFrag + 100;
  Buffer buf(pod.pd, len);
  Fill(buf.data(), len, 1);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, len), 11), 0);
  const std::vector<Request> reqs = proxy->TakeRequests();
  ASSERT_EQ(reqs.size(), 4u);
  const uint8_t flags[] = {ff::kRecFirst, 0, 0, ff::kRecLast};
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(reqs[i].h.kind, ff::kRecSend);
    EXPECT_EQ(reqs[i].h.flags, flags[i]) << i;
    EXPECT_EQ(reqs[i].h.msg_len, len);
    EXPECT_EQ(reqs[i].h.src_qpn, qp->qp_num);
    EXPECT_EQ(reqs[i].req.seq, 0u);
    EXPECT_EQ(reqs[i].req.opcode, IBV_WR_SEND);
    EXPECT_EQ(reqs[i].req.length, len);
    EXPECT_EQ(reqs[i].req.last, i == 3 ? 1 : 0);
    EXPECT_EQ(reqs[i].req.rnr_retry, 5);
    EXPECT_EQ(reqs[i].data.size(), i == 3 ? 100u : kFrag);
  }
  EXPECT_EQ(Joined(reqs), std::vector<char>(buf.data(), buf.data() + len));

  ASSERT_EQ(PostSend(qp, IBV_WR_SEND_WITH_IMM, buf.Sge(0, 10), 12), 0);
  const std::vector<Request> imm = proxy->TakeRequests();
  ASSERT_EQ(imm.size(), 1u);
  EXPECT_EQ(imm[0].h.flags, ff::kRecFirst | ff::kRecLast | ff::kRecImm);
  EXPECT_EQ(imm[0].h.imm, htonl(0xabcd));
  EXPECT_EQ(imm[0].req.seq, 1u);

  pod.router.Respond(proxy, 0, IBV_WC_SUCCESS);
  pod.router.Respond(proxy, 1, IBV_WC_SUCCESS);
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 11u);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_SEND);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[0].byte_len, len);
  EXPECT_EQ(wcs[1].wr_id, 12u);
}

TEST_F(RouterLink, WriteRequestsCarryEachFragmentsTargetAndLastOnlyAtTheEnd) {
  const uint32_t len = 2 * kFrag + 10;
  Buffer buf(pod.pd, len);
  Fill(buf.data(), len, 3);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE, buf.Sge(0, len), 1, 0x10000, 0x1234), 0);
  const std::vector<Request> reqs = proxy->TakeRequests();
  ASSERT_EQ(reqs.size(), 3u);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(reqs[i].h.kind, ff::kRecWrite);
    EXPECT_EQ(reqs[i].req.opcode, IBV_WR_RDMA_WRITE);
    EXPECT_EQ(reqs[i].req.remote_addr, 0x10000 + i * kFrag);
    EXPECT_EQ(reqs[i].req.rkey, 0x1234u);
    EXPECT_EQ(reqs[i].req.last, i == 2 ? 1 : 0);
  }
  EXPECT_EQ(Joined(reqs), std::vector<char>(buf.data(), buf.data() + len));
  pod.router.Respond(proxy, 0, IBV_WC_SUCCESS);
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
}

TEST_F(RouterLink, WriteWithImmediateEndsWithAnImmediateRecord) {
  Buffer buf(pod.pd, 100);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE_WITH_IMM, buf.Sge(0, 100), 1, 0x5000, 9), 0);
  const std::vector<Request> reqs = proxy->TakeRequests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].h.kind, ff::kRecWrite);
  EXPECT_EQ(reqs[0].req.last, 0);
  EXPECT_EQ(reqs[0].data.size(), 100u);
  EXPECT_EQ(reqs[1].h.kind, ff::kRecWriteImm);
  EXPECT_EQ(reqs[1].h.flags, ff::kRecFirst | ff::kRecLast | ff::kRecImm);
  EXPECT_EQ(reqs[1].h.imm, htonl(0xabcd));
  EXPECT_EQ(reqs[1].req.remote_addr, 0x5000u);
  EXPECT_EQ(reqs[1].req.last, 1);
  EXPECT_TRUE(reqs[1].data.empty());
}

TEST_F(RouterLink, ReadAndAtomicsAreRequestsWithoutData) {
  Buffer buf(pod.pd, 8192);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_READ, buf.Sge(0, 5000), 1, 0x2000, 7), 0);
  ASSERT_EQ(PostAtomic(qp, IBV_WR_ATOMIC_CMP_AND_SWP, buf.Sge(5000, 8), 2, 0x3000, 8, 3, 9), 0);
  ASSERT_EQ(PostAtomic(qp, IBV_WR_ATOMIC_FETCH_AND_ADD, buf.Sge(5008, 8), 3, 0x3008, 8, 5, 0), 0);
  const std::vector<Request> reqs = proxy->TakeRequests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[0].h.kind, ff::kRecReadReq);
  EXPECT_EQ(reqs[0].req.length, 5000u);
  EXPECT_EQ(reqs[0].req.remote_addr, 0x2000u);
  EXPECT_EQ(reqs[0].req.rkey, 7u);
  EXPECT_EQ(reqs[1].h.kind, ff::kRecAtomicReq);
  EXPECT_EQ(reqs[1].req.opcode, IBV_WR_ATOMIC_CMP_AND_SWP);
  EXPECT_EQ(reqs[1].req.compare_add, 3u);
  EXPECT_EQ(reqs[1].req.swap, 9u);
  EXPECT_EQ(reqs[1].req.length, 8u);
  EXPECT_EQ(reqs[2].req.opcode, IBV_WR_ATOMIC_FETCH_AND_ADD);
  EXPECT_EQ(reqs[2].req.compare_add, 5u);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(reqs[i].req.seq, i);
    EXPECT_EQ(reqs[i].req.last, 1);
    EXPECT_TRUE(reqs[i].data.empty());
  }
}

TEST_F(RouterLink, ResponsesCompleteWorkRequestsInPostingOrder) {
  Buffer buf(pod.pd, 64);
  for (uint64_t id = 1; id <= 3; ++id)
    ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE, buf.Sge(0, 64), id, 0x1000, 1), 0);
  ASSERT_EQ(proxy->TakeRequests().size(), 3u);
  pod.router.Respond(proxy, 2, IBV_WC_SUCCESS);
  EXPECT_TRUE(PollFew(pod.cq, 1).empty()) << "the third completed before the first";
  pod.router.Respond(proxy, 0, IBV_WC_SUCCESS);
  std::vector<ibv_wc> wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  pod.router.Respond(proxy, 1, IBV_WC_SUCCESS);
  wcs = PollN(pod.cq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 2u);
  EXPECT_EQ(wcs[1].wr_id, 3u);
}

TEST_F(RouterLink, ReadDataArrivingInPiecesLandsAtTheirOffsets) {
  const uint32_t len = 3 * kFrag;
  Buffer buf(pod.pd, len);
  std::vector<char> want(len);
  Fill(want.data(), len, 9);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_READ, buf.Sge(0, len), 1, 0x8000, 3), 0);
  ASSERT_EQ(proxy->TakeRequests().size(), 1u);
  pod.router.Respond(proxy, 0, IBV_WC_SUCCESS, false, 2 * kFrag, want.data() + 2 * kFrag, kFrag);
  pod.router.Respond(proxy, 0, IBV_WC_SUCCESS, false, 0, want.data(), kFrag);
  pod.router.Respond(proxy, 0, IBV_WC_SUCCESS, false, len, want.data(), 10);  // outside: dropped
  pod.router.Respond(proxy, 0, IBV_WC_SUCCESS, true, kFrag, want.data() + kFrag, kFrag);
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(buf.data(), want.data(), len), 0);
}

TEST_F(RouterLink, AtomicCompletesWithTheOriginalValue) {
  Buffer buf(pod.pd, 8);
  ASSERT_EQ(PostAtomic(qp, IBV_WR_ATOMIC_FETCH_AND_ADD, buf.Sge(0, 8), 1, 0x40, 2, 1, 0), 0);
  ASSERT_EQ(proxy->TakeRequests().size(), 1u);
  const uint64_t original = 41;
  pod.router.Respond(proxy, 0, IBV_WC_SUCCESS, true, 0, &original, 8);
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_FETCH_ADD);
  EXPECT_EQ(wcs[0].byte_len, 8u);
  uint64_t got = 0;
  std::memcpy(&got, buf.data(), 8);
  EXPECT_EQ(got, original);
}

TEST_F(RouterLink, RemoteAccessErrorCompletesThatRequestAndFlushesTheRest) {
  Buffer buf(pod.pd, 64);
  for (uint64_t id = 1; id <= 3; ++id)
    ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE, buf.Sge(0, 64), id, 0x1000, 1), 0);
  ASSERT_EQ(proxy->TakeRequests().size(), 3u);
  pod.router.Respond(proxy, 0, IBV_WC_SUCCESS);
  pod.router.Respond(proxy, 1, IBV_WC_REM_ACCESS_ERR);
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 3);
  ASSERT_EQ(wcs.size(), 3u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[1].wr_id, 2u);
  EXPECT_EQ(wcs[1].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(wcs[2].wr_id, 3u);
  EXPECT_EQ(wcs[2].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(StateOf(qp), IBV_QPS_ERR);
}

TEST_F(RouterLink, RnrExhaustedAtThePeerFailsThatSend) {
  Buffer buf(pod.pd, 64);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 64), 1), 0);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 64), 2), 0);
  ASSERT_EQ(proxy->TakeRequests().size(), 2u);
  pod.router.Respond(proxy, 0, IBV_WC_RNR_RETRY_EXC_ERR);
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
  EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(StateOf(qp), IBV_QPS_ERR);
}

// Raw records in the response ring that a well-behaved router never writes.
void AppendRaw(ProxySegment* p, uint8_t kind, const void* payload, uint32_t len) {
  ff::RecordHeader h{};
  h.kind = kind;
  ASSERT_EQ(ff::AppendRecord(p->responses, h, static_cast<const char*>(payload), len),
            ff::RingStatus::kOk);
  p->responses.Publish();
}

TEST_F(RouterLink, StaleDuplicateAndMalformedResponsesAreIgnored) {
  Buffer buf(pod.pd, 64);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE, buf.Sge(0, 64), 1, 0x1000, 1), 0);
  pod.router.Respond(proxy, 0, IBV_WC_SUCCESS);
  ASSERT_EQ(PollN(pod.cq, 1).size(), 1u);

  pod.router.Respond(proxy, 0, IBV_WC_REM_ACCESS_ERR);   // duplicate of a finished request
  pod.router.Respond(proxy, 57, IBV_WC_REM_ACCESS_ERR);  // never posted
  const uint32_t short_payload = 1;
  AppendRaw(proxy, ff::kRecResp, &short_payload, sizeof(short_payload));
  ff::ProxyResponse bad_status{};
  bad_status.seq = 1;
  bad_status.status = 999;
  bad_status.last = 1;
  AppendRaw(proxy, ff::kRecResp, &bad_status, sizeof(bad_status));
  ff::ProxyResponse wrong_kind{};
  wrong_kind.seq = 1;
  wrong_kind.status = IBV_WC_REM_ACCESS_ERR;
  wrong_kind.last = 1;
  AppendRaw(proxy, ff::kRecSend, &wrong_kind, sizeof(wrong_kind));

  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE, buf.Sge(0, 64), 2, 0x1000, 1), 0);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE, buf.Sge(0, 64), 3, 0x1000, 1), 0);
  ASSERT_EQ(proxy->TakeRequests().size(), 3u);
  pod.router.Respond(proxy, 2, IBV_WC_SUCCESS);
  EXPECT_TRUE(PollFew(pod.cq, 1).empty());              // done, waiting for the one before
  pod.router.Respond(proxy, 2, IBV_WC_REM_ACCESS_ERR);  // a duplicate of it
  pod.router.Respond(proxy, 1, IBV_WC_SUCCESS);
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 2u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[1].wr_id, 3u);
  EXPECT_EQ(wcs[1].status, IBV_WC_SUCCESS);
  EXPECT_EQ(StateOf(qp), IBV_QPS_RTS);
}

TEST_F(RouterLink, NoMoreThanMaxRdAtomicReadsAreOutstanding) {
  QpOptions o;
  o.max_rd_atomic = 2;
  Up(o);
  Buffer buf(pod.pd, 4 * 64);
  for (uint64_t id = 0; id < 4; ++id)
    ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_READ, buf.Sge(id * 64, 64), id, 0x1000, 1), 0);
  std::vector<Request> reqs = proxy->TakeRequests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[1].req.seq, 1u);
  pod.router.Respond(proxy, 0, IBV_WC_SUCCESS);
  ASSERT_EQ(PollN(pod.cq, 1).size(), 1u);
  reqs = proxy->TakeRequests();
  ASSERT_EQ(reqs.size(), 1u) << "one READ finished, so one more may go";
  EXPECT_EQ(reqs[0].req.seq, 2u);
  pod.router.Respond(proxy, 1, IBV_WC_SUCCESS);
  pod.router.Respond(proxy, 2, IBV_WC_SUCCESS);
  ASSERT_EQ(PollN(pod.cq, 2).size(), 2u);
  reqs = proxy->TakeRequests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].req.seq, 3u);
}

TEST_F(RouterLink, DoorbellIsRungOnlyWhenTheRouterArmedIt) {
  Buffer buf(pod.pd, 64);
  proxy->header()->doorbell.armed.store(0);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE, buf.Sge(0, 64), 1, 0x1000, 1), 0);
  EXPECT_EQ(ff::DrainWakes(proxy->doorbell.get()), 0) << "rang an unarmed doorbell";

  proxy->header()->doorbell.armed.store(1);
  ASSERT_EQ(PostSend(qp, IBV_WR_RDMA_WRITE, buf.Sge(0, 64), 2, 0x1000, 1), 0);
  EXPECT_EQ(ff::DrainWakes(proxy->doorbell.get()), 1) << "one wake through the wake socket";
  EXPECT_EQ(proxy->header()->doorbell.armed.load(), 0u) << "the ring disarms it";
  EXPECT_EQ(proxy->TakeRequests().size(), 2u);
}

TEST(RouterLinkUd, UdSendThroughTheRouterCompletesOnceItLeft) {
  Pod pod;
  QpOptions o;
  o.type = IBV_QPT_UD;
  ibv_qp* qp = pod.CreateQp(o);
  ASSERT_NE(qp, nullptr);
  ProxySegment* proxy = pod.router.AnswerThroughRouter(qp->qp_num, kPeerQpn, IBV_QPT_UD);
  ASSERT_EQ(pod.Connect(qp, kPeerQpn, o), 0);
  Buffer buf(pod.pd, 64);
  ASSERT_EQ(PostUdSend(qp, pod.NewAh(), buf.Sge(0, 64), 5, kPeerQpn, 0x2222), 0);
  const std::vector<Request> reqs = proxy->TakeRequests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].h.qkey, 0x2222u);
  const std::vector<ibv_wc> wcs = PollN(pod.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 5u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
}

}  // namespace
}  // namespace fftest
