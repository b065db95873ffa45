// The rules for claiming a node key in etcd, without etcd: who may take the key, and what
// the refusal says.
#include "node_claim.h"

#include <gtest/gtest.h>

#include "freeflow/ipv4.h"

namespace ff::cp {
namespace {

const Endpoint kSelf{"node-a", 0xac1f0002, 7471};  // 172.31.0.2:7471
const std::string kSelfValue = R"({"address":"172.31.0.2","port":7471})";
const std::string kOtherValue = R"({"address":"172.31.0.3","port":7471})";
const std::string kKey = "/freeflow/v2/nodes/node-a/endpoint";

TEST(NodeValueTest, RoundTrips) {
  EXPECT_EQ(NodeValue(kSelf), kSelfValue);
  EXPECT_EQ(ParseNodeValue("node-a", kSelfValue), kSelf);
  EXPECT_EQ(ParseNodeValue("node-a", R"({"port": 7471, "address": "172.31.0.2", "x": 1})"), kSelf);
}

TEST(NodeValueTest, RefusesMalformedValues) {
  for (const char* value :
       {"", "not json", "[]", R"({"address":"172.31.0.2"})", R"({"port":7471})",
        R"({"address":"172.31.0.256","port":7471})", R"({"address":"172.31.0.2","port":0})",
        R"({"address":"172.31.0.2","port":65536})", R"({"address":"172.31.0.2","port":"7471"})",
        R"({"address":17,"port":7471})", R"({"address":"172.31.0.2","port":7471.5})"})
    EXPECT_EQ(ParseNodeValue("node-a", value), std::nullopt) << value;
  EXPECT_EQ(ParseNodeValue("", kSelfValue), std::nullopt);
  EXPECT_EQ(ParseNodeValue("a/b", kSelfValue), std::nullopt);
}

TEST(JudgeNodeKeyTest, AnUnleasedKeyIsTaken) {
  EXPECT_EQ(JudgeNodeKey({kOtherValue, 0}, kSelf, {}), NodeKeyVerdict::kUnleased);
  EXPECT_EQ(JudgeNodeKey({kOtherValue, 0}, kSelf, {7, 7}), NodeKeyVerdict::kUnleased);
}

TEST(JudgeNodeKeyTest, OurOwnLeasesAreOurs) {
  EXPECT_EQ(JudgeNodeKey({kSelfValue, 7}, kSelf, {7, 0}), NodeKeyVerdict::kOurs);
  // The lease of the last claim (a refresh failed and a new lease was granted since).
  EXPECT_EQ(JudgeNodeKey({kSelfValue, 5}, kSelf, {7, 5}), NodeKeyVerdict::kOurs);
  // Whatever the value says: only this router writes under its leases.
  EXPECT_EQ(JudgeNodeKey({kOtherValue, 7}, kSelf, {7, 5}), NodeKeyVerdict::kOurs);
}

TEST(JudgeNodeKeyTest, OurAddressUnderAnotherLeaseIsAPreviousRunUntilWeClaimed) {
  EXPECT_EQ(JudgeNodeKey({kSelfValue, 9}, kSelf, {0, 0}), NodeKeyVerdict::kRestarted);
  EXPECT_EQ(JudgeNodeKey({kSelfValue, 9}, kSelf, {7, 0}), NodeKeyVerdict::kRestarted);
  // Once claimed, another lease on our address is another live router: no taking turns.
  EXPECT_EQ(JudgeNodeKey({kSelfValue, 9}, kSelf, {7, 5}), NodeKeyVerdict::kHeld);
  EXPECT_EQ(JudgeNodeKey({kSelfValue, 9}, kSelf, {0, 5}), NodeKeyVerdict::kHeld);
}

TEST(JudgeNodeKeyTest, AnotherEndpointUnderAnotherLeaseIsHeld) {
  EXPECT_EQ(JudgeNodeKey({kOtherValue, 9}, kSelf, {0, 0}), NodeKeyVerdict::kHeld);
  EXPECT_EQ(JudgeNodeKey({kOtherValue, 9}, kSelf, {7, 5}), NodeKeyVerdict::kHeld);
  // Same address, another port: another router.
  EXPECT_EQ(JudgeNodeKey({R"({"address":"172.31.0.2","port":7472})", 9}, kSelf, {0, 0}),
            NodeKeyVerdict::kHeld);
  // Unreadable: nothing says it is ours.
  EXPECT_EQ(JudgeNodeKey({"garbage", 9}, kSelf, {0, 0}), NodeKeyVerdict::kHeld);
}

TEST(NodeClashMessageTest, NamesTheNodeBothEndpointsTheKeyAndTheFix) {
  const std::string m = NodeClashMessage(kSelf, kKey, {kOtherValue, 0x1234abcd});
  EXPECT_NE(m.find("node name \"node-a\" is taken"), std::string::npos) << m;
  EXPECT_NE(m.find("a live router at 172.31.0.3:7471 holds it"), std::string::npos) << m;
  EXPECT_NE(m.find("etcd key /freeflow/v2/nodes/node-a/endpoint, lease 1234abcd"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("this router serves node links on 172.31.0.2:7471"), std::string::npos) << m;
  EXPECT_NE(m.find("--node-name"), std::string::npos) << m;
  EXPECT_EQ(m.find("the same address"), std::string::npos) << m;
}

TEST(NodeClashMessageTest, SaysWhenTheAddressIsTheSameOrUnreadable) {
  EXPECT_NE(NodeClashMessage(kSelf, kKey, {kSelfValue, 9}).find("(the same address"),
            std::string::npos);
  const std::string m = NodeClashMessage(kSelf, kKey, {"garbage", 9});
  EXPECT_NE(m.find("an unreadable address (garbage)"), std::string::npos) << m;
}

}  // namespace
}  // namespace ff::cp
