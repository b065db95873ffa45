// TCP mode as records of a hand-over (docs/handover.md, version 3): the pod list and each
// pod's claims table (their read-write and read-only descriptors: pods keep the mappings they
// have, and the successor writes on in them), the socket sessions with the handles on their
// namespaces, the listening ports, and every connection record with its segment, sides and
// bells. A sweep under way is not carried: the successor starts its own. The successor
// reads every record typed and bounded and checks it against what it took already: a member
// is a session of the same address, a listener a member of its address, a record's ends the
// addresses of its key, a claims table one per address that has members.
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "base/handover_state.h"
#include "freeflow/stream_segment.h"
#include "tcpmode/service.h"

namespace ff::router {
namespace {

using Json = nlohmann::json;
using H = HandoverState;
constexpr size_t kMaxRecords = 1u << 20;


// A memfd of exactly `bytes` (a record's segment or side: the pods map that much).
UniqueFd SizedMemfd(HandoverState& state, const Json& j, uint64_t bytes) {
  UniqueFd fd = state.TakeFd(j, FdKind::kMemfd);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) != bytes)
    throw HandoverError("a TCP-mode segment is not of its size");
  return fd;
}

}  // namespace

std::string TcpModeService::WhyNotMovable(uint32_t version) const {
  if (members_.empty() && records_.empty() && listener_count_ == 0) return "";
  if (version < 3) return "it serves TCP-mode sessions (hand-over version 3 carries them)";
  if (pods_.rw_fd() < 0) return "its TCP-mode pod list is not a table a successor can write";
  for (const auto& [ip, c] : claims_)
    if (c->table.rw_fd() < 0) return "a TCP-mode claims table is not one a successor can write";
  for (const auto& [pod, m] : members_)
    if (m.ns == nullptr || m.ns->fd() < 0) return "its TCP-mode namespace handles cannot move";
  for (const auto& [key, r] : records_)
    for (const End& e : r.ends)
      if (e.ns != nullptr && e.ns->fd() < 0) return "its TCP-mode namespace handles cannot move";
  return "";
}

void TcpModeService::Export(HandoverState& state) const {
  std::map<const NetnsHandle*, size_t> index;
  Json handles = Json::array();
  const auto handle = [&](const std::shared_ptr<NetnsHandle>& ns) -> Json {
    if (ns == nullptr) return nullptr;
    const auto [it, fresh] = index.try_emplace(ns.get(), handles.size());
    if (fresh) handles.push_back(state.PutFd(ns->fd()));
    return it->second;
  };
  Json members = Json::array();
  for (const auto& [pod, m] : members_)
    members.push_back({{"pod", pod}, {"ip", m.ip}, {"netns", m.netns}, {"ns", handle(m.ns)}});
  Json claims = Json::array();
  for (const auto& [ip, c] : claims_)
    claims.push_back({{"ip", ip},
                      {"rw", state.PutFd(c->table.rw_fd())},
                      {"ro", state.PutFd(c->table.read_only_fd())}});
  Json listeners = Json::array();
  for (const auto& [where, pods] : listeners_)
    listeners.push_back({where.first, where.second, pods});
  Json records = Json::array();
  for (const auto& [k, r] : records_) {
    Json ends = Json::array();
    for (const End& e : r.ends) {
      ends.push_back({{"ip", e.ip},
                      {"netns", e.netns},
                      {"ns", handle(e.ns)},
                      {"side", state.PutFd(e.side.get())},
                      {"bell", state.PutFd(e.bell.get())},
                      {"seen", e.seen},
                      {"closed", e.closed},
                      {"closed_said", e.closed_said},
                      {"last", static_cast<uint32_t>(e.last)}});
    }
    records.push_back({{"key", {k.client_ip, k.client_port, k.server_ip, k.server_port}},
                       {"gen", r.gen},
                       {"segment", state.PutFd(r.segment.get())},
                       {"ends", std::move(ends)},
                       {"charged", r.charged},
                       {"server_claimed", r.server_claimed},
                       {"awaiting", r.awaiting},
                       {"placed", r.placed},
                       {"created_ns", r.created_ns}});
  }
  state.doc["tcp_mode"] = {
      {"pod_list", {{"rw", state.PutFd(pods_.rw_fd())}, {"ro", state.PutFd(pods_.ro_fd())}}},
      {"handles", std::move(handles)},
      {"members", std::move(members)},
      {"claims", std::move(claims)},
      {"listeners", std::move(listeners)},
      {"records", std::move(records)},
      {"asks", asks_},
      {"next_gen", next_gen_}};
}

