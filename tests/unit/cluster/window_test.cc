// Memory windows, type 1 and type 2, between two pods on one router and across two: the
// bind rules (each refusal completes with IBV_WC_MW_BIND_ERR and fails the QP), remote
// access through a window's key checked against its range, rights and QP, invalidation,
// and deregistration of a registration that windows are bound to.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cstring>

#include "pods.h"

namespace ff::cluster_test {
namespace {

constexpr int kWindowMr = kAllAccess | IBV_ACCESS_MW_BIND;
constexpr size_t kWindowBytes = 1 << 16;
constexpr size_t kWindowAt = 4096;  // the window covers [kWindowAt, kWindowAt + 8192) of b
constexpr uint64_t kWindowLength = 8192;

class WindowTest : public ClusterTest {
 protected:
  // b registers the start of its buffer with `access` again (MW_BIND) for windows.
  void Register(int access = kWindowMr) {
    bmr = ibv_reg_mr(b->pd, b->buf, kWindowBytes, access);
    ASSERT_NE(bmr, nullptr);
  }
  void TearDown() override {
    if (mw != nullptr) {
      EXPECT_EQ(ibv_dealloc_mw(mw), 0);
    }
    if (bmr != nullptr) {
      EXPECT_EQ(ibv_dereg_mr(bmr), 0);
    }
  }
  ibv_mw_bind_info Info(int rights, uint64_t length = kWindowLength) const {
    return ibv_mw_bind_info{bmr, reinterpret_cast<uintptr_t>(b->buf + kWindowAt), length,
                            static_cast<unsigned>(rights)};
  }
  // Binds type 1 window `mw` through b's QP; the completion's status.
  ibv_wc_status BindType1(int rights, uint64_t length = kWindowLength) {
    ibv_mw_bind bind{};
    bind.wr_id = 77;
    bind.send_flags = IBV_SEND_SIGNALED;
    bind.bind_info = Info(rights, length);
    EXPECT_EQ(ibv_bind_mw(b->qp, mw, &bind), 0);
    return Completion(*b, IBV_WC_BIND_MW, 77);
  }
  // Posts a BIND_MW of type 2 window `mw` with key `rkey` through `qp` of b.
  ibv_wc_status BindType2(ibv_qp* qp, uint32_t rkey, int rights) {
    ibv_send_wr wr{};
    wr.wr_id = 78;
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = rkey;
    wr.bind_mw.bind_info = Info(rights);
    ibv_send_wr* bad = nullptr;
    EXPECT_EQ(ibv_post_send(qp, &wr, &bad), 0);
    return Completion(*b, IBV_WC_BIND_MW, 78);
  }
  ibv_wc_status LocalInv(uint32_t rkey) {
    ibv_send_wr wr{};
    wr.wr_id = 79;
    wr.opcode = IBV_WR_LOCAL_INV;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.invalidate_rkey = rkey;
    ibv_send_wr* bad = nullptr;
    EXPECT_EQ(ibv_post_send(b->qp, &wr, &bad), 0);
    return Completion(*b, IBV_WC_LOCAL_INV, 79);
  }
  static ibv_wc_status Completion(Pod& pod, ibv_wc_opcode opcode, uint64_t wr_id) {
    const auto wc = pod.Poll(1);
    if (wc.size() != 1) return IBV_WC_GENERAL_ERR;
    EXPECT_EQ(wc[0].wr_id, wr_id);
    if (wc[0].status == IBV_WC_SUCCESS) {
      EXPECT_EQ(wc[0].opcode, opcode);
    }
    return wc[0].status;
  }
  // a's access of `len` bytes at b's buffer + `offset` through `rkey`: its status.
  ibv_wc_status Access(ibv_wr_opcode op, uint32_t rkey, size_t offset, uint32_t len,
                       ibv_qp* qp = nullptr) {
    return a->Access(op, rkey, reinterpret_cast<uintptr_t>(b->buf + offset), 500000, len, qp);
  }
  // Both QPs connected, b's registration for windows, and a window of `type` in `mw`.
  void SetUpWindow(ibv_mw_type type, int access = kWindowMr) {
    ConnectBoth();
    Register(access);
    mw = ibv_alloc_mw(b->pd, type);
    ASSERT_NE(mw, nullptr);
  }
  static ibv_qp_state State(ibv_qp* qp) {
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    EXPECT_EQ(ibv_query_qp(qp, &attr, IBV_QP_STATE, &init), 0);
    return attr.qp_state;
  }

