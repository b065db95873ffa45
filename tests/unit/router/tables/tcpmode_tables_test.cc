// TCP mode's shared tables handed to a router that takes over (tcpmode/pod_list.h,
// tcpmode/claims_table.h): the successor takes the pod list and a claims table by their two
// descriptors and writes on where the old router stopped; any other pair it refuses with
// the reason its hand-over then gives (the old router serves on).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <map>
#include <string>

#include "base/table_store.h"
#include "freeflow/fd.h"
#include "freeflow/stream_claims.h"
#include "freeflow/stream_pods.h"
#include "tcpmode/claims_table.h"
#include "tcpmode/pod_list.h"

namespace ff::router {
namespace {

UniqueFd Dup(int fd) { return UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0)); }

// Whether the tables are files of the router's private tmpfs, which a successor can map
// writable; sealed memfds (no mount API) cannot be handed over, and say so.
bool Movable() {
  if (RouterTables().movable()) return true;
  EXPECT_NE(::geteuid(), 0u) << "root, yet no private tmpfs: " << RouterTables().why_not();
  return false;
}

TEST(TcpModeTablesTest, ASuccessorTakesThePodListAndWritesOnWhereTheOldRouterStopped) {
  TcpModePodList old;
  ASSERT_EQ(old.Create(), 0);
  old.Hold(0x0a000001);
  TcpModePodList successor;
  const std::string why =
      successor.Adopt(Dup(old.rw_fd()), Dup(old.ro_fd()), {{0x0a000001, 1}, {0x0a000002, 1}});
  if (!Movable()) {
    EXPECT_EQ(why, "it cannot be mapped writable (a sealed memfd of an older router)");
    return;
  }
  ASSERT_EQ(why, "");
  EXPECT_TRUE(successor.Listed(0x0a000002));
  // What a socket session that mapped the old router's list reads now: both addresses.
  Mapping pod;
  ASSERT_EQ(MapRouterTable(old.ro_fd(), kStreamPodsBytes, &pod), 0);
  const auto* header = pod.as<const StreamPodsHeader>();
  EXPECT_EQ(header->magic, kStreamPodsMagic);
  EXPECT_EQ(header->count.load(), 2u) << "the successor's list did not reach the old one's readers";
}

TEST(TcpModeTablesTest, ASuccessorRefusesAnythingButThatTableWithTheReason) {
  TcpModePodList list;
  ASSERT_EQ(list.Create(), 0);
  TcpModeClaims claims;
  ASSERT_EQ(claims.Create(), 0);
  if (!Movable()) return;  // every pair is refused then (the test above)

  // A pod list handed over as a claims table (smaller than one), and the other way round.
  static_assert(kStreamPodsBytes < kStreamClaimsBytes);
  TcpModeClaims wrong_kind;
  EXPECT_EQ(wrong_kind.Adopt(Dup(list.rw_fd()), Dup(list.ro_fd())),
            "its read-only descriptor is not a router table");
  TcpModePodList wrong_list;
  const std::string why = wrong_list.Adopt(Dup(claims.rw_fd()), Dup(claims.read_only_fd()), {});
  EXPECT_EQ(why.rfind("it is another kind of table", 0), 0u) << why;
  // The two descriptors of different tables, and a read-only one that is not a router table.
  TcpModePodList mixed;
  EXPECT_EQ(mixed.Adopt(Dup(list.rw_fd()), Dup(claims.read_only_fd()), {}),
            "its two descriptors are not the same file");
  UniqueFd loose(::memfd_create("loose", MFD_CLOEXEC));
  ASSERT_TRUE(loose);
  ASSERT_EQ(::ftruncate(loose.get(), kStreamPodsBytes), 0);
  TcpModePodList forged;
  EXPECT_EQ(forged.Adopt(Dup(loose.get()), Dup(loose.get()), {}),
            "its read-only descriptor is not a router table");
  EXPECT_EQ(forged.rw_fd(), -1) << "a refused list was kept";
}

}  // namespace
}  // namespace ff::router
