// ibv_rereg_mr between two pods on one router and across two: the handle stays, its keys
// change, and a peer still using an old key fails; input errors leave the old registration
// working.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "pods.h"

namespace ff::cluster_test {
namespace {

class ReregTest : public ClusterTest {
 protected:
  // a reads (or `op`) `len` bytes at b's buffer + `offset` through `rkey`: its status.
  ibv_wc_status Read(uint32_t rkey, size_t offset, uint32_t len = 8,
                     ibv_wr_opcode op = IBV_WR_RDMA_READ) {
    return a->Access(op, rkey, reinterpret_cast<uintptr_t>(b->buf + offset), 600000, len);
  }
};

TEST_P(ReregTest, NewAccessGivesNewKeysAndRetiresTheOldOnes) {
  ConnectBoth();
  ibv_mr* handle = b->mr;
  const uint32_t old_rkey = b->mr->rkey;
  ASSERT_EQ(ibv_rereg_mr(b->mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ),
            0);
  EXPECT_EQ(b->mr, handle);
  EXPECT_NE(b->mr->rkey, old_rkey);
  EXPECT_EQ(b->mr->lkey, b->mr->rkey);
  EXPECT_EQ(Read(b->mr->rkey, 64), IBV_WC_SUCCESS);
  EXPECT_EQ(Read(b->mr->rkey, 64, 8, IBV_WR_RDMA_WRITE), IBV_WC_REM_ACCESS_ERR);
}

TEST_P(ReregTest, APeerUsingTheOldKeyFails) {
  ConnectBoth();
  const uint32_t old_rkey = b->mr->rkey;
  ASSERT_EQ(ibv_rereg_mr(b->mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ),
            0);
  EXPECT_EQ(Read(old_rkey, 64), IBV_WC_REM_ACCESS_ERR);
}

TEST_P(ReregTest, NewTranslationMovesTheRange) {
  ConnectBoth();
  std::memset(b->buf + 8192, 0x3c, 8);
  ASSERT_EQ(ibv_rereg_mr(b->mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, b->buf + 8192, 4096, 0),
            0);
  EXPECT_EQ(b->mr->addr, b->buf + 8192);
  EXPECT_EQ(b->mr->length, 4096u);
  EXPECT_EQ(Read(b->mr->rkey, 8192), IBV_WC_SUCCESS);
  EXPECT_EQ(a->buf[600000], 0x3c);
  EXPECT_EQ(Read(b->mr->rkey, 0), IBV_WC_REM_ACCESS_ERR);  // before the new range
}

TEST_P(ReregTest, NewPdOfTheSameContextOnly) {
  ConnectBoth();
  ibv_pd* other = ibv_alloc_pd(b->ctx);
  ASSERT_NE(other, nullptr);
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(b->mr, IBV_REREG_MR_CHANGE_PD, a->pd, nullptr, 0, 0),
            IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL);
  ASSERT_EQ(ibv_rereg_mr(b->mr, IBV_REREG_MR_CHANGE_PD, other, nullptr, 0, 0), 0);
  EXPECT_EQ(b->mr->pd, other);
  ASSERT_EQ(ibv_rereg_mr(b->mr, IBV_REREG_MR_CHANGE_PD, b->pd, nullptr, 0, 0), 0);
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
}

// Memory of b outside its pod buffer, page-aligned, freed at the end.
struct Pages {
  explicit Pages(size_t n) : bytes(n), p(static_cast<char*>(std::aligned_alloc(4096, n))) {
    std::memset(p, 0, n);
  }
  ~Pages() { std::free(p); }
  size_t bytes;
  char* p;
};

// What the third-party test did: remote access added to a local registration
// reaches the memory under the new key.
TEST_P(ReregTest, AddedRemoteAccessLetsAPeerIn) {
  ConnectBoth();
  Pages mem(16384);
  ibv_mr* mr = ibv_reg_mr(b->pd, mem.p, mem.bytes, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ),
            0);
  std::memset(a->buf + 600000, 0x6b, 64);
  EXPECT_EQ(
      a->Access(IBV_WR_RDMA_WRITE, mr->rkey, reinterpret_cast<uintptr_t>(mem.p) + 4096, 600000, 64),
      IBV_WC_SUCCESS);
  EXPECT_EQ(mem.p[4096 + 63], 0x6b);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

// A new translation onto other memory: the peer's bytes land there, not in the old buffer.
TEST_P(ReregTest, ANewTranslationOntoOtherMemoryTakesThePeersBytes) {
  ConnectBoth();
  Pages first(8192), second(8192);
  ibv_mr* mr = ibv_reg_mr(b->pd, first.p, first.bytes, kAllAccess);
  ASSERT_NE(mr, nullptr);
  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, second.p, second.bytes, 0),
            0);
  std::memset(a->buf + 600000, 0x2d, 64);
  EXPECT_EQ(a->Access(IBV_WR_RDMA_WRITE, mr->rkey, reinterpret_cast<uintptr_t>(second.p) + 128,
                      600000, 64),
            IBV_WC_SUCCESS);
  EXPECT_EQ(second.p[128 + 63], 0x2d);
  EXPECT_EQ(first.p[128 + 63], 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

// A registration moved to another PD is not the old PD's QPs' to use.
TEST_P(ReregTest, ARegistrationMovedToAnotherPdServesNoQpOfTheOldOne) {
  ConnectBoth();
  ibv_pd* other = ibv_alloc_pd(b->ctx);
  ASSERT_NE(other, nullptr);
  Pages mem(8192);
  ibv_mr* mr = ibv_reg_mr(b->pd, mem.p, mem.bytes, kAllAccess);
  ASSERT_NE(mr, nullptr);
  const auto at = reinterpret_cast<uintptr_t>(mem.p);
  ASSERT_EQ(a->Access(IBV_WR_RDMA_READ, mr->rkey, at, 600000, 8), IBV_WC_SUCCESS);
  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, other, nullptr, 0, 0), 0);
  // A peer's access through b's QP (of b->pd) with the registration's new key: refused, as
  // a responder HCA refuses a key of another PD than its QP's.
  EXPECT_EQ(a->Access(IBV_WR_RDMA_READ, mr->rkey, at, 600000, 8), IBV_WC_REM_ACCESS_ERR);
  // b's QP (of b->pd) sends from it: a local protection error.
  ibv_sge sge{reinterpret_cast<uintptr_t>(mem.p), 8, mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 9;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(b->qp, &wr, &bad), 0);
  const auto wc = b->Poll(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 9u);
  EXPECT_EQ(wc[0].status, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
}

