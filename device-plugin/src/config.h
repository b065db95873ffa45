// Plugin configuration: one ResourceConfig per advertised resource.
//
// Accepted input formats (all JSON):
//   1. Mellanox shared plugin: {"periodicUpdateInterval":N,"configList":[{...}]}
//      Entries may also carry "mode" ("hca" default, "sriov", "virtual").
//   2. Mellanox sriov plugin / Alibaba Cloud ConfigMap: {"mode":"hca"} or
//      {"mode":"sriov","pfNetdevices":[...]}, both advertising rdma/hca.
// parse_config() throws ConfigError whose message names the offending field;
// it never returns a half-valid configuration.
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "freeflow/router_socket.h"

namespace ff::dp {

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Mode { kHca, kSriov, kVirtual };

const char* mode_name(Mode mode);

// Values within one selector are OR'd; selectors are AND'd; an empty selector
// matches everything.
struct Selectors {
  std::vector<std::string> vendors;     // "15b3" (with or without 0x)
  std::vector<std::string> device_ids;  // "1017"
  std::vector<std::string> drivers;     // "mlx5_core"
  std::vector<std::string> if_names;    // netdev names of the PCI function
  std::vector<std::string> link_types;  // "infiniband" | "ethernet" (any port)
};

struct ResourceConfig {
  std::string resource_prefix = "rdma";
  std::string resource_name;
  Mode mode = Mode::kHca;
  // hca mode
  int rdma_hca_max = 1000;
  Selectors selectors;
  // sriov mode
  std::vector<std::string> pf_netdevices;
  // virtual mode
  int virtual_devices = 100;
  std::string freeflow_dir = ff::kDefaultFreeflowDir;  // host folder of the router
  std::string router_name = ff::kDefaultRouterName;    // socket: ff::RouterSocketPath
  std::string container_dir = "/freeflow";             // where pods see the folder
  // TCP mode (docs/tcp-mode.md): when set (a CIDR, the pod network), pods also preload
  // libfsocket.so with VNET_PREFIX set to it.
  std::string tcp_mode_prefix;

  std::string full_name() const { return resource_prefix + "/" + resource_name; }
  // Bare socket file name used in the kubelet folder.
  std::string socket_name() const;
};

struct PluginConfig {
  int periodic_update_interval_s = 60;  // accepted for compatibility, see docs
  std::chrono::milliseconds health_interval{500};
  std::vector<ResourceConfig> resources;
};

PluginConfig parse_config(const std::string& json_text);
PluginConfig load_config_file(const std::string& path);

}  // namespace ff::dp
