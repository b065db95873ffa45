// The query verbs and the errno each bad call gets (the kernel's and rdma-core's answers).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <poll.h>

#include <cerrno>
#include <cstring>

#include "freeflow/ipv4.h"
#include "pod.h"
#include "session/session.h"

namespace fftest {
namespace {

TEST(GidTable, EntriesCarryTypeIndexAndTheWholeTableOrEinval) {
  Pod pod;
  ibv_gid_entry e[3]{};
  ASSERT_EQ(ibv_query_gid_table(pod.ctx, e, 3, 0), 2);
  EXPECT_EQ(e[0].gid_index, 0u);
  EXPECT_EQ(e[0].gid_type, IBV_GID_TYPE_ROCE_V1);
  EXPECT_EQ(e[1].gid_index, 1u);
  EXPECT_EQ(e[1].gid_type, IBV_GID_TYPE_ROCE_V2);
  EXPECT_EQ(e[1].port_num, 1u);
  ibv_gid gid{};
  ASSERT_EQ(ibv_query_gid(pod.ctx, 1, 1, &gid), 0);
  EXPECT_EQ(std::memcmp(gid.raw, e[1].gid.raw, 16), 0);
  // The fake router's pod address is on no interface of this process.
  EXPECT_EQ(e[1].ndev_ifindex, 0u);
  EXPECT_EQ(ibv_query_gid_table(pod.ctx, e, 1, 0), -EINVAL);  // too small for the table
  EXPECT_EQ(ibv_query_gid_table(pod.ctx, e, 0, 0), -EINVAL);
  EXPECT_EQ(ibv_query_gid_table(pod.ctx, e, 3, 1), -EINVAL);
}

TEST(GidTable, QueryGidExRefusesBadPortIndexAndFlags) {
  Pod pod;
  ibv_gid_entry e{};
  EXPECT_EQ(ibv_query_gid_ex(pod.ctx, 1, 1, &e, 0), 0);
  EXPECT_EQ(e.gid_type, IBV_GID_TYPE_ROCE_V2);
  EXPECT_EQ(ibv_query_gid_ex(pod.ctx, 1, 2, &e, 0), EINVAL);  // past the table
  EXPECT_EQ(ibv_query_gid_ex(pod.ctx, 1, 1000, &e, 0), EINVAL);
  EXPECT_EQ(ibv_query_gid_ex(pod.ctx, 2, 0, &e, 0), EINVAL);  // no port 2
  EXPECT_EQ(ibv_query_gid_ex(pod.ctx, 0, 0, &e, 0), EINVAL);
  EXPECT_EQ(ibv_query_gid_ex(pod.ctx, 1, 0, &e, 1), EINVAL);
}

TEST(GidTable, IfindexIsTheInterfaceHoldingTheAddress) {
  EXPECT_EQ(ff::verbs::IfindexOfIp(INADDR_LOOPBACK), ::if_nametoindex("lo"));
  EXPECT_NE(ff::verbs::IfindexOfIp(INADDR_LOOPBACK), 0u);
  EXPECT_EQ(ff::verbs::IfindexOfIp(0x0a0b0c0d), 0u);  // 10.11.12.13: nobody's
}

// A second context on the pod's session; closing it releases what the test made in it.
struct OtherContext {
  explicit OtherContext(Pod& pod) : ctx(ff::verbs::OpenContext(pod.session)) {
    EXPECT_NE(ctx, nullptr);
  }
  ~OtherContext() { EXPECT_EQ(ibv_close_device(ctx), 0); }
  OtherContext(const OtherContext&) = delete;
  OtherContext& operator=(const OtherContext&) = delete;
  ibv_context* ctx;
};

// The errno of each bad call, checked as rdma-core's tests (tests/test_device.py,
// test_cq.py, test_pd.py, test_qp.py) make them.
TEST(BadCalls, DeviceAndPortQueries) {
  Pod pod;
  ibv_port_attr port{};
  EXPECT_EQ(ibv_query_port(pod.ctx, 1, &port), 0);
  EXPECT_EQ(ibv_query_port(pod.ctx, 0, &port), EINVAL);
  EXPECT_EQ(ibv_query_port(pod.ctx, 2, &port), EINVAL);
  ibv_device_attr_ex attr{};
  ibv_query_device_ex_input input{};
  EXPECT_EQ(ibv_query_device_ex(pod.ctx, &input, &attr), 0);
  // Equal below 256 ports, as libibverbs and every provider fill them.
  EXPECT_EQ(attr.phys_port_cnt_ex, attr.orig_attr.phys_port_cnt);
  EXPECT_EQ(attr.phys_port_cnt_ex, 1u);
  input.comp_mask = 1;
  EXPECT_EQ(ibv_query_device_ex(pod.ctx, &input, &attr), EINVAL);
  __be16 pkey;
  EXPECT_EQ(ibv_query_pkey(pod.ctx, 1, 0, &pkey), 0);
  EXPECT_NE(ibv_query_pkey(pod.ctx, 1, 1, &pkey), 0);
}

TEST(BadCalls, CqSizesVectorsAndForeignChannels) {
  Pod pod;
  for (int cqe : {0, -1, static_cast<int>(ff::kMaxCqe) + 1}) {
    errno = 0;
    EXPECT_EQ(ibv_create_cq(pod.ctx, cqe, nullptr, nullptr, 0), nullptr) << cqe;
    EXPECT_EQ(errno, EINVAL) << cqe;
  }
  EXPECT_EQ(ibv_create_cq(pod.ctx, 8, nullptr, nullptr, 1), nullptr);  // one vector
  EXPECT_EQ(errno, EINVAL);
  OtherContext other(pod);
  ibv_comp_channel* foreign = ibv_create_comp_channel(other.ctx);
  ASSERT_NE(foreign, nullptr);
  EXPECT_EQ(ibv_create_cq(pod.ctx, 8, nullptr, foreign, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST(BadCalls, DestroyingWhatIsInUseIsEbusy) {
  Pod pod;
  ibv_comp_channel* ch = pod.NewChannel();
  ibv_cq* cq = ibv_create_cq(pod.ctx, 8, nullptr, ch, 0);
  ASSERT_NE(cq, nullptr);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), EBUSY);
  ibv_pd* pd = ibv_alloc_pd(pod.ctx);
  ASSERT_NE(pd, nullptr);
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(pd, &qa);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(ibv_destroy_cq(cq), EBUSY);
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  {
    Buffer buf(pd, 4096);
    EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);  // the MR uses it
  }
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd, &sa);
  ASSERT_NE(srq, nullptr);
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  ibv_ah_attr aa{};
  aa.port_num = 1;
  aa.is_global = 1;
  aa.grh.sgid_index = 1;
  ff::Ipv4MappedGid(0x0af40002, aa.grh.dgid.raw);
  ibv_ah* ah = ibv_create_ah(pd, &aa);
  ASSERT_NE(ah, nullptr);
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY) << "an address handle uses it";
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// As a real device: an SRQ's QP that enters the error state, however it gets there, says
// so once with IBV_EVENT_QP_LAST_WQE_REACHED (programs wait for it before destroying the
// QP); a QP with its own receive queue never does.
TEST(Srq, AQpOfAnSrqReportsItsLastWqeOnceWhenItEntersTheErrorState) {
  Pod pod;
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pod.pd, &sa);
  ASSERT_NE(srq, nullptr);
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = pod.cq;
  qa.srq = srq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = 4;
  qa.cap.max_send_sge = 1;
  ibv_qp* qp = ibv_create_qp(pod.pd, &qa);
  ASSERT_NE(qp, nullptr);
  qa.srq = nullptr;
  qa.cap.max_recv_wr = qa.cap.max_recv_sge = 1;
  ibv_qp* own = ibv_create_qp(pod.pd, &qa);
  ASSERT_NE(own, nullptr);
  auto pending = [&] {
    pollfd p{pod.ctx->async_fd, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
  };
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(own, &a, IBV_QP_STATE), 0);
  EXPECT_FALSE(pending()) << "a QP with its own receive queue";
  for (int round = 0; round < 2; ++round) {
    a.qp_state = IBV_QPS_ERR;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
    ibv_async_event e{};
    ASSERT_EQ(NextAsyncEvent(pod.ctx, &e), 0) << "round " << round;
    EXPECT_EQ(e.event_type, IBV_EVENT_QP_LAST_WQE_REACHED);
    EXPECT_EQ(e.element.qp, qp);
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);  // ERR again: nothing new
    EXPECT_FALSE(pending()) << "once per error state";
    a.qp_state = IBV_QPS_RESET;  // and from RESET the next error reports again
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
  }
  // Destroyed with its event not read: the event goes with it (as the kernel drops a
  // destroyed object's events), so no later read hands out the freed QP.
  a.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
  ASSERT_TRUE(pending());
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_FALSE(pending()) << "an event about a destroyed QP";
  EXPECT_EQ(ibv_destroy_qp(own), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
}

