// Work requests that wait in the library for the router, and a program that, having posted
// them, waits on memory instead of calling the library again (riostream: it posts its
// riowrite()s, then spins on a byte the peer's last WRITE sets). An HCA advances its send
// queue on its own; here the router must have the library's event thread do it, or the
// last requests never leave (issue 12's rsockets stall across nodes).
//
// Node b's router is paused while a posts, so that requests pile up in a's proxy ring and
// then in a's send queue; once it runs again, a's process makes no verbs call: only
// memory is read, with a bound.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "base/objects.h"
#include "marker_fixture.h"

namespace ff::cluster_test {
namespace {

constexpr char kMarker = 0x5a;

class WaitingSendsTest : public MarkerTest {
 protected:
  // How many of a's WQEs the library has not handed to the router yet.
  uint64_t Unexecuted() { return MarkerTest::Unexecuted(*a); }
  void PostMarker(uint64_t wr_id) { MarkerTest::PostMarker(wr_id, kMarker); }
  bool MarkerArrives() { return Arrives(kMarkerOffset, kMarker); }
  // Every WQE completed successfully, in order (polled only after the marker was checked).
  void ExpectAllCompleted(size_t n) {
    const auto wc = a->Poll(n);
    ASSERT_EQ(wc.size(), n);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(wc[i].status, IBV_WC_SUCCESS) << i;
      EXPECT_EQ(wc[i].wr_id, i);
    }
  }
};

// The proxy ring (kProxyRingBytes) is full and the router may forward no more
// (kChannelWindow uncredited) while b's router does not run: the rest of 4 MiB of WRITEs
// waits in a's send queue. When b runs again the router drains the ring to empty.
TEST_P(WaitingSendsTest, WritesThatWaitedForRoomInTheRingLeaveWithoutAnotherCall) {
  ConnectBoth();
  constexpr uint32_t kWrites = 255, kBytes = 16384;
  static_assert((kWrites * kBytes) > kChannelWindow + kProxyRingBytes);
  net.Pause("node-b", true);
  for (uint32_t i = 0; i < kWrites; ++i)
    ASSERT_EQ(a->Post(IBV_WR_RDMA_WRITE, i, 0, kBytes, b.get(), 0), 0);
  PostMarker(kWrites);
  ASSERT_GT(Unexecuted(), 1u) << "the test needs WQEs waiting in the library";
  net.Pause("node-b", false);
  EXPECT_TRUE(MarkerArrives()) << Unexecuted() << " WQEs never left the library";
  ExpectAllCompleted(kWrites + 1);
}

// A READ waits in the library for one of the max_rd_atomic slots (16), which only answers
// free, and the WRITE behind it waits too. The router delivers the answers.
TEST_P(WaitingSendsTest, AWriteBehindAReadThatWaitedForASlotLeavesWithoutAnotherCall) {
  ConnectBoth();
  constexpr uint32_t kReads = 17;
  net.Pause("node-b", true);
  for (uint32_t i = 0; i < kReads; ++i)
    ASSERT_EQ(a->Post(IBV_WR_RDMA_READ, i, 4096 + 8 * i, 8, b.get(), 0), 0);
  PostMarker(kReads);
  ASSERT_EQ(Unexecuted(), 2u) << "the last READ and the WRITE wait for a slot";
  net.Pause("node-b", false);
  EXPECT_TRUE(MarkerArrives()) << Unexecuted() << " WQEs never left the library";
  ExpectAllCompleted(kReads + 1);
}

// Only across nodes: on one node WRITEs and READs are done at once, nothing waits.
INSTANTIATE_TEST_SUITE_P(Nodes, WaitingSendsTest, ::testing::Values(true),
                         [](const ::testing::TestParamInfo<bool>&) { return "AcrossNodes"; });

}  // namespace
}  // namespace ff::cluster_test
