// What both ends of cross-node traffic work with: the forwarder (a local QP's link to a QP
// on another node) and the executor (QPs on other nodes producing into local QPs). All of it
// is owned by the router, which hands the same parts to both.
#pragma once

#include <functional>

#include "base/quotas.h"
#include "nodes/directory.h"
#include "nodes/node_transport.h"
#include "objects/resources.h"
#include "pods/pod_sessions.h"

namespace ff::router {

struct CrossNodeParts {
  NodeTransport* transport;  // nullptr on a router without a control plane
  ResourceTables& tables;
  PodSessions& sessions;
  Directory& directory;
  Quotas& quotas;
  // Asks the router for a fast timer tick: something waits (a sender for room or a receive,
  // a connect for an address).
  std::function<void()> retry_soon;
};

}  // namespace ff::router
