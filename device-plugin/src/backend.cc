#include "backend.h"

#include <errno.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "freeflow/router_socket.h"

namespace ff::dp {
namespace {

std::string normalize_hex(std::string s) {
  if (s.starts_with("0x") || s.starts_with("0X")) s = s.substr(2);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

template <typename Pred>
bool any_or_empty(const std::vector<std::string>& wanted, Pred pred) {
  return wanted.empty() || std::any_of(wanted.begin(), wanted.end(), pred);
}

DeviceNode char_node(const std::string& host_dev_root, const std::string& name) {
  return {host_dev_root + "/infiniband/" + name, "/dev/infiniband/" + name, "rwm"};
}

void add_unique(std::vector<DeviceNode>* nodes, DeviceNode node) {
  if (std::find(nodes->begin(), nodes->end(), node) == nodes->end())
    nodes->push_back(std::move(node));
}

// Shared HCA mode: rdmaHcaMax interchangeable IDs, each giving every char
// device of every matched HCA.
class HcaBackend final : public DeviceBackend {
 public:
  HcaBackend(ResourceConfig cfg, BackendContext ctx) : cfg_(std::move(cfg)), ctx_(std::move(ctx)) {}

  std::vector<PluginDevice> scan() override {
    SysfsDiscovery disc(*ctx_.sys, *ctx_.dev);
    std::vector<DeviceNode> nodes;
    bool healthy = false;
    std::set<int> numa;
    std::set<std::string> groups;
    size_t matched = 0;
    for (const auto& d : disc.rdma_devices()) {
      if (!selectors_match(cfg_.selectors, d)) continue;
      ++matched;
      healthy = healthy || d.any_port_active();
      if (d.numa_node) numa.insert(*d.numa_node);
      groups.insert(d.pci_parent);
      for (const auto& c : d.char_devices) add_unique(&nodes, char_node(ctx_.host_dev_root, c));
    }
    if (disc.rdma_cm_present()) add_unique(&nodes, char_node(ctx_.host_dev_root, "rdma_cm"));
    // Without a verbs device there is nothing a pod could use.
    bool has_verbs = std::any_of(nodes.begin(), nodes.end(), [](const DeviceNode& n) {
      return n.container_path.find("/uverbs") != std::string::npos;
    });
    healthy = healthy && has_verbs;
    if (matched != last_matched_) {
      spdlog::info("{}: {} HCA(s) match the selectors", cfg_.full_name(), matched);
      last_matched_ = matched;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      nodes_ = nodes;
    }
    std::vector<PluginDevice> out;
    out.reserve(cfg_.rdma_hca_max);
    std::string group = groups.size() == 1 ? *groups.begin() : "";
    for (int i = 0; i < cfg_.rdma_hca_max; ++i) {
      out.push_back({fmt::format("hca-{}", i), healthy && matched > 0,
                     std::vector<int>(numa.begin(), numa.end()), group});
    }
    return out;
  }

  ContainerEdits allocate(const std::vector<std::string>& ids) const override {
    for (const auto& id : ids) {
      if (!valid_id(id)) throw AllocationError(fmt::format("unknown device ID '{}'", id));
    }
    ContainerEdits edits;
    std::lock_guard<std::mutex> lock(mu_);
    edits.devices = nodes_;
    return edits;
  }

 private:
  bool valid_id(const std::string& id) const {
    if (!id.starts_with("hca-") || id.size() > 10) return false;
    std::string n = id.substr(4);
    if (n.empty() || !std::all_of(n.begin(), n.end(), ::isdigit)) return false;
    return std::stoi(n) < cfg_.rdma_hca_max;
  }

  const ResourceConfig cfg_;
  const BackendContext ctx_;
  size_t last_matched_ = static_cast<size_t>(-1);
  mutable std::mutex mu_;
  std::vector<DeviceNode> nodes_;
};

// SR-IOV mode: one device per VF, its PCI address as ID.
class SriovBackend final : public DeviceBackend {
 public:
  SriovBackend(ResourceConfig cfg, BackendContext ctx)
      : cfg_(std::move(cfg)), ctx_(std::move(ctx)) {}

  std::vector<PluginDevice> scan() override {
    SysfsDiscovery disc(*ctx_.sys, *ctx_.dev);
    std::map<std::string, std::vector<std::string>> vf_nodes;
    std::vector<PluginDevice> out;
    for (const auto& pf : cfg_.pf_netdevices) {
      std::string error;
      auto vfs = disc.virtual_functions(pf, &error);
      if (!vfs) {
        if (last_error_[pf] != error) spdlog::warn("{}: {}", cfg_.full_name(), error);
        last_error_[pf] = error;
        continue;
      }
      last_error_[pf].clear();
      for (const auto& vf : *vfs) {
        bool healthy = !vf.rdma.empty();
        std::vector<std::string> names;
        for (const auto& d : vf.rdma) {
          healthy = healthy && d.any_port_active();
          names.insert(names.end(), d.char_devices.begin(), d.char_devices.end());
        }
        // A VF that cannot open verbs is useless to an RDMA pod.
        healthy = healthy && std::any_of(names.begin(), names.end(), [](const std::string& n) {
                    return n.starts_with("uverbs");
                  });
        PluginDevice dev{vf.pci_address, healthy, {}, vf.pci_parent};
        if (vf.numa_node) dev.numa_nodes.push_back(*vf.numa_node);
        out.push_back(std::move(dev));
        vf_nodes[vf.pci_address] = std::move(names);
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    vf_nodes_ = std::move(vf_nodes);
    rdma_cm_ = disc.rdma_cm_present();
    return out;
  }

  ContainerEdits allocate(const std::vector<std::string>& ids) const override {
    ContainerEdits edits;
    nlohmann::json info = nlohmann::json::object();
    std::string list;
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& id : ids) {
      auto it = vf_nodes_.find(id);
      if (it == vf_nodes_.end()) throw AllocationError(fmt::format("unknown VF '{}'", id));
      nlohmann::json rdma = nlohmann::json::object();
      for (const auto& n : it->second) {
        add_unique(&edits.devices, char_node(ctx_.host_dev_root, n));
        std::string kind = n.starts_with("uverbs") ? "uverbs"
                           : n.starts_with("umad") ? "umad"
                                                   : "issm";
        rdma[kind] = "/dev/infiniband/" + n;
      }
      if (rdma_cm_) rdma["rdma_cm"] = "/dev/infiniband/rdma_cm";
      info[id] = {{"generic", {{"deviceID", id}}}, {"rdma", rdma}};
      if (!list.empty()) list += ",";
      list += id;
    }
    // RDMA_CM is what SR-IOV mode usually forgets (sriov-dp #22).
    if (rdma_cm_) add_unique(&edits.devices, char_node(ctx_.host_dev_root, "rdma_cm"));
    const std::string env = pcidevice_env_name(cfg_.full_name());
    edits.envs[env] = list;
    edits.envs[env + "_INFO"] = info.dump();
    return edits;
  }

 private:
  const ResourceConfig cfg_;
  const BackendContext ctx_;
  std::map<std::string, std::string> last_error_;
  mutable std::mutex mu_;
  std::map<std::string, std::vector<std::string>> vf_nodes_;
  bool rdma_cm_ = false;
};

// Virtual mode: N devices backed by the node's freeflow router.
class VirtualBackend final : public DeviceBackend {
 public:
  VirtualBackend(ResourceConfig cfg, BackendContext ctx)
      : cfg_(std::move(cfg)), ctx_(std::move(ctx)) {
    socket_path_ = ff::RouterSocketPath(cfg_.freeflow_dir, cfg_.router_name);
  }

  std::vector<PluginDevice> scan() override {
    bool up =
        ctx_.router_probe ? ctx_.router_probe(socket_path_) : probe_router_socket(socket_path_);
    if (up != last_up_) {
      if (up)
        spdlog::info("{}: router at {} answers", cfg_.full_name(), socket_path_);
      else
        spdlog::warn("{}: router at {} does not answer", cfg_.full_name(), socket_path_);
      last_up_ = up;
    }
    std::vector<PluginDevice> out;
    out.reserve(cfg_.virtual_devices);
    for (int i = 0; i < cfg_.virtual_devices; ++i)
      out.push_back({fmt::format("vrdma-{}", i), up, {}, ""});
    return out;
  }

  ContainerEdits allocate(const std::vector<std::string>& ids) const override {
    for (const auto& id : ids) {
      bool ok = id.starts_with("vrdma-") && id.size() > 6 && id.size() < 13 &&
                std::all_of(id.begin() + 6, id.end(), ::isdigit) &&
                std::stoi(id.substr(6)) < cfg_.virtual_devices;
      if (!ok) throw AllocationError(fmt::format("unknown device ID '{}'", id));
    }
    ContainerEdits edits;
    // Read-only: a pod that could write the folder could replace the library later pods
    // load or the socket they connect to. Pods only connect() to the socket, which a
    // read-only mount allows.
    edits.mounts.push_back({cfg_.freeflow_dir, cfg_.container_dir, true});
    edits.envs["LD_PRELOAD"] = cfg_.container_dir + "/libffverbs.so";
    edits.envs["FFR_NAME"] = cfg_.router_name;
    if (!cfg_.tcp_mode_prefix.empty()) {  // TCP mode (docs/tcp-mode.md)
      edits.envs["LD_PRELOAD"] += " " + cfg_.container_dir + "/libfsocket.so";
      edits.envs["VNET_PREFIX"] = cfg_.tcp_mode_prefix;
    }
    return edits;
  }

 private:
  const ResourceConfig cfg_;
  const BackendContext ctx_;
  std::string socket_path_;
  std::optional<bool> last_up_;
};

}  // namespace

bool selectors_match(const Selectors& s, const RdmaDevice& d) {
  const std::string vendor = normalize_hex(d.vendor);
  const std::string device = normalize_hex(d.device_id);
  return any_or_empty(s.vendors,
                      [&](const std::string& v) { return normalize_hex(v) == vendor; }) &&
         any_or_empty(s.device_ids,
                      [&](const std::string& v) { return normalize_hex(v) == device; }) &&
         any_or_empty(s.drivers, [&](const std::string& v) { return v == d.driver; }) &&
         any_or_empty(s.if_names,
                      [&](const std::string& v) {
                        return std::find(d.netdevs.begin(), d.netdevs.end(), v) != d.netdevs.end();
                      }) &&
         any_or_empty(s.link_types, [&](const std::string& v) {
           return std::any_of(d.ports.begin(), d.ports.end(),
                              [&](const RdmaPort& p) { return p.link_layer == v; });
         });
}

std::string pcidevice_env_name(const std::string& full_resource_name) {
  std::string out = "PCIDEVICE_";
  for (char c : full_resource_name) {
    out += std::isalnum(static_cast<unsigned char>(c))
               ? static_cast<char>(std::toupper(static_cast<unsigned char>(c)))
               : '_';
  }
  return out;
}

bool probe_router_socket(const std::string& socket_path) {
  sockaddr_un addr{};
  if (socket_path.size() >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  std::copy(socket_path.begin(), socket_path.end(), addr.sun_path);
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  // EAGAIN: the listen backlog is full, so the router is alive but busy.
  bool up = rc == 0 || errno == EAGAIN || errno == EINPROGRESS;
  ::close(fd);
  return up;
}

std::unique_ptr<DeviceBackend> make_backend(const ResourceConfig& cfg, const BackendContext& ctx) {
  switch (cfg.mode) {
    case Mode::kHca:
      return std::make_unique<HcaBackend>(cfg, ctx);
    case Mode::kSriov:
      return std::make_unique<SriovBackend>(cfg, ctx);
    case Mode::kVirtual:
      return std::make_unique<VirtualBackend>(cfg, ctx);
  }
  return nullptr;
}

}  // namespace ff::dp
