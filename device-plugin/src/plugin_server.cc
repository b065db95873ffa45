#include "plugin_server.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdi.h"
#include "deviceplugin.grpc.pb.h"
#include "freeflow/tunables.h"
#include "pluginregistration.grpc.pb.h"
#include "topology.h"

namespace ff::dp {

class ResourcePlugin::Service final : public v1beta1::DevicePlugin::Service {
 public:
  explicit Service(ResourcePlugin* plugin) : p_(plugin) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* out) override {
    out->set_pre_start_required(false);
    out->set_get_preferred_allocation_available(true);
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    uint64_t seen = 0;
    // Bounded by server stop and by kubelet cancelling the stream.
    while (!p_->stopping() && !ctx->IsCancelled()) {
      uint64_t now = 0;
      if (!p_->wait_for_change(seen, &now, ff::kPluginStreamWakeMs)) continue;
      v1beta1::ListAndWatchResponse resp;
      p_->fill_list(&resp);
      seen = now;
      if (!writer->Write(resp)) break;
    }
    return grpc::Status::OK;
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest* req,
                                      v1beta1::PreferredAllocationResponse* resp) override {
    p_->prefer(*req, resp);
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* req,
                        v1beta1::AllocateResponse* resp) override {
    std::string error = p_->allocate(*req, resp);
    if (!error.empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, error);
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest*,
                                 v1beta1::PreStartContainerResponse*) override {
    return grpc::Status::OK;
  }

 private:
  ResourcePlugin* p_;
};

class ResourcePlugin::RegistryService final : public pluginregistration::Registration::Service {
 public:
  explicit RegistryService(ResourcePlugin* plugin) : p_(plugin) {}

  grpc::Status GetInfo(grpc::ServerContext*, const pluginregistration::InfoRequest*,
                       pluginregistration::PluginInfo* info) override {
    info->set_type("DevicePlugin");
    info->set_name(p_->config().full_name());
    info->set_endpoint(p_->socket_path());
    info->add_supported_versions("v1beta1");
    return grpc::Status::OK;
  }

  grpc::Status NotifyRegistrationStatus(grpc::ServerContext*,
                                        const pluginregistration::RegistrationStatus* st,
                                        pluginregistration::RegistrationStatusResponse*) override {
    p_->set_registry_status(st->plugin_registered(), st->error());
    return grpc::Status::OK;
  }

 private:
  ResourcePlugin* p_;
};

ResourcePlugin::ResourcePlugin(ResourceConfig cfg, std::unique_ptr<DeviceBackend> backend,
                               ServeOptions opts, Metrics* metrics)
    : cfg_(std::move(cfg)),
      backend_(std::move(backend)),
      opts_(std::move(opts)),
      metrics_(metrics) {}

ResourcePlugin::~ResourcePlugin() { stop(); }

bool ResourcePlugin::start(std::string* error) {
  if (server_) return true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = false;
  }
  const std::string path = socket_path();
  ::unlink(path.c_str());  // a stale socket from a previous run blocks bind()
  service_ = std::make_unique<Service>(this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  // kubelet is the only client: one completion queue is plenty, and each
  // extra queue brings threads that cost resident memory.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  if (opts_.plugins_registry) {
    registry_service_ = std::make_unique<RegistryService>(this);
    builder.RegisterService(registry_service_.get());
  }
  server_ = builder.BuildAndStart();
  if (!server_) {
    *error = fmt::format("cannot serve {} on {}", cfg_.full_name(), path);
    service_.reset();
    registry_service_.reset();
    return false;
  }
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    socket_dev_ = st.st_dev;
    socket_ino_ = st.st_ino;
  }
  spdlog::info("{}: serving on {}", cfg_.full_name(), path);
  return true;
}

void ResourcePlugin::stop() {
  if (!server_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  // Streams leave as soon as they see stopping_; the deadline only bounds a
  // handler stuck in a write to a dead peer.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  server_->Wait();
  server_.reset();
  service_.reset();
  registry_service_.reset();
  // Only remove the socket if it is still ours (kubelet may have replaced the folder).
  if (socket_intact()) ::unlink(socket_path().c_str());
  socket_ino_ = 0;
}

bool ResourcePlugin::socket_intact() const {
  struct stat st;
  if (::stat(socket_path().c_str(), &st) != 0) return false;
  return st.st_ino == socket_ino_ && st.st_dev == socket_dev_;
}

bool ResourcePlugin::refresh() {
  std::vector<PluginDevice> fresh = backend_->scan();
  int healthy = 0;
  for (const auto& d : fresh) healthy += d.healthy ? 1 : 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (version_ != 0 && fresh == devices_) return false;
    devices_ = std::move(fresh);
    ++version_;
    if (metrics_)
      metrics_->set_devices(cfg_.full_name(), healthy, static_cast<int>(devices_.size()) - healthy);
  }
  cv_.notify_all();
  return true;
}

