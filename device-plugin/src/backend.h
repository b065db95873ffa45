// Device backends: what each mode advertises and what Allocate hands out.
//
// Threading contract: scan() is called from the daemon's main loop only;
// allocate() and snapshot() may be called concurrently from gRPC threads and
// read the result of the latest scan under a mutex. allocate() throws
// AllocationError for IDs it does not know; nothing else throws.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "config.h"
#include "sysfs.h"

namespace ff::dp {

struct PluginDevice {
  std::string id;
  bool healthy = false;
  std::vector<int> numa_nodes;  // empty: no NUMA affinity known
  std::string pci_group;        // devices with equal non-empty groups share a switch
  bool operator==(const PluginDevice&) const = default;
};

struct DeviceNode {
  std::string host_path;
  std::string container_path;
  std::string permissions;
  bool operator==(const DeviceNode&) const = default;
};

struct MountSpec {
  std::string host_path;
  std::string container_path;
  bool read_only = false;
};

struct ContainerEdits {
  std::vector<DeviceNode> devices;
  std::vector<MountSpec> mounts;
  std::map<std::string, std::string> envs;
};

class AllocationError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual std::vector<PluginDevice> scan() = 0;
  virtual ContainerEdits allocate(const std::vector<std::string>& ids) const = 0;
};

// Where the backends look. host_dev_root is what DeviceSpec.host_path uses
// (the node's /dev), independent of where the daemon itself sees /dev.
struct BackendContext {
  std::shared_ptr<const FileSystem> sys;
  std::shared_ptr<const FileSystem> dev;
  std::string host_dev_root = "/dev";
  // Virtual mode health probe; defaults to connect() on the router socket.
  std::function<bool(const std::string& socket_path)> router_probe;
};

bool selectors_match(const Selectors& s, const RdmaDevice& d);
// "PCIDEVICE_RDMA_HCA_SRIOV" for rdma/hca_sriov, as the SR-IOV network device plugin names it.
std::string pcidevice_env_name(const std::string& full_resource_name);
bool probe_router_socket(const std::string& socket_path);

std::unique_ptr<DeviceBackend> make_backend(const ResourceConfig& cfg, const BackendContext& ctx);

}  // namespace ff::dp
