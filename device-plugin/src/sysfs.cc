#include "sysfs.h"

#include <dirent.h>
#include <limits.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

namespace ff::dp {
namespace {

// Rescans run every few hundred milliseconds; a broken file would otherwise
// flood the log with the same line.
void warn_once(const std::string& message) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  if (seen.size() < 4096 && seen.insert(message).second) spdlog::warn("sysfs: {}", message);
}

std::string basename_of(const std::string& path) {
  auto pos = path.find_last_of('/');
  return pos == std::string::npos ? path : path.substr(pos + 1);
}

std::string dirname_of(const std::string& path) {
  auto pos = path.find_last_of('/');
  return pos == std::string::npos || pos == 0 ? "/" : path.substr(0, pos);
}

bool looks_like_pci_address(const std::string& s) {
  // dddd:bb:dd.f
  if (s.size() != 12) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (i == 4 || i == 7) {
      if (c != ':') return false;
    } else if (i == 10) {
      if (c != '.') return false;
    } else if (!std::isxdigit(static_cast<unsigned char>(c))) {
      return false;
    }
  }
  return true;
}

std::string strip_hex_prefix(std::string s) {
  if (s.starts_with("0x") || s.starts_with("0X")) s = s.substr(2);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

RootedFileSystem::RootedFileSystem(std::string root) : root_(std::move(root)) {
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
  if (root_ == "/") root_.clear();
}

std::optional<std::string> RootedFileSystem::read_file(const std::string& path) const {
  std::ifstream in(root_ + path);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return std::nullopt;
  std::string s = ss.str();
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

std::vector<std::string> RootedFileSystem::list_dir(const std::string& path) const {
  std::vector<std::string> out;
  DIR* d = ::opendir((root_ + path).c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(std::move(name));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

bool RootedFileSystem::exists(const std::string& path) const {
  struct stat st;
  return ::stat((root_ + path).c_str(), &st) == 0;
}

std::optional<std::string> RootedFileSystem::resolve(const std::string& path) const {
  char buf[PATH_MAX];
  if (::realpath((root_ + path).c_str(), buf) == nullptr) return std::nullopt;
  std::string full = buf;
  if (root_.empty()) return full;
  char rootbuf[PATH_MAX];
  if (::realpath(root_.c_str(), rootbuf) == nullptr) return std::nullopt;
  std::string root = rootbuf;
  if (full.compare(0, root.size(), root) != 0) return std::nullopt;  // escaped the root
  std::string rest = full.substr(root.size());
  return rest.empty() ? "/" : rest;
}

bool RdmaDevice::any_port_active() const {
  return std::any_of(ports.begin(), ports.end(),
                     [](const RdmaPort& p) { return p.state == PortState::kActive; });
}

std::optional<int> parse_numa_node(const std::string& text) {
  if (text.empty()) return std::nullopt;
  size_t i = text[0] == '-' ? 1 : 0;
  if (i == text.size() || text.size() > 6) return std::nullopt;
  for (size_t j = i; j < text.size(); ++j)
    if (!std::isdigit(static_cast<unsigned char>(text[j]))) return std::nullopt;
  int value = std::stoi(text);
  if (value < 0) return std::nullopt;
  return value;
}

PortState parse_port_state(const std::string& text) {
  // "4: ACTIVE": the number is authoritative, the word is for humans.
  size_t colon = text.find(':');
  std::string num = text.substr(0, colon);
  if (num.size() != 1 || num[0] < '1' || num[0] > '5') return PortState::kUnknown;
  return static_cast<PortState>(num[0] - '0');
}

void SysfsDiscovery::fill_pci(const std::string& bdf, std::optional<int>* numa,
                              std::string* parent) const {
  const std::string base = "/bus/pci/devices/" + bdf;
  if (auto text = sys_.read_file(base + "/numa_node")) {
    *numa = parse_numa_node(*text);
    if (!numa->has_value() && *text != "-1")
      warn_once(bdf + "/numa_node is malformed ('" + *text + "'), treating as unknown");
  }
  if (auto canonical = sys_.resolve(base)) {
    std::string up = dirname_of(*canonical);
    // Functions behind the same bridge/switch port share this parent.
    if (looks_like_pci_address(basename_of(up))) *parent = up;
  }
}

RdmaDevice SysfsDiscovery::describe(const std::string& ibdev) const {
  RdmaDevice d;
  d.name = ibdev;
  const std::string base = "/class/infiniband/" + ibdev;
  if (auto pci = sys_.resolve(base + "/device")) {
    std::string bdf = basename_of(*pci);
    if (looks_like_pci_address(bdf)) d.pci_address = bdf;
  }
  if (!d.pci_address.empty()) {
    const std::string pci = "/bus/pci/devices/" + d.pci_address;
    d.vendor = strip_hex_prefix(sys_.read_file(pci + "/vendor").value_or(""));
    d.device_id = strip_hex_prefix(sys_.read_file(pci + "/device").value_or(""));
    if (auto drv = sys_.resolve(pci + "/driver")) d.driver = basename_of(*drv);
    d.netdevs = sys_.list_dir(pci + "/net");
    fill_pci(d.pci_address, &d.numa_node, &d.pci_parent);
  }

  for (const auto& p : sys_.list_dir(base + "/ports")) {
    RdmaPort port;
    try {
      port.number = std::stoi(p);
    } catch (const std::exception&) {
      warn_once(ibdev + ": ignoring port entry '" + p + "'");
      continue;
    }
    const std::string pb = base + "/ports/" + p;
    auto state = sys_.read_file(pb + "/state");
    port.state = state ? parse_port_state(*state) : PortState::kUnknown;
    if (state && port.state == PortState::kUnknown)
      warn_once(ibdev + " port " + p + ": malformed state '" + *state + "'");
    std::string ll = sys_.read_file(pb + "/link_layer").value_or("");
    for (char& c : ll) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (ll == "infiniband" || ll == "ethernet") port.link_layer = ll;
    d.ports.push_back(port);
  }
  std::sort(d.ports.begin(), d.ports.end(),
            [](const RdmaPort& a, const RdmaPort& b) { return a.number < b.number; });

  // Character devices: uverbs from infiniband_verbs, umad/issm from
  // infiniband_mad; each kept only if its /dev node exists, so a missing
  // optional node (issm is the usual one) never hides the rest.
  std::vector<std::string> names;
  for (const auto& cls : {"/class/infiniband_verbs/", "/class/infiniband_mad/"}) {
    for (const auto& n : sys_.list_dir(cls)) {
      if (sys_.read_file(std::string(cls) + n + "/ibdev").value_or("") == ibdev) names.push_back(n);
    }
  }
  for (const auto& n : names) {
    if (dev_.exists("/infiniband/" + n)) d.char_devices.push_back(n);
  }
  return d;
}

std::vector<RdmaDevice> SysfsDiscovery::rdma_devices() const {
  std::vector<RdmaDevice> out;
  for (const auto& name : sys_.list_dir("/class/infiniband")) out.push_back(describe(name));
  return out;
}

std::optional<std::vector<VirtualFunction>> SysfsDiscovery::virtual_functions(
    const std::string& pf_netdev, std::string* error) const {
  auto pf = sys_.resolve("/class/net/" + pf_netdev + "/device");
  if (!pf) {
    *error = "PF netdevice '" + pf_netdev + "' not found";
    return std::nullopt;
  }
  const std::string pf_bdf = basename_of(*pf);
  const std::string pci = "/bus/pci/devices/" + pf_bdf;
  if (!sys_.exists(pci + "/sriov_totalvfs")) {
    *error = "PF '" + pf_netdev + "' (" + pf_bdf + ") has no SR-IOV capability";
    return std::nullopt;
  }
  // Map every RDMA device to its PCI function once, then attach to VFs.
  std::map<std::string, std::vector<std::string>> ib_by_bdf;
  for (const auto& name : sys_.list_dir("/class/infiniband")) {
    if (auto p = sys_.resolve("/class/infiniband/" + name + "/device"))
      ib_by_bdf[basename_of(*p)].push_back(name);
  }
  std::vector<std::pair<int, VirtualFunction>> numbered;
  for (const auto& entry : sys_.list_dir(pci)) {
    if (!entry.starts_with("virtfn")) continue;
    int index = 0;
    try {
      index = std::stoi(entry.substr(6));
    } catch (const std::exception&) {
      continue;
    }
    auto vf_path = sys_.resolve(pci + "/" + entry);
    if (!vf_path) continue;  // dangling link: VF is going away
    VirtualFunction vf;
    vf.pci_address = basename_of(*vf_path);
    vf.pf_netdev = pf_netdev;
    fill_pci(vf.pci_address, &vf.numa_node, &vf.pci_parent);
    for (const auto& ib : ib_by_bdf[vf.pci_address]) vf.rdma.push_back(describe(ib));
    numbered.emplace_back(index, std::move(vf));
  }
  std::sort(numbered.begin(), numbered.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<VirtualFunction> out;
  for (auto& [i, vf] : numbered) out.push_back(std::move(vf));
  return out;
}

bool SysfsDiscovery::rdma_cm_present() const { return dev_.exists("/infiniband/rdma_cm"); }

}  // namespace ff::dp