  ibv_mr* bmr = nullptr;
  ibv_mw* mw = nullptr;
};

TEST_P(WindowTest, TheDeviceReportsWindowsOfBothTypes) {
  ibv_device_attr attr{};
  ASSERT_EQ(ibv_query_device(a->ctx, &attr), 0);
  EXPECT_TRUE(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW);
  EXPECT_TRUE(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B);
  EXPECT_GT(attr.max_mw, 0);
  ibv_device_attr_ex ex{};
  ASSERT_EQ(ibv_query_device_ex(a->ctx, nullptr, &ex), 0);
  EXPECT_EQ(ex.orig_attr.device_cap_flags, attr.device_cap_flags);
  EXPECT_EQ(ex.orig_attr.max_mw, attr.max_mw);
}

TEST_P(WindowTest, AnUnboundWindowReachesNothing) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindow(IBV_MW_TYPE_1));
  EXPECT_EQ(mw->type, IBV_MW_TYPE_1);
  EXPECT_EQ(mw->pd, b->pd);
  EXPECT_EQ(Access(IBV_WR_RDMA_WRITE, mw->rkey, kWindowAt, 8), IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(State(a->qp), IBV_QPS_ERR);
}

TEST_P(WindowTest, ATypeOneBindChangesTheKeyAndGrantsTheWindowsRights) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindow(IBV_MW_TYPE_1));
  const uint32_t before = mw->rkey;
  ASSERT_EQ(BindType1(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC),
            IBV_WC_SUCCESS);
  EXPECT_EQ(mw->rkey, ibv_inc_rkey(before));
  std::memset(a->buf + 500000, 0x5a, 64);
  EXPECT_EQ(Access(IBV_WR_RDMA_WRITE, mw->rkey, kWindowAt, 64), IBV_WC_SUCCESS);
  EXPECT_EQ(b->buf[kWindowAt + 63], 0x5a);
  EXPECT_EQ(Access(IBV_WR_RDMA_READ, mw->rkey, kWindowAt + kWindowLength - 64, 64), IBV_WC_SUCCESS);
  EXPECT_EQ(Access(IBV_WR_ATOMIC_FETCH_AND_ADD, mw->rkey, kWindowAt + 8, 8), IBV_WC_SUCCESS);
  // One byte past the window (still inside the registration) is refused.
  EXPECT_EQ(Access(IBV_WR_RDMA_READ, mw->rkey, kWindowAt + kWindowLength - 63, 64),
            IBV_WC_REM_ACCESS_ERR);
}

TEST_P(WindowTest, ARebindRetiresTheOldKeyAndAZeroLengthBindUnbinds) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindow(IBV_MW_TYPE_1));
  ASSERT_EQ(BindType1(IBV_ACCESS_REMOTE_READ), IBV_WC_SUCCESS);
  const uint32_t first = mw->rkey;
  ASSERT_EQ(BindType1(IBV_ACCESS_REMOTE_READ), IBV_WC_SUCCESS);
  EXPECT_NE(mw->rkey, first);
  EXPECT_EQ(Access(IBV_WR_RDMA_READ, mw->rkey, kWindowAt, 8), IBV_WC_SUCCESS);
  ASSERT_EQ(BindType1(0, 0), IBV_WC_SUCCESS);  // unbind
  EXPECT_EQ(Access(IBV_WR_RDMA_READ, mw->rkey, kWindowAt, 8), IBV_WC_REM_ACCESS_ERR);
}

TEST_P(WindowTest, AnOldKeyOfAReboundWindowIsRefused) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindow(IBV_MW_TYPE_1));
  ASSERT_EQ(BindType1(IBV_ACCESS_REMOTE_READ), IBV_WC_SUCCESS);
  const uint32_t first = mw->rkey;
  ASSERT_EQ(BindType1(IBV_ACCESS_REMOTE_READ), IBV_WC_SUCCESS);
  EXPECT_EQ(Access(IBV_WR_RDMA_READ, first, kWindowAt, 8), IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(State(a->qp), IBV_QPS_ERR);
}