void TcpModeService::Import(HandoverState& state) {
  const auto found = state.doc.find("tcp_mode");
  if (found == state.doc.end()) return;  // a router of hand-over version 1 or 2 holds none
  const Json& t = *found;
  std::vector<std::shared_ptr<NetnsHandle>> handles;
  for (const Json& h : H::Array(t, "handles", kMaxRecords)) {
    handles.push_back(parts_.probe.Adopt(state.TakeFd(h, FdKind::kSocket)));
    if (handles.back() == nullptr) throw HandoverError("a TCP-mode namespace handle is not one");
  }
  const auto handle = [&](const Json& j) -> std::shared_ptr<NetnsHandle> {
    const auto it = j.find("ns");
    if (it == j.end() || it->is_null()) return nullptr;
    if (!it->is_number_unsigned() || it->get<uint64_t>() >= handles.size())
      throw HandoverError("a TCP-mode record names no handle");
    return handles[it->get<size_t>()];
  };
  std::map<uint32_t, uint32_t> refs;  // the pod list's reasons, made again from the records
  for (const Json& j : H::Array(t, "members", kMaxRecords)) {
    const PodId pod = H::U32(j, "pod");
    const PodIdentity* who = parts_.sessions.Identity(pod);
    Member m{H::U32(j, "ip"), H::U64(j, "netns"), handle(j)};
    if (who == nullptr || who->ip != m.ip || who->netns != m.netns || m.ns == nullptr ||
        members_.count(pod) != 0)
      throw HandoverError("a TCP-mode member is not a session of its address and namespace");
    handles_[{m.ip, m.netns}] = m.ns;
    members_[pod] = std::move(m);
    ++refs[who->ip];
  }
  ImportClaims(state, t);
  for (const Json& l : H::Array(t, "listeners", kMaxRecords)) {
    if (!l.is_array() || l.size() != 3 || !l[2].is_array() || l[2].empty())
      throw HandoverError("a TCP-mode listener is malformed");
    const auto ip = static_cast<uint32_t>(H::At(l, 0, UINT32_MAX));
    const auto port = static_cast<uint16_t>(H::At(l, 1, UINT16_MAX));
    std::vector<PodId>& pods = listeners_[{ip, port}];
    if (port == 0 || !pods.empty()) throw HandoverError("a TCP-mode listener is named twice");
    for (size_t i = 0; i < l[2].size(); ++i) {
      const auto m = members_.find(static_cast<PodId>(H::At(l[2], i, UINT32_MAX)));
      if (m == members_.end() || m->second.ip != ip)
        throw HandoverError("a TCP-mode listener is not a member of its address");
      pods.push_back(m->first);
      ++listener_count_;
    }
  }
  ImportRecords(state, t, handle, &refs);
  if (std::string why = pods_.Adopt(state.TakeFd(H::Object(t, "pod_list").at("rw"), FdKind::kMemfd),
                                    state.TakeFd(H::Object(t, "pod_list").at("ro"), FdKind::kMemfd),
                                    std::move(refs));
      !why.empty())
    throw HandoverError("the TCP-mode pod list is not a router table: " + why);
  asks_ = H::U64(t, "asks");
  next_gen_ = H::U64(t, "next_gen");
  for (const auto& [k, r] : records_)
    if (r.gen >= next_gen_) throw HandoverError("a TCP-mode record is newer than the next one");
}

