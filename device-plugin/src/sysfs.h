// Read-only view of sysfs and /dev, and RDMA discovery on top of it.
//
// FileSystem is the seam: RootedFileSystem maps "/class/infiniband" onto
// <root>/class/infiniband, so unit tests point it at a fixture tree and run
// without root. Every reader tolerates missing and malformed files: a bad file
// degrades one attribute (logged once), never the whole scan.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ff::dp {

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // File contents with trailing whitespace removed; nullopt if unreadable.
  virtual std::optional<std::string> read_file(const std::string& path) const = 0;
  // Sorted entry names (no "." / ".."); empty if the directory is missing.
  virtual std::vector<std::string> list_dir(const std::string& path) const = 0;
  virtual bool exists(const std::string& path) const = 0;
  // Path (inside the root) that `path` resolves to after following links.
  virtual std::optional<std::string> resolve(const std::string& path) const = 0;
};

class RootedFileSystem final : public FileSystem {
 public:
  explicit RootedFileSystem(std::string root);
  std::optional<std::string> read_file(const std::string& path) const override;
  std::vector<std::string> list_dir(const std::string& path) const override;
  bool exists(const std::string& path) const override;
  std::optional<std::string> resolve(const std::string& path) const override;
  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

// Port states as the kernel numbers them in ports/<n>/state.
enum class PortState {
  kUnknown = 0,
  kDown = 1,
  kInit = 2,
  kArmed = 3,
  kActive = 4,
  kActiveDefer = 5
};

struct RdmaPort {
  int number = 0;
  PortState state = PortState::kUnknown;
  std::string link_layer;  // lower case: "infiniband", "ethernet" or "" if unknown
};

// One RDMA device (an entry of /sys/class/infiniband), i.e. one PCI function.
struct RdmaDevice {
  std::string name;         // mlx5_0
  std::string pci_address;  // 0000:3b:00.0 ("" if not a PCI device)
  std::string vendor;       // "15b3" (no 0x)
  std::string device_id;    // "1017"
  std::string driver;       // "mlx5_core"
  std::vector<std::string> netdevs;
  std::optional<int> numa_node;  // nullopt when sysfs says -1 or is unreadable
  std::string pci_parent;        // bridge/switch port above the function ("" unknown)
  std::vector<RdmaPort> ports;
  // Names under /dev/infiniband that exist for this device: uverbsN, umadN, issmN.
  std::vector<std::string> char_devices;

  bool any_port_active() const;
};

struct VirtualFunction {
  std::string pci_address;
  std::string pf_netdev;
  std::optional<int> numa_node;
  std::string pci_parent;
  std::vector<RdmaDevice> rdma;  // RDMA devices bound to the VF (usually one)
};

std::optional<int> parse_numa_node(const std::string& text);
PortState parse_port_state(const std::string& text);

class SysfsDiscovery {
 public:
  // `sys` is rooted at the sysfs mount, `dev` at the /dev mount.
  SysfsDiscovery(const FileSystem& sys, const FileSystem& dev) : sys_(sys), dev_(dev) {}

  std::vector<RdmaDevice> rdma_devices() const;
  // VFs of the PF behind `pf_netdev`; nullopt (with *error set) when the PF
  // is missing or has no SR-IOV capability.
  std::optional<std::vector<VirtualFunction>> virtual_functions(const std::string& pf_netdev,
                                                                std::string* error) const;
  bool rdma_cm_present() const;

 private:
  RdmaDevice describe(const std::string& ibdev) const;
  void fill_pci(const std::string& bdf, std::optional<int>* numa, std::string* parent) const;

  const FileSystem& sys_;
  const FileSystem& dev_;
};

}  // namespace ff::dp
