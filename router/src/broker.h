// The broker: answers pod requests. It creates and releases what pods hand over (channels,
// CQs, SRQs, QPs, registered regions), assigns QP numbers and memory keys, and introduces a
// QP to its peer: a QP of this node gets a ring of the peer's segment; a QP on another node
// is left to the forwarder. When a pod goes away, everything it held is released and the
// QPs connected to its QPs hear of it. What each object costs its pod is charged to the
// pod's quotas (quotas.h) when it is created and given back when it goes. TCP mode's
// requests (socket sessions) go to the socket service, rdma_cm's to the CM service.
#pragma once

#include <cstdint>
#include <string>

#include "base/quotas.h"
#include "cm/cm_service.h"
#include "direct/direct_connections.h"
#include "freeflow/ipv4.h"
#include "nodes/directory.h"
#include "nodes/executor.h"
#include "nodes/forwarder.h"
#include "objects/resources.h"
#include "pods/pod_sessions.h"
#include "tcpmode/service.h"

namespace ff::router {

class Broker final : public PodSessions::Handler {
 public:
  // What the broker works with (all owned by the router).
  struct Parts {
    ResourceTables& tables;
    PodSessions& sessions;
    Directory& directory;
    Forwarder& forwarder;
    Executor& executor;
    Quotas& quotas;
    CmService& cm;
    TcpModeService& sockets;
    DirectConnections& direct;  // forgotten when the library says one ended, or it goes
    std::string node_name;  // told to pods at HELLO
    Ipv4Prefix overlay;     // likewise (its length); LIDs are offsets in it
  };
  explicit Broker(Parts parts) : parts_(std::move(parts)) {}

  bool OnRequest(const Call& call, const char* msg, UniqueFd* fds, int nfds) override;
  void OnPodGone(PodId pod) override;

 private:
  Parts parts_;
};

}  // namespace ff::router
