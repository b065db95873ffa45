// Spare QP segments (verbs-library.md): the segment of a destroyed RC QP that never left its
// process becomes the next QP's and works as a new one; a segment that a peer mapped (a pod
// of this node was given it, or the router mapped it for a sender on another node) is never
// used again. The attack: a pod that was given a QP's segment writes on into it after the
// QP is gone, or seals it against writes to keep later peers out.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>

#include "base/objects.h"
#include "pods.h"

namespace ff::cluster_test {
namespace {

using ff::test::WaitFor;
using router::test::RawLink;
using router::test::RawPod;
using router::test::RawQp;
using router::test::WriteMessage;

ff::verbs::Qp* Internal(ibv_qp* q) { return reinterpret_cast<ff::verbs::Qp*>(q); }

ino_t SegmentInode(ibv_qp* q) {
  struct stat st {};
  return ::fstat(Internal(q)->inbound.seg_fd.get(), &st) == 0 ? st.st_ino : 0;
}

size_t Spares(const Pod& p) {
  ff::verbs::Session* s = p.session();
  std::lock_guard<std::mutex> g(s->spare_mu);
  return s->spare_segments.size();
}

// True once the router has served the destroys of all of `p`'s spare segments (2 s at most).
bool SparesServed(const Pod& p) {
  ff::verbs::Session* s = p.session();
  return WaitFor(
      [s] {
        std::lock_guard<std::mutex> g(s->spare_mu);
        return std::all_of(
            s->spare_segments.begin(), s->spare_segments.end(),
            [s](const ff::verbs::Session::SpareSegment& e) { return s->Served(e.served_at); });
      },
      std::chrono::milliseconds(2000));
}

class SpareSegmentTest : public ClusterTest {};

TEST_P(SpareSegmentTest, AQpNoPeerMappedLendsItsSegmentToTheNextQpWhichWorksAsNew) {
  ibv_qp* q1 = a->NewQp();
  ASSERT_NE(q1, nullptr);
  const ino_t first = SegmentInode(q1);
  // Connected and given a receive, but its peer never sends: nobody maps its segment.
  ASSERT_EQ(a->ConnectQp(q1, *b, b->qp->qp_num), 0);
  ASSERT_EQ(a->PostRecv(1, 0, 64, q1), 0);
  ASSERT_EQ(a->DestroyQp(q1), 0);
  EXPECT_EQ(Spares(*a), 1u);
  ASSERT_TRUE(SparesServed(*a));
  ibv_qp* q2 = a->NewQp();
  ASSERT_NE(q2, nullptr);
  EXPECT_EQ(SegmentInode(q2), first);
  EXPECT_EQ(Spares(*a), 0u);
  const auto* hdr = Internal(q2)->inbound.seg.as<QpSegmentHeader>();
  EXPECT_EQ(hdr->credits.posted.load(), 0u);
  EXPECT_EQ(
      QpRing(Internal(q2)->inbound.seg.get(), 0, Internal(q2)->inbound.ring_bytes)->tail.load(),
      0u);

  // Traffic both ways through it.
  ASSERT_EQ(b->ConnectQp(b->qp, *a, q2->qp_num), 0);
  ASSERT_EQ(a->ConnectQp(q2, *b, b->qp->qp_num), 0);
  ASSERT_EQ(b->PostRecv(10, 0, 64), 0);
  std::memset(a->buf, 'x', 64);
  EXPECT_EQ(a->Access(IBV_WR_SEND, 0, 0, 0, 64, q2), IBV_WC_SUCCESS);
  const auto got = b->Poll(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].wr_id, 10u);
  EXPECT_EQ(got[0].src_qp, q2->qp_num);
  EXPECT_EQ(std::memcmp(b->buf, a->buf, 64), 0);
  ASSERT_EQ(a->PostRecv(11, 4096, 64, q2), 0);
  std::memset(b->buf + 128, 'y', 64);
  ASSERT_EQ(b->Post(IBV_WR_SEND, 12, 128, 64), 0);
  const auto in = a->Poll(1);
  ASSERT_EQ(in.size(), 1u);
  EXPECT_EQ(in[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(in[0].wr_id, 11u);
  EXPECT_EQ(std::memcmp(a->buf + 4096, b->buf + 128, 64), 0);
  EXPECT_EQ(b->Poll(1).size(), 1u);

  // The peer produced into it (given the segment on one node, through its router's mapping
  // across nodes): it left the process, and goes with its QP.
  EXPECT_TRUE(SealsFrozen(Internal(q2)->inbound.seg_fd.get()));
  ASSERT_EQ(a->DestroyQp(q2), 0);
  EXPECT_EQ(Spares(*a), 0u);
  ibv_qp* q3 = a->NewQp();
  ASSERT_NE(q3, nullptr);
  EXPECT_NE(SegmentInode(q3), first);
}

TEST_P(SpareSegmentTest, SparesAreKeptPerSizeAndAtMostAFew) {
  std::vector<ibv_qp*> qps;
  for (size_t i = 0; i < kSpareQpSegments + 2; ++i) qps.push_back(a->NewQp());
  for (ibv_qp* q : qps) ASSERT_EQ(a->DestroyQp(q), 0);
  EXPECT_EQ(Spares(*a), kSpareQpSegments);
  ASSERT_TRUE(SparesServed(*a));
  // A QP of another ring size makes its own segment.
  ibv_qp_init_attr init{};
  init.send_cq = a->cq;
  init.recv_cq = a->cq;
  init.qp_type = IBV_QPT_RC;
  init.cap = {16, 4096, 1, 1, 0};
  ibv_qp* deep = ibv_create_qp(a->pd, &init);
  ASSERT_NE(deep, nullptr);
  EXPECT_EQ(Spares(*a), kSpareQpSegments);
  EXPECT_EQ(ibv_destroy_qp(deep), 0);
  EXPECT_EQ(Spares(*a), kSpareQpSegments);  // the oldest went
}

INSTANTIATE_TEST_SUITE_P(Nodes, SpareSegmentTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "cross" : "same"; });

// The attack, on one node where a peer holds the segment itself.
TEST(SpareSegments, APodGivenAQpsSegmentCanNeitherSealItNorReachTheOwnersNextQp) {
  router::test::TestRouter router{router::test::TestRouter::Options{}};
  Pod a(router, Ip("10.1.0.1"));
  RawPod c(router, Ip("10.1.0.9"));
  ASSERT_EQ(c.Hello(), 0);
  const RawQp qc = c.CreateQp(IBV_QPT_RC);
  ibv_qp* q1 = a.NewQp();
  ASSERT_NE(q1, nullptr);
  const ino_t first = SegmentInode(q1);
  ASSERT_EQ(a.ConnectQp(q1, Ip("10.1.0.9"), qc.qpn), 0);  // q1 named C's QP: C may link
  RawLink link = c.Connect(qc, Ip("10.1.0.1"), q1->qp_num);
  ASSERT_EQ(link.status, 0);
  // C cannot seal the segment or the notify words against writes, which would keep every
  // later peer of the pod from mapping them.
  EXPECT_EQ(::fcntl(link.fds[0].get(), F_ADD_SEALS, F_SEAL_FUTURE_WRITE), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(::fcntl(link.fds[1].get(), F_ADD_SEALS, F_SEAL_FUTURE_WRITE), -1);
  EXPECT_EQ(errno, EPERM);

  ASSERT_EQ(a.DestroyQp(q1), 0);
  EXPECT_EQ(Spares(a), 0u);
  ibv_qp* q2 = a.NewQp();
  ASSERT_NE(q2, nullptr);
  EXPECT_NE(SegmentInode(q2), first);
  // What C writes on into the old segment reaches nobody.
  ASSERT_EQ(a.ConnectQp(q2, Ip("10.1.0.9"), qc.qpn), 0);
  ASSERT_EQ(a.PostRecv(1, 0, 64, q2), 0);
  ASSERT_TRUE(WriteMessage(link, "forged"));
  EXPECT_TRUE(a.Poll(1, std::chrono::milliseconds(200)).empty());
  EXPECT_EQ(
      QpRing(Internal(q2)->inbound.seg.get(), 0, Internal(q2)->inbound.ring_bytes)->tail.load(),
      0u);
}

}  // namespace
}  // namespace ff::cluster_test
