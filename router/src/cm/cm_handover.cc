// rdma_cm as records of a hand-over (docs/handover.md, version 2): every id with its state
// and exchange, the ports as the old router held them (in their order: who listens and who
// shares), the handles granted and not used yet, and each channel's socket with the events
// it could not take yet. Ids whose exchange runs over a node link stay out: the old router
// refuses then (CmService::WhyNotMovable). The successor reads every record typed and
// bounded, and checks what it can against what it already took: each id's pod is one of the
// sessions it took, a bound id holds its pod's address, each id's channel is one of the
// channels of its pod, each port names bound ids once.
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/handover_state.h"
#include "cm/cm_service.h"
#include "cm/cm_table.h"
#include "freeflow/tunables.h"
#include "nodes/link_resume.h"

namespace ff::router {
namespace {

using Json = nlohmann::json;
using H = HandoverState;
constexpr size_t kMaxRecords = 1u << 20;

}  // namespace

Json CmTable::Export() const {
  Json ids = Json::array();
  for (const auto& [h, p] : ids_) {
    const CmId& id = *p;
    ids.push_back({{"handle", id.handle},
                   {"pod", id.pod},
                   {"channel", id.channel},
                   {"uid", id.uid},
                   {"ps", id.ps},
                   {"qp_type", id.qp_type},
                   {"state", static_cast<uint32_t>(id.state)},
                   {"bound", id.bound},
                   {"wildcard", id.wildcard},
                   {"ipv6", id.ipv6},
                   {"reuseaddr", id.reuseaddr},
                   {"tos", id.tos},
                   {"local", {id.local.ip, id.local.port}},
                   {"remote", {id.remote.ip, id.remote.port}},
                   {"listener", id.listener},
                   {"touched", id.touched},
                   {"backlog", id.backlog},
                   {"children", id.children},
                   {"qpn", id.qpn},
                   {"remote_qpn", id.remote_qpn},
                   {"remote_comm", id.remote_comm},
                   {"psn", id.psn},
                   {"remote_psn", id.remote_psn},
                   {"qkey", id.qkey},
                   {"resources", {id.responder_resources, id.initiator_depth}},
                   {"retries", {id.retry_count, id.rnr_retry_count}},
                   {"flow_control", id.flow_control},
                   {"srq", id.srq},
                   {"deadline_ns", id.deadline_ns},
                   {"remote_node", id.remote_node}});
  }
  Json ports = Json::array();
  for (const auto& [key, handles] : ports_)
    ports.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), handles});
  Json grants = Json::array();
  for (const auto& [key, handles] : granted_)
    grants.push_back(
        {key.first, key.second, std::vector<uint32_t>(handles.begin(), handles.end())});
  return {{"ids", std::move(ids)},
          {"ports", std::move(ports)},
          {"grants", std::move(grants)},
          {"next_handle", next_handle_},
          {"next_ephemeral", next_ephemeral_}};
}

namespace {

// [a, b] of two numbers, each at most `max`.
std::pair<uint64_t, uint64_t> Pair(const Json& j, const char* key, uint64_t max) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array() || it->size() != 2)
    throw HandoverError(std::string("field '") + key + "' is not a pair");
  try {
    return {H::At(*it, 0, max), H::At(*it, 1, max)};
  } catch (const HandoverError& e) {  // which field: the operator reads it
    throw HandoverError(std::string("field '") + key + "': " + e.what());
  }
}

}  // namespace

