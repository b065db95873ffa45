#include "nodes/link_resume.h"

#include <algorithm>

#include "freeflow/tunables.h"

namespace ff::router {

bool LinkResume::ParksOnDown(LinkId link, uint64_t now, std::string* node, bool* dialled) {
  bool parks = false;
  if (auto it = resuming_.find(link); it != resuming_.end()) {
    *node = it->second;
    *dialled = true;
    resuming_.erase(it);
    parks = true;
  }
  if (auto it = announced_.find(link); it != announced_.end()) {
    if (!parks && now < it->second.until_ns) {
      *node = it->second.node;
      *dialled = it->second.dialled;
      parks = true;
    }
    announced_.erase(it);
  }
  return parks;
}

std::vector<LinkId> LinkResume::AnnouncedBy(const std::string& node) const {
  std::vector<LinkId> out;
  for (const auto& [link, a] : announced_)
    if (a.node == node && !a.dialled) out.push_back(link);
  return out;
}

void LinkResume::Expire(uint64_t now) {
  std::erase_if(announced_, [now](const auto& a) { return now >= a.second.until_ns; });
}

LinkId LinkResume::Park(const std::string& node, bool initiated, uint64_t now) {
  auto [it, made] = nodes_.try_emplace(node);
  Node& n = it->second;
  if (made) {
    n.name = node;
    n.deadline_ns = now + grace_ns_;
  }
  LinkId& link = initiated ? n.initiated : n.received;
  if (link == kNoLink) link = next_++;
  return link;
}

LinkId LinkResume::Parked(const std::string& node, bool initiated) const {
  const auto it = nodes_.find(node);
  if (it == nodes_.end()) return kNoLink;
  return initiated ? it->second.initiated : it->second.received;
}

void LinkResume::Unpark(const std::string& node, bool initiated) {
  const auto it = nodes_.find(node);
  if (it != nodes_.end()) (initiated ? it->second.initiated : it->second.received) = kNoLink;
}

bool LinkResume::Resuming(const std::string& node) const {
  for (const auto& [link, n] : resuming_)
    if (n == node) return true;
  return false;
}

std::vector<LinkResume::Node> LinkResume::Nodes() const {
  std::vector<Node> out;
  for (const auto& [name, n] : nodes_) out.push_back(n);
  return out;
}

bool LinkResume::DialDue(const std::string& node, uint64_t now) {
  const auto it = nodes_.find(node);
  if (it == nodes_.end() || now < it->second.next_dial_ns) return false;
  Node& n = it->second;
  n.next_dial_ns =
      now + std::min<uint64_t>(kResumeDialNs << std::min<uint32_t>(n.dials, 5), 1'000'000'000);
  ++n.dials;
  return true;
}

}  // namespace ff::router
