// ResourcePlugin over a real Unix socket with the real gRPC stack, driven by
// a fake backend so each test controls devices and health directly.
#include "plugin_server.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "cdi.h"
#include "deviceplugin.grpc.pb.h"
#include "pluginregistration.grpc.pb.h"

namespace ff::dp {
namespace {
namespace fs = std::filesystem;

class FakeBackend final : public DeviceBackend {
 public:
  explicit FakeBackend(std::vector<PluginDevice>* devices) : devices_(devices) {}
  std::vector<PluginDevice> scan() override { return *devices_; }
  ContainerEdits allocate(const std::vector<std::string>& ids) const override {
    ContainerEdits e;
    for (const auto& id : ids) {
      if (id == "bad") throw AllocationError("unknown device ID 'bad'");
      e.devices.push_back({"/dev/infiniband/" + id, "/dev/infiniband/" + id, "rwm"});
    }
    e.mounts.push_back({"/freeflow", "/freeflow", false});
    e.envs["FFR_NAME"] = "ffrouter";
    return e;
  }

 private:
  std::vector<PluginDevice>* devices_;
};

class PluginServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ffdp-srv-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    devices_ = {{"uverbs0", true, {0}, "sw"}, {"uverbs1", true, {1}, "sw2"}};
  }
  void TearDown() override {
    plugin_.reset();
    fs::remove_all(dir_);
  }
  void make(bool registry = false, std::string cdi_dir = "") {
    ResourceConfig rc;
    rc.resource_name = "hca";
    ServeOptions opts;
    opts.socket_dir = dir_;
    opts.plugins_registry = registry;
    opts.cdi_dir = cdi_dir;
    plugin_ = std::make_unique<ResourcePlugin>(rc, std::make_unique<FakeBackend>(&devices_), opts,
                                               &metrics_);
    plugin_->refresh();
    std::string error;
    ASSERT_TRUE(plugin_->start(&error)) << error;
    channel_ =
        grpc::CreateChannel("unix:" + plugin_->socket_path(), grpc::InsecureChannelCredentials());
    stub_ = v1beta1::DevicePlugin::NewStub(channel_);
  }

  std::string dir_;
  std::vector<PluginDevice> devices_;
  Metrics metrics_;
  std::unique_ptr<ResourcePlugin> plugin_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub_;
};

TEST_F(PluginServerTest, OptionsAndRegisterRequest) {
  make();
  grpc::ClientContext ctx;
  v1beta1::DevicePluginOptions opts;
  ASSERT_TRUE(stub_->GetDevicePluginOptions(&ctx, v1beta1::Empty(), &opts).ok());
  EXPECT_TRUE(opts.get_preferred_allocation_available());
  EXPECT_FALSE(opts.pre_start_required());
  auto req = plugin_->register_request();
  EXPECT_EQ(req.version(), "v1beta1");
  EXPECT_EQ(req.resource_name(), "rdma/hca");
  EXPECT_EQ(req.endpoint(), "freeflow-rdma_hca.sock");
  EXPECT_TRUE(req.options().get_preferred_allocation_available());
}

TEST_F(PluginServerTest, ListAndWatchSendsInitialListAndChanges) {
  make();
  grpc::ClientContext ctx;
  auto reader = stub_->ListAndWatch(&ctx, v1beta1::Empty());
  v1beta1::ListAndWatchResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  ASSERT_EQ(resp.devices_size(), 2);
  EXPECT_EQ(resp.devices(0).id(), "uverbs0");
  EXPECT_EQ(resp.devices(0).health(), "Healthy");
  ASSERT_EQ(resp.devices(1).topology().nodes_size(), 1);
  EXPECT_EQ(resp.devices(1).topology().nodes(0).id(), 1);

  EXPECT_FALSE(plugin_->refresh());  // nothing changed, nothing sent
  devices_[1].healthy = false;
  EXPECT_TRUE(plugin_->refresh());
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.devices(1).health(), "Unhealthy");
  ctx.TryCancel();
  while (reader->Read(&resp)) {
  }
  reader->Finish();
}