TEST_P(WindowTest, AWindowGrantsOnlyItsRights) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindow(IBV_MW_TYPE_1));
  ASSERT_EQ(BindType1(IBV_ACCESS_REMOTE_READ), IBV_WC_SUCCESS);
  EXPECT_EQ(Access(IBV_WR_RDMA_WRITE, mw->rkey, kWindowAt, 8), IBV_WC_REM_ACCESS_ERR);
}

TEST_P(WindowTest, ABindOverARegistrationWithoutMwBindFailsTheQp) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindow(IBV_MW_TYPE_1, kAllAccess));
  EXPECT_EQ(BindType1(IBV_ACCESS_REMOTE_READ), IBV_WC_MW_BIND_ERR);
  EXPECT_EQ(State(b->qp), IBV_QPS_ERR);
}

// As the verbs define a bind: writes and atomics through a window need the registration's
// local write; remote flags it need not have (the next test).
TEST_P(WindowTest, AWindowGrantsWritesOnlyOverARegistrationWithLocalWrite) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindow(IBV_MW_TYPE_1, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND));
  EXPECT_EQ(BindType1(IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE), IBV_WC_MW_BIND_ERR);
}

// Binding a window is how the owner grants remote access, as on an HCA: a registration with
// local write and IBV_ACCESS_MW_BIND only takes a window with every remote right.
TEST_P(WindowTest, AWindowGrantsRemoteRightsOverARegistrationWithoutAny) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindow(IBV_MW_TYPE_1, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND));
  ASSERT_EQ(BindType1(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC),
            IBV_WC_SUCCESS);
  std::memset(a->buf + 500000, 0x3c, 64);
  EXPECT_EQ(Access(IBV_WR_RDMA_WRITE, mw->rkey, kWindowAt, 64), IBV_WC_SUCCESS);
  EXPECT_EQ(b->buf[kWindowAt + 63], 0x3c);
  EXPECT_EQ(Access(IBV_WR_RDMA_READ, mw->rkey, kWindowAt + 128, 64), IBV_WC_SUCCESS);
  EXPECT_EQ(Access(IBV_WR_ATOMIC_FETCH_AND_ADD, mw->rkey, kWindowAt + 8, 8), IBV_WC_SUCCESS);
  // The registration's own key grants nothing remote.
  EXPECT_EQ(Access(IBV_WR_RDMA_READ, bmr->rkey, kWindowAt, 8), IBV_WC_REM_ACCESS_ERR);
}

TEST_P(WindowTest, AWindowMustLieInsideItsRegistration) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindow(IBV_MW_TYPE_1));
  EXPECT_EQ(BindType1(IBV_ACCESS_REMOTE_READ, kWindowBytes), IBV_WC_MW_BIND_ERR);
}

TEST_P(WindowTest, ARegistrationWithBoundWindowsCannotBeDeregistered) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindow(IBV_MW_TYPE_1));
  ASSERT_EQ(BindType1(IBV_ACCESS_REMOTE_READ), IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_dereg_mr(bmr), EBUSY);
  EXPECT_EQ(Access(IBV_WR_RDMA_READ, mw->rkey, kWindowAt, 8), IBV_WC_SUCCESS);
  ASSERT_EQ(BindType1(0, 0), IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_dereg_mr(bmr), 0);
  bmr = nullptr;
}

TEST_P(WindowTest, ATypeTwoWindowIsBoundByAWorkRequestAndInvalidatedLocally) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindow(IBV_MW_TYPE_2));
  const uint32_t rkey = ibv_inc_rkey(mw->rkey);
  ASSERT_EQ(BindType2(b->qp, rkey, IBV_ACCESS_REMOTE_WRITE), IBV_WC_SUCCESS);
  EXPECT_EQ(mw->rkey, rkey);
  EXPECT_EQ(Access(IBV_WR_RDMA_WRITE, rkey, kWindowAt, 8), IBV_WC_SUCCESS);
  ASSERT_EQ(LocalInv(rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(Access(IBV_WR_RDMA_WRITE, rkey, kWindowAt, 8), IBV_WC_REM_ACCESS_ERR);
}

// a sends SEND_WITH_INV naming `rkey`; b's receive completion.
ibv_wc SendWithInv(Pod& a, Pod& b, uint32_t rkey) {
  EXPECT_EQ(b.PostRecv(60, 0, 64), 0);
  ibv_sge sge{reinterpret_cast<uintptr_t>(a.buf), 16, a.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 61;
  wr.opcode = IBV_WR_SEND_WITH_INV;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.invalidate_rkey = rkey;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(a.qp, &wr, &bad), 0);
  const auto sent = a.Poll(1);
  EXPECT_EQ(sent.size(), 1u);
  const auto got = b.Poll(1);
  ibv_wc wc{};
  wc.status = IBV_WC_GENERAL_ERR;
  return got.size() == 1 ? got[0] : wc;
}

TEST_P(WindowTest, APeersSendWithInvalidateUnbindsATypeTwoWindow) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindow(IBV_MW_TYPE_2));
  const uint32_t rkey = ibv_inc_rkey(mw->rkey);
  ASSERT_EQ(BindType2(b->qp, rkey, IBV_ACCESS_REMOTE_READ), IBV_WC_SUCCESS);
  EXPECT_EQ(Access(IBV_WR_RDMA_READ, rkey, kWindowAt, 8), IBV_WC_SUCCESS);
  const ibv_wc wc = SendWithInv(*a, *b, rkey);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_RECV);
  EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_INV);
  EXPECT_EQ(wc.invalidated_rkey, rkey);
  EXPECT_EQ(Access(IBV_WR_RDMA_READ, rkey, kWindowAt, 8), IBV_WC_REM_ACCESS_ERR);
}

