#include "static_file.h"

#include <gtest/gtest.h>

#include "freeflow/ipv4.h"

namespace ff::cp {
namespace {

uint32_t Ip(const char* text) { return *ParseIpv4(text); }

TEST(StaticFileTest, ParsesTheDocumentedExample) {
  const char* text = R"({
    "nodes": [{"name": "node-a", "address": "172.31.0.2", "port": 7471,
               "podCIDRs": ["10.244.1.0/24"]},
              {"name": "node-b", "address": "172.31.0.3", "port": 7472,
               "podCIDRs": ["10.244.2.0/24", "10.245.0.0/16"]},
              {"name": "node-c", "address": "172.31.0.4", "port": 1}],
    "pods": {"10.244.3.7": "node-b"},
    "comment": "unknown keys are ignored"})";
  Mapping m;
  std::string error;
  ASSERT_TRUE(ParseStaticFile(text, &m, &error)) << error;
  ASSERT_EQ(m.nodes.size(), 3u);
  EXPECT_EQ(m.nodes["node-a"], (Endpoint{"node-a", Ip("172.31.0.2"), 7471}));
  EXPECT_EQ(m.nodes["node-b"], (Endpoint{"node-b", Ip("172.31.0.3"), 7472}));
  EXPECT_EQ(m.nodes["node-c"], (Endpoint{"node-c", Ip("172.31.0.4"), 1}));
  ASSERT_EQ(m.routes.size(), 3u);
  EXPECT_EQ(m.routes[0], (Route{Ip("10.244.1.0"), 24, "node-a"}));
  EXPECT_EQ(m.routes[1], (Route{Ip("10.244.2.0"), 24, "node-b"}));
  EXPECT_EQ(m.routes[2], (Route{Ip("10.245.0.0"), 16, "node-b"}));
  ASSERT_EQ(m.pods.size(), 1u);
  EXPECT_EQ(m.pods[Ip("10.244.3.7")], "node-b");
}

TEST(StaticFileTest, PodsAreOptionalAndNodesMayBeEmpty) {
  Mapping m;
  std::string error;
  EXPECT_TRUE(ParseStaticFile(R"({"nodes": []})", &m, &error)) << error;
  EXPECT_TRUE(m.nodes.empty());
}

struct BadFile {
  const char* text;
  const char* error;  // the exact message
};
// Stable test names (the default would print the pointers).
std::string CaseName(const ::testing::TestParamInfo<BadFile>& info) {
  return "Case" + std::to_string(info.index);
}

class StaticFileErrorTest : public ::testing::TestWithParam<BadFile> {};

TEST_P(StaticFileErrorTest, NamesTheField) {
  Mapping m;
  m.nodes["untouched"] = {};
  std::string error;
  EXPECT_FALSE(ParseStaticFile(GetParam().text, &m, &error));
  EXPECT_EQ(error, GetParam().error);
  EXPECT_EQ(m.nodes.size(), 1u) << "a failed parse must leave the output alone";
}

#define NODE_A R"({"name": "node-a", "address": "172.31.0.2", "port": 7471})"