void TcpModeService::ImportClaims(HandoverState& state, const Json& t) {
  for (const Json& c : H::Array(t, "claims", kMaxRecords)) {
    const uint32_t ip = H::U32(c, "ip");
    uint32_t members = 0;
    for (const auto& [pod, m] : members_) members += m.ip == ip ? 1 : 0;
    if (members == 0 || claims_.count(ip) != 0)
      throw HandoverError("a TCP-mode claims table of an address without members, or twice");
    auto pc = std::make_unique<PodClaims>();
    pc->members = members;
    if (std::string why = pc->table.Adopt(state.TakeFd(c.at("rw"), FdKind::kMemfd),
                                          state.TakeFd(c.at("ro"), FdKind::kMemfd));
        !why.empty())
      throw HandoverError("a TCP-mode claims table is not a router table: " + why);
    claims_[ip] = std::move(pc);
  }
}

void TcpModeService::ImportRecords(
    HandoverState& state, const Json& t,
    const std::function<std::shared_ptr<NetnsHandle>(const Json&)>& handle,
    std::map<uint32_t, uint32_t>* refs) {
  for (const Json& j : H::Array(t, "records", kMaxRecords)) {
    const Json& k = j.at("key");
    if (!k.is_array() || k.size() != 4) throw HandoverError("a TCP-mode record's key is malformed");
    const Key key{
        static_cast<uint32_t>(H::At(k, 0, UINT32_MAX)), static_cast<uint16_t>(H::At(k, 1, UINT16_MAX)),
        static_cast<uint32_t>(H::At(k, 2, UINT32_MAX)), static_cast<uint16_t>(H::At(k, 3, UINT16_MAX))};
    if (key.client_port == 0 || key.server_port == 0 || records_.count(key) != 0)
      throw HandoverError("a TCP-mode record's key is taken or names port 0");
    Record r;
    r.gen = H::U64(j, "gen");
    r.segment = SizedMemfd(state, j.at("segment"), StreamSegmentBytes(kStreamRingBytes));
    const Json& ends = j.at("ends");
    if (!ends.is_array() || ends.size() != 2) throw HandoverError("a TCP-mode record's ends");
    for (int i : {kClient, kServer}) {
      const Json& e = ends[i];
      End& to = r.ends[i];
      to.ip = H::U32(e, "ip");
      to.netns = H::U64(e, "netns");
      to.ns = handle(e);
      to.side = SizedMemfd(state, e.at("side"), kStreamSideBytes);
      to.bell = state.TakeFd(e.at("bell"), FdKind::kSocket);
      to.seen = H::Bool(e, "seen");
      to.closed = H::Bool(e, "closed");
      to.closed_said = H::Bool(e, "closed_said");
      to.last = static_cast<Presence>(H::U32(e, "last", static_cast<uint32_t>(Presence::kUnknown)));
      if (to.ns == nullptr && !to.closed) throw HandoverError("an open TCP-mode end has no handle");
      if (to.ns != nullptr) handles_[{to.ip, to.netns}] = to.ns;
      ++(*refs)[to.ip];
    }
    if (r.ends[kClient].ip != key.client_ip || r.ends[kServer].ip != key.server_ip)
      throw HandoverError("a TCP-mode record's ends are not its key's addresses");
    r.charged = static_cast<int>(H::U32(j, "charged", kServer));
    r.server_claimed = H::Bool(j, "server_claimed");
    r.awaiting = H::Bool(j, "awaiting");
    r.placed = H::Bool(j, "placed");
    r.created_ns = H::U64(j, "created_ns");
    if (r.awaiting && claims_.count(key.server_ip) == 0)
      throw HandoverError("a TCP-mode record awaits a claims table that is not there");
    records_.emplace(key, std::move(r));
  }
}

}  // namespace ff::router
