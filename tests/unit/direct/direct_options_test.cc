// ffrouter's direct-path flags: --cross-node-path, --direct-ports, --direct-seal,
// --direct-datagrams (defaults, values, refusals at start).
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "options.h"

namespace ff::router {
namespace {

std::optional<RouterConfig> Parse(std::vector<std::string> extra, int* code = nullptr) {
  std::vector<std::string> args = {"ffrouter", "--vnet-prefix", "10.244.0.0/16", "--library",
                                   "/dev/null"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  int exit_code = 0;
  auto c = ParseOptions(static_cast<int>(argv.size()), argv.data(), &exit_code);
  if (code != nullptr) *code = exit_code;
  return c;
}

TEST(DirectOptionsTest, DirectIsTheDefaultWithEncryptedFramesOnPorts20000To20999) {
  const auto c = Parse({});
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(c->direct_path);
  EXPECT_EQ(c->direct_port_lo, 20000);
  EXPECT_EQ(c->direct_port_hi, 20999);
  EXPECT_EQ(c->direct_seal, SealMode::kEncrypt);
  EXPECT_FALSE(c->direct_datagrams) << "UD stays relayed unless asked";
}

TEST(DirectOptionsTest, TheFlagsAreTaken) {
  const auto c = Parse({"--cross-node-path", "direct", "--direct-ports", "31000-31000",
                        "--direct-seal", "authenticate"});
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(c->direct_path);
  EXPECT_EQ(c->direct_port_lo, 31000);
  EXPECT_EQ(c->direct_port_hi, 31000);
  EXPECT_EQ(c->direct_seal, SealMode::kAuthenticate);
  EXPECT_FALSE(Parse({"--cross-node-path=relay"})->direct_path);
  EXPECT_TRUE(Parse({"--direct-datagrams"})->direct_datagrams);
}

TEST(DirectOptionsTest, BadValuesStopTheRouterBeforeItStarts) {
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--cross-node-path", "pigeon"},
        {"--direct-seal", "none"},
        {"--direct-ports", "20999-20000"},
        {"--direct-ports", "0-10"},
        {"--direct-ports", "20000-70000"},
        {"--direct-ports", "20000"},
        {"--direct-ports", "20000-20999x"},
        {"--direct-ports", "-5-10"},
        {"--direct-ports", ""}}) {
    int code = 0;
    EXPECT_FALSE(Parse(bad, &code).has_value()) << bad[0] << " " << bad[1];
    EXPECT_NE(code, 0) << bad[0] << " " << bad[1];
  }
}

}  // namespace
}  // namespace ff::router
