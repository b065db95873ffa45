// The kernel-ABI marshalling helpers librdmacm calls on the rdma_cm device's answers
// (verbs/src/control/helpers_and_refusals.cc): every field of the kernel's layout lands in
// libibverbs' field of the same meaning. Each field gets a value of its own so that a swapped pair
// shows.
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

// Fills a kernel structure with bytes first, first+1, ... so that every field holds a value
// no other field holds (a swapped or dropped field shows).
template <typename T>
T Patterned(uint8_t first) {
  T t;
  auto* bytes = reinterpret_cast<uint8_t*>(&t);
  for (size_t i = 0; i < sizeof(t); ++i) bytes[i] = static_cast<uint8_t>(first + i);
  return t;
}

// dst's field `f` holds src's field `g`.
#define EXPECT_MOVED(dst, f, src, g) EXPECT_EQ(dst.f, src.g) << #f
#define EXPECT_SAME(dst, src, f) EXPECT_MOVED(dst, f, src, f)

// The field checks stay grouped several to a line.
// clang-format off
TEST(Marshall, QpAttrFromKernelTakesEveryFieldButTheAskedState) {
  auto k = Patterned<ib_uverbs_qp_attr>(1);
  k.cur_qp_state = IBV_QPS_RTR;  // the enums get values they can hold
  k.path_mtu = IBV_MTU_2048;
  k.path_mig_state = IBV_MIG_REARM;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;  // what rdma_init_qp_attr asked about
  a.rate_limit = 77;
  ibv_copy_qp_attr_from_kern(&a, &k);
  EXPECT_EQ(a.qp_state, IBV_QPS_INIT) << "left as the caller set it, as libibverbs does";
  EXPECT_EQ(a.rate_limit, 77u) << "the kernel has no such field";
  EXPECT_EQ(static_cast<uint32_t>(a.cur_qp_state), k.cur_qp_state);
  EXPECT_EQ(static_cast<uint32_t>(a.path_mtu), k.path_mtu);
  EXPECT_EQ(static_cast<uint32_t>(a.path_mig_state), k.path_mig_state);
  EXPECT_SAME(a, k, qkey); EXPECT_SAME(a, k, rq_psn); EXPECT_SAME(a, k, sq_psn);
  EXPECT_SAME(a, k, dest_qp_num); EXPECT_SAME(a, k, qp_access_flags);
  EXPECT_MOVED(a, cap.max_send_wr, k, max_send_wr); EXPECT_MOVED(a, cap.max_recv_wr, k, max_recv_wr);
  EXPECT_MOVED(a, cap.max_send_sge, k, max_send_sge); EXPECT_MOVED(a, cap.max_recv_sge, k, max_recv_sge);
  EXPECT_MOVED(a, cap.max_inline_data, k, max_inline_data);
  EXPECT_SAME(a, k, pkey_index); EXPECT_SAME(a, k, alt_pkey_index); EXPECT_SAME(a, k, en_sqd_async_notify);
  EXPECT_SAME(a, k, sq_draining); EXPECT_SAME(a, k, max_rd_atomic); EXPECT_SAME(a, k, max_dest_rd_atomic);
  EXPECT_SAME(a, k, min_rnr_timer); EXPECT_SAME(a, k, port_num); EXPECT_SAME(a, k, timeout);
  EXPECT_SAME(a, k, retry_cnt); EXPECT_SAME(a, k, rnr_retry); EXPECT_SAME(a, k, alt_port_num);
  EXPECT_SAME(a, k, alt_timeout);
  // Both address vectors, each from its own kernel field (AhAttrFromKernel checks the fields).
  ibv_ah_attr want{}, alt{};
  ibv_copy_ah_attr_from_kern(&want, &k.ah_attr);
  ibv_copy_ah_attr_from_kern(&alt, &k.alt_ah_attr);
  EXPECT_EQ(std::memcmp(&a.ah_attr, &want, sizeof(want)), 0);
  EXPECT_EQ(std::memcmp(&a.alt_ah_attr, &alt, sizeof(alt)), 0);
  EXPECT_NE(want.dlid, alt.dlid);
}

TEST(Marshall, PathRecordFromKernelAndBack) {
  auto k = Patterned<ib_user_path_rec>(3);
  k.mtu = IBV_MTU_4096;  // libibverbs' field is one byte
  ibv_sa_path_rec p{};
  ibv_copy_path_rec_from_kern(&p, &k);
  EXPECT_EQ(std::memcmp(p.dgid.raw, k.dgid, 16), 0);
  EXPECT_EQ(std::memcmp(p.sgid.raw, k.sgid, 16), 0);
  EXPECT_SAME(p, k, dlid); EXPECT_SAME(p, k, slid); EXPECT_EQ(static_cast<uint32_t>(p.raw_traffic), k.raw_traffic);
  EXPECT_SAME(p, k, flow_label); EXPECT_SAME(p, k, hop_limit); EXPECT_SAME(p, k, traffic_class);
  EXPECT_EQ(static_cast<uint32_t>(p.reversible), k.reversible); EXPECT_SAME(p, k, numb_path); EXPECT_SAME(p, k, pkey);
  EXPECT_SAME(p, k, sl); EXPECT_SAME(p, k, mtu_selector); EXPECT_SAME(p, k, mtu); EXPECT_SAME(p, k, rate_selector);
  EXPECT_SAME(p, k, rate); EXPECT_SAME(p, k, packet_life_time_selector); EXPECT_SAME(p, k, packet_life_time);
  EXPECT_SAME(p, k, preference);
  ib_user_path_rec back{};
  ibv_copy_path_rec_to_kern(&back, &p);
  EXPECT_EQ(std::memcmp(&back, &k, sizeof(k)), 0) << "the round trip is exact";
}
// clang-format on

}  // namespace
}  // namespace fftest