void CmTable::Import(const Json& j, const std::function<const PodIdentity*(PodId)>& pod_of) {
  if (!ids_.empty()) throw HandoverError("rdma_cm ids imported twice");
  for (const Json& r : H::Array(j, "ids", kMaxRecords)) {
    const uint32_t handle = H::U32(r, "handle");
    const PodId pod = H::U32(r, "pod");
    const PodIdentity* who = pod_of(pod);
    if (handle == 0 || ids_.count(handle) != 0)
      throw HandoverError("an rdma_cm id's handle is 0 or taken");
    if (who == nullptr) throw HandoverError("an rdma_cm id of a process that has no session");
    if (per_pod_[pod] >= kMaxCmIdsPerSession)
      throw HandoverError("a process holds too many rdma_cm ids");
    CmId& id = *Insert(pod, H::U32(r, "channel"), handle);
    id.uid = H::U64(r, "uid");
    id.ps = static_cast<uint16_t>(H::U32(r, "ps", UINT16_MAX));
    id.qp_type = static_cast<uint8_t>(H::U32(r, "qp_type", UINT8_MAX));
    id.state = static_cast<CmState>(H::U32(r, "state", static_cast<uint32_t>(CmState::kDone)));
    id.bound = H::Bool(r, "bound");
    id.wildcard = H::Bool(r, "wildcard");
    id.ipv6 = H::Bool(r, "ipv6");
    id.reuseaddr = H::Bool(r, "reuseaddr");
    id.tos = static_cast<uint8_t>(H::U32(r, "tos", UINT8_MAX));
    const auto local = Pair(r, "local", UINT32_MAX), remote = Pair(r, "remote", UINT32_MAX);
    if (local.second > UINT16_MAX || remote.second > UINT16_MAX)
      throw HandoverError("an rdma_cm id's port is out of range");
    id.local = {static_cast<uint32_t>(local.first), static_cast<uint16_t>(local.second)};
    id.remote = {static_cast<uint32_t>(remote.first), static_cast<uint16_t>(remote.second)};
    if (id.bound && id.local.ip != who->ip)
      throw HandoverError("an rdma_cm id is bound to an address that is not its pod's");
    id.listener = H::U32(r, "listener");
    id.touched = H::Bool(r, "touched");
    id.backlog = H::U32(r, "backlog");
    id.children = H::U32(r, "children");
    id.qpn = H::U32(r, "qpn", 0xffffff);
    id.remote_qpn = H::U32(r, "remote_qpn", 0xffffff);
    id.remote_comm = H::U32(r, "remote_comm");
    id.psn = H::U32(r, "psn", 0xffffff);
    id.remote_psn = H::U32(r, "remote_psn", 0xffffff);
    id.qkey = H::U32(r, "qkey");
    const auto resources = Pair(r, "resources", UINT8_MAX), retries = Pair(r, "retries", 7);
    id.responder_resources = static_cast<uint8_t>(resources.first);
    id.initiator_depth = static_cast<uint8_t>(resources.second);
    id.retry_count = static_cast<uint8_t>(retries.first);
    id.rnr_retry_count = static_cast<uint8_t>(retries.second);
    id.flow_control = static_cast<uint8_t>(H::U32(r, "flow_control", 1));
    id.srq = static_cast<uint8_t>(H::U32(r, "srq", 1));
    id.deadline_ns = H::U64(r, "deadline_ns");
    // Version 4: the node of a peer on another node (CmService::Import parks the id there).
    if (r.contains("remote_node")) id.remote_node = H::Text(r, "remote_node", H::kMaxNodeName);
  }
  // A child's listener is an id of the same process; once the program named the child, the
  // listener may have gone (its handle is never reused).
  for (const auto& [h, id] : ids_) {
    const CmId* l = id->listener != 0 ? Find(id->listener) : nullptr;
    if ((l != nullptr && l->pod != id->pod) || (id->listener != 0 && l == nullptr && !id->touched))
      throw HandoverError("an rdma_cm id names a listener that is not its process's");
  }
  ImportPorts(j);
  ImportGrants(j, pod_of);
  next_handle_ = H::U32(j, "next_handle");
  next_ephemeral_ = static_cast<uint16_t>(
      H::U32(j, "next_ephemeral", kCmLastEphemeralPort - kCmFirstEphemeralPort));
}

// Every port with its holders in their order; each bound id holds exactly its own.
void CmTable::ImportPorts(const Json& j) {
  size_t named = 0;
  for (const Json& p : H::Array(j, "ports", kMaxRecords)) {
    if (!p.is_array() || p.size() != 4 || !p[3].is_array() || p[3].empty())
      throw HandoverError("an rdma_cm port is malformed");
    const PortKey key{static_cast<uint32_t>(H::At(p, 0, UINT32_MAX)),
                      static_cast<uint16_t>(H::At(p, 1, UINT16_MAX)),
                      static_cast<uint16_t>(H::At(p, 2, UINT16_MAX))};
    if (ports_.count(key) != 0) throw HandoverError("an rdma_cm port is named twice");
    std::vector<uint32_t>& holders = ports_[key];
    for (size_t i = 0; i < p[3].size(); ++i) {
      const CmId* id = Find(static_cast<uint32_t>(H::At(p[3], i, UINT32_MAX)));
      if (id == nullptr || !id->bound || id->local.ip != std::get<0>(key) ||
          id->ps != std::get<1>(key) || id->local.port != std::get<2>(key) ||
          std::find(holders.begin(), holders.end(), id->handle) != holders.end())
        throw HandoverError("an rdma_cm port names an id that is not bound to it");
      holders.push_back(id->handle);
      ++named;
    }
  }
  size_t bound = 0;
  for (const auto& [h, id] : ids_) bound += id->bound ? 1 : 0;
  if (bound != named) throw HandoverError("a bound rdma_cm id holds no port");
}