INSTANTIATE_TEST_SUITE_P(
    Errors, StaticFileErrorTest,
    ::testing::Values(
        BadFile{R"([])", "top level: expected a JSON object with \"nodes\""},
        BadFile{R"({})", "nodes: missing"},
        BadFile{R"({"nodes": {}})", "nodes: expected an array, got {}"},
        BadFile{R"({"nodes": [7]})",
                "nodes[0]: expected an object with name, address and port, got 7"},
        BadFile{R"({"nodes": [{"address": "1.2.3.4", "port": 1}]})", "nodes[0].name: missing"},
        BadFile{R"({"nodes": [{"name": "", "address": "1.2.3.4", "port": 1}]})",
                "nodes[0].name: expected a non-empty string, got \"\""},
        BadFile{R"({"nodes": [)" NODE_A R"(, {"name": "node-b", "port": 1}]})",
                "nodes[1].address: missing"},
        BadFile{R"({"nodes": [{"name": "n", "address": "1.2.3", "port": 1}]})",
                "nodes[0].address: \"1.2.3\" is not an IPv4 address"},
        BadFile{R"({"nodes": [{"name": "n", "address": "1.2.3.4"}]})", "nodes[0].port: missing"},
        BadFile{R"({"nodes": [{"name": "n", "address": "1.2.3.4", "port": 70000}]})",
                "nodes[0].port: 70000 is not a port number (1-65535)"},
        BadFile{R"({"nodes": [{"name": "n", "address": "1.2.3.4", "port": "80"}]})",
                "nodes[0].port: \"80\" is not a port number (1-65535)"},
        BadFile{R"({"nodes": [)" NODE_A R"(,
                   {"name": "node-b", "address": "172.31.0.3", "port": 7471,
                    "podCIDRs": ["10.244.2/24"]}]})",
                "nodes[1].podCIDRs[0]: \"10.244.2/24\" is not an IPv4 prefix (like "
                "\"10.244.1.0/24\")"},
        BadFile{R"({"nodes": [{"name": "n", "address": "1.2.3.4", "port": 1,
                               "podCIDRs": ["10.0.0.0/8", "10.244.2.0"]}]})",
                "nodes[0].podCIDRs[1]: \"10.244.2.0\" is not an IPv4 prefix (like "
                "\"10.244.1.0/24\")"},
        BadFile{R"({"nodes": [{"name": "n", "address": "1.2.3.4", "port": 1,
                               "podCIDRs": ["10.244.2.1/24"]}]})",
                "nodes[0].podCIDRs[0]: \"10.244.2.1/24\" has host bits set (did you mean "
                "\"10.244.2.0/24\"?)"},
        BadFile{R"({"nodes": [{"name": "n", "address": "1.2.3.4", "port": 1,
                               "podCIDRs": "10.0.0.0/8"}]})",
                "nodes[0].podCIDRs: expected an array of prefixes, got \"10.0.0.0/8\""},
        BadFile{R"({"nodes": [)" NODE_A "," NODE_A R"(]})",
                "nodes[1].name: \"node-a\" is already used by nodes[0]"},
        BadFile{R"({"nodes": [{"name": "a", "address": "1.2.3.4", "port": 1,
                               "podCIDRs": ["10.1.0.0/16"]},
                              {"name": "b", "address": "1.2.3.5", "port": 1,
                               "podCIDRs": ["10.2.0.0/16", "10.1.0.0/16"]}]})",
                "nodes[1].podCIDRs[1]: 10.1.0.0/16 is already assigned by nodes[0].podCIDRs[0]"},
        BadFile{R"({"nodes": [)" NODE_A R"(], "pods": []})",
                "pods: expected an object mapping pod addresses to node names, got []"},
        BadFile{R"({"nodes": [)" NODE_A R"(], "pods": {"10.244.3": "node-a"}})",
                "pods[\"10.244.3\"]: \"10.244.3\" is not an IPv4 address"},
        BadFile{R"({"nodes": [)" NODE_A R"(], "pods": {"10.244.3.7": 1}})",
                "pods[\"10.244.3.7\"]: expected a node name (a string), got 1"},
        BadFile{R"({"nodes": [)" NODE_A R"(], "pods": {"10.244.3.7": "node-z"}})",
                "pods[\"10.244.3.7\"]: node \"node-z\" is not listed in nodes"}),
    CaseName);

TEST(StaticFileTest, SyntaxErrorsSaySo) {
  Mapping m;
  std::string error;
  EXPECT_FALSE(ParseStaticFile(R"({"nodes": [)", &m, &error));
  EXPECT_EQ(error.rfind("not valid JSON: ", 0), 0u) << error;
}

