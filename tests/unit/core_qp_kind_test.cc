// The QP kinds both the library and the router take their answers from (qp_kind.h), and the
// kind an rdma_cm id's port space gives (cm_qp_attr.h): every type from outside is looked up,
// and one freeflow does not serve has no kind.
#include <gtest/gtest.h>
#include <netinet/in.h>
// After <netinet/in.h>, as in cm_qp_attr.h: the uapi headers then leave glibc's types alone.
#include <rdma/rdma_user_cm.h>

#include "freeflow/cm_qp_attr.h"
#include "freeflow/qp_kind.h"

namespace ff {
namespace {

TEST(QpKind, EachServedTypeHasItsKind) {
  EXPECT_EQ(QpKindOf(IBV_QPT_RC), &kRcQp);
  EXPECT_EQ(QpKindOf(IBV_QPT_UC), &kUcQp);
  EXPECT_EQ(QpKindOf(IBV_QPT_UD), &kUdQp);
  for (const QpKind* kind : {&kRcQp, &kUcQp, &kUdQp}) EXPECT_EQ(QpKindOf(kind->type), kind);
}

TEST(QpKind, OtherTypesHaveNone) {
  for (uint32_t type :
       {0u, 1u, static_cast<uint32_t>(IBV_QPT_RAW_PACKET), static_cast<uint32_t>(IBV_QPT_XRC_SEND),
        static_cast<uint32_t>(IBV_QPT_XRC_RECV), static_cast<uint32_t>(IBV_QPT_DRIVER),
        0xffffffffu}) {
    EXPECT_EQ(QpKindOf(type), nullptr) << type;
    EXPECT_FALSE(IsDatagram(type)) << type;
  }
}

TEST(QpKind, OnlyUdIsADatagram) {
  EXPECT_TRUE(IsDatagram(IBV_QPT_UD));
  EXPECT_FALSE(IsDatagram(IBV_QPT_RC));
  EXPECT_FALSE(IsDatagram(IBV_QPT_UC));
  // What goes with it: a ring per sender, any sender, no answers, errors that do not fail.
  EXPECT_EQ(kUdQp.rings, kUdRingsPerQp);
  EXPECT_EQ(kUdQp.ring_bytes, kUdRingBytes);
  EXPECT_FALSE(kUdQp.needs_consent || kUdQp.answered || kUdQp.error_fails_qp);
  for (const QpKind* kind : {&kRcQp, &kUcQp}) {
    EXPECT_EQ(kind->rings, 1u);
    EXPECT_EQ(kind->ring_bytes, 0u) << "sized by the receive queue";
    EXPECT_TRUE(kind->needs_consent && kind->answered && kind->error_fails_qp);
    EXPECT_TRUE(kind->posted_create);
  }
  EXPECT_FALSE(kUdQp.posted_create);
}

TEST(QpKind, MessageSizes) {
  EXPECT_EQ(kUdQp.max_fragment, kMtu);
  EXPECT_EQ(kUdQp.max_message, kMtu);
  EXPECT_EQ(kRcQp.max_fragment, kMaxFragment);
  EXPECT_EQ(kUcQp.max_message, kMaxMsgSize);
}

TEST(QpKind, OnlyRcRetriesForAReceive) {
  EXPECT_TRUE(kRcQp.rnr_retry);
  EXPECT_FALSE(kUcQp.rnr_retry);
  EXPECT_FALSE(kUdQp.rnr_retry);
}

TEST(QpKind, WorkRequestsEachKindTakes) {
  for (ibv_wr_opcode op : {IBV_WR_SEND, IBV_WR_SEND_WITH_IMM}) {
    EXPECT_TRUE(kRcQp.Allows(op) && kUcQp.Allows(op) && kUdQp.Allows(op)) << op;
  }
  for (ibv_wr_opcode op :
       {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND_WITH_INV, IBV_WR_LOCAL_INV}) {
    EXPECT_TRUE(kRcQp.Allows(op) && kUcQp.Allows(op)) << op;
    EXPECT_FALSE(kUdQp.Allows(op)) << op;
  }
  for (ibv_wr_opcode op : {IBV_WR_RDMA_READ, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD,
                           IBV_WR_ATOMIC_WRITE, IBV_WR_BIND_MW}) {
    EXPECT_TRUE(kRcQp.Allows(op)) << op;
    EXPECT_FALSE(kUcQp.Allows(op) || kUdQp.Allows(op)) << op;
  }
  for (uint32_t op : {static_cast<uint32_t>(IBV_WR_TSO), 31u, 32u, 1000u})
    EXPECT_FALSE(kRcQp.Allows(op)) << op;
}

TEST(QpKind, ModifyAttributesAsTheSpecificationRequires) {
  EXPECT_TRUE(kUdQp.init_attrs & IBV_QP_QKEY);
  EXPECT_FALSE(kUdQp.init_attrs & IBV_QP_ACCESS_FLAGS);
  EXPECT_TRUE(kRcQp.init_attrs & IBV_QP_ACCESS_FLAGS);
  EXPECT_EQ(kUdQp.rtr_attrs, IBV_QP_STATE);
  EXPECT_TRUE(kRcQp.rtr_attrs & IBV_QP_MIN_RNR_TIMER);
  EXPECT_FALSE(kUcQp.rtr_attrs & IBV_QP_MIN_RNR_TIMER);
  EXPECT_TRUE(kRcQp.rts_attrs & IBV_QP_RETRY_CNT);
  EXPECT_EQ(kUcQp.rts_attrs, IBV_QP_STATE | IBV_QP_SQ_PSN);
}

TEST(CmIdKind, PortSpaces) {
  EXPECT_EQ(CmIdKind(RDMA_PS_TCP, 0), &kRcQp);
  EXPECT_EQ(CmIdKind(RDMA_PS_TCP, IBV_QPT_UD), &kRcQp) << "the port space decides";
  EXPECT_EQ(CmIdKind(RDMA_PS_UDP, 0), &kUdQp);
  EXPECT_EQ(CmIdKind(RDMA_PS_IPOIB, 0), &kUdQp);
  EXPECT_EQ(CmIdKind(RDMA_PS_IB, IBV_QPT_UC), &kUcQp);
  EXPECT_EQ(CmIdKind(RDMA_PS_IB, IBV_QPT_RC), &kRcQp);
  EXPECT_EQ(CmIdKind(RDMA_PS_IB, IBV_QPT_XRC_SEND), nullptr);
  EXPECT_EQ(CmIdKind(RDMA_PS_IB, 0), nullptr);
  EXPECT_EQ(CmIdKind(0x999, IBV_QPT_RC), nullptr);
}

}  // namespace
}  // namespace ff
