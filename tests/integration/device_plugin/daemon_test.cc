// The real daemon against the kubelet stand-in. Every process started here is
// stopped by its PID; every wait is bounded.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "kubelet_standin.h"
#include "sysfs_fixture.h"

namespace ff::dp::testing {
namespace {
namespace fs = std::filesystem;
using std::chrono::milliseconds;

constexpr const char* kHca = "rdma/hca";
constexpr const char* kSriov = "rdma/sriov_vf";
constexpr const char* kVirtual = "freeflow/vrdma";

class RouterStandIn {
 public:
  explicit RouterStandIn(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
    ::unlink(path.c_str());
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd_, 128) != 0)
      throw std::runtime_error("router stand-in cannot listen on " + path);
  }
  ~RouterStandIn() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }

 private:
  std::string path_;
  int fd_ = -1;
};

bool all_health(const v1beta1::ListAndWatchResponse& l, const std::string& h, int count) {
  if (l.devices_size() != count) return false;
  for (const auto& d : l.devices())
    if (d.health() != h) return false;
  return true;
}

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = make_temp_dir("it");
    kubelet_dir_ = root_ + "/device-plugins";
    ff_dir_ = root_ + "/freeflow";
    fs::create_directories(kubelet_dir_);
    fs::create_directories(ff_dir_);
    // Shared HCA: dual-port ConnectX, port 1 IB ACTIVE, port 2 Ethernet DOWN.
    SysfsFixture::dual_port_connectx(&sysfs_);
    // SR-IOV PF with 4 VFs on NUMA 0,0,1,1.
    HcaSpec pf;
    pf.ibdev = "mlx5_1";
    pf.bdf = "0000:5e:00.0";
    pf.bridge = "0000:5d:00.0";
    pf.netdevs = {"ens1f0"};
    pf.ports = {PortSpec{4, "Ethernet"}};
    pf.uverbs = 1;
    sysfs_.add_sriov_pf(pf, {{"0000:5e:00.2", "0", "0000:5d:00.0", "mlx5_2", 2, 4},
                             {"0000:5e:00.3", "0", "0000:5d:00.0", "mlx5_3", 3, 4},
                             {"0000:af:00.2", "1", "0000:ae:00.0", "mlx5_4", 4, 4},
                             {"0000:af:00.3", "1", "0000:ae:00.0", "mlx5_5", 5, 4}});
    config_path_ = root_ + "/config.json";
    write_config(5);
    kubelet_ = std::make_unique<KubeletStandIn>(kubelet_dir_);
    kubelet_->start();
  }

  void TearDown() override {
    daemon_.reset();  // SIGTERM by PID
    kubelet_.reset();
    if (HasFailure()) std::cerr << "---- daemon log ----\n" << read_text(root_ + "/daemon.log");
    fs::remove_all(root_);
  }

  void write_config(int hca_max) {
    nlohmann::json cfg = {
        {"healthCheckIntervalMs", 200},
        {"configList",
         {{{"resourceName", "hca"},
           {"rdmaHcaMax", hca_max},
           {"selectors", {{"linkTypes", {"infiniband"}}}}},
          {{"resourceName", "sriov_vf"}, {"mode", "sriov"}, {"pfNetdevices", {"ens1f0"}}},
          {{"resourceName", "vrdma"},
           {"mode", "virtual"},
           {"virtualDevices", 3},
           {"freeflowDir", ff_dir_},
           {"routerName", "ffr"}}}}};
    std::ofstream(config_path_) << cfg.dump(2);
  }

  void start_daemon(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {
        "--config",        config_path_, "--kubelet-dir",   kubelet_dir_,  "--sysfs-root",
        sysfs_.sys_root(), "--dev-root", sysfs_.dev_root(), "--log-level", "debug"};
    args.insert(args.end(), extra.begin(), extra.end());
    daemon_ = std::make_unique<DaemonProcess>(FFDP_BINARY, args, root_ + "/daemon.log");
  }

  void expect_registered_all() {
    for (const char* r : {kHca, kSriov, kVirtual})
      ASSERT_TRUE(kubelet_->wait_registration(r, 1, milliseconds(5000))) << r;
  }

  std::string root_, kubelet_dir_, ff_dir_, config_path_;
  SysfsFixture sysfs_;
  std::unique_ptr<KubeletStandIn> kubelet_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(DaemonTest, RegistersEveryResourceWithTheRightFields) {
  start_daemon();
  expect_registered_all();
  auto reg = kubelet_->wait_registration(kHca, 1, milliseconds(100));
  EXPECT_EQ(reg->request.version(), "v1beta1");
  EXPECT_EQ(reg->request.endpoint(), "freeflow-rdma_hca.sock");
  EXPECT_EQ(reg->request.endpoint().find('/'), std::string::npos);
  EXPECT_TRUE(reg->request.options().get_preferred_allocation_available());
  EXPECT_FALSE(reg->request.options().pre_start_required());
  EXPECT_TRUE(fs::is_socket(kubelet_dir_ + "/" + reg->request.endpoint()));
  EXPECT_EQ(kubelet_->wait_registration(kVirtual, 1, milliseconds(100))->request.endpoint(),
            "freeflow-freeflow_vrdma.sock");
}

