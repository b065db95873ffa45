// Where pods live, as the router sees it: the overlay addresses of this node's pods (told to
// the control plane while at least one of their processes is connected) and, for any other
// address, the router endpoint of the node that holds it. Without a control plane the
// router serves its own node only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "freeflow/controlplane.h"

namespace ff::router {

class Directory {
 public:
  // `cp` may be nullptr (this node only). `self` is this router's own endpoint.
  Directory(std::unique_ptr<cp::ControlPlane> cp, cp::Endpoint self);

  // Starts the control plane and announces what was published before. false + *error.
  bool Start(std::string* error);
  bool cluster() const { return cp_ != nullptr; }

  // A process with overlay address `ip` connected / went away (reference counted: a pod
  // may run several processes).
  void Publish(uint32_t ip);
  void Withdraw(uint32_t ip);
  // True when a connected process of this node has address `ip`.
  bool IsLocal(uint32_t ip) const { return local_.count(ip) != 0; }
  // The router of the node that holds `ip`; std::nullopt when unknown, when there is no
  // control plane, or when the control plane names this router (the pod is gone).
  std::optional<cp::Endpoint> Locate(uint32_t ip) const;
  // True when a pod holds `ip` as far as this router knows: a connected process here, or
  // the control plane names a node for it (this one included: a pod whose processes have
  // all closed the device is still there).
  bool Known(uint32_t ip) const;

 private:
  std::unique_ptr<cp::ControlPlane> cp_;
  cp::Endpoint self_;
  bool started_ = false;
  std::map<uint32_t, int> local_;  // overlay ip -> connected processes with it
};

}  // namespace ff::router
