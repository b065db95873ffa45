// One advertised resource: its backend, its device list, and the gRPC server
// on its own Unix socket that kubelet talks to.
//
// Threading: start/stop/restart/refresh are called from the daemon's main
// loop only. The gRPC handlers run on gRPC threads and read shared state under
// mu_. ListAndWatch streams wake on every published change and end when the
// server stops or kubelet cancels them.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend.h"
#include "config.h"
#include "deviceplugin.pb.h"
#include "metrics.h"

namespace grpc {
class Server;
}

namespace ff::dp {

struct ServeOptions {
  std::string socket_dir;         // where the plugin socket lives
  bool plugins_registry = false;  // also serve pluginregistration.Registration
  std::string cdi_dir;            // non-empty: name CDI devices in Allocate
  bool cdi_only = false;          // with cdi_dir: leave device specs/mounts/envs to CDI
};

class ResourcePlugin {
 public:
  ResourcePlugin(ResourceConfig cfg, std::unique_ptr<DeviceBackend> backend, ServeOptions opts,
                 Metrics* metrics);
  ~ResourcePlugin();
  ResourcePlugin(const ResourcePlugin&) = delete;
  ResourcePlugin& operator=(const ResourcePlugin&) = delete;

  bool start(std::string* error);
  void stop();  // ends streams, stops the server, removes our socket
  bool restart(std::string* error) {
    stop();
    return start(error);
  }
  bool running() const { return server_ != nullptr; }
  // True if the socket file on disk is the one this server created.
  bool socket_intact() const;

  // Rescans the backend and publishes the list if it changed; returns true then.
  bool refresh();
  std::vector<PluginDevice> devices() const;
  uint64_t version() const;

  const ResourceConfig& config() const { return cfg_; }
  const DeviceBackend& backend() const { return *backend_; }
  std::string socket_path() const { return opts_.socket_dir + "/" + cfg_.socket_name(); }
  v1beta1::RegisterRequest register_request() const;
  std::string cdi_kind() const { return cfg_.full_name(); }

  // Set by the plugins_registry path when kubelet reports back.
  void set_registry_status(bool registered, const std::string& error);

  // gRPC handler bodies (public so the service adaptor can call them).
  void fill_list(v1beta1::ListAndWatchResponse* out) const;
  bool wait_for_change(uint64_t seen, uint64_t* now_version, int timeout_ms) const;
  bool stopping() const;
  std::string allocate(const v1beta1::AllocateRequest& req, v1beta1::AllocateResponse* resp);
  void prefer(const v1beta1::PreferredAllocationRequest& req,
              v1beta1::PreferredAllocationResponse* resp) const;

 private:
  class Service;
  class RegistryService;

  const ResourceConfig cfg_;
  const std::unique_ptr<DeviceBackend> backend_;
  const ServeOptions opts_;
  Metrics* const metrics_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<PluginDevice> devices_;
  uint64_t version_ = 0;
  bool stopping_ = false;

  std::unique_ptr<Service> service_;
  std::unique_ptr<RegistryService> registry_service_;
  std::unique_ptr<grpc::Server> server_;
  dev_t socket_dev_ = 0;
  ino_t socket_ino_ = 0;
};

}  // namespace ff::dp
