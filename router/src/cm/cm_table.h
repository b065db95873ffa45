// The router's rdma_cm state: the ids pods created (the kernel's rdma_cm_id behind each
// handle), and the ports they bind. Pure bookkeeping, no I/O: CmService (cm_service.h)
// drives it. Ports are per (pod address, port space, port), the kernel's rule for a network
// namespace holding one address: every process of a pod shares its ports.
// Threading: the loop's thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "identity/identity.h"
#include "objects/resources.h"

namespace ff::router {

enum class CmState : uint8_t {
  kIdle,
  kBound,
  kAddrResolved,
  kRouteResolved,
  kListening,
  kConnecting,     // active: REQ (SIDR REQ) sent, no answer yet
  kRequested,      // passive: a REQ arrived; the program has neither accepted nor rejected it
  kRepSent,        // passive: accepted, waiting for the RTU
  kRepReceived,    // active: the REP arrived (CONNECT_RESPONSE), waiting for the program's RTU
  kEstablished,    //
  kDisconnecting,  // DREQ sent, waiting for the DREP
  kDone,           // rejected, unreachable or disconnected: only DESTROY_ID is left
};
const char* CmStateName(CmState s);

struct CmAddr {
  uint32_t ip = 0;  // host byte order
  uint16_t port = 0;
};

struct CmId {
  uint32_t handle = 0;
  PodId pod = 0;
  uint32_t channel = 0;
  uint64_t uid = 0;  // the program's cookie, returned in every event; never interpreted
  uint16_t ps = 0;
  uint8_t qp_type = 0;
  CmState state = CmState::kIdle;
  bool bound = false;     // holds local.port in the port table
  bool wildcard = false;  // bound to "any": reported as such, and no device until connected
  bool ipv6 = false;      // the program used AF_INET6 addresses (answers use that family)
  bool reuseaddr = false;
  uint8_t tos = 0;
  CmAddr local, remote;
  // A listener's child until the program first names it: destroyed with the listener.
  uint32_t listener = 0;
  bool touched = true;
  uint32_t backlog = 0;   // listener
  uint32_t children = 0;  // listener: requests not yet touched by the program
  // The connection.
  uint32_t qpn = 0, remote_qpn = 0, remote_comm = 0;
  uint32_t psn = 0, remote_psn = 0, qkey = 0;
  uint8_t responder_resources = 0, initiator_depth = 0;
  uint8_t retry_count = 7, rnr_retry_count = 7, flow_control = 0, srq = 0;
  uint64_t deadline_ns = 0;  // kConnecting, kRepSent, kDisconnecting: when to give up
  uint32_t link = 0;         // the node link its messages go out on (0: the peer is local)
  std::string remote_node;   // the node of the peer pod ("": this one); answers come from it
};

// An id's starting packet sequence number: any 24-bit value, different for each id.
inline uint32_t CmPsn(uint32_t handle) { return (handle * 2654435761u) & 0xffffff; }

class CmTable {
 public:
  // A new id for `pod`; nullptr when the pod holds kMaxCmIdsPerSession already.
  CmId* Create(PodId pod, uint32_t channel);
  // Handles for the CREATE_IDs `pod` posts on `channel`: kCmHandleGrant that no id has, in
  // *first on, unless the channel still holds some of its last grant (false).
  bool Grant(PodId pod, uint32_t channel, uint32_t* first);
  // A new id for `pod` on `channel` under `handle`, one of that channel's grants (used up);
  // nullptr with ENOENT in *error when it is none of them, ENOMEM when the pod holds
  // kMaxCmIdsPerSession ids.
  CmId* CreateGranted(PodId pod, uint32_t channel, uint32_t handle, int* error);
  // Forgets the unused grants of `pod`'s channel `channel` (closed), or of all its channels
  // (its process is gone).
  void ForgetGrants(PodId pod, uint32_t channel);
  void ForgetGrants(PodId pod);
  CmId* Find(uint32_t handle);
  // Frees the id and its port.
  void Erase(uint32_t handle);
  // Every id of `pod` (or of one of its channels), in creation order.
  std::vector<uint32_t> IdsOf(PodId pod) const;
  std::vector<uint32_t> IdsOn(PodId pod, uint32_t channel) const;
  template <typename Fn>
  void ForEach(Fn fn) {
    for (auto& [h, id] : ids_) fn(*id);
  }
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (const auto& [h, id] : ids_) fn(static_cast<const CmId&>(*id));
  }
  size_t size() const { return ids_.size(); }

  // Binds `id` to `ip`:`port` (port 0: an ephemeral one). 0, EADDRINUSE or EADDRNOTAVAIL
  // (no ephemeral port left).
  int Bind(CmId& id, uint32_t ip, uint16_t port);
  void Unbind(CmId& id);
  // 0, or EADDRINUSE when another id listens on the same port.
  int CheckListen(const CmId& id) const;
  // The id listening on ip:port in port space `ps`; nullptr when none.
  CmId* Listener(uint32_t ip, uint16_t ps, uint16_t port);

  // The hand-over (cm_handover.cc): the whole table as a record, and back into an empty
  // table; `pod_of` gives the identity of a process the successor took (nullptr: none).
  // Import throws HandoverError.
  nlohmann::json Export() const;
  void Import(const nlohmann::json& j, const std::function<const PodIdentity*(PodId)>& pod_of);

 private:
  using PortKey = std::tuple<uint32_t, uint16_t, uint16_t>;  // ip, ps, port
  uint32_t next_handle_ = 1;
  std::map<uint32_t, std::unique_ptr<CmId>> ids_;
  std::unordered_map<PodId, uint32_t> per_pod_;
  std::map<std::pair<PodId, uint32_t>, std::set<uint32_t>> granted_;  // (pod, channel)

  CmId* Insert(PodId pod, uint32_t channel, uint32_t handle);
  void ImportPorts(const nlohmann::json& j);
  void ImportGrants(const nlohmann::json& j,
                    const std::function<const PodIdentity*(PodId)>& pod_of);
  std::map<PortKey, std::vector<uint32_t>> ports_;
  uint16_t next_ephemeral_ = 0;
};

}  // namespace ff::router
