#include "cache.h"

#include <gtest/gtest.h>

#include "freeflow/ipv4.h"

namespace ff::cp {
namespace {

uint32_t Ip(const char* text) { return *ParseIpv4(text); }

Endpoint Node(const char* name, const char* address, uint16_t port = 7471) {
  return {name, Ip(address), port};
}

class CacheTest : public ::testing::Test {
 protected:
  CacheTest() : cache_(Node("node-a", "172.31.0.2")) {
    Mapping m;
    for (auto n : {Node("node-a", "172.31.0.99"), Node("node-b", "172.31.0.3"),
                   Node("node-c", "172.31.0.4", 9000)})
      m.nodes[n.node] = n;
    m.routes = {{Ip("10.244.1.0"), 24, "node-a"},
                {Ip("10.244.0.0"), 16, "node-b"},
                {Ip("10.244.2.128"), 25, "node-c"},
                {Ip("10.244.9.0"), 24, "node-gone"}};
    m.pods[Ip("10.244.1.50")] = "node-c";
    m.pods[Ip("10.99.0.1")] = "node-b";
    cache_.Replace(m);
  }
  Cache cache_;
};

TEST_F(CacheTest, LongestPrefixWins) {
  EXPECT_EQ(cache_.Lookup(Ip("10.244.2.129")), Node("node-c", "172.31.0.4", 9000));
  EXPECT_EQ(cache_.Lookup(Ip("10.244.2.127")), Node("node-b", "172.31.0.3"));
  EXPECT_EQ(cache_.Lookup(Ip("10.244.200.1")), Node("node-b", "172.31.0.3"));
  EXPECT_EQ(cache_.Lookup(Ip("10.245.0.1")), std::nullopt);
}

TEST_F(CacheTest, ExplicitPodEntryWinsOverPrefixes) {
  EXPECT_EQ(cache_.Lookup(Ip("10.244.1.50")), Node("node-c", "172.31.0.4", 9000));
  EXPECT_EQ(cache_.Lookup(Ip("10.99.0.1")), Node("node-b", "172.31.0.3"));
  EXPECT_EQ(cache_.Lookup(Ip("10.99.0.2")), std::nullopt);
}

TEST_F(CacheTest, OwnNodeResolvesToSelf) {
  // The file says node-a is at .99, but this router's own endpoint is authoritative.
  EXPECT_EQ(cache_.Lookup(Ip("10.244.1.7")), cache_.self());
}

TEST_F(CacheTest, EntryNamingUnknownNodeResolvesToNothing) {
  EXPECT_EQ(cache_.Lookup(Ip("10.244.9.1")), std::nullopt);
}

TEST_F(CacheTest, PublishedAddressesResolveToSelfAndWinOverEverything) {
  EXPECT_TRUE(cache_.AddLocal(Ip("10.244.1.50")));
  EXPECT_FALSE(cache_.AddLocal(Ip("10.244.1.50")));
  EXPECT_TRUE(cache_.AddLocal(Ip("192.168.7.7")));  // not in any prefix
  EXPECT_EQ(cache_.Lookup(Ip("10.244.1.50")), cache_.self());
  EXPECT_EQ(cache_.Lookup(Ip("192.168.7.7")), cache_.self());
  EXPECT_TRUE(cache_.RemoveLocal(Ip("10.244.1.50")));
  EXPECT_FALSE(cache_.RemoveLocal(Ip("10.1.1.1")));
  EXPECT_EQ(cache_.Lookup(Ip("10.244.1.50")), Node("node-c", "172.31.0.4", 9000));
}

TEST_F(CacheTest, NodesExcludesSelf) {
  auto nodes = cache_.Nodes();
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].node, "node-b");
  EXPECT_EQ(nodes[1].node, "node-c");
}

TEST_F(CacheTest, IncrementalUpdatesReportChanges) {
  EXPECT_FALSE(cache_.PutNode(Node("node-b", "172.31.0.3")));
  EXPECT_TRUE(cache_.PutNode(Node("node-b", "172.31.0.30")));
  EXPECT_EQ(cache_.Lookup(Ip("10.99.0.1")), Node("node-b", "172.31.0.30"));
  EXPECT_TRUE(cache_.DeleteNode("node-b"));
  EXPECT_FALSE(cache_.DeleteNode("node-b"));
  EXPECT_EQ(cache_.Lookup(Ip("10.99.0.1")), std::nullopt);
  EXPECT_TRUE(cache_.PutPod(Ip("10.99.0.1"), "node-c"));
  EXPECT_FALSE(cache_.PutPod(Ip("10.99.0.1"), "node-c"));
  EXPECT_EQ(cache_.Lookup(Ip("10.99.0.1")), Node("node-c", "172.31.0.4", 9000));
  EXPECT_TRUE(cache_.DeletePod(Ip("10.99.0.1")));
  EXPECT_FALSE(cache_.DeletePod(Ip("10.99.0.1")));
  EXPECT_FALSE(cache_.Replace(cache_.Snapshot()));
}

TEST(CacheDefaultRoute, ZeroLengthPrefixMatchesEverything) {
  Cache cache(Node("self", "1.1.1.1"));
  Mapping m;
  m.nodes["gw"] = Node("gw", "172.31.0.1");
  m.routes = {{0, 0, "gw"}};
  cache.Replace(m);
  EXPECT_EQ(cache.Lookup(Ip("8.8.8.8")), Node("gw", "172.31.0.1"));
}

}  // namespace
}  // namespace ff::cp
