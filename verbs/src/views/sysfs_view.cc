#include "views/sysfs_view.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "files/virtual_files.h"
#include "views/device_facts.h"

namespace ff::verbs {
namespace {

constexpr const char* kUverbsAbiVersion = "6";     // /sys/class/infiniband_verbs/abi_version
constexpr const char* kUverbsDevAbiVersion = "1";  // per device
constexpr const char* kUverbsDev = "231:192";      // IB_UVERBS_MAJOR:IB_UVERBS_BASE_MINOR

std::string Format(const char* fmt, auto... args) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

// "xxxx:xxxx:xxxx:xxxx" from a GUID in network order.
std::string GuidText(__be64 guid) {
  uint8_t b[8];
  std::memcpy(b, &guid, sizeof(b));
  return Format("%02x%02x:%02x%02x:%02x%02x:%02x%02x", b[0], b[1], b[2], b[3], b[4], b[5], b[6],
                b[7]);
}

// Eight groups of four hex digits, uncompressed (the kernel's %pI6).
std::string GidText(const ibv_gid& gid) {
  std::string out;
  for (int i = 0; i < 16; i += 2) {
    if (i != 0) out += ':';
    out += Format("%02x%02x", gid.raw[i], gid.raw[i + 1]);
  }
  return out;
}

std::string StateText(int state) {
  static const char* const kNames[] = {"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"};
  const char* name = state >= 0 && state < 6 ? kNames[state] : "UNKNOWN";
  return Format("%d: %s", state, name);
}

std::string PhysStateText(int phys) {
  static const char* const kNames[] = {
      "<unknown>",         "Sleep",   "Polling", "Disabled", "PortConfigurationTraining", "LinkUp",
      "LinkErrorRecovery", "Phy Test"};
  return Format("%d: %s", phys, phys >= 0 && phys < 8 ? kNames[phys] : "<unknown>");
}

std::string ReadLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The number of the one NUMA node, or -1 when there are several or none to tell.
int NumaNode() {
  DIR* d = ::opendir("/sys/devices/system/node");
  if (d == nullptr) return -1;
  int node = -1;
  int count = 0;
  while (const dirent* e = ::readdir(d)) {
    int n;
    char tail;
    if (std::sscanf(e->d_name, "node%d%c", &n, &tail) == 1) {
      node = n;
      ++count;
    }
  }
  ::closedir(d);
  return count == 1 ? node : -1;
}

// The highest CPU number in a list such as "0-3,8", plus one; 0 if malformed.
unsigned CpuCount(const std::string& list) {
  unsigned top = 0;
  const char* p = list.c_str();
  while (*p != '\0') {
    unsigned a = 0, b = 0;
    int used = 0;
    if (std::sscanf(p, "%u-%u%n", &a, &b, &used) == 2 || std::sscanf(p, "%u%n", &b, &used) == 1) {
      if (b + 1 > top) top = b + 1;
      p += used;
      if (*p == ',') ++p;
    } else {
      return 0;
    }
  }
  return top;
}

void AddPort(vfs::Tree* t, const std::string& dir, const DeviceFacts& a) {
  const ibv_port_attr& p = a.port;
  t->AddFile(dir + "/state", StateText(p.state) + "\n");
  t->AddFile(dir + "/phys_state", PhysStateText(p.phys_state) + "\n");
  t->AddFile(dir + "/rate", RateText(p.active_speed, p.active_width) + "\n");
  t->AddFile(dir + "/lid", Format("0x%x\n", p.lid));
  t->AddFile(dir + "/sm_lid", Format("0x%x\n", p.sm_lid));
  t->AddFile(dir + "/sm_sl", Format("%u\n", p.sm_sl));
  t->AddFile(dir + "/lid_mask_count", Format("%u\n", p.lmc));
  t->AddFile(dir + "/cap_mask", Format("0x%08x\n", p.port_cap_flags));
  t->AddFile(dir + "/link_layer",
             p.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet\n" : "InfiniBand\n");
  for (size_t i = 0; i < a.gids.size(); ++i) {
    const ibv_gid_entry& e = a.gids[i];
    const std::string n = std::to_string(i);
    t->AddFile(dir + "/gids/" + n, GidText(e.gid) + "\n");
    t->AddFile(dir + "/gid_attrs/types/" + n,
               e.gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2\n" : "IB/RoCE v1\n");
    char ifname[IF_NAMESIZE] = "";
    if (e.ndev_ifindex != 0 && ::if_indextoname(e.ndev_ifindex, ifname) != nullptr)
      t->AddFile(dir + "/gid_attrs/ndevs/" + n, std::string(ifname) + "\n");
  }
  for (size_t i = 0; i < a.pkeys.size(); ++i)
    t->AddFile(dir + "/pkeys/" + std::to_string(i), Format("0x%04x\n", a.pkeys[i]));
}

std::shared_ptr<const vfs::Tree> Build() {
  DeviceFacts a;
  if (!QueryDeviceFacts(&a)) return nullptr;
  auto t = std::make_shared<vfs::Tree>();
  const std::string parent = "/sys/devices/virtual/freeflow/" + a.name;
  const std::string ib = parent + "/infiniband/" + a.name;
  const std::string uverbs = parent + "/infiniband_verbs/" + a.uverbs;
  const ibv_device_attr& d = a.device;

  t->AddLink("/sys/class/infiniband/" + a.name,
             "../../devices/virtual/freeflow/" + a.name + "/infiniband/" + a.name);
  t->AddFile(ib + "/node_type", "1: CA\n");
  t->AddFile(ib + "/node_guid", GuidText(d.node_guid) + "\n");
  t->AddFile(ib + "/sys_image_guid", GuidText(d.sys_image_guid) + "\n");
  t->AddFile(ib + "/fw_ver", std::string(d.fw_ver) + "\n");
  t->AddFile(ib + "/hw_rev", Format("0x%x\n", d.hw_ver));
  t->AddFile(ib + "/hca_type",
             d.vendor_id == 0x02c9 ? Format("MT%u\n", d.vendor_part_id) : "freeflow\n");
  t->AddFile(ib + "/board_id", "FREEFLOW_VIRTUAL\n");
  char host[256] = "";
  ::gethostname(host, sizeof(host) - 1);
  t->AddFile(ib + "/node_desc", std::string(host) + " " + a.name + "\n");
  t->AddLink(ib + "/device", "../../../" + a.name);
  AddPort(t.get(), ib + "/ports/1", a);

  const std::string online = ReadLine("/sys/devices/system/cpu/online");
  const unsigned possible = CpuCount(ReadLine("/sys/devices/system/cpu/possible"));
  t->AddFile(parent + "/local_cpulist", online + "\n");
  t->AddFile(parent + "/local_cpus", CpuMaskText(online, possible) + "\n");
  t->AddFile(parent + "/numa_node", Format("%d\n", NumaNode()));

  t->AddLink("/sys/class/infiniband_verbs/" + a.uverbs,
             "../../devices/virtual/freeflow/" + a.name + "/infiniband_verbs/" + a.uverbs);
  t->AddFile("/sys/class/infiniband_verbs/abi_version", std::string(kUverbsAbiVersion) + "\n");
  t->AddFile(uverbs + "/ibdev", a.name + "\n");
  t->AddFile(uverbs + "/abi_version", std::string(kUverbsDevAbiVersion) + "\n");
  t->AddFile(uverbs + "/dev", std::string(kUverbsDev) + "\n");
  t->AddLink(uverbs + "/device", "../../../" + a.name);
  return t;
}

__attribute__((constructor)) void InstallSysfsView() {
  vfs::SetBuilder(&BuildSysfsView, SysfsRoots());
}

}  // namespace

std::shared_ptr<const vfs::Tree> BuildSysfsView() { return Build(); }

std::vector<std::string> SysfsRoots() {
  return {"/sys/class/infiniband", "/sys/class/infiniband_verbs", "/sys/devices/virtual/freeflow"};
}

std::string RateText(uint8_t active_speed, uint8_t active_width) {
  const char* speed = " SDR";
  int rate = 25;  // in 100 Mb/s per lane; anything unknown is SDR, as in the kernel
  switch (active_speed) {
    case 2:
      speed = " DDR";
      rate = 50;
      break;
    case 4:
      speed = " QDR";
      rate = 100;
      break;
    case 8:
      speed = " FDR10";
      rate = 100;
      break;
    case 16:
      speed = " FDR";
      rate = 140;
      break;
    case 32:
      speed = " EDR";
      rate = 250;
      break;
    case 64:
      speed = " HDR";
      rate = 500;
      break;
    case 128:
      speed = " NDR";
      rate = 1000;
      break;
    default:
      break;
  }
  int lanes = -1;
  switch (active_width) {
    case 1:
      lanes = 1;
      break;
    case 2:
      lanes = 4;
      break;
    case 4:
      lanes = 8;
      break;
    case 8:
      lanes = 12;
      break;
    case 16:
      lanes = 2;
      break;
    default:
      break;
  }
  if (lanes < 0) return "";  // the kernel fails the read (EINVAL)
  rate *= lanes;
  return Format("%d%s Gb/sec (%dX%s)", rate / 10, rate % 10 != 0 ? ".5" : "", lanes, speed);
}

std::string CpuMaskText(const std::string& cpulist, unsigned bits) {
  std::vector<uint32_t> words((bits + 31) / 32, 0);
  if (words.empty()) return "";
  const char* p = cpulist.c_str();
  while (*p != '\0') {
    unsigned a = 0, b = 0;
    int used = 0;
    if (std::sscanf(p, "%u-%u%n", &a, &b, &used) != 2) {
      if (std::sscanf(p, "%u%n", &a, &used) != 1) return "";
      b = a;
    }
    if (a > b || b >= bits) return "";
    for (unsigned c = a; c <= b; ++c) words[c / 32] |= 1u << (c % 32);
    p += used;
    if (*p == ',') ++p;
  }
  // The top word has as many hex digits as its bits need; the others eight.
  const unsigned top_bits = bits % 32 == 0 ? 32 : bits % 32;
  std::string out = Format("%0*x", static_cast<int>((top_bits + 3) / 4), words.back());
  for (size_t i = words.size() - 1; i-- > 0;) out += Format(",%08x", words[i]);
  return out;
}

}  // namespace ff::verbs
