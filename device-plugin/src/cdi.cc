#include "cdi.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ff::dp {

std::string cdi_device_name(const std::string& device_id) {
  std::string out = device_id;
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') c = '-';
  }
  return out;
}

std::string cdi_qualified_name(const std::string& kind, const std::string& device_id) {
  return kind + "=" + cdi_device_name(device_id);
}

std::string render_cdi_spec(const std::string& kind, const std::vector<PluginDevice>& devices,
                            const DeviceBackend& backend) {
  nlohmann::json spec;
  spec["cdiVersion"] = "0.5.0";
  spec["kind"] = kind;
  nlohmann::json list = nlohmann::json::array();
  for (const auto& d : devices) {
    ContainerEdits edits;
    try {
      edits = backend.allocate({d.id});
    } catch (const AllocationError&) {
      continue;
    }
    nlohmann::json e = nlohmann::json::object();
    if (!edits.devices.empty()) {
      e["deviceNodes"] = nlohmann::json::array();
      for (const auto& n : edits.devices)
        e["deviceNodes"].push_back({{"path", n.container_path},
                                    {"hostPath", n.host_path},
                                    {"permissions", n.permissions}});
    }
    if (!edits.mounts.empty()) {
      e["mounts"] = nlohmann::json::array();
      for (const auto& m : edits.mounts)
        e["mounts"].push_back({{"hostPath", m.host_path},
                               {"containerPath", m.container_path},
                               {"options", m.read_only ? nlohmann::json{"ro", "bind"}
                                                       : nlohmann::json{"rw", "bind"}}});
    }
    if (!edits.envs.empty()) {
      e["env"] = nlohmann::json::array();
      for (const auto& [k, v] : edits.envs) e["env"].push_back(k + "=" + v);
    }
    list.push_back({{"name", cdi_device_name(d.id)}, {"containerEdits", e}});
  }
  spec["devices"] = list;
  return spec.dump(2) + "\n";
}

bool write_file_atomically(const std::string& dir, const std::string& file,
                           const std::string& content, std::string* error) {
  const std::string path = dir + "/" + file;
  {
    std::ifstream in(path);
    if (in) {
      std::ostringstream ss;
      ss << in.rdbuf();
      if (ss.str() == content) return true;
    }
  }
  const std::string tmp = fmt::format("{}/.{}.{}.tmp", dir, file, ::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << content;
    out.flush();
    if (!out) {
      *error = fmt::format("cannot write {}", tmp);
      std::remove(tmp.c_str());
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    *error = fmt::format("cannot rename {} to {}", tmp, path);
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

}  // namespace ff::dp
