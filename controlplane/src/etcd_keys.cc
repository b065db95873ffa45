#include "etcd_keys.h"

#include "freeflow/ipv4.h"

namespace ff::cp {
namespace {

constexpr std::string_view kNodes = "nodes/";
constexpr std::string_view kEndpoint = "endpoint";
constexpr std::string_view kPods = "pods/";

}  // namespace

std::string EtcdKeys::NodeDir(const std::string& node) const {
  return prefix_ + std::string(kNodes) + node + "/";
}

std::string EtcdKeys::Endpoint(const std::string& node) const {
  return NodeDir(node) + std::string(kEndpoint);
}

std::string EtcdKeys::Pod(const std::string& node, uint32_t ip) const {
  return NodeDir(node) + std::string(kPods) + FormatIpv4(ip);
}

EtcdKeys::Parsed EtcdKeys::Parse(std::string_view key) const {
  Parsed parsed;
  if (!key.starts_with(prefix_)) return parsed;
  key.remove_prefix(prefix_.size());
  if (!key.starts_with(kNodes)) return parsed;
  key.remove_prefix(kNodes.size());
  const auto slash = key.find('/');
  if (slash == 0 || slash == std::string_view::npos) return parsed;
  const std::string_view node = key.substr(0, slash);
  const std::string_view rest = key.substr(slash + 1);
  if (rest == kEndpoint) {
    parsed.kind = Parsed::Kind::kEndpoint;
  } else if (rest.starts_with(kPods)) {
    const auto ip = ParseIpv4(rest.substr(kPods.size()));
    if (!ip) return parsed;
    parsed.kind = Parsed::Kind::kPod;
    parsed.ip = *ip;
  } else {
    return parsed;
  }
  parsed.node = node;
  return parsed;
}

std::string PodClaims::Put(uint32_t ip, const std::string& node, int64_t create_revision) {
  claims_[ip][node] = create_revision;
  return *Holder(ip);
}

std::optional<std::string> PodClaims::Delete(uint32_t ip, const std::string& node) {
  const auto it = claims_.find(ip);
  if (it == claims_.end()) return std::nullopt;
  it->second.erase(node);
  if (it->second.empty()) {
    claims_.erase(it);
    return std::nullopt;
  }
  return Holder(ip);
}

std::optional<std::string> PodClaims::Holder(uint32_t ip) const {
  const auto it = claims_.find(ip);
  if (it == claims_.end() || it->second.empty()) return std::nullopt;
  // The lowest create revision; two keys created in one transaction (never by two
  // routers) tie, and the node name decides so that every router agrees.
  const std::string* best = nullptr;
  int64_t best_revision = 0;
  for (const auto& [node, revision] : it->second) {
    if (best == nullptr || revision < best_revision) {
      best = &node;
      best_revision = revision;
    }
  }
  return *best;
}

std::map<uint32_t, std::string> PodClaims::Holders() const {
  std::map<uint32_t, std::string> holders;
  for (const auto& [ip, nodes] : claims_)
    if (auto holder = Holder(ip)) holders.emplace(ip, std::move(*holder));
  return holders;
}

size_t PodClaims::Claimants(uint32_t ip) const {
  const auto it = claims_.find(ip);
  return it == claims_.end() ? 0 : it->second.size();
}

}  // namespace ff::cp