std::vector<PluginDevice> ResourcePlugin::devices() const {
  std::lock_guard<std::mutex> lock(mu_);
  return devices_;
}

uint64_t ResourcePlugin::version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return version_;
}

bool ResourcePlugin::stopping() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_;
}

bool ResourcePlugin::wait_for_change(uint64_t seen, uint64_t* now_version, int timeout_ms) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
               [&] { return stopping_ || (version_ != 0 && version_ != seen); });
  *now_version = version_;
  return !stopping_ && version_ != 0 && version_ != seen;
}

void ResourcePlugin::fill_list(v1beta1::ListAndWatchResponse* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& d : devices_) {
    auto* dev = out->add_devices();
    dev->set_id(d.id);
    dev->set_health(d.healthy ? "Healthy" : "Unhealthy");
    if (!d.numa_nodes.empty()) {
      auto* topo = dev->mutable_topology();
      for (int n : d.numa_nodes) topo->add_nodes()->set_id(n);
    }
  }
}

std::string ResourcePlugin::allocate(const v1beta1::AllocateRequest& req,
                                     v1beta1::AllocateResponse* resp) {
  for (const auto& creq : req.container_requests()) {
    std::vector<std::string> ids(creq.devices_ids().begin(), creq.devices_ids().end());
    ContainerEdits edits;
    try {
      edits = backend_->allocate(ids);
    } catch (const AllocationError& e) {
      if (metrics_) metrics_->count_allocation(cfg_.full_name(), false);
      spdlog::warn("{}: Allocate refused: {}", cfg_.full_name(), e.what());
      return e.what();
    }
    auto* cresp = resp->add_container_responses();
    if (!opts_.cdi_dir.empty()) {
      for (const auto& id : ids)
        cresp->add_cdi_devices()->set_name(cdi_qualified_name(cdi_kind(), id));
    }
    if (opts_.cdi_dir.empty() || !opts_.cdi_only) {
      for (const auto& n : edits.devices) {
        auto* spec = cresp->add_devices();
        spec->set_host_path(n.host_path);
        spec->set_container_path(n.container_path);
        spec->set_permissions(n.permissions);
      }
      for (const auto& m : edits.mounts) {
        auto* mount = cresp->add_mounts();
        mount->set_host_path(m.host_path);
        mount->set_container_path(m.container_path);
        mount->set_read_only(m.read_only);
      }
      for (const auto& [k, v] : edits.envs) (*cresp->mutable_envs())[k] = v;
    }
    if (metrics_) metrics_->count_allocation(cfg_.full_name(), true);
  }
  return "";
}

void ResourcePlugin::prefer(const v1beta1::PreferredAllocationRequest& req,
                            v1beta1::PreferredAllocationResponse* resp) const {
  std::vector<PluginDevice> known = devices();
  for (const auto& creq : req.container_requests()) {
    std::vector<std::string> avail(creq.available_deviceids().begin(),
                                   creq.available_deviceids().end());
    std::vector<std::string> must(creq.must_include_deviceids().begin(),
                                  creq.must_include_deviceids().end());
    auto* out = resp->add_container_responses();
    for (auto& id : preferred_allocation(known, avail, must, creq.allocation_size()))
      out->add_deviceids(id);
  }
}

v1beta1::RegisterRequest ResourcePlugin::register_request() const {
  v1beta1::RegisterRequest req;
  req.set_version("v1beta1");
  req.set_endpoint(cfg_.socket_name());
  req.set_resource_name(cfg_.full_name());
  req.mutable_options()->set_pre_start_required(false);
  req.mutable_options()->set_get_preferred_allocation_available(true);
  return req;
}

void ResourcePlugin::set_registry_status(bool registered, const std::string& error) {
  if (metrics_) metrics_->count_registration(cfg_.full_name(), registered);
  if (registered)
    spdlog::info("{}: kubelet plugin watcher registered us", cfg_.full_name());
  else
    spdlog::error("{}: kubelet plugin watcher rejected us: {}", cfg_.full_name(), error);
}

}  // namespace ff::dp
