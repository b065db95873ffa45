#include "config.h"

#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace ff::dp {
namespace {

// "a.b.c.d/len": four decimal octets 0-255 and a length 0-32, nothing else.
bool valid_ipv4_prefix(const std::string& text) {
  unsigned a = 0, b = 0, c = 0, d = 0, len = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%3u.%3u.%3u.%3u/%2u%c", &a, &b, &c, &d, &len, &tail) != 5)
    return false;
  return a < 256 && b < 256 && c < 256 && d < 256 && len <= 32 &&
         text.find_first_not_of("0123456789./") == std::string::npos;
}

using nlohmann::json;

[[noreturn]] void fail(const std::string& field, const std::string& why) {
  throw ConfigError(fmt::format("config field '{}': {}", field, why));
}

std::string get_string(const json& obj, const std::string& key, const std::string& path,
                       const std::string& fallback) {
  auto it = obj.find(key);
  if (it == obj.end()) return fallback;
  if (!it->is_string()) fail(path + key, "must be a string");
  return it->get<std::string>();
}

int get_int(const json& obj, const std::string& key, const std::string& path, int fallback, int min,
            int max) {
  auto it = obj.find(key);
  if (it == obj.end()) return fallback;
  if (!it->is_number_integer()) fail(path + key, "must be an integer");
  auto value = it->get<long long>();
  if (value < min || value > max) fail(path + key, fmt::format("must be in [{}, {}]", min, max));
  return static_cast<int>(value);
}

std::vector<std::string> get_strings(const json& obj, const std::string& key,
                                     const std::string& path) {
  std::vector<std::string> out;
  auto it = obj.find(key);
  if (it == obj.end()) return out;
  if (!it->is_array()) fail(path + key, "must be an array of strings");
  for (size_t i = 0; i < it->size(); ++i) {
    if (!(*it)[i].is_string()) fail(fmt::format("{}{}[{}]", path, key, i), "must be a string");
    out.push_back((*it)[i].get<std::string>());
  }
  return out;
}

// Kubernetes extended resource names: DNS-1123-ish prefix and a name of
// alphanumerics, '-', '_' and '.', starting and ending alphanumeric.
bool valid_name_part(const std::string& s, bool allow_dots) {
  if (s.empty() || s.size() > 63) return false;
  auto alnum = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  if (!alnum(s.front()) || !alnum(s.back())) return false;
  for (char c : s) {
    if (alnum(c) || c == '-' || c == '_') continue;
    if (c == '.' && allow_dots) continue;
    return false;
  }
  return true;
}

Mode parse_mode(const std::string& text, const std::string& field) {
  if (text == "hca" || text == "shared") return Mode::kHca;
  if (text == "sriov") return Mode::kSriov;
  if (text == "virtual") return Mode::kVirtual;
  fail(field, fmt::format("unknown mode '{}' (expected hca, sriov or virtual)", text));
}

void check_known_keys(const json& obj, const std::set<std::string>& known,
                      const std::string& path) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (!known.count(it.key())) fail(path + it.key(), "unknown field");
  }
}

Selectors parse_selectors(const json& obj, const std::string& path) {
  Selectors s;
  if (!obj.is_object()) fail(path.substr(0, path.size() - 1), "must be an object");
  check_known_keys(obj, {"vendors", "deviceIDs", "drivers", "ifNames", "linkTypes"}, path);
  s.vendors = get_strings(obj, "vendors", path);
  s.device_ids = get_strings(obj, "deviceIDs", path);
  s.drivers = get_strings(obj, "drivers", path);
  s.if_names = get_strings(obj, "ifNames", path);
  s.link_types = get_strings(obj, "linkTypes", path);
  for (size_t i = 0; i < s.link_types.size(); ++i) {
    std::string& lt = s.link_types[i];
    for (char& c : lt) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lt == "ib") lt = "infiniband";
    if (lt == "ether" || lt == "eth") lt = "ethernet";
    if (lt != "infiniband" && lt != "ethernet")
      fail(fmt::format("{}linkTypes[{}]", path, i), "must be 'infiniband' or 'ethernet'");
  }
  return s;
}