// Found by fuzz/controlplane_file: a number too large for a double is not a syntax error to
// the JSON library (it throws out_of_range), and it used to escape the parser and end the
// router that read the file.
TEST(StaticFileTest, NumbersTooLargeAreRefusedNotThrown) {
  for (const char* text : {"4E263864", R"({"nodes": [], "x": -1e999})",
                           R"({"nodes": [{"name": "n", "address": "1.2.3.4", "port": 1e400}]})"}) {
    Mapping m;
    std::string error;
    EXPECT_FALSE(ParseStaticFile(text, &m, &error)) << text;
    EXPECT_EQ(error.rfind("not valid JSON: ", 0), 0u) << error;
  }
}

// node-a at 172.31.0.2:7471 and node-b at 172.31.0.3:7471.
Mapping TwoNodeMapping() {
  Mapping m;
  std::string error;
  EXPECT_TRUE(ParseStaticFile(R"({"nodes": [
    {"name": "node-a", "address": "172.31.0.2", "port": 7471},
    {"name": "node-b", "address": "172.31.0.3", "port": 7471}]})",
                              &m, &error))
      << error;
  return m;
}

TEST(CheckSelfTest, AListedNodeAtItsOwnEndpointIsFine) {
  const SelfCheck check = CheckSelf(TwoNodeMapping(), {"node-a", Ip("172.31.0.2"), 7471});
  EXPECT_FALSE(check.fatal);
  EXPECT_EQ(check.problem, "");
}

TEST(CheckSelfTest, ItsNameAtAnotherEndpointIsFatal) {
  // node-a's name, started on node-b's host: the classic default-host-name mistake.
  SelfCheck check = CheckSelf(TwoNodeMapping(), {"node-a", Ip("172.31.0.3"), 7471});
  EXPECT_TRUE(check.fatal);
  EXPECT_EQ(check.problem,
            "it lists node \"node-a\" at 172.31.0.2:7471, but this router serves node links on "
            "172.31.0.3:7471: the other routers would send node-a's traffic to "
            "172.31.0.2:7471. If this host is not node-a, start this router with its own "
            "--node-name (or NODE_NAME; the default is the host name) (the file lists "
            "172.31.0.3:7471 as node \"node-b\": --node-name node-b?); if it is, correct the "
            "file or this router's --host-ip/--port");
  // Another port is another endpoint too; no hint when no node has this endpoint.
  check = CheckSelf(TwoNodeMapping(), {"node-a", Ip("172.31.0.2"), 7472});
  EXPECT_TRUE(check.fatal);
  EXPECT_NE(check.problem.find("serves node links on 172.31.0.2:7472"), std::string::npos);
  EXPECT_EQ(check.problem.find("--node-name node-"), std::string::npos) << check.problem;
}

TEST(CheckSelfTest, ItsEndpointUnderAnotherNameIsFatal) {
  const SelfCheck check = CheckSelf(TwoNodeMapping(), {"my-host", Ip("172.31.0.3"), 7471});
  EXPECT_TRUE(check.fatal);
  EXPECT_EQ(check.problem,
            "this router's node name \"my-host\" is not in it, but its address 172.31.0.3:7471 "
            "is, as node \"node-b\": start this router with --node-name node-b (or NODE_NAME; "
            "the default is the host name)");
}

TEST(CheckSelfTest, AnUnlistedNodeIsWarnedAbout) {
  const SelfCheck check = CheckSelf(TwoNodeMapping(), {"node-c", Ip("172.31.0.4"), 7471});
  EXPECT_FALSE(check.fatal);
  EXPECT_EQ(check.problem,
            "node \"node-c\" is not in it, so the routers that use this file cannot reach this "
            "node's pods until it lists them (the file is reloaded when it changes): add "
            "{\"name\": \"node-c\", \"address\": \"172.31.0.4\", \"port\": 7471} to its "
            "nodes, or start this router with the --node-name it has there");
}

}  // namespace
}  // namespace ff::cp
