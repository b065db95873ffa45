// sysfs_check: reads every sysfs entry a program may read beside the verbs for each device,
// and checks each against what the verbs answer (issue 38). Prints one PASS or FAIL line per
// entry; exits 1 if any failed, 2 if there is no device.
//
// The entries: /sys/class/infiniband/<dev>/{node_type,node_guid,sys_image_guid,fw_ver,
// hw_rev,hca_type,board_id,node_desc}, ports/N/{state,phys_state,rate,lid,sm_lid,sm_sl,
// lid_mask_count,cap_mask,link_layer,gids/I,gid_attrs/types/I,gid_attrs/ndevs/I,pkeys/I},
// the device link and device/{local_cpus,local_cpulist,numa_node}, and
// /sys/class/infiniband_verbs/<uverbs>/{ibdev,dev,abi_version}; the directories list what
// the verbs say they hold; ibv_read_sysfs_file reads the same text.
#include <arpa/inet.h>
#include <dirent.h>
#include <endian.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <net/if.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

// libibverbs exports it (ibv_devinfo reads board_id with it); its header is the providers'.
extern "C" int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size);

namespace {

int g_failures = 0;

void Check(bool ok, const std::string& what, const std::string& detail = "") {
  std::printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", what.c_str(), detail.empty() ? "" : ": ",
              detail.c_str());
  if (!ok) ++g_failures;
}

// The file's text without its one trailing newline; "<missing>" if it cannot be read.
std::string Read(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "<missing>";
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

void Expect(const std::string& path, const std::string& want) {
  const std::string got = Read(path);
  Check(got == want, path, got == want ? got : "'" + got + "', the verbs say '" + want + "'");
}

std::set<std::string> Entries(const std::string& dir) {
  std::set<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
        names.insert(e->d_name);
    closedir(d);
  }
  return names;
}

std::set<std::string> Numbers(int n) {
  std::set<std::string> out;
  for (int i = 0; i < n; ++i) out.insert(std::to_string(i));
  return out;
}

std::string Hex(const char* fmt, unsigned v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string Guid(__be64 guid) {
  const uint64_t g = be64toh(guid);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04x:%04x:%04x:%04x", static_cast<unsigned>(g >> 48) & 0xffff,
                static_cast<unsigned>(g >> 32) & 0xffff, static_cast<unsigned>(g >> 16) & 0xffff,
                static_cast<unsigned>(g) & 0xffff);
  return buf;
}

std::string Gid(const ibv_gid& gid) {
  std::string out;
  for (int i = 0; i < 16; i += 2)
    out += Hex(i == 0 ? "%04x" : ":%04x", static_cast<unsigned>(gid.raw[i] << 8 | gid.raw[i + 1]));
  return out;
}

// The kernel's names and lane counts (drivers/infiniband/core/sysfs.c), written out again
// here rather than shared with the library, so that a mistake in one shows.
std::string Rate(const ibv_port_attr& p) {
  const int w = p.active_width;
  const int lanes = w == 1 ? 1 : w == 2 ? 4 : w == 4 ? 8 : w == 8 ? 12 : w == 16 ? 2 : 0;
  const struct {
    int code;
    int tenths;
    const char* name;
  } kSpeeds[] = {{1, 25, "SDR"},   {2, 50, "DDR"},   {4, 100, "QDR"},  {8, 100, "FDR10"},
                 {16, 140, "FDR"}, {32, 250, "EDR"}, {64, 500, "HDR"}, {128, 1000, "NDR"}};
  int tenths = 25;
  const char* name = "SDR";
  for (const auto& s : kSpeeds) {
    if (s.code == p.active_speed) {
      tenths = s.tenths;
      name = s.name;
    }
  }
  const int total = tenths * lanes;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%d%s Gb/sec (%dX %s)", total / 10, total % 10 ? ".5" : "", lanes,
                name);
  return buf;
}

