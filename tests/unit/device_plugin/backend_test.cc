#include "backend.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cdi.h"
#include "sysfs_fixture.h"

namespace ff::dp {
namespace {

using testing::HcaSpec;
using testing::PortSpec;
using testing::SysfsFixture;

BackendContext context_for(const SysfsFixture& f) {
  BackendContext ctx;
  ctx.sys = std::make_shared<RootedFileSystem>(f.sys_root());
  ctx.dev = std::make_shared<RootedFileSystem>(f.dev_root());
  return ctx;
}

ResourceConfig hca_config(int max = 4) {
  ResourceConfig rc;
  rc.resource_name = "hca";
  rc.rdma_hca_max = max;
  return rc;
}

std::vector<std::string> container_paths(const ContainerEdits& e) {
  std::vector<std::string> out;
  for (const auto& d : e.devices) out.push_back(d.container_path);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(HcaBackend, AdvertisesRdmaHcaMaxIdsAndAllCharDevices) {
  SysfsFixture f;
  SysfsFixture::dual_port_connectx(&f);
  auto b = make_backend(hca_config(), context_for(f));
  auto devs = b->scan();
  ASSERT_EQ(devs.size(), 4u);
  EXPECT_EQ(devs[0].id, "hca-0");
  EXPECT_TRUE(devs[0].healthy);  // port 1 is ACTIVE even though port 2 is down
  EXPECT_EQ(devs[0].numa_nodes, std::vector<int>{0});
  auto edits = b->allocate({"hca-1"});
  EXPECT_EQ(container_paths(edits),
            (std::vector<std::string>{"/dev/infiniband/issm0", "/dev/infiniband/issm1",
                                      "/dev/infiniband/rdma_cm", "/dev/infiniband/umad0",
                                      "/dev/infiniband/umad1", "/dev/infiniband/uverbs0"}));
  EXPECT_EQ(edits.devices[0].permissions, "rwm");
  EXPECT_EQ(edits.devices[0].host_path.rfind("/dev/infiniband/", 0), 0u);
  EXPECT_THROW(b->allocate({"hca-4"}), AllocationError);
  EXPECT_THROW(b->allocate({"bogus"}), AllocationError);
}

TEST(HcaBackend, MissingIssmDoesNotZeroTheResource) {
  SysfsFixture f;
  HcaSpec h;
  h.issm = false;
  f.add_hca(h);
  auto b = make_backend(hca_config(), context_for(f));
  auto devs = b->scan();
  ASSERT_EQ(devs.size(), 4u);
  EXPECT_TRUE(devs[0].healthy);
  auto paths = container_paths(b->allocate({"hca-0"}));
  EXPECT_EQ(paths, (std::vector<std::string>{"/dev/infiniband/umad0", "/dev/infiniband/uverbs0"}));
}

TEST(HcaBackend, HealthFollowsPortsAndDevicePresence) {
  SysfsFixture f;
  SysfsFixture::dual_port_connectx(&f);
  auto b = make_backend(hca_config(2), context_for(f));
  EXPECT_TRUE(b->scan()[0].healthy);
  f.set_port_state("mlx5_0", 1, 1);
  EXPECT_FALSE(b->scan()[0].healthy);
  f.set_port_state("mlx5_0", 1, 4);
  EXPECT_TRUE(b->scan()[0].healthy);
  f.remove_hca("mlx5_0");
  auto devs = b->scan();
  ASSERT_EQ(devs.size(), 2u);  // IDs stay, so allocatable never silently drops
  EXPECT_FALSE(devs[0].healthy);
}

TEST(HcaBackend, SelectorsAreAndedAcrossAndOredWithin) {
  SysfsFixture f;
  HcaSpec ib;
  ib.ibdev = "mlx5_0";
  ib.netdevs = {"ib0"};
  f.add_hca(ib);
  HcaSpec eth;
  eth.ibdev = "mlx5_1";
  eth.bdf = "0000:3b:00.1";
  eth.netdevs = {"ens1f1"};
  eth.ports = {PortSpec{4, "Ethernet"}};
  eth.uverbs = 1;
  eth.numa_node = "1";
  f.add_hca(eth);
  RootedFileSystem sys(f.sys_root()), dev(f.dev_root());
  auto all = SysfsDiscovery(sys, dev).rdma_devices();
  ASSERT_EQ(all.size(), 2u);
  Selectors s;
  EXPECT_TRUE(selectors_match(s, all[0]));
  s.link_types = {"ethernet"};
  EXPECT_FALSE(selectors_match(s, all[0]));
  EXPECT_TRUE(selectors_match(s, all[1]));
  s.vendors = {"0x15B3", "8086"};
  EXPECT_TRUE(selectors_match(s, all[1]));
  s.drivers = {"ice"};
  EXPECT_FALSE(selectors_match(s, all[1]));
  Selectors by_if;
  by_if.if_names = {"ib0", "ens9"};
  EXPECT_TRUE(selectors_match(by_if, all[0]));
  EXPECT_FALSE(selectors_match(by_if, all[1]));

  auto rc = hca_config(1);
  rc.selectors.link_types = {"ethernet"};
  auto b = make_backend(rc, context_for(f));
  auto devs = b->scan();
  EXPECT_EQ(devs[0].numa_nodes, std::vector<int>{1});
  EXPECT_EQ(container_paths(b->allocate({"hca-0"})),
            (std::vector<std::string>{"/dev/infiniband/issm1", "/dev/infiniband/umad1",
                                      "/dev/infiniband/uverbs1"}));
}

TEST(SriovBackend, OneDevicePerVfWithPciDeviceEnv) {
  SysfsFixture f;
  SysfsFixture::sriov_four_vfs_two_numa(&f);
  ResourceConfig rc;
  rc.resource_name = "sriov_rdma";
  rc.mode = Mode::kSriov;
  rc.pf_netdevices = {"ens1f0", "missing0"};
  auto b = make_backend(rc, context_for(f));
  auto devs = b->scan();
  ASSERT_EQ(devs.size(), 4u);
  EXPECT_EQ(devs[0].id, "0000:5e:00.2");
  EXPECT_EQ(devs[2].numa_nodes, std::vector<int>{1});
  for (const auto& d : devs) EXPECT_TRUE(d.healthy) << d.id;

  auto edits = b->allocate({"0000:5e:00.2", "0000:af:00.3"});
  EXPECT_EQ(edits.envs.at("PCIDEVICE_RDMA_SRIOV_RDMA"), "0000:5e:00.2,0000:af:00.3");
  auto info = nlohmann::json::parse(edits.envs.at("PCIDEVICE_RDMA_SRIOV_RDMA_INFO"));
  EXPECT_EQ(info["0000:af:00.3"]["rdma"]["uverbs"], "/dev/infiniband/uverbs5");
  EXPECT_EQ(info["0000:af:00.3"]["rdma"]["rdma_cm"], "/dev/infiniband/rdma_cm");
  auto paths = container_paths(edits);
  EXPECT_TRUE(std::count(paths.begin(), paths.end(), "/dev/infiniband/uverbs2"));
  EXPECT_TRUE(std::count(paths.begin(), paths.end(), "/dev/infiniband/uverbs5"));
  EXPECT_FALSE(std::count(paths.begin(), paths.end(), "/dev/infiniband/uverbs3"));
  EXPECT_TRUE(std::count(paths.begin(), paths.end(), "/dev/infiniband/rdma_cm"));
  EXPECT_THROW(b->allocate({"0000:00:00.0"}), AllocationError);

  f.set_port_state("mlx5_3", 1, 1);
  devs = b->scan();
  EXPECT_FALSE(devs[1].healthy);
  EXPECT_TRUE(devs[0].healthy);
}

TEST(SriovBackend, EnvNameFollowsSriovNetworkDevicePlugin) {
  EXPECT_EQ(pcidevice_env_name("rdma/hca"), "PCIDEVICE_RDMA_HCA");
  EXPECT_EQ(pcidevice_env_name("intel.com/sriov-net"), "PCIDEVICE_INTEL_COM_SRIOV_NET");
}

class RouterStandIn {
 public:
  explicit RouterStandIn(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
    ::unlink(path.c_str());
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd_, 64), 0);
  }
  ~RouterStandIn() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }

 private:
  std::string path_;
  int fd_ = -1;
};

TEST(VirtualBackend, TcpModeAddsTheSocketLibraryAndThePodNetwork) {
  SysfsFixture f;
  ResourceConfig rc;
  rc.resource_name = "vrdma";
  rc.resource_prefix = "freeflow";
  rc.mode = Mode::kVirtual;
  rc.virtual_devices = 1;
  rc.freeflow_dir = f.root();
  rc.tcp_mode_prefix = "10.244.0.0/16";
  auto edits = make_backend(rc, context_for(f))->allocate({"vrdma-0"});
  EXPECT_EQ(edits.envs.at("LD_PRELOAD"), "/freeflow/libffverbs.so /freeflow/libfsocket.so");
  EXPECT_EQ(edits.envs.at("VNET_PREFIX"), "10.244.0.0/16");
}

TEST(VirtualBackend, HealthyOnlyWhileTheRouterAnswers) {
  SysfsFixture f;
  const std::string dir = f.root() + "/freeflow";
  std::filesystem::create_directories(dir);
  ResourceConfig rc;
  rc.resource_name = "vrdma";
  rc.resource_prefix = "freeflow";
  rc.mode = Mode::kVirtual;
  rc.virtual_devices = 3;
  rc.freeflow_dir = dir;
  rc.router_name = "ffr1";
  auto b = make_backend(rc, context_for(f));
  auto devs = b->scan();
  ASSERT_EQ(devs.size(), 3u);
  EXPECT_EQ(devs[2].id, "vrdma-2");
  EXPECT_FALSE(devs[0].healthy);
  {
    RouterStandIn router(dir + "/ffr1.sock");
    EXPECT_TRUE(b->scan()[0].healthy);
  }
  EXPECT_FALSE(b->scan()[0].healthy);

  auto edits = b->allocate({"vrdma-0", "vrdma-2"});
  ASSERT_EQ(edits.mounts.size(), 1u);
  EXPECT_EQ(edits.mounts[0].host_path, dir);
  EXPECT_EQ(edits.mounts[0].container_path, "/freeflow");
  EXPECT_TRUE(edits.mounts[0].read_only);  // pods must not change what other pods load
  EXPECT_EQ(edits.envs.at("LD_PRELOAD"), "/freeflow/libffverbs.so");
  EXPECT_EQ(edits.envs.at("FFR_NAME"), "ffr1");
  EXPECT_EQ(edits.envs.count("VNET_PREFIX"), 0u);  // TCP mode is asked for, not implied
  EXPECT_TRUE(edits.devices.empty());
  EXPECT_THROW(b->allocate({"vrdma-3"}), AllocationError);
  EXPECT_THROW(b->allocate({"vrdma-"}), AllocationError);

  // The CDI spec mounts the folder read-only too.
  const auto spec = nlohmann::json::parse(render_cdi_spec("freeflow/vrdma", devs, *b));
  ASSERT_EQ(spec["devices"].size(), 3u);
  for (const auto& d : spec["devices"]) {
    const auto& mounts = d["containerEdits"]["mounts"];
    ASSERT_EQ(mounts.size(), 1u);
    EXPECT_EQ(mounts[0]["hostPath"], dir);
    EXPECT_EQ(mounts[0]["options"], nlohmann::json({"ro", "bind"}));
  }
}

}  // namespace
}  // namespace ff::dp
