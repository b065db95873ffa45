// The query verbs and the errno each bad call gets (the kernel's and rdma-core's answers).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <net/if.h>

#include <cerrno>

#include "pod.h"

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
  EXPECT_EQ(ffv::IfindexOfIp(INADDR_LOOPBACK), ::if_nametoindex("lo"));
  EXPECT_NE(ffv::IfindexOfIp(INADDR_LOOPBACK), 0u);
  EXPECT_EQ(ffv::IfindexOfIp(0x0a0b0c0d), 0u);  // 10.11.12.13: nobody's
}

}  // namespace
}  // namespace fftest