TEST_F(DaemonTest, ListAndWatchPerMode) {
  start_daemon();
  expect_registered_all();
  auto hca = kubelet_->wait_list(
      kHca, [](auto& l) { return all_health(l, "Healthy", 5); }, milliseconds(3000));
  ASSERT_TRUE(hca);
  EXPECT_EQ(hca->list.devices(0).id(), "hca-0");
  ASSERT_EQ(hca->list.devices(0).topology().nodes_size(), 1);
  EXPECT_EQ(hca->list.devices(0).topology().nodes(0).id(), 0);

  auto vf = kubelet_->wait_list(
      kSriov, [](auto& l) { return all_health(l, "Healthy", 4); }, milliseconds(3000));
  ASSERT_TRUE(vf);
  EXPECT_EQ(vf->list.devices(0).id(), "0000:5e:00.2");
  EXPECT_EQ(vf->list.devices(3).id(), "0000:af:00.3");
  EXPECT_EQ(vf->list.devices(3).topology().nodes(0).id(), 1);

  // No router yet: virtual devices are advertised but Unhealthy.
  auto v = kubelet_->wait_list(
      kVirtual, [](auto& l) { return all_health(l, "Unhealthy", 3); }, milliseconds(3000));
  ASSERT_TRUE(v);
  EXPECT_EQ(v->list.devices(0).topology().nodes_size(), 0);
}

