// The kernel-ABI marshalling helpers librdmacm calls on the rdma_cm device's answers
// (verbs/src/misc.cc): every field of the kernel's layout lands in libibverbs' field of the
// same meaning. Each field gets a value of its own so that a swapped pair shows.
#include <gtest/gtest.h>
#include <infiniband/sa.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>

#include <cstring>

extern "C" {
void ibv_copy_ah_attr_from_kern(void* dst, const void* src);
void ibv_copy_qp_attr_from_kern(void* dst, const void* src);
void ibv_copy_path_rec_from_kern(void* dst, const void* src);
void ibv_copy_path_rec_to_kern(void* dst, const void* src);
}

namespace fftest {
namespace {

// An address vector whose fields are `base`, base+1, ... (dgid bytes base+20 on).
ib_uverbs_ah_attr KernAh(uint8_t base) {
  ib_uverbs_ah_attr k{};
  for (int i = 0; i < 16; ++i) k.grh.dgid[i] = static_cast<uint8_t>(base + 20 + i);
  k.grh.flow_label = 0x12345u + base;
  k.grh.sgid_index = base + 1;
  k.grh.hop_limit = base + 2;
  k.grh.traffic_class = base + 3;
  k.dlid = static_cast<uint16_t>(0x4000 + base);
  k.sl = base + 4;
  k.src_path_bits = base + 5;
  k.static_rate = base + 6;
  k.is_global = 1;
  k.port_num = base + 7;
  return k;
}

void ExpectAh(const ibv_ah_attr& a, uint8_t base, const char* which) {
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(a.grh.dgid.raw[i], base + 20 + i) << which << " dgid " << i;
  EXPECT_EQ(a.grh.flow_label, 0x12345u + base) << which;
  EXPECT_EQ(a.grh.sgid_index, base + 1) << which;
  EXPECT_EQ(a.grh.hop_limit, base + 2) << which;
  EXPECT_EQ(a.grh.traffic_class, base + 3) << which;
  EXPECT_EQ(a.dlid, 0x4000 + base) << which;
  EXPECT_EQ(a.sl, base + 4) << which;
  EXPECT_EQ(a.src_path_bits, base + 5) << which;
  EXPECT_EQ(a.static_rate, base + 6) << which;
  EXPECT_EQ(a.is_global, 1) << which;
  EXPECT_EQ(a.port_num, base + 7) << which;
}

TEST(Marshall, AhAttrFromKernel) {
  const ib_uverbs_ah_attr k = KernAh(10);
  ibv_ah_attr a{};
  ibv_copy_ah_attr_from_kern(&a, &k);
  ExpectAh(a, 10, "ah_attr");
}

TEST(Marshall, QpAttrFromKernelTakesEveryFieldButTheAskedState) {
  ib_uverbs_qp_attr k{};
  k.qp_state = IBV_QPS_RTS;
  k.cur_qp_state = IBV_QPS_RTR;
  k.path_mtu = IBV_MTU_2048;
  k.path_mig_state = IBV_MIG_REARM;
  k.qkey = 0x11111111;
  k.rq_psn = 0x222222;
  k.sq_psn = 0x333333;
  k.dest_qp_num = 0x444444;
  k.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
  k.ah_attr = KernAh(40);
  k.alt_ah_attr = KernAh(80);
  k.max_send_wr = 501;
  k.max_recv_wr = 502;
  k.max_send_sge = 503;
  k.max_recv_sge = 504;
  k.max_inline_data = 505;
  k.pkey_index = 601;
  k.alt_pkey_index = 602;
  k.en_sqd_async_notify = 1;
  k.sq_draining = 2;
  k.max_rd_atomic = 3;
  k.max_dest_rd_atomic = 4;
  k.min_rnr_timer = 5;
  k.port_num = 6;
  k.timeout = 7;
  k.retry_cnt = 8;
  k.rnr_retry = 9;
  k.alt_port_num = 10;
  k.alt_timeout = 11;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;  // what rdma_init_qp_attr asked about
  a.rate_limit = 77;
  ibv_copy_qp_attr_from_kern(&a, &k);
  EXPECT_EQ(a.qp_state, IBV_QPS_INIT) << "left as the caller set it, as libibverbs does";
  EXPECT_EQ(a.cur_qp_state, IBV_QPS_RTR);
  EXPECT_EQ(a.path_mtu, IBV_MTU_2048);
  EXPECT_EQ(a.path_mig_state, IBV_MIG_REARM);
  EXPECT_EQ(a.qkey, 0x11111111u);
  EXPECT_EQ(a.rq_psn, 0x222222u);
  EXPECT_EQ(a.sq_psn, 0x333333u);
  EXPECT_EQ(a.dest_qp_num, 0x444444u);
  EXPECT_EQ(a.qp_access_flags, unsigned{IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE});
  EXPECT_EQ(a.cap.max_send_wr, 501u);
  EXPECT_EQ(a.cap.max_recv_wr, 502u);
  EXPECT_EQ(a.cap.max_send_sge, 503u);
  EXPECT_EQ(a.cap.max_recv_sge, 504u);
  EXPECT_EQ(a.cap.max_inline_data, 505u);
  ExpectAh(a.ah_attr, 40, "ah_attr");
  ExpectAh(a.alt_ah_attr, 80, "alt_ah_attr");
  EXPECT_EQ(a.pkey_index, 601);
  EXPECT_EQ(a.alt_pkey_index, 602);
  EXPECT_EQ(a.en_sqd_async_notify, 1);
  EXPECT_EQ(a.sq_draining, 2);
  EXPECT_EQ(a.max_rd_atomic, 3);
  EXPECT_EQ(a.max_dest_rd_atomic, 4);
  EXPECT_EQ(a.min_rnr_timer, 5);
  EXPECT_EQ(a.port_num, 6);
  EXPECT_EQ(a.timeout, 7);
  EXPECT_EQ(a.retry_cnt, 8);
  EXPECT_EQ(a.rnr_retry, 9);
  EXPECT_EQ(a.alt_port_num, 10);
  EXPECT_EQ(a.alt_timeout, 11);
  EXPECT_EQ(a.rate_limit, 77u) << "the kernel has no such field";
}

ib_user_path_rec KernPath() {
  ib_user_path_rec k{};
  for (int i = 0; i < 16; ++i) {
    k.dgid[i] = static_cast<uint8_t>(0xd0 + i);
    k.sgid[i] = static_cast<uint8_t>(0x50 + i);
  }
  k.dlid = htobe16(0x1234);
  k.slid = htobe16(0x5678);
  k.raw_traffic = 1;
  k.flow_label = htobe32(0xabcde);
  k.reversible = 1;
  k.mtu = IBV_MTU_4096;
  k.pkey = htobe16(0xffff);
  k.hop_limit = 64;
  k.traffic_class = 3;
  k.numb_path = 2;
  k.sl = 5;
  k.mtu_selector = 2;
  k.rate_selector = 1;
  k.rate = 7;
  k.packet_life_time_selector = 0;
  k.packet_life_time = 18;
  k.preference = 9;
  return k;
}

TEST(Marshall, PathRecordFromKernelAndBack) {
  const ib_user_path_rec k = KernPath();
  ibv_sa_path_rec p{};
  ibv_copy_path_rec_from_kern(&p, &k);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(p.dgid.raw[i], 0xd0 + i);
    EXPECT_EQ(p.sgid.raw[i], 0x50 + i);
  }
  EXPECT_EQ(be16toh(p.dlid), 0x1234) << "LIDs stay in network order";
  EXPECT_EQ(be16toh(p.slid), 0x5678);
  EXPECT_EQ(p.raw_traffic, 1);
  EXPECT_EQ(be32toh(p.flow_label), 0xabcdeu);
  EXPECT_EQ(p.reversible, 1);
  EXPECT_EQ(p.mtu, IBV_MTU_4096);
  EXPECT_EQ(be16toh(p.pkey), 0xffff);
  EXPECT_EQ(p.hop_limit, 64);
  EXPECT_EQ(p.traffic_class, 3);
  EXPECT_EQ(p.numb_path, 2);
  EXPECT_EQ(p.sl, 5);
  EXPECT_EQ(p.mtu_selector, 2);
  EXPECT_EQ(p.rate_selector, 1);
  EXPECT_EQ(p.rate, 7);
  EXPECT_EQ(p.packet_life_time_selector, 0);
  EXPECT_EQ(p.packet_life_time, 18);
  EXPECT_EQ(p.preference, 9);
  ib_user_path_rec back{};
  ibv_copy_path_rec_to_kern(&back, &p);
  EXPECT_EQ(std::memcmp(&back, &k, sizeof(k)), 0) << "the round trip is exact";
}

}  // namespace
}  // namespace fftest