ResourceConfig parse_entry(const json& entry, const std::string& path) {
  if (!entry.is_object()) fail(path.substr(0, path.size() - 1), "must be an object");
  check_known_keys(
      entry,
      {"resourceName", "resourcePrefix", "rdmaHcaMax", "selectors", "mode", "pfNetdevices",
       "virtualDevices", "freeflowDir", "routerName", "containerDir", "tcpModePrefix"},
      path);
  ResourceConfig rc;
  rc.mode = parse_mode(get_string(entry, "mode", path, "hca"), path + "mode");
  if (!entry.contains("resourceName")) fail(path + "resourceName", "is required");
  rc.resource_name = get_string(entry, "resourceName", path, "");
  if (!valid_name_part(rc.resource_name, true))
    fail(path + "resourceName",
         fmt::format("'{}' is not a valid resource name (1-63 of [A-Za-z0-9._-], "
                     "alphanumeric at both ends)",
                     rc.resource_name));
  rc.resource_prefix =
      get_string(entry, "resourcePrefix", path, rc.mode == Mode::kVirtual ? "freeflow" : "rdma");
  if (!valid_name_part(rc.resource_prefix, true) ||
      rc.resource_prefix.find('_') != std::string::npos)
    fail(path + "resourcePrefix", fmt::format("'{}' is not a valid DNS name", rc.resource_prefix));
  if (rc.resource_prefix == "kubernetes.io" || rc.resource_prefix.ends_with(".kubernetes.io"))
    fail(path + "resourcePrefix", "the kubernetes.io domain is reserved");

  rc.rdma_hca_max = get_int(entry, "rdmaHcaMax", path, 1000, 1, 100000);
  if (entry.contains("selectors"))
    rc.selectors = parse_selectors(entry["selectors"], path + "selectors.");
  rc.pf_netdevices = get_strings(entry, "pfNetdevices", path);
  rc.virtual_devices = get_int(entry, "virtualDevices", path, 100, 1, 100000);
  rc.freeflow_dir = get_string(entry, "freeflowDir", path, rc.freeflow_dir);
  rc.router_name = get_string(entry, "routerName", path, rc.router_name);
  rc.container_dir = get_string(entry, "containerDir", path, rc.container_dir);
  rc.tcp_mode_prefix = get_string(entry, "tcpModePrefix", path, "");

  switch (rc.mode) {
    case Mode::kHca:
      if (!rc.pf_netdevices.empty()) fail(path + "pfNetdevices", "only valid with mode sriov");
      break;
    case Mode::kSriov:
      if (rc.pf_netdevices.empty())
        fail(path + "pfNetdevices", "sriov mode needs at least one PF netdevice");
      for (size_t i = 0; i < rc.pf_netdevices.size(); ++i) {
        const auto& n = rc.pf_netdevices[i];
        if (n.empty() || n.find('/') != std::string::npos || n == "." || n == "..")
          fail(fmt::format("{}pfNetdevices[{}]", path, i),
               fmt::format("'{}' is not an interface name", n));
      }
      break;
    case Mode::kVirtual:
      if (rc.freeflow_dir.empty() || rc.freeflow_dir.front() != '/')
        fail(path + "freeflowDir", "must be an absolute path");
      if (rc.container_dir.empty() || rc.container_dir.front() != '/')
        fail(path + "containerDir", "must be an absolute path");
      if (!valid_name_part(rc.router_name, true))
        fail(path + "routerName", fmt::format("'{}' is not a valid router name", rc.router_name));
      if (!rc.tcp_mode_prefix.empty() && !valid_ipv4_prefix(rc.tcp_mode_prefix))
        fail(path + "tcpModePrefix",
             fmt::format("'{}' is not an IPv4 prefix (a.b.c.d/len)", rc.tcp_mode_prefix));
      break;
  }
  if (rc.mode != Mode::kVirtual && !rc.tcp_mode_prefix.empty())
    fail(path + "tcpModePrefix", "only valid with mode virtual");
  return rc;
}

}  // namespace

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::kHca:
      return "hca";
    case Mode::kSriov:
      return "sriov";
    case Mode::kVirtual:
      return "virtual";
  }
  return "?";
}

std::string ResourceConfig::socket_name() const {
  std::string s = "freeflow-" + resource_prefix + "_" + resource_name + ".sock";
  for (char& c : s)
    if (c == '/') c = '_';
  return s;
}

PluginConfig parse_config(const std::string& json_text) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw ConfigError(fmt::format("config is not valid JSON: {}", e.what()));
  }
  if (!root.is_object()) throw ConfigError("config must be a JSON object");

  PluginConfig cfg;
  cfg.periodic_update_interval_s = get_int(root, "periodicUpdateInterval", "", 60, 0, 86400);
  cfg.health_interval =
      std::chrono::milliseconds(get_int(root, "healthCheckIntervalMs", "", 500, 50, 1900));

  const bool legacy = root.contains("mode");
  const bool list = root.contains("configList");
  if (legacy && list) fail("mode", "use either top-level 'mode' or 'configList', not both");
  if (!legacy && !list) fail("configList", "is required (or a top-level 'mode')");

  if (legacy) {
    // Mellanox sriov plugin format, as in the Alibaba Cloud ConfigMap.
    check_known_keys(
        root, {"mode", "pfNetdevices", "periodicUpdateInterval", "healthCheckIntervalMs"}, "");
    if (!root["mode"].is_string()) fail("mode", "must be a string");
    json entry = json::object();
    entry["mode"] = root["mode"];
    entry["resourceName"] = "hca";
    entry["resourcePrefix"] = "rdma";
    if (root.contains("pfNetdevices")) entry["pfNetdevices"] = root["pfNetdevices"];
    ResourceConfig rc = parse_entry(entry, "");
    if (rc.mode == Mode::kVirtual) fail("mode", "virtual mode needs a configList entry");
    cfg.resources.push_back(rc);
  } else {
    check_known_keys(root, {"configList", "periodicUpdateInterval", "healthCheckIntervalMs"}, "");
    const json& listj = root["configList"];
    if (!listj.is_array()) fail("configList", "must be an array");
    if (listj.empty()) fail("configList", "must have at least one entry");
    for (size_t i = 0; i < listj.size(); ++i)
      cfg.resources.push_back(parse_entry(listj[i], fmt::format("configList[{}].", i)));
  }

  std::set<std::string> names;
  for (size_t i = 0; i < cfg.resources.size(); ++i) {
    if (!names.insert(cfg.resources[i].full_name()).second)
      fail(fmt::format("configList[{}].resourceName", i),
           fmt::format("duplicate resource '{}'", cfg.resources[i].full_name()));
  }
  return cfg;
}

PluginConfig load_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("cannot read config file '{}'", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str());
}

}  // namespace ff::dp
