#include <gtest/gtest.h>

#include "freeflow/controlplane.h"

namespace ff::cp {
namespace {

const Endpoint kSelf{"node-a", 0xac1f0002, 7471};

std::string ErrorFor(const std::string& spec, const Options& options = {},
                     const Endpoint& self = kSelf) {
  std::string error;
  auto cp = MakeControlPlane(spec, self, options, &error);
  EXPECT_EQ(cp, nullptr) << spec;
  return error;
}

TEST(SpecTest, RejectsUnknownKinds) {
  EXPECT_NE(ErrorFor("consul:foo").find("must be static:FILE or etcd:URL"), std::string::npos);
  EXPECT_NE(ErrorFor("").find("must be static:FILE"), std::string::npos);
  EXPECT_NE(ErrorFor("static:").find("names no file"), std::string::npos);
  EXPECT_NE(ErrorFor("etcd:").find("names no endpoint"), std::string::npos);
}

TEST(SpecTest, RejectsMalformedEtcdEndpoints) {
  EXPECT_NE(ErrorFor("etcd:https://127.0.0.1:2379").find("TLS is not supported"),
            std::string::npos);
  EXPECT_NE(ErrorFor("etcd:127.0.0.1").find("\"127.0.0.1\" is not of the form"), std::string::npos);
  EXPECT_NE(ErrorFor("etcd:http://127.0.0.1:2379,http://x/y:1").find("\"http://x/y:1\""),
            std::string::npos);
  EXPECT_NE(ErrorFor("etcd:127.0.0.1:99999").find("not in 1-65535"), std::string::npos);
}

TEST(SpecTest, RejectsBadOptionsAndSelf) {
  Options o;
  o.backoff_min = std::chrono::milliseconds(500);
  o.backoff_max = std::chrono::milliseconds(100);
  EXPECT_NE(ErrorFor("static:/x.json", o).find("backoff"), std::string::npos);
  EXPECT_NE(ErrorFor("static:/x.json", {}, Endpoint{"", 1, 1}).find("node name"),
            std::string::npos);
  EXPECT_NE(ErrorFor("static:/x.json", {}, Endpoint{"a/b", 1, 1}).find("node name"),
            std::string::npos);
}

TEST(SpecTest, StaticStartNamesTheMissingFile) {
  std::string error;
  auto cp = MakeControlPlane("static:/nonexistent/ff-nodes.json", kSelf, {}, &error);
  ASSERT_NE(cp, nullptr) << error;
  EXPECT_FALSE(cp->Start(&error));
  EXPECT_NE(error.find("/nonexistent/ff-nodes.json"), std::string::npos) << error;
  EXPECT_FALSE(cp->Healthy());
}

}  // namespace
}  // namespace ff::cp