TEST_F(PluginServerTest, AllocateAnswersAndRejectsUnknownIds) {
  make(false, dir_);
  v1beta1::AllocateRequest req;
  req.add_container_requests()->add_devices_ids("uverbs1");
  v1beta1::AllocateResponse resp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Allocate(&ctx, req, &resp).ok());
  }
  ASSERT_EQ(resp.container_responses_size(), 1);
  const auto& c = resp.container_responses(0);
  ASSERT_EQ(c.devices_size(), 1);
  EXPECT_EQ(c.devices(0).container_path(), "/dev/infiniband/uverbs1");
  EXPECT_EQ(c.devices(0).permissions(), "rwm");
  ASSERT_EQ(c.mounts_size(), 1);
  EXPECT_EQ(c.envs().at("FFR_NAME"), "ffrouter");
  ASSERT_EQ(c.cdi_devices_size(), 1);
  EXPECT_EQ(c.cdi_devices(0).name(), "rdma/hca=uverbs1");

  req.mutable_container_requests(0)->add_devices_ids("bad");
  grpc::ClientContext ctx2;
  auto st = stub_->Allocate(&ctx2, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("bad"), std::string::npos);
  auto text = metrics_.render();
  EXPECT_NE(text.find("freeflow_dp_allocations_total{resource=\"rdma/hca\",result=\"ok\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("freeflow_dp_allocations_total{resource=\"rdma/hca\",result=\"error\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("freeflow_dp_devices{resource=\"rdma/hca\",health=\"Healthy\"} 2"),
            std::string::npos);
}

TEST_F(PluginServerTest, PreferredAllocationUsesTopology) {
  make();
  v1beta1::PreferredAllocationRequest req;
  auto* c = req.add_container_requests();
  c->add_available_deviceids("uverbs0");
  c->add_available_deviceids("uverbs1");
  c->add_must_include_deviceids("uverbs1");
  c->set_allocation_size(1);
  v1beta1::PreferredAllocationResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->GetPreferredAllocation(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.container_responses_size(), 1);
  ASSERT_EQ(resp.container_responses(0).deviceids_size(), 1);
  EXPECT_EQ(resp.container_responses(0).deviceids(0), "uverbs1");
}

TEST_F(PluginServerTest, StopRemovesOnlyItsOwnSocket) {
  make();
  const auto path = plugin_->socket_path();
  EXPECT_TRUE(plugin_->socket_intact());
  plugin_->stop();
  EXPECT_FALSE(fs::exists(path));
  std::string error;
  ASSERT_TRUE(plugin_->start(&error)) << error;
  fs::remove(path);  // kubelet restart
  EXPECT_FALSE(plugin_->socket_intact());
  ASSERT_TRUE(plugin_->restart(&error)) << error;
  EXPECT_TRUE(plugin_->socket_intact());
}

TEST_F(PluginServerTest, PluginsRegistryGetInfo) {
  make(true);
  auto stub = pluginregistration::Registration::NewStub(channel_);
  grpc::ClientContext ctx;
  pluginregistration::PluginInfo info;
  ASSERT_TRUE(stub->GetInfo(&ctx, pluginregistration::InfoRequest(), &info).ok());
  EXPECT_EQ(info.type(), "DevicePlugin");
  EXPECT_EQ(info.name(), "rdma/hca");
  EXPECT_EQ(info.endpoint(), plugin_->socket_path());
  ASSERT_EQ(info.supported_versions_size(), 1);
  EXPECT_EQ(info.supported_versions(0), "v1beta1");
  grpc::ClientContext ctx2;
  pluginregistration::RegistrationStatus st;
  st.set_plugin_registered(true);
  pluginregistration::RegistrationStatusResponse r;
  ASSERT_TRUE(stub->NotifyRegistrationStatus(&ctx2, st, &r).ok());
  EXPECT_NE(metrics_.render().find(
                "freeflow_dp_registrations_total{resource=\"rdma/hca\",result=\"ok\"} 1"),
            std::string::npos);
}

TEST(Cdi, SpecListsEditsPerDevice) {
  std::vector<PluginDevice> devs = {{"0000:5e:00.2", true, {}, ""}};
  FakeBackend b(&devs);
  auto spec = render_cdi_spec("rdma/sriov", devs, b);
  EXPECT_NE(spec.find("\"kind\": \"rdma/sriov\""), std::string::npos);
  EXPECT_NE(spec.find("\"name\": \"0000-5e-00.2\""), std::string::npos);
  EXPECT_NE(spec.find("/dev/infiniband/0000:5e:00.2"), std::string::npos);
  EXPECT_EQ(cdi_qualified_name("rdma/sriov", "0000:5e:00.2"), "rdma/sriov=0000-5e-00.2");
}

}  // namespace
}  // namespace ff::dp