// A key registered in another PD than the target QP's serves no peer's READ, WRITE or
// atomic through that QP; the same memory registered in the QP's PD does.
TEST_P(ReregTest, APeersKeyOfAnotherPdThanTheQpsIsRefused) {
  ConnectBoth();
  ibv_pd* other = ibv_alloc_pd(b->ctx);
  ASSERT_NE(other, nullptr);
  Pages mem(8192);
  ibv_mr* foreign = ibv_reg_mr(other, mem.p, mem.bytes, kAllAccess);
  ASSERT_NE(foreign, nullptr);
  const auto at = reinterpret_cast<uintptr_t>(mem.p);
  // Each refusal moves the pair to ERR: every access on a fresh pair of QPs (b's in b->pd).
  for (const ibv_wr_opcode op :
       {IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE, IBV_WR_ATOMIC_FETCH_AND_ADD}) {
    ibv_qp* from = NewPair();
    ASSERT_NE(from, nullptr);
    EXPECT_EQ(a->Access(op, foreign->rkey, at, 600000, 8, from), IBV_WC_REM_ACCESS_ERR) << op;
  }
  ibv_mr* own = ibv_reg_mr(b->pd, mem.p, mem.bytes, kAllAccess);
  ASSERT_NE(own, nullptr);
  ibv_qp* from = NewPair();
  ASSERT_NE(from, nullptr);
  EXPECT_EQ(a->Access(IBV_WR_RDMA_WRITE, own->rkey, at, 600000, 8, from), IBV_WC_SUCCESS);
  EXPECT_EQ(a->Access(IBV_WR_ATOMIC_FETCH_AND_ADD, own->rkey, at, 600000, 8, from), IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_dereg_mr(own), 0);
  EXPECT_EQ(ibv_dereg_mr(foreign), 0);
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
}

TEST_P(ReregTest, InputErrorsLeaveTheOldRegistrationWorking) {
  ConnectBoth();
  const uint32_t rkey = b->mr->rkey;
  const struct {
    int flags;
    void* addr;
    size_t length;
    int access;
  } bad[] = {
      {0, nullptr, 0, 0},                                                 // nothing to change
      {IBV_REREG_MR_FLAGS_SUPPORTED + 1, nullptr, 0, 0},                  // unknown flag
      {IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, 4096, 0},                // no address
      {IBV_REREG_MR_CHANGE_TRANSLATION, b->buf, 0, 0},                    // no length
      {IBV_REREG_MR_CHANGE_PD, nullptr, 0, IBV_ACCESS_LOCAL_WRITE},       // access, not asked
      {IBV_REREG_MR_CHANGE_ACCESS, nullptr, 0, IBV_ACCESS_REMOTE_WRITE},  // no local write
  };
  for (const auto& c : bad) {
    errno = 0;
    EXPECT_EQ(ibv_rereg_mr(b->mr, c.flags, b->pd, c.addr, c.length, c.access),
              IBV_REREG_MR_ERR_INPUT)
        << c.flags;
    EXPECT_EQ(errno, EINVAL) << c.flags;
  }
  EXPECT_EQ(b->mr->rkey, rkey);
  EXPECT_EQ(Read(rkey, 64), IBV_WC_SUCCESS);
}

TEST_P(ReregTest, ARegistrationWithABoundWindowIsBusy) {
  ConnectBoth();
  ibv_mr* mr = ibv_reg_mr(b->pd, b->buf, 4096, kAllAccess | IBV_ACCESS_MW_BIND);
  ASSERT_NE(mr, nullptr);
  ibv_mw* mw = ibv_alloc_mw(b->pd, IBV_MW_TYPE_1);
  ASSERT_NE(mw, nullptr);
  ibv_mw_bind bind{};
  bind.bind_info = {mr, reinterpret_cast<uintptr_t>(b->buf), 64, IBV_ACCESS_REMOTE_READ};
  ASSERT_EQ(ibv_bind_mw(b->qp, mw, &bind), 0);
  ASSERT_EQ(b->Poll(1).size(), 1u);
  errno = 0;
  EXPECT_EQ(
      ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_LOCAL_WRITE),
      IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EBUSY);
  EXPECT_EQ(Read(mw->rkey, 0), IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

INSTANTIATE_TEST_SUITE_P(Nodes, ReregTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "TwoNodes" : "OneNode"; });

}  // namespace
}  // namespace ff::cluster_test