TEST(BadCalls, QpCapsTypesAndForeignCqs) {
  Pod pod;
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = pod.cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  ibv_qp_init_attr bad = qa;
  bad.cap.max_send_wr = ff::kMaxQpWr + 1;
  EXPECT_EQ(ibv_create_qp(pod.pd, &bad), nullptr);
  EXPECT_EQ(errno, EINVAL);
  bad = qa;
  bad.cap.max_recv_sge = ff::kMaxSge + 1;
  EXPECT_EQ(ibv_create_qp(pod.pd, &bad), nullptr);
  EXPECT_EQ(errno, EINVAL);
  bad = qa;
  bad.send_cq = nullptr;
  EXPECT_EQ(ibv_create_qp(pod.pd, &bad), nullptr);
  EXPECT_EQ(errno, EINVAL);
  OtherContext other(pod);
  bad = qa;
  bad.recv_cq = ibv_create_cq(other.ctx, 8, nullptr, nullptr, 0);
  ASSERT_NE(bad.recv_cq, nullptr);
  EXPECT_EQ(ibv_create_qp(pod.pd, &bad), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST(BadCalls, SendOpsAQpTypeCannotPostAreRefusedAtCreate) {
  Pod pod;
  ibv_qp_init_attr_ex qa{};
  qa.send_cq = qa.recv_cq = pod.cq;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  qa.pd = pod.pd;
  qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  const struct {
    ibv_qp_type type;
    uint64_t ops;
    bool ok;
  } cases[] = {
      {IBV_QPT_RC, IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_BIND_MW,
       true},
      {IBV_QPT_UC, IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND_WITH_INV, true},
      {IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM, true},
      {IBV_QPT_UC, IBV_QP_EX_WITH_RDMA_READ, false},
      {IBV_QPT_UD, IBV_QP_EX_WITH_RDMA_WRITE, false},
      {IBV_QPT_RC, IBV_QP_EX_WITH_TSO, false},
      {IBV_QPT_RC, 1ull << 40, false},
  };
  for (const auto& c : cases) {
    ibv_qp_init_attr_ex a = qa;
    a.qp_type = c.type;
    a.send_ops_flags = c.ops;
    ibv_qp* qp = ibv_create_qp_ex(pod.ctx, &a);
    EXPECT_EQ(qp != nullptr, c.ok) << "type " << c.type << " ops 0x" << std::hex << c.ops;
    if (qp != nullptr) {
      EXPECT_EQ(ibv_destroy_qp(qp), 0);
    } else {
      EXPECT_EQ(errno, EOPNOTSUPP);
    }
  }
}

TEST(BadCalls, ModifyQpAndAhOutsideThePortAndTables) {
  Pod pod;
  ibv_qp* qp = pod.CreateQp();
  ASSERT_NE(qp, nullptr);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RESET;
  EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 2;
  const int init_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  EXPECT_EQ(ibv_modify_qp(qp, &a, init_mask), EINVAL);
  a.port_num = 1;
  a.pkey_index = 1;
  EXPECT_EQ(ibv_modify_qp(qp, &a, init_mask), EINVAL);
  a.pkey_index = 0;
  ASSERT_EQ(ibv_modify_qp(qp, &a, init_mask), 0);
  a.qp_state = IBV_QPS_RTS;  // INIT -> RTS skips RTR
  EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), EINVAL);
  ibv_qp_attr rtr{};
  rtr.qp_state = IBV_QPS_RTR;
  rtr.path_mtu = IBV_MTU_1024;
  rtr.dest_qp_num = 0x77;
  rtr.ah_attr.is_global = 1;
  rtr.ah_attr.grh.sgid_index = 2;  // the table has 0 and 1
  rtr.ah_attr.port_num = 1;
  rtr.max_dest_rd_atomic = 1;
  rtr.min_rnr_timer = 1;
  const int rtr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  EXPECT_EQ(ibv_modify_qp(qp, &rtr, rtr_mask), EINVAL);
  rtr.ah_attr.grh.sgid_index = 1;
  rtr.path_mtu = static_cast<ibv_mtu>(6);
  EXPECT_EQ(ibv_modify_qp(qp, &rtr, rtr_mask), EINVAL);

  ibv_ah_attr ah{};
  ah.dlid = 5;
  ah.port_num = 2;
  EXPECT_EQ(ibv_create_ah(pod.pd, &ah), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ah.port_num = 1;
  ah.is_global = 1;
  ah.grh.sgid_index = 5;
  ff::Ipv4MappedGid(0x0af40002, ah.grh.dgid.raw);
  EXPECT_EQ(ibv_create_ah(pod.pd, &ah), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ah.grh.sgid_index = 1;
  ibv_ah* good = ibv_create_ah(pod.pd, &ah);
  ASSERT_NE(good, nullptr);
  EXPECT_EQ(ibv_destroy_ah(good), 0);
  // GID index 0 of a pod's port names it too (ibv_ud_pingpong -g 0, libfabric's verbs
  // dgram endpoints); a link-local GID of no freeflow port does not.
  ah.grh.sgid_index = 0;
  ff::LinkLocalGid(0x0af40002, ah.grh.dgid.raw);
  good = ibv_create_ah(pod.pd, &ah);
  ASSERT_NE(good, nullptr) << std::strerror(errno);
  EXPECT_EQ(ibv_destroy_ah(good), 0);
  ah.grh.dgid.raw[9] ^= 1;
  EXPECT_EQ(ibv_create_ah(pod.pd, &ah), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

// Sharing a context between processes goes through the kernel's command descriptor, which
// freeflow0 has none of: each import is EOPNOTSUPP (as on a device without the ioctl), not
// EBADF, so a program can tell "not supported" from its own mistake.
TEST(Import, ContextsPdsAndMrsAreNotSharedBetweenProcesses) {
  Pod pod;
  errno = 0;
  EXPECT_EQ(ibv_import_device(pod.ctx->cmd_fd), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  errno = 0;
  EXPECT_EQ(ibv_import_pd(pod.ctx, pod.pd->handle), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  errno = 0;
  EXPECT_EQ(ibv_import_mr(pod.pd, 1), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

TEST(Xrc, EveryEntryPointRefusesWithEopnotsupp) {
  Pod pod;
  ibv_xrcd_init_attr xa{};
  xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  xa.fd = -1;
  xa.oflags = O_CREAT;
  errno = 0;
  EXPECT_EQ(ibv_open_xrcd(pod.ctx, &xa), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  ibv_srq_init_attr_ex sa{};
  sa.comp_mask =
      IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
  sa.srq_type = IBV_SRQT_XRC;
  sa.pd = pod.pd;
  sa.cq = pod.cq;
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(pod.ctx, &sa), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  for (ibv_qp_type t : {IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV}) {
    ibv_qp_init_attr_ex qa{};
    qa.qp_type = t;
    qa.comp_mask = t == IBV_QPT_XRC_SEND ? IBV_QP_INIT_ATTR_PD : IBV_QP_INIT_ATTR_XRCD;
    qa.pd = pod.pd;
    qa.send_cq = qa.recv_cq = pod.cq;
    qa.cap.max_send_wr = 4;
    qa.cap.max_send_sge = 1;
    errno = 0;
    EXPECT_EQ(ibv_create_qp_ex(pod.ctx, &qa), nullptr) << t;
    EXPECT_EQ(errno, EOPNOTSUPP) << t;
  }
  // A basic SRQ through ibv_create_srq_ex still works.
  sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ;
  sa.srq_type = IBV_SRQT_BASIC;
  ibv_srq* srq = ibv_create_srq_ex(pod.ctx, &sa);
  ASSERT_NE(srq, nullptr) << std::strerror(errno);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
}

}  // namespace
}  // namespace fftest
