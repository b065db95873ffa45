#include "config.h"

#include <gtest/gtest.h>

namespace ff::dp {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_config(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, SharedPluginFormat) {
  auto cfg = parse_config(R"({"periodicUpdateInterval":300,"configList":[
    {"resourceName":"hca_shared_devices_a","rdmaHcaMax":1000,
     "selectors":{"vendors":["15b3"],"deviceIDs":["1017"],"drivers":["mlx5_core"],
                  "ifNames":["ens1f0"],"linkTypes":["ether"]}}]})");
  ASSERT_EQ(cfg.resources.size(), 1u);
  const auto& r = cfg.resources[0];
  EXPECT_EQ(cfg.periodic_update_interval_s, 300);
  EXPECT_EQ(r.full_name(), "rdma/hca_shared_devices_a");
  EXPECT_EQ(r.mode, Mode::kHca);
  EXPECT_EQ(r.rdma_hca_max, 1000);
  EXPECT_EQ(r.selectors.vendors, std::vector<std::string>{"15b3"});
  EXPECT_EQ(r.selectors.link_types, std::vector<std::string>{"ethernet"});
  EXPECT_EQ(r.socket_name(), "freeflow-rdma_hca_shared_devices_a.sock");
}

TEST(Config, TcpModePrefixIsACidrOfAVirtualResource) {
  auto cfg = parse_config(
      R"({"configList":[{"resourceName":"vrdma","mode":"virtual","tcpModePrefix":"10.244.0.0/16"}]})");
  EXPECT_EQ(cfg.resources.at(0).tcp_mode_prefix, "10.244.0.0/16");
  for (const char* bad : {"10.244.0.0", "10.244.0.0/33", "300.1.1.1/8", "10.0.0.0/8x", "x"}) {
    EXPECT_THROW(
        parse_config(
            std::string(
                R"({"configList":[{"resourceName":"v","mode":"virtual","tcpModePrefix":")") +
            bad + "\"}]}"),
        ConfigError)
        << bad;
  }
  EXPECT_THROW(
      parse_config(R"({"configList":[{"resourceName":"h","tcpModePrefix":"10.0.0.0/8"}]})"),
      ConfigError);
}

TEST(Config, LegacyHcaModeIsRdmaHca) {
  auto cfg = parse_config(R"({"mode":"hca"})");
  ASSERT_EQ(cfg.resources.size(), 1u);
  EXPECT_EQ(cfg.resources[0].full_name(), "rdma/hca");
  EXPECT_EQ(cfg.resources[0].mode, Mode::kHca);
}

TEST(Config, LegacySriovMode) {
  auto cfg = parse_config(R"({"mode":"sriov","pfNetdevices":["ens1f0","ens2f0"]})");
  ASSERT_EQ(cfg.resources.size(), 1u);
  EXPECT_EQ(cfg.resources[0].mode, Mode::kSriov);
  EXPECT_EQ(cfg.resources[0].full_name(), "rdma/hca");
  EXPECT_EQ(cfg.resources[0].pf_netdevices.size(), 2u);
}

TEST(Config, VirtualEntryDefaults) {
  auto cfg = parse_config(
      R"({"configList":[{"resourceName":"vrdma","mode":"virtual","virtualDevices":8}]})");
  const auto& r = cfg.resources[0];
  EXPECT_EQ(r.full_name(), "freeflow/vrdma");
  EXPECT_EQ(r.virtual_devices, 8);
  EXPECT_EQ(r.freeflow_dir, "/freeflow");
  EXPECT_EQ(r.router_name, "ffrouter");
}

TEST(Config, ErrorsNameTheField) {
  {
    EXPECT_NE(error_of("{").find("not valid JSON"), std::string::npos);
    EXPECT_NE(error_of("[]").find("JSON object"), std::string::npos);
    EXPECT_NE(error_of(R"({})").find("'configList'"), std::string::npos);
    EXPECT_NE(error_of(R"({"configList":[{}]})").find("configList[0].resourceName"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"configList":[{"resourceName":"a","rdmaHcaMax":0}]})")
                  .find("configList[0].rdmaHcaMax"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"configList":[{"resourceName":"a","rdmaHcaMax":"5"}]})")
                  .find("must be an integer"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"configList":[{"resourceName":"a","selectors":{"linkTypes":["x"]}}]})")
                  .find("configList[0].selectors.linkTypes[0]"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"configList":[{"resourceName":"a","selectors":{"vendor":["15b3"]}}]})")
                  .find("configList[0].selectors.vendor': unknown field"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"mode":"sriov"})").find("'pfNetdevices'"), std::string::npos);
    EXPECT_NE(error_of(R"({"mode":"turbo"})").find("unknown mode 'turbo'"), std::string::npos);
    EXPECT_NE(error_of(R"({"mode":5})").find("'mode': must be a string"), std::string::npos);
    EXPECT_NE(
        error_of(R"({"configList":[{"resourceName":"a"},{"resourceName":"a"}]})").find("duplicate"),
        std::string::npos);
    EXPECT_NE(error_of(R"({"configList":[{"resourceName":"a","resourcePrefix":"kubernetes.io"}]})")
                  .find("resourcePrefix"),
              std::string::npos);
    EXPECT_NE(
        error_of(R"({"configList":[{"resourceName":"v","mode":"virtual","freeflowDir":"rel"}]})")
            .find("configList[0].freeflowDir"),
        std::string::npos);
    EXPECT_NE(error_of(R"({"configList":[],"mode":"hca"})").find("not both"), std::string::npos);
    EXPECT_NE(error_of(R"({"configList":[]})").find("at least one"), std::string::npos);
  }
}

TEST(Config, MissingFileIsAConfigError) {
  EXPECT_THROW(load_config_file("/nonexistent/ffdp.json"), ConfigError);
}

}  // namespace
}  // namespace ff::dp
