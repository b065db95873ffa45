#include "cache.h"

#include <algorithm>
#include <mutex>

#include "freeflow/ipv4.h"

namespace ff::cp {
namespace {

using ff::Ipv4Prefix;
uint64_t RouteKey(uint32_t length, uint32_t network) {
  return (static_cast<uint64_t>(length) << 32) | network;
}

}  // namespace

Cache::Cache(Endpoint self) : self_(std::move(self)) {}

std::optional<Endpoint> Cache::Resolve(const std::string& node) const {
  if (node == self_.node) return self_;
  auto it = mapping_.nodes.find(node);
  if (it == mapping_.nodes.end()) return std::nullopt;
  return it->second;
}

std::optional<Endpoint> Cache::Lookup(uint32_t ip) const {
  std::shared_lock lock(mu_);
  if (local_.count(ip)) return self_;
  if (auto it = mapping_.pods.find(ip); it != mapping_.pods.end()) return Resolve(it->second);
  for (uint32_t length : route_lengths_) {
    auto it = route_index_.find(RouteKey(length, ip & Ipv4Prefix::Mask(length)));
    if (it != route_index_.end()) return Resolve(it->second);
  }
  return std::nullopt;
}

std::vector<Endpoint> Cache::Nodes() const {
  std::shared_lock lock(mu_);
  std::vector<Endpoint> out;
  out.reserve(mapping_.nodes.size());
  for (const auto& [name, endpoint] : mapping_.nodes)
    if (name != self_.node) out.push_back(endpoint);
  return out;
}

void Cache::IndexRoutes() {
  route_index_.clear();
  route_lengths_.clear();
  for (const Route& r : mapping_.routes) {
    // The first route of a given prefix wins; the file parser refuses duplicates anyway.
    route_index_.emplace(RouteKey(r.length, r.network & Ipv4Prefix::Mask(r.length)), r.node);
    route_lengths_.push_back(r.length);
  }
  std::sort(route_lengths_.begin(), route_lengths_.end(), std::greater<>());
  route_lengths_.erase(std::unique(route_lengths_.begin(), route_lengths_.end()),
                       route_lengths_.end());
}

bool Cache::Replace(Mapping mapping) {
  std::unique_lock lock(mu_);
  if (mapping == mapping_) return false;
  mapping_ = std::move(mapping);
  IndexRoutes();
  return true;
}

bool Cache::PutNode(const Endpoint& endpoint) {
  std::unique_lock lock(mu_);
  auto [it, inserted] = mapping_.nodes.try_emplace(endpoint.node, endpoint);
  if (inserted) return true;
  if (it->second == endpoint) return false;
  it->second = endpoint;
  return true;
}

bool Cache::DeleteNode(const std::string& node) {
  std::unique_lock lock(mu_);
  return mapping_.nodes.erase(node) > 0;
}

bool Cache::PutPod(uint32_t ip, const std::string& node) {
  std::unique_lock lock(mu_);
  auto [it, inserted] = mapping_.pods.try_emplace(ip, node);
  if (inserted) return true;
  if (it->second == node) return false;
  it->second = node;
  return true;
}

bool Cache::DeletePod(uint32_t ip) {
  std::unique_lock lock(mu_);
  return mapping_.pods.erase(ip) > 0;
}

Mapping Cache::Snapshot() const {
  std::shared_lock lock(mu_);
  return mapping_;
}

bool Cache::AddLocal(uint32_t ip) {
  std::unique_lock lock(mu_);
  return local_.insert(ip).second;
}

bool Cache::RemoveLocal(uint32_t ip) {
  std::unique_lock lock(mu_);
  return local_.erase(ip) > 0;
}

bool Cache::IsLocal(uint32_t ip) const {
  std::shared_lock lock(mu_);
  return local_.count(ip) > 0;
}

std::set<uint32_t> Cache::Local() const {
  std::shared_lock lock(mu_);
  return local_;
}

}  // namespace ff::cp
