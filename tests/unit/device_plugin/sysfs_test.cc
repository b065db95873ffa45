#include "sysfs.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "sysfs_fixture.h"

namespace ff::dp {
namespace {

using testing::HcaSpec;
using testing::PortSpec;
using testing::SysfsFixture;

struct Discovery {
  explicit Discovery(const SysfsFixture& f)
      : sys(f.sys_root()), dev(f.dev_root()), disc(sys, dev) {}
  RootedFileSystem sys, dev;
  SysfsDiscovery disc;
};

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

TEST(Sysfs, DualPortConnectXWithOnePortDown) {
  SysfsFixture f;
  SysfsFixture::dual_port_connectx(&f);
  Discovery d(f);
  auto devs = d.disc.rdma_devices();
  ASSERT_EQ(devs.size(), 1u);
  const auto& h = devs[0];
  EXPECT_EQ(h.name, "mlx5_0");
  EXPECT_EQ(h.pci_address, "0000:3b:00.0");
  EXPECT_EQ(h.vendor, "15b3");
  EXPECT_EQ(h.device_id, "1017");
  EXPECT_EQ(h.driver, "mlx5_core");
  EXPECT_EQ(h.netdevs, std::vector<std::string>{"ib0"});
  ASSERT_EQ(h.numa_node, std::optional<int>(0));
  ASSERT_EQ(h.ports.size(), 2u);
  EXPECT_EQ(h.ports[0].state, PortState::kActive);
  EXPECT_EQ(h.ports[0].link_layer, "infiniband");
  EXPECT_EQ(h.ports[1].state, PortState::kDown);
  EXPECT_EQ(h.ports[1].link_layer, "ethernet");
  EXPECT_TRUE(h.any_port_active());
  EXPECT_NE(h.pci_parent.find("0000:3a:00.0"), std::string::npos);
  for (const char* n : {"uverbs0", "umad0", "umad1", "issm0", "issm1"})
    EXPECT_TRUE(has(h.char_devices, n)) << n;
  EXPECT_TRUE(d.disc.rdma_cm_present());
}

TEST(Sysfs, HcaWithoutIssmKeepsTheOtherNodes) {
  SysfsFixture f;
  HcaSpec h;
  h.issm = false;
  f.add_hca(h);
  Discovery d(f);
  auto devs = d.disc.rdma_devices();
  ASSERT_EQ(devs.size(), 1u);
  EXPECT_TRUE(has(devs[0].char_devices, "uverbs0"));
  EXPECT_TRUE(has(devs[0].char_devices, "umad0"));
  EXPECT_FALSE(has(devs[0].char_devices, "issm0"));
  EXPECT_FALSE(d.disc.rdma_cm_present());
}

TEST(Sysfs, NumaNodeMinusOneMeansUnknown) {
  SysfsFixture f;
  HcaSpec h;
  h.numa_node = "-1";
  f.add_hca(h);
  Discovery d(f);
  EXPECT_FALSE(d.disc.rdma_devices()[0].numa_node.has_value());
  EXPECT_EQ(parse_numa_node("-1"), std::nullopt);
  EXPECT_EQ(parse_numa_node("3"), std::optional<int>(3));
}

TEST(Sysfs, MalformedFilesDegradeOneAttribute) {
  SysfsFixture f;
  HcaSpec h;
  h.numa_node = "zero";
  h.ports = {PortSpec{4, "InfiniBand"}, PortSpec{4, "Ethernet"}};
  f.add_hca(h);
  f.write_sys("class/infiniband/mlx5_0/ports/1/state", "garbage");
  f.write_sys("class/infiniband/mlx5_0/ports/2/link_layer", "\x01\x02");
  f.write_sys("class/infiniband/mlx5_0/ports/junk/state", "4: ACTIVE");
  Discovery d(f);
  auto devs = d.disc.rdma_devices();
  ASSERT_EQ(devs.size(), 1u);
  EXPECT_FALSE(devs[0].numa_node.has_value());
  ASSERT_EQ(devs[0].ports.size(), 2u);  // "junk" ignored
  EXPECT_EQ(devs[0].ports[0].state, PortState::kUnknown);
  EXPECT_EQ(devs[0].ports[1].state, PortState::kActive);
  EXPECT_EQ(devs[0].ports[1].link_layer, "");
  EXPECT_EQ(parse_port_state(""), PortState::kUnknown);
  EXPECT_EQ(parse_port_state("9: WHAT"), PortState::kUnknown);
  EXPECT_EQ(parse_port_state("4: ACTIVE"), PortState::kActive);
}

TEST(Sysfs, SriovPfWithFourVfsAcrossNumaNodes) {
  SysfsFixture f;
  SysfsFixture::sriov_four_vfs_two_numa(&f);
  Discovery d(f);
  std::string error;
  auto vfs = d.disc.virtual_functions("ens1f0", &error);
  ASSERT_TRUE(vfs.has_value()) << error;
  ASSERT_EQ(vfs->size(), 4u);
  EXPECT_EQ((*vfs)[0].pci_address, "0000:5e:00.2");
  EXPECT_EQ((*vfs)[0].numa_node, std::optional<int>(0));
  EXPECT_EQ((*vfs)[3].pci_address, "0000:af:00.3");
  EXPECT_EQ((*vfs)[3].numa_node, std::optional<int>(1));
  ASSERT_EQ((*vfs)[2].rdma.size(), 1u);
  EXPECT_EQ((*vfs)[2].rdma[0].name, "mlx5_4");
  EXPECT_TRUE(has((*vfs)[2].rdma[0].char_devices, "uverbs4"));
  EXPECT_EQ((*vfs)[2].pci_parent, (*vfs)[3].pci_parent);
  EXPECT_NE((*vfs)[0].pci_parent, (*vfs)[1].pci_parent);

  EXPECT_FALSE(d.disc.virtual_functions("nope0", &error).has_value());
  EXPECT_NE(error.find("nope0"), std::string::npos);
}

TEST(Sysfs, EmptyTreeFindsNothing) {
  SysfsFixture f;
  Discovery d(f);
  EXPECT_TRUE(d.disc.rdma_devices().empty());
  RootedFileSystem missing("/nonexistent-ffdp");
  SysfsDiscovery none(missing, missing);
  EXPECT_TRUE(none.rdma_devices().empty());
}

}  // namespace
}  // namespace ff::dp