void CheckPort(ibv_context* ctx, const std::string& dir, uint8_t port) {
  ibv_port_attr p{};
  if (ibv_query_port(ctx, port, &p) != 0) {
    Check(false, dir, "ibv_query_port failed");
    return;
  }
  static const char* const kStates[] = {"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"};
  Expect(dir + "/state", std::to_string(p.state) + ": " + (p.state < 6 ? kStates[p.state] : "?"));
  Check(Read(dir + "/phys_state").rfind(std::to_string(p.phys_state) + ": ", 0) == 0,
        dir + "/phys_state", Read(dir + "/phys_state"));
  Expect(dir + "/rate", Rate(p));
  Expect(dir + "/lid", Hex("0x%x", p.lid));
  Expect(dir + "/sm_lid", Hex("0x%x", p.sm_lid));
  Expect(dir + "/sm_sl", std::to_string(p.sm_sl));
  Expect(dir + "/lid_mask_count", std::to_string(p.lmc));
  Expect(dir + "/cap_mask", Hex("0x%08x", p.port_cap_flags));
  Expect(dir + "/link_layer", p.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand");
  Check(Entries(dir + "/gids") == Numbers(p.gid_tbl_len), dir + "/gids lists the GID table");
  Check(Entries(dir + "/pkeys") == Numbers(p.pkey_tbl_len), dir + "/pkeys lists the P_Key table");
  for (int i = 0; i < p.gid_tbl_len; ++i) {
    const std::string n = std::to_string(i);
    ibv_gid_entry e{};
    if (ibv_query_gid_ex(ctx, port, static_cast<uint32_t>(i), &e, 0) != 0) {
      Check(false, dir + "/gids/" + n, "ibv_query_gid_ex failed");
      continue;
    }
    ibv_gid gid{};
    ibv_query_gid(ctx, port, i, &gid);
    Check(std::memcmp(&gid, &e.gid, sizeof(gid)) == 0, "ibv_query_gid and _ex agree on GID " + n);
    Expect(dir + "/gids/" + n, Gid(e.gid));
    Expect(dir + "/gid_attrs/types/" + n,
           e.gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" : "IB/RoCE v1");
    char ifname[IF_NAMESIZE] = "";
    if (e.ndev_ifindex != 0 && if_indextoname(e.ndev_ifindex, ifname) != nullptr)
      Expect(dir + "/gid_attrs/ndevs/" + n, ifname);
  }
  for (int i = 0; i < p.pkey_tbl_len; ++i) {
    __be16 pkey = 0;
    ibv_query_pkey(ctx, port, i, &pkey);
    Expect(dir + "/pkeys/" + std::to_string(i), Hex("0x%04x", ntohs(pkey)));
  }
}

void CheckDevice(ibv_device* dev) {
  const std::string name = ibv_get_device_name(dev);
  const std::string dir = "/sys/class/infiniband/" + name;
  Check(std::string(dev->ibdev_path) == dir, "ibdev_path is " + dir, dev->ibdev_path);
  Check(Entries("/sys/class/infiniband").count(name) == 1, "/sys/class/infiniband lists " + name);
  ibv_context* ctx = ibv_open_device(dev);
  if (ctx == nullptr) {
    Check(false, name, "ibv_open_device failed");
    return;
  }
  ibv_device_attr a{};
  ibv_query_device(ctx, &a);
  Expect(dir + "/node_type", "1: CA");
  Expect(dir + "/node_guid", Guid(a.node_guid));
  Check(a.node_guid == ibv_get_device_guid(dev), "ibv_get_device_guid is the node GUID");
  Expect(dir + "/sys_image_guid", Guid(a.sys_image_guid));
  Expect(dir + "/fw_ver", a.fw_ver);
  Expect(dir + "/hw_rev", Hex("0x%x", a.hw_ver));
  for (const char* f : {"hca_type", "board_id", "node_desc"}) {
    const std::string text = Read(dir + "/" + f);
    Check(!text.empty() && text != "<missing>", dir + "/" + f, text);
  }
  char buf[64] = "";
  Check(ibv_read_sysfs_file(dev->ibdev_path, "node_guid", buf, sizeof(buf)) > 0 &&
            Guid(a.node_guid) == buf,
        "ibv_read_sysfs_file reads node_guid", buf);
  std::set<std::string> ports;
  for (int p = 1; p <= a.phys_port_cnt; ++p) ports.insert(std::to_string(p));
  Check(Entries(dir + "/ports") == ports, dir + "/ports lists the ports");
  for (int p = 1; p <= a.phys_port_cnt; ++p)
    CheckPort(ctx, dir + "/ports/" + std::to_string(p), static_cast<uint8_t>(p));

  char real[PATH_MAX];
  const bool linked = realpath((dir + "/device").c_str(), real) != nullptr;
  Check(linked, dir + "/device is a link to the device", linked ? real : "");
  const std::string cpus = Read(dir + "/device/local_cpus");
  Check(cpus.find_first_not_of("0123456789abcdef,") == std::string::npos && !cpus.empty(),
        dir + "/device/local_cpus", cpus);
  Expect(dir + "/device/local_cpulist", Read("/sys/devices/system/cpu/online"));
  const std::string numa = Read(dir + "/device/numa_node");
  Check(numa == "-1" || Entries("/sys/devices/system/node").count("node" + numa) == 1,
        dir + "/device/numa_node names a NUMA node or none", numa);

  const std::string uverbs = "/sys/class/infiniband_verbs/" + std::string(dev->dev_name);
  Check(std::string(dev->dev_path) == uverbs, "dev_path is " + uverbs, dev->dev_path);
  Expect(uverbs + "/ibdev", name);
  Expect(uverbs + "/dev", "231:192");
  Check(Read(uverbs + "/abi_version") != "<missing>", uverbs + "/abi_version");
  Check(Read("/sys/class/infiniband_verbs/abi_version") == "6",
        "/sys/class/infiniband_verbs/abi_version is the uverbs ABI 6");
  ibv_close_device(ctx);
}

}  // namespace

int main() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n == 0) {
    std::printf("FAIL no RDMA device\n");
    return 2;
  }
  for (int i = 0; i < n; ++i) CheckDevice(list[i]);
  ibv_free_device_list(list);
  std::printf("%s: %d failed\n", g_failures == 0 ? "PASS" : "FAIL", g_failures);
  return g_failures == 0 ? 0 : 1;
}