TEST_P(WindowTest, ASendWithInvalidateMayNameOnlyAWindowOfItsQp) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindow(IBV_MW_TYPE_1));
  ASSERT_EQ(BindType1(IBV_ACCESS_REMOTE_READ), IBV_WC_SUCCESS);
  const ibv_wc wc = SendWithInv(*a, *b, mw->rkey);  // type 1: not invalidated remotely
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR);
  EXPECT_FALSE(wc.wc_flags & IBV_WC_WITH_INV);
  EXPECT_EQ(Access(IBV_WR_RDMA_READ, mw->rkey, kWindowAt, 8), IBV_WC_SUCCESS);
  ASSERT_EQ(BindType1(0, 0), IBV_WC_SUCCESS);
}

// The same through the ibv_wr_* API: ibv_wr_bind_mw, ibv_wr_send_inv, ibv_wr_local_inv.
TEST_P(WindowTest, TheWorkRequestApiBindsAndInvalidates) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindow(IBV_MW_TYPE_2));
  ibv_qp_ex* bx = ibv_qp_to_qp_ex(b->qp);
  ibv_qp_ex* ax = ibv_qp_to_qp_ex(a->qp);
  ASSERT_NE(bx, nullptr);
  ASSERT_NE(ax, nullptr);
  uint32_t rkey = ibv_inc_rkey(mw->rkey);
  const ibv_mw_bind_info info = Info(IBV_ACCESS_REMOTE_READ);
  ibv_wr_start(bx);
  bx->wr_id = 90;
  ibv_wr_bind_mw(bx, mw, rkey, &info);
  ASSERT_EQ(ibv_wr_complete(bx), 0);
  EXPECT_EQ(Completion(*b, IBV_WC_BIND_MW, 90), IBV_WC_SUCCESS);
  EXPECT_EQ(Access(IBV_WR_RDMA_READ, rkey, kWindowAt, 8), IBV_WC_SUCCESS);
  ASSERT_EQ(b->PostRecv(91, 0, 64), 0);
  ibv_wr_start(ax);
  ax->wr_id = 92;
  ibv_wr_send_inv(ax, rkey);
  ibv_wr_set_sge(ax, a->mr->lkey, reinterpret_cast<uintptr_t>(a->buf), 8);
  ASSERT_EQ(ibv_wr_complete(ax), 0);
  EXPECT_EQ(a->Poll(1).size(), 1u);
  const auto got = b->Poll(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].wc_flags & IBV_WC_WITH_INV);
  EXPECT_EQ(got[0].invalidated_rkey, rkey);
  rkey = ibv_inc_rkey(rkey);
  ibv_wr_start(bx);
  bx->wr_id = 93;
  ibv_wr_bind_mw(bx, mw, rkey, &info);
  bx->wr_id = 94;
  ibv_wr_local_inv(bx, rkey);
  ASSERT_EQ(ibv_wr_complete(bx), 0);
  const auto done = b->Poll(2);
  ASSERT_EQ(done.size(), 2u);
  ExpectWc(done[0], 93, IBV_WC_SUCCESS, IBV_WC_BIND_MW);
  ExpectWc(done[1], 94, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV);
  EXPECT_EQ(Access(IBV_WR_RDMA_READ, rkey, kWindowAt, 8), IBV_WC_REM_ACCESS_ERR);
}

