// The etcd key layout (every key a router writes is under <prefix>nodes/<node>/) and who
// holds an address that several nodes announce (the first to announce it).
#include "etcd_keys.h"

#include <gtest/gtest.h>

#include "freeflow/ipv4.h"

namespace ff::cp {
namespace {

using Kind = EtcdKeys::Parsed::Kind;

const EtcdKeys kKeys("/freeflow/v2/");
uint32_t Ip(const char* text) { return *ParseIpv4(text); }

TEST(EtcdKeysTest, EveryKeyOfANodeIsUnderItsOwnPrefix) {
  EXPECT_EQ(kKeys.NodeDir("node-a"), "/freeflow/v2/nodes/node-a/");
  EXPECT_EQ(kKeys.Endpoint("node-a"), "/freeflow/v2/nodes/node-a/endpoint");
  EXPECT_EQ(kKeys.Pod("node-a", Ip("10.244.1.5")), "/freeflow/v2/nodes/node-a/pods/10.244.1.5");
  // node-a's prefix ends with '/': it does not cover node-ab's keys.
  EXPECT_FALSE(kKeys.Endpoint("node-ab").starts_with(kKeys.NodeDir("node-a")));
}

TEST(EtcdKeysTest, ParsesWhatItWrites) {
  auto p = kKeys.Parse(kKeys.Endpoint("node-a"));
  EXPECT_EQ(p.kind, Kind::kEndpoint);
  EXPECT_EQ(p.node, "node-a");
  p = kKeys.Parse(kKeys.Pod("node-b.example", Ip("10.244.2.7")));
  EXPECT_EQ(p.kind, Kind::kPod);
  EXPECT_EQ(p.node, "node-b.example");
  EXPECT_EQ(p.ip, Ip("10.244.2.7"));
}

TEST(EtcdKeysTest, IgnoresEverythingElse) {
  for (const char* key :
       {"/freeflow/v2/nodes/node-a", "/freeflow/v2/nodes//endpoint", "/freeflow/v2/nodes/a/x",
        "/freeflow/v2/nodes/a/pods/10.244.1", "/freeflow/v2/nodes/a/pods/10.244.1.5/x",
        "/freeflow/v2/nodes/a/endpoint/x", "/freeflow/v2/pods/10.244.1.5",
        "/freeflow/v1/nodes/a/endpoint", "/other/nodes/a/endpoint", ""})
    EXPECT_EQ(kKeys.Parse(key).kind, Kind::kOther) << key;
}

TEST(PodClaimsTest, TheFirstToAnnounceAnAddressHoldsIt) {
  PodClaims claims;
  const uint32_t ip = Ip("10.244.1.5");
  EXPECT_EQ(claims.Put(ip, "node-b", 20), "node-b");
  EXPECT_EQ(claims.Put(ip, "node-a", 30), "node-b");  // later: node-b keeps it
  EXPECT_EQ(claims.Put(ip, "node-b", 20), "node-b");  // rewritten: same create revision
  EXPECT_EQ(claims.Claimants(ip), 2u);
  EXPECT_EQ(claims.Holders(), (std::map<uint32_t, std::string>{{ip, "node-b"}}));
  EXPECT_EQ(claims.Delete(ip, "node-a"), "node-b");  // the later one withdraws
  EXPECT_EQ(claims.Put(ip, "node-a", 40), "node-b");
  EXPECT_EQ(claims.Delete(ip, "node-b"), "node-a");  // the holder withdraws: next in line
  EXPECT_EQ(claims.Delete(ip, "node-a"), std::nullopt);
  EXPECT_EQ(claims.Delete(ip, "node-a"), std::nullopt);  // unknown: no-op
  EXPECT_EQ(claims.Claimants(ip), 0u);
  EXPECT_TRUE(claims.Holders().empty());
}

TEST(PodClaimsTest, EqualRevisionsAreBrokenByNodeName) {
  PodClaims claims;
  const uint32_t ip = Ip("10.244.1.5");
  claims.Put(ip, "node-b", 7);
  EXPECT_EQ(claims.Put(ip, "node-a", 7), "node-a");
  claims.Clear();
  EXPECT_EQ(claims.Holder(ip), std::nullopt);
}

}  // namespace
}  // namespace ff::cp