// Handles granted to a process's channel and not used yet: no id has them.
void CmTable::ImportGrants(const Json& j, const std::function<const PodIdentity*(PodId)>& pod_of) {
  for (const Json& g : H::Array(j, "grants", kMaxRecords)) {
    if (!g.is_array() || g.size() != 3 || !g[2].is_array() || g[2].size() > kCmHandleGrant)
      throw HandoverError("an rdma_cm grant is malformed");
    const PodId pod = static_cast<PodId>(H::At(g, 0, UINT32_MAX));
    if (pod_of(pod) == nullptr) throw HandoverError("rdma_cm handles granted to no session");
    std::set<uint32_t>& to = granted_[{pod, static_cast<uint32_t>(H::At(g, 1, UINT32_MAX))}];
    for (size_t i = 0; i < g[2].size(); ++i) {
      const uint32_t handle = static_cast<uint32_t>(H::At(g[2], i, UINT32_MAX));
      if (handle == 0 || ids_.count(handle) != 0) throw HandoverError("a granted handle is taken");
      to.insert(handle);
    }
  }
}

std::string CmService::WhyNotMovable(uint32_t version) const {
  if (table_.size() == 0 && channels_.empty()) return "";
  if (version < 2) return "it holds rdma_cm ids (hand-over version 2 carries them)";
  std::string why;
  table_.ForEach([&](const CmId& id) {
    if (!why.empty() || (id.link == 0 && id.remote_node.empty())) return;
    if (version < 4) why = "it holds rdma_cm ids connected to other nodes";
    // An answer from the other node is awaited: it would come to the old router.
    if (id.state == CmState::kConnecting || id.state == CmState::kRepSent ||
        id.state == CmState::kDisconnecting)
      why = "rdma_cm ids wait for another node's answer";
  });
  return why;
}

size_t CmService::Move(LinkId from, LinkId to) {
  size_t n = 0;
  table_.ForEach([&](CmId& id) {
    if (id.link != from) return;
    id.link = to;
    ++n;
  });
  return n;
}

uint32_t CmService::AnyPeerOn(LinkId link) const {
  uint32_t ip = 0;
  table_.ForEach([&](const CmId& id) {
    if (ip == 0 && id.link == link) ip = id.remote.ip;
  });
  return ip;
}

size_t CmService::CountOn(LinkId link) const {
  size_t n = 0;
  table_.ForEach([&](const CmId& id) { n += id.link == link ? 1 : 0; });
  return n;
}

void CmService::Export(HandoverState& state) const {
  Json channels = Json::array();
  for (const auto& [key, ch] : channels_) {
    Json backlog = Json::array();
    for (const proto::CmEvent& e : ch.backlog) {
      const auto* b = reinterpret_cast<const uint8_t*>(&e);
      backlog.push_back(Json::binary(std::vector<uint8_t>(b, b + sizeof(e))));
    }
    channels.push_back({{"pod", key.first},
                        {"channel", key.second},
                        {"fd", state.PutFd(ch.sock.get())},
                        {"backlog", std::move(backlog)}});
  }
  state.doc["cm"] = {{"table", table_.Export()},
                     {"channels", std::move(channels)},
                     {"state_version", state_version_}};
}

void CmService::Import(HandoverState& state, LinkResume& resume, uint64_t now) {
  const auto it = state.doc.find("cm");
  if (it == state.doc.end()) return;  // a router of hand-over version 1 holds none
  const Json& cm = *it;
  table_.Import(H::Object(cm, "table"), [this](PodId pod) { return p_.sessions.Identity(pod); });
  // Ids connected to another node: on its parked link until this router links to it again
  // (nodes/link_resume.h), failed as on a lost link if it cannot.
  table_.ForEach([&](CmId& id) {
    if (!id.remote_node.empty()) id.link = resume.Park(id.remote_node, true, now);
  });
  for (const Json& c : H::Array(cm, "channels", kMaxRecords)) {
    const ChannelKey key{H::U32(c, "pod"), H::U32(c, "channel")};
    if (p_.sessions.Identity(key.first) == nullptr || channels_.count(key) != 0)
      throw HandoverError("an rdma_cm channel of no session, or named twice");
    Channel& ch = channels_[key];
    ch.sock = state.TakeFd(c.at("fd"), FdKind::kSocket);
    int type = 0;
    socklen_t len = sizeof(type);
    if (::getsockopt(ch.sock.get(), SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET)
      throw HandoverError("an rdma_cm channel is not a SOCK_SEQPACKET socket");
    for (const Json& e : H::Array(c, "backlog", kMaxCmBacklog)) {
      if (!e.is_binary() || e.get_binary().size() != sizeof(proto::CmEvent))
        throw HandoverError("a waiting rdma_cm event is malformed");
      proto::CmEvent event{};
      std::memcpy(&event, e.get_binary().data(), sizeof(event));
      ch.backlog.push_back(event);
    }
    WatchChannel(key, ch);
  }
  table_.ForEach([&](const CmId& id) {
    if (channels_.count({id.pod, id.channel}) == 0)
      throw HandoverError("an rdma_cm id on a channel that is not there");
  });
  state_version_ = H::U32(cm, "state_version");
}

}  // namespace ff::router
