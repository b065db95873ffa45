// The routers' table of direct connections: tokens that name a process and never another,
// connections found by the pair of processes and by id, forgotten as the library, the
// listener or the session end says, and a bound per process.
#include "direct/direct_connections.h"

#include <gtest/gtest.h>

#include <set>

#include "freeflow/tunables.h"

namespace ff::router {
namespace {

DirectConnections::Conn Conn(PodId pod, uint32_t ip, uint64_t token, uint64_t id) {
  DirectConnections::Conn c;
  c.id = id;
  c.pod = pod;
  c.peer_ip = ip;
  c.peer_token = token;
  return c;
}

TEST(DirectConnectionsTest, TokensNameOneProcessEachAndDifferFromAnotherRoutersTokens) {
  DirectConnections a, b;
  std::set<uint64_t> seen;
  for (PodId pod = 1; pod <= 10000; ++pod) {
    const uint64_t t = a.Token(pod);
    EXPECT_NE(t, 0u);
    EXPECT_EQ(t, a.Token(pod));
    EXPECT_TRUE(seen.insert(t).second) << pod;
  }
  // A restarted router numbers its sessions from 1 again: its tokens are not the old ones.
  EXPECT_NE(a.Token(1), b.Token(1));
}

TEST(DirectConnectionsTest, AConnectionIsFoundByItsPairOfProcessesAndByItsId) {
  DirectConnections t;
  EXPECT_EQ(t.Find(0x0a020001, 77, 1), nullptr);
  ASSERT_TRUE(t.Add(Conn(1, 0x0a020001, 77, 500)));
  const DirectConnections::Conn* c = t.Find(0x0a020001, 77, 1);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->id, 500u);
  EXPECT_EQ(c->state, DirectConnections::State::kPending);
  EXPECT_EQ(t.FindById(1, 500), c);
  // Another process of either pod is another pair.
  EXPECT_EQ(t.Find(0x0a020001, 78, 1), nullptr);
  EXPECT_EQ(t.Find(0x0a020001, 77, 2), nullptr);
  EXPECT_EQ(t.Find(0x0a020002, 77, 1), nullptr);
  EXPECT_EQ(t.FindById(2, 500), nullptr);
  EXPECT_FALSE(t.Add(Conn(1, 0x0a020009, 1, 500))) << "an id a process holds is not taken twice";
  EXPECT_TRUE(t.SetOpen(1, 500));
  EXPECT_EQ(t.FindById(1, 500)->state, DirectConnections::State::kOpen);
}

// Both processes asked at once: two connections of the pair, the newest is shared from then.
TEST(DirectConnectionsTest, OfTwoConnectionsOfOnePairTheNewestIsFound) {
  DirectConnections t;
  ASSERT_TRUE(t.Add(Conn(1, 9, 77, 600)));
  ASSERT_TRUE(t.Add(Conn(1, 9, 77, 500)));
  EXPECT_EQ(t.Find(9, 77, 1)->id, 500u);
  ASSERT_TRUE(t.Forget(1, 500).has_value());
  EXPECT_EQ(t.Find(9, 77, 1)->id, 600u);
}

TEST(DirectConnectionsTest, ForgottenConnectionsAreNotFoundAgain) {
  DirectConnections t;
  ASSERT_TRUE(t.Add(Conn(1, 9, 77, 500)));
  ASSERT_TRUE(t.Add(Conn(1, 10, 78, 501)));
  ASSERT_TRUE(t.Add(Conn(2, 9, 77, 502)));
  const std::optional<DirectConnections::Conn> gone = t.Forget(1, 500);
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->peer_ip, 9u);
  EXPECT_FALSE(t.Forget(1, 500).has_value());
  EXPECT_FALSE(t.SetOpen(1, 500));
  EXPECT_EQ(t.Find(9, 77, 1), nullptr);
  EXPECT_EQ(t.count(1), 1u);
  t.ForgetPod(1);
  EXPECT_EQ(t.count(1), 0u);
  EXPECT_EQ(t.Find(10, 78, 1), nullptr);
  EXPECT_NE(t.Find(9, 77, 2), nullptr) << "another process keeps its own";
  EXPECT_EQ(t.size(), 1u);
}

TEST(DirectConnectionsTest, AProcessHoldsABoundedNumberOfConnections) {
  DirectConnections t;
  for (uint64_t i = 0; i < kMaxDirectConnsPerProcess; ++i) {
    EXPECT_FALSE(t.Full(1));
    ASSERT_TRUE(t.Add(Conn(1, 9, i + 1, t.NewId(1))));
  }
  EXPECT_TRUE(t.Full(1));
  EXPECT_FALSE(t.Full(2));
  t.Forget(1, t.Find(9, 1, 1)->id);
  EXPECT_FALSE(t.Full(1));
}

TEST(DirectConnectionsTest, NewIdsAreNeverZeroAndNotOnesTheProcessHolds) {
  DirectConnections t;
  std::set<uint64_t> ids;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t id = t.NewId(1);
    ASSERT_NE(id, 0u);
    ASSERT_TRUE(t.Add(Conn(1, 9, static_cast<uint64_t>(i) + 1, id)));
    EXPECT_TRUE(ids.insert(id).second);
  }
}

}  // namespace
}  // namespace ff::router