TEST_P(WindowTest, ATypeTwoWindowMustBeInvalidatedBeforeItIsBoundAgain) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindow(IBV_MW_TYPE_2));
  ASSERT_EQ(BindType2(b->qp, ibv_inc_rkey(mw->rkey), IBV_ACCESS_REMOTE_READ), IBV_WC_SUCCESS);
  EXPECT_EQ(BindType2(b->qp, ibv_inc_rkey(mw->rkey), IBV_ACCESS_REMOTE_READ), IBV_WC_MW_BIND_ERR);
  EXPECT_EQ(State(b->qp), IBV_QPS_ERR);
}

TEST_P(WindowTest, ATypeTwoKeyMustKeepTheWindowsIndex) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindow(IBV_MW_TYPE_2));
  EXPECT_EQ(BindType2(b->qp, mw->rkey + 0x100, IBV_ACCESS_REMOTE_READ), IBV_WC_MW_BIND_ERR);
}

TEST_P(WindowTest, ATypeTwoWindowServesOnlyTheQpItWasBoundThrough) {
  ConnectBoth();
  Register();
  ibv_qp* b2 = b->NewQp();
  ibv_qp* a2 = a->NewQp();
  ASSERT_NE(b2, nullptr);
  ASSERT_NE(a2, nullptr);
  ASSERT_EQ(b->ConnectQp(b2, *a, a2->qp_num), 0);
  ASSERT_EQ(a->ConnectQp(a2, *b, b2->qp_num), 0);
  mw = ibv_alloc_mw(b->pd, IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  const uint32_t rkey = ibv_inc_rkey(mw->rkey);
  ASSERT_EQ(BindType2(b2, rkey, IBV_ACCESS_REMOTE_READ), IBV_WC_SUCCESS);
  EXPECT_EQ(Access(IBV_WR_RDMA_READ, rkey, kWindowAt, 8, a2), IBV_WC_SUCCESS);
  EXPECT_EQ(Access(IBV_WR_RDMA_READ, rkey, kWindowAt, 8), IBV_WC_REM_ACCESS_ERR);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_LOCAL_INV;
  wr.invalidate_rkey = rkey;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(b2, &wr, &bad), 0);  // unbound, so that TearDown may free it
  EXPECT_EQ(Completion(*b, IBV_WC_LOCAL_INV, 0), IBV_WC_SUCCESS);
}

TEST_P(WindowTest, EachWindowTypeIsBoundOnlyItsOwnWay) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindow(IBV_MW_TYPE_1));
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_BIND_MW;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info = Info(IBV_ACCESS_REMOTE_READ);
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(b->qp, &wr, &bad), EINVAL);
  ibv_mw* two = ibv_alloc_mw(b->pd, IBV_MW_TYPE_2);
  ASSERT_NE(two, nullptr);
  ibv_mw_bind bind{};
  bind.bind_info = Info(IBV_ACCESS_REMOTE_READ);
  EXPECT_EQ(ibv_bind_mw(b->qp, two, &bind), EINVAL);
  EXPECT_EQ(ibv_dealloc_mw(two), 0);
  EXPECT_EQ(ibv_alloc_mw(b->pd, static_cast<ibv_mw_type>(3)), nullptr);
}

TEST_P(WindowTest, LocalInvalidationOfATypeOneWindowFails) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindow(IBV_MW_TYPE_1));
  ASSERT_EQ(BindType1(IBV_ACCESS_REMOTE_READ), IBV_WC_SUCCESS);
  EXPECT_EQ(LocalInv(mw->rkey), IBV_WC_LOC_QP_OP_ERR);
  EXPECT_EQ(Access(IBV_WR_RDMA_READ, mw->rkey, kWindowAt, 8), IBV_WC_SUCCESS);
  EXPECT_EQ(BindType1(0, 0), IBV_WC_WR_FLUSH_ERR);  // b's QP is in ERR: no unbind
  EXPECT_EQ(ibv_dereg_mr(bmr), EBUSY);
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
  mw = nullptr;
}

INSTANTIATE_TEST_SUITE_P(Nodes, WindowTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "TwoNodes" : "OneNode"; });

}  // namespace
}  // namespace ff::cluster_test
