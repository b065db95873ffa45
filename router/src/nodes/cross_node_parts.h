// What both ends of cross-node traffic work with: the forwarder (a local QP's link to a QP
// on another node) and the executor (QPs on other nodes producing into local QPs). All of it
// is owned by the router, which hands the same parts to both.
#pragma once

#include <functional>

#include "base/quotas.h"
#include "direct/direct_connections.h"
#include "direct/direct_listener.h"
#include "freeflow/frame_seal.h"
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
  // Direct connections between pod processes (docs/direct-path.md): whether this router
  // asks for and gives them (--cross-node-path=direct), their seal (--direct-seal), the
  // connections it knows and the listeners it opens inside pods.
  struct Direct {
    bool on = false;
    bool datagrams = false;  // UD too (--direct-datagrams); else UD stays relayed
    SealMode seal = SealMode::kEncrypt;
    DirectConnections* conns = nullptr;
    DirectListeners* listeners = nullptr;
  };
  Direct direct;
};

}  // namespace ff::router