TEST_F(DaemonTest, AllocateAnswersPerMode) {
  start_daemon();
  expect_registered_all();
  {
    auto stub = kubelet_->plugin(kHca);
    v1beta1::AllocateRequest req;
    req.add_container_requests()->add_devices_ids("hca-3");
    v1beta1::AllocateResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Allocate(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.container_responses_size(), 1);
    std::set<std::string> paths;
    for (const auto& d : resp.container_responses(0).devices()) {
      paths.insert(d.container_path());
      EXPECT_EQ(d.permissions(), "rwm");
      EXPECT_EQ(d.host_path(), d.container_path());
    }
    EXPECT_EQ(paths, (std::set<std::string>{"/dev/infiniband/uverbs0", "/dev/infiniband/umad0",
                                            "/dev/infiniband/umad1", "/dev/infiniband/issm0",
                                            "/dev/infiniband/issm1", "/dev/infiniband/rdma_cm"}));
  }
  {
    auto stub = kubelet_->plugin(kSriov);
    v1beta1::AllocateRequest req;
    auto* c = req.add_container_requests();
    c->add_devices_ids("0000:af:00.2");
    c->add_devices_ids("0000:af:00.3");
    v1beta1::AllocateResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Allocate(&ctx, req, &resp).ok());
    const auto& r = resp.container_responses(0);
    EXPECT_EQ(r.envs().at("PCIDEVICE_RDMA_SRIOV_VF"), "0000:af:00.2,0000:af:00.3");
    EXPECT_TRUE(r.envs().count("PCIDEVICE_RDMA_SRIOV_VF_INFO"));
    std::set<std::string> paths;
    for (const auto& d : r.devices()) paths.insert(d.container_path());
    EXPECT_TRUE(paths.count("/dev/infiniband/uverbs4"));
    EXPECT_TRUE(paths.count("/dev/infiniband/uverbs5"));
    EXPECT_TRUE(paths.count("/dev/infiniband/rdma_cm"));
    EXPECT_FALSE(paths.count("/dev/infiniband/uverbs2"));
  }
  {
    auto stub = kubelet_->plugin(kVirtual);
    v1beta1::AllocateRequest req;
    req.add_container_requests()->add_devices_ids("vrdma-1");
    v1beta1::AllocateResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Allocate(&ctx, req, &resp).ok());
    const auto& r = resp.container_responses(0);
    ASSERT_EQ(r.mounts_size(), 1);
    EXPECT_EQ(r.mounts(0).host_path(), ff_dir_);
    EXPECT_EQ(r.mounts(0).container_path(), "/freeflow");
    EXPECT_TRUE(r.mounts(0).read_only());  // pods must not change what other pods load
    EXPECT_EQ(r.envs().at("LD_PRELOAD"), "/freeflow/libffverbs.so");
    EXPECT_EQ(r.envs().at("FFR_NAME"), "ffr");
  }
  {
    auto stub = kubelet_->plugin(kHca);
    v1beta1::AllocateRequest req;
    req.add_container_requests()->add_devices_ids("hca-99");
    v1beta1::AllocateResponse resp;
    grpc::ClientContext ctx;
    EXPECT_EQ(stub->Allocate(&ctx, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  EXPECT_TRUE(daemon_->alive());
}

TEST_F(DaemonTest, PreferredAllocationStaysOnOneNumaNode) {
  start_daemon();
  expect_registered_all();
  ASSERT_TRUE(kubelet_->wait_list(
      kSriov, [](auto& l) { return l.devices_size() == 4; }, milliseconds(3000)));
  auto stub = kubelet_->plugin(kSriov);
  v1beta1::PreferredAllocationRequest req;
  auto* c = req.add_container_requests();
  for (const char* id : {"0000:5e:00.2", "0000:5e:00.3", "0000:af:00.2", "0000:af:00.3"})
    c->add_available_deviceids(id);
  c->add_must_include_deviceids("0000:af:00.3");
  c->set_allocation_size(2);
  v1beta1::PreferredAllocationResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->GetPreferredAllocation(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.container_responses(0).deviceids_size(), 2);
  EXPECT_EQ(resp.container_responses(0).deviceids(0), "0000:af:00.3");
  EXPECT_EQ(resp.container_responses(0).deviceids(1), "0000:af:00.2");
}

TEST_F(DaemonTest, HealthChangesReachListAndWatchWithinTwoSeconds) {
  start_daemon();
  expect_registered_all();
  ASSERT_TRUE(kubelet_->wait_list(
      kHca, [](auto& l) { return all_health(l, "Healthy", 5); }, milliseconds(3000)));

  auto t0 = Clock::now();
  sysfs_.set_port_state("mlx5_0", 1, 1);
  auto down = kubelet_->wait_list(
      kHca, [](auto& l) { return all_health(l, "Unhealthy", 5); }, milliseconds(2000));
  ASSERT_TRUE(down) << "port down did not reach ListAndWatch within 2 s";
  EXPECT_LT(down->at - t0, milliseconds(2000));

  t0 = Clock::now();
  sysfs_.set_port_state("mlx5_0", 1, 4);
  auto up = kubelet_->wait_list(
      kHca, [](auto& l) { return all_health(l, "Healthy", 5); }, milliseconds(2000));
  ASSERT_TRUE(up) << "port up did not reach ListAndWatch within 2 s";

  // VF port down marks only that VF.
  sysfs_.set_port_state("mlx5_3", 1, 1);
  ASSERT_TRUE(kubelet_->wait_list(
      kSriov,
      [](auto& l) {
        return l.devices_size() == 4 && l.devices(1).health() == "Unhealthy" &&
               l.devices(0).health() == "Healthy";
      },
      milliseconds(2000)));

  // Virtual: router comes and goes.
  {
    RouterStandIn router(ff_dir_ + "/ffr.sock");
    ASSERT_TRUE(kubelet_->wait_list(
        kVirtual, [](auto& l) { return all_health(l, "Healthy", 3); }, milliseconds(2000)));
  }
  ASSERT_TRUE(kubelet_->wait_list(
      kVirtual, [](auto& l) { return all_health(l, "Unhealthy", 3); }, milliseconds(2000)));

  // HCA disappearing entirely.
  sysfs_.remove_hca("mlx5_0");
  ASSERT_TRUE(kubelet_->wait_list(
      kHca, [](auto& l) { return all_health(l, "Unhealthy", 5); }, milliseconds(2000)));
}

TEST_F(DaemonTest, KubeletRestartLeadsToRegistrationWithinOneSecond) {
  start_daemon();
  expect_registered_all();
  for (int round = 1; round <= 3; ++round) {
    auto created = kubelet_->restart(milliseconds(round == 3 ? 300 : 0));
    for (const char* r : {kHca, kSriov, kVirtual}) {
      auto reg = kubelet_->wait_registration_since(r, created, milliseconds(3000));
      ASSERT_TRUE(reg) << r << " did not re-register in round " << round;
      EXPECT_LT(reg->at - created, milliseconds(1000)) << r << " round " << round;
      const std::string sock = kubelet_dir_ + "/" + reg->request.endpoint();
      for (int i = 0; i < 40 && !fs::is_socket(sock); ++i)
        std::this_thread::sleep_for(milliseconds(25));
      EXPECT_TRUE(fs::is_socket(sock)) << sock;
    }
  }
  // The restarted kubelet gets a full, healthy list again: allocatable is not stuck at zero.
  ASSERT_TRUE(kubelet_->wait_list(
      kHca, [](auto& l) { return all_health(l, "Healthy", 5); }, milliseconds(3000)));
}

TEST_F(DaemonTest, RegistersAsSoonAsKubeletComesUp) {
  kubelet_->stop(true);
  // A stale kubelet.sock nobody listens on, as a crashed kubelet leaves behind.
  {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", (kubelet_dir_ + "/kubelet.sock").c_str());
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ::close(fd);
  }
  start_daemon();
  std::this_thread::sleep_for(milliseconds(700));
  ASSERT_TRUE(daemon_->alive());
  auto created = kubelet_->restart();
  for (const char* r : {kHca, kSriov, kVirtual}) {
    auto reg = kubelet_->wait_registration_since(r, created, milliseconds(3000));
    ASSERT_TRUE(reg) << r;
    EXPECT_LT(reg->at - created, milliseconds(1000)) << r;
  }
}

TEST_F(DaemonTest, SighupWithBadConfigKeepsServingAndGoodConfigApplies) {
  int port = free_loopback_port();
  start_daemon({"--metrics-address", "127.0.0.1:" + std::to_string(port)});
  expect_registered_all();
  std::ofstream(config_path_) << R"({"configList":[{"resourceName":"hca","rdmaHcaMax":-4}]})";
  daemon_->signal(SIGHUP);
  std::this_thread::sleep_for(milliseconds(500));
  ASSERT_TRUE(daemon_->alive());
  EXPECT_NE(read_text(root_ + "/daemon.log").find("configList[0].rdmaHcaMax"), std::string::npos);
  {
    auto stub = kubelet_->plugin(kHca);
    v1beta1::AllocateRequest req;
    req.add_container_requests()->add_devices_ids("hca-4");
    v1beta1::AllocateResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub->Allocate(&ctx, req, &resp).ok()) << "old config no longer served";
  }
  EXPECT_EQ(kubelet_->registrations(kHca), 1u);

  write_config(7);
  daemon_->signal(SIGHUP);
  ASSERT_TRUE(kubelet_->wait_registration(kHca, 2, milliseconds(3000)));
  ASSERT_TRUE(kubelet_->wait_list(
      kHca, [](auto& l) { return all_health(l, "Healthy", 7); }, milliseconds(3000)));

  // Counters are updated right after the RPC returns; poll briefly.
  std::string metrics;
  for (int i = 0; i < 40; ++i) {
    metrics = http_get(port, "/metrics");
    if (metrics.find(
            "freeflow_dp_registrations_total{resource=\"freeflow/vrdma\",result=\"ok\"} 2") !=
        std::string::npos)
      break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_NE(metrics.find("freeflow_dp_devices{resource=\"rdma/hca\",health=\"Healthy\"} 7"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("freeflow_dp_config_reloads_total{result=\"error\"} 1"),
            std::string::npos);
  EXPECT_NE(metrics.find("freeflow_dp_config_reloads_total{result=\"ok\"} 1"), std::string::npos);
  EXPECT_NE(
      metrics.find("freeflow_dp_registrations_total{resource=\"freeflow/vrdma\",result=\"ok\"} 2"),
      std::string::npos);
  EXPECT_NE(metrics.find("freeflow_dp_allocations_total{resource=\"rdma/hca\",result=\"ok\"} 1"),
            std::string::npos);
}

TEST_F(DaemonTest, SigtermStopsCleanlyAndRemovesSockets) {
  start_daemon();
  expect_registered_all();
  EXPECT_EQ(daemon_->stop(), 0);
  for (const char* s :
       {"freeflow-rdma_hca.sock", "freeflow-rdma_sriov_vf.sock", "freeflow-freeflow_vrdma.sock"})
    EXPECT_FALSE(fs::exists(kubelet_dir_ + "/" + s)) << s;
  EXPECT_TRUE(fs::exists(kubelet_dir_ + "/kubelet.sock"));
}

TEST_F(DaemonTest, BadConfigAtStartFailsFastNamingTheField) {
  std::ofstream(config_path_) << R"({"configList":[{"resourceName":"sriov","mode":"sriov"}]})";
  start_daemon();
  auto status = daemon_->wait_exit(milliseconds(5000));
  ASSERT_TRUE(status);
  EXPECT_EQ(*status, 2);
  EXPECT_NE(read_text(root_ + "/daemon.log").find("configList[0].pfNetdevices"), std::string::npos);
}

TEST_F(DaemonTest, LegacyHcaConfigMapAndCdi) {
  std::ofstream(config_path_) << R"({"mode":"hca"})";
  const std::string cdi = root_ + "/cdi";
  fs::create_directories(cdi);
  start_daemon({"--cdi-dir", cdi});
  ASSERT_TRUE(kubelet_->wait_registration(kHca, 1, milliseconds(5000)));
  ASSERT_TRUE(kubelet_->wait_list(
      kHca, [](auto& l) { return all_health(l, "Healthy", 1000); }, milliseconds(3000)));
  auto stub = kubelet_->plugin(kHca);
  v1beta1::AllocateRequest req;
  req.add_container_requests()->add_devices_ids("hca-999");
  v1beta1::AllocateResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->Allocate(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.container_responses(0).cdi_devices_size(), 1);
  EXPECT_EQ(resp.container_responses(0).cdi_devices(0).name(), "rdma/hca=hca-999");
  auto spec = nlohmann::json::parse(read_text(cdi + "/freeflow-rdma-hca.json"));
  EXPECT_EQ(spec["kind"], "rdma/hca");
  EXPECT_EQ(spec["devices"].size(), 1000u);
}

TEST_F(DaemonTest, PluginsRegistryPath) {
  const std::string reg_dir = root_ + "/plugins_registry";
  fs::create_directories(reg_dir);
  std::ofstream(config_path_) << R"({"mode":"hca"})";
  start_daemon({"--registration", "plugins-registry", "--plugins-registry-dir", reg_dir});
  const std::string sock = reg_dir + "/freeflow-rdma_hca.sock";
  for (int i = 0; i < 100 && !fs::is_socket(sock); ++i)
    std::this_thread::sleep_for(milliseconds(50));
  ASSERT_TRUE(fs::is_socket(sock));
  auto channel = grpc::CreateChannel("unix:" + sock, grpc::InsecureChannelCredentials());
  auto reg = pluginregistration::Registration::NewStub(channel);
  pluginregistration::PluginInfo info;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  ASSERT_TRUE(reg->GetInfo(&ctx, pluginregistration::InfoRequest(), &info).ok());
  EXPECT_EQ(info.type(), "DevicePlugin");
  EXPECT_EQ(info.name(), kHca);
  EXPECT_EQ(info.endpoint(), sock);
  // Plugin watcher then dials the endpoint as a device plugin.
  auto dp = v1beta1::DevicePlugin::NewStub(channel);
  grpc::ClientContext ctx2;
  v1beta1::DevicePluginOptions opts;
  ASSERT_TRUE(dp->GetDevicePluginOptions(&ctx2, v1beta1::Empty(), &opts).ok());
  EXPECT_EQ(kubelet_->registrations(kHca), 0u);  // no Register call on this path
  // Socket deleted (kubelet restart) -> served again.
  fs::remove(sock);
  for (int i = 0; i < 40 && !fs::is_socket(sock); ++i)
    std::this_thread::sleep_for(milliseconds(25));
  EXPECT_TRUE(fs::is_socket(sock));
}

}  // namespace
}  // namespace ff::dp::testing
