#include "nodes/directory.h"

namespace ff::router {

Directory::Directory(std::unique_ptr<cp::ControlPlane> cp, cp::Endpoint self)
    : cp_(std::move(cp)), self_(std::move(self)) {}

bool Directory::Start(std::string* error) {
  if (cp_ == nullptr) return true;
  if (!cp_->Start(error)) return false;
  started_ = true;
  for (const auto& [ip, n] : local_) cp_->Publish(ip);
  return true;
}

void Directory::Publish(uint32_t ip) {
  if (local_[ip]++ == 0 && started_) cp_->Publish(ip);
}

void Directory::Withdraw(uint32_t ip) {
  auto it = local_.find(ip);
  if (it == local_.end()) return;
  if (--it->second == 0) {
    local_.erase(it);
    if (started_) cp_->Withdraw(ip);
  }
}

std::optional<cp::Endpoint> Directory::Locate(uint32_t ip) const {
  if (cp_ == nullptr) return std::nullopt;
  auto ep = cp_->Lookup(ip);
  if (ep && ep->address == self_.address && ep->port == self_.port) return std::nullopt;
  return ep;
}

bool Directory::Known(uint32_t ip) const {
  return IsLocal(ip) || (cp_ != nullptr && cp_->Lookup(ip).has_value());
}

}  // namespace ff::router
