// What pods hold, as the records of a hand-over (docs/handover.md): descriptors by index in
// the state, everything else as numbers the new router checks as it would a request's.
#include <nlohmann/json.hpp>

#include "base/handover_state.h"
#include "base/table_store.h"
#include "freeflow/qp_kind.h"
#include "objects/memory_windows.h"
#include "objects/mr_table.h"
#include "objects/resources.h"

namespace ff::router {
namespace {

using Json = nlohmann::json;
using H = HandoverState;

constexpr size_t kMaxRecords = 1u << 20;  // of any one kind: far beyond every quota

// A descriptor index, or null for an empty descriptor.
Json FdOrNull(HandoverState& state, const UniqueFd& fd) {
  return fd ? Json(state.PutFd(fd.get())) : Json(nullptr);
}

UniqueFd TakeOrEmpty(HandoverState& state, const Json& j, const char* key, FdKind kind) {
  const auto it = j.find(key);
  if (it == j.end()) throw HandoverError(std::string("field '") + key + "' is missing");
  return it->is_null() ? UniqueFd() : state.TakeFd(*it, kind);
}

std::vector<uint32_t> U32s(const Json& j, const char* key) {
  std::vector<uint32_t> out;
  for (const Json& v : H::Array(j, key, kMaxRecords)) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > UINT32_MAX)
      throw HandoverError(std::string("a number of '") + key + "' is out of range");
    out.push_back(v.get<uint32_t>());
  }
  return out;
}

}  // namespace

Json MrTable::Export(HandoverState& state) const {
  return {{"rw", state.PutFd(fd_.get())},
          {"ro", state.PutFd(ro_fd_.get())},
          {"next_slot", next_slot_},
          {"tags", Json::binary(std::vector<uint8_t>(tags_.begin(), tags_.end()))},
          {"free", free_}};
}

void MrTable::Import(HandoverState& state, const Json& j) {
  next_slot_ = H::U32(j, "next_slot", kMrTableSlots);
  if (next_slot_ == 0) throw HandoverError("an MR table's next slot is 0");
  const std::string tags = H::Bytes(j, "tags", kMrTableSlots);
  tags_.assign(tags.begin(), tags.end());
  free_ = U32s(j, "free");
  for (const uint32_t slot : free_) {
    if (slot == 0 || slot >= next_slot_)
      throw HandoverError("an MR table frees a slot it never used");
  }
  fd_ = state.TakeFd(j.at("rw"), FdKind::kMemfd);
  ro_fd_ = state.TakeFd(j.at("ro"), FdKind::kMemfd);
  if (const std::string why = TableStore::Adopt(fd_.get(), ro_fd_.get(), kMrTableBytes, &map_);
      !why.empty())
    throw HandoverError("an MR table: " + why);
}

Json Windows::Export() const {
  Json out = Json::array();
  for (const auto& [slot, w] : windows_) out.push_back({slot, w.type, w.mr_key, w.pd});
  return out;
}

void Windows::Import(const Json& j) {
  if (!j.is_array() || j.size() > kMrTableSlots) throw HandoverError("windows are not a list");
  for (const Json& w : j) {
    if (!w.is_array() || w.size() != 4)
      throw HandoverError("a window is not [slot, type, key, pd]");
    for (const Json& n : w) {
      if (!n.is_number_unsigned() || n.get<uint64_t>() > UINT32_MAX)
        throw HandoverError("a window's number is out of range");
    }
    const auto slot = w[0].get<uint32_t>();
    if (slot == 0 || slot >= kMrTableSlots) throw HandoverError("a window's slot is out of range");
    windows_[slot] = Window{w[1].get<uint32_t>(), w[2].get<uint32_t>(), w[3].get<uint32_t>()};
  }
}

Json ResourceTables::ExportQp(HandoverState& state, const Qp& qp) const {
  Json producers = Json::array(), ud_rings = Json::array();
  for (const Producer& p : qp.producers) producers.push_back({static_cast<uint32_t>(p.kind), p.id});
  for (const UniqueFd& fd : qp.ud_rings) ud_rings.push_back(FdOrNull(state, fd));
  return {{"qpn", qp.qpn},
          {"type", qp.kind->type},
          {"owner", qp.owner},
          {"seg", FdOrNull(state, qp.seg)},
          {"seg_frozen", qp.seg_frozen},
          {"num_rings", qp.num_rings},
          {"ring_bytes", qp.ring_bytes},
          {"srq_id", qp.srq_id},
          {"recv_cq_id", qp.recv_cq_id},
          {"send_cq_id", qp.send_cq_id},
          {"producers", std::move(producers)},
          {"given_at", qp.given_at},
          {"rings_given", qp.rings_given},
          {"produces_into", qp.produces_into},
          {"ud_rings", std::move(ud_rings)},
          {"named_ip", qp.named.ip},
          {"named_qpn", qp.named.qpn},
          {"asked", qp.asked}};
}

void ResourceTables::ImportQp(HandoverState& state, const Json& j) {
  auto qp = std::make_unique<Qp>();
  qp->qpn = H::U32(j, "qpn");
  qp->kind = QpKindOf(H::U32(j, "type"));
  if (qp->qpn == 0 || qp->kind == nullptr || qps_.count(qp->qpn) != 0)
    throw HandoverError("a QP's number or type is wrong, or taken twice");
  qp->owner = H::U32(j, "owner");
  Pod* owner = FindPod(qp->owner);
  if (owner == nullptr || owner->qps.count(qp->qpn) == 0)
    throw HandoverError("a QP's owner does not hold it");
  qp->seg = TakeOrEmpty(state, j, "seg", FdKind::kMemfd);
  qp->seg_frozen = H::Bool(j, "seg_frozen");
  qp->num_rings = H::U32(j, "num_rings", kMaxRecords);
  qp->ring_bytes = H::U32(j, "ring_bytes");
  qp->srq_id = H::U32(j, "srq_id");
  qp->recv_cq_id = H::U32(j, "recv_cq_id");
  qp->send_cq_id = H::U32(j, "send_cq_id");
  for (const Json& p : H::Array(j, "producers", qp->num_rings)) {
    if (!p.is_array() || p.size() != 2 || !p[0].is_number_unsigned() || p[0].get<uint64_t>() > 2 ||
        !p[1].is_number_unsigned() || p[1].get<uint64_t>() > UINT32_MAX)
      throw HandoverError("a QP's producer is malformed");
    qp->producers.push_back(
        {static_cast<Producer::Kind>(p[0].get<uint32_t>()), p[1].get<uint32_t>()});
  }
  if (qp->producers.size() != qp->num_rings) throw HandoverError("a QP's producers miss rings");
  for (const Json& g : H::Array(j, "given_at", qp->num_rings)) {
    if (!g.is_number_unsigned()) throw HandoverError("a QP's ring time is malformed");
    qp->given_at.push_back(g.get<uint64_t>());
  }
  qp->rings_given = H::U64(j, "rings_given");
  for (const uint32_t into : U32s(j, "produces_into")) qp->produces_into.insert(into);
  const Json& rings = H::Array(j, "ud_rings", qp->num_rings);
  for (size_t i = 0; i < rings.size(); ++i)
    qp->ud_rings.push_back(rings[i].is_null() ? UniqueFd()
                                              : state.TakeFd(rings[i], FdKind::kMemfd));
  qp->named.ip = H::U32(j, "named_ip");
  qp->named.qpn = H::U32(j, "named_qpn");
  qp->asked = H::Bool(j, "asked");
  qps_[qp->qpn] = std::move(qp);
}

void ResourceTables::Export(HandoverState& state) const {
  Json pods = Json::array(), qps = Json::array();
  for (const auto& [id, pod] : pods_) {
    Json channels = Json::array(), cqs = Json::array(), srqs = Json::array(),
         regions = Json::array();
    for (const auto& [cid, fd] : pod->channels) channels.push_back({cid, state.PutFd(fd.get())});
    for (const auto& [cid, cq] : pod->cqs) cqs.push_back({cid, cq.notify_slot, cq.chan_id});
    for (const auto& [sid, fd] : pod->srqs) srqs.push_back({sid, state.PutFd(fd.get())});
    for (const auto& [rid, r] : pod->regions)
      regions.push_back({rid, state.PutFd(r.fd.get()), r.size, r.remote_mrs, r.writable_mrs});
    pods.push_back({{"id", id},
                    {"pid", pod->who.pid},
                    {"ip", pod->who.ip},
                    {"netns", pod->who.netns},
                    {"notify_seg", FdOrNull(state, pod->notify_seg)},
                    {"wake_fd", FdOrNull(state, pod->wake_fd)},
                    {"netns_fd", FdOrNull(state, pod->netns)},
                    {"mr", pod->mr.Export(state)},
                    {"windows", pod->windows.Export()},
                    {"channels", std::move(channels)},
                    {"cqs", std::move(cqs)},
                    {"srqs", std::move(srqs)},
                    {"regions", std::move(regions)},
                    {"qps", pod->qps},
                    {"qpn_grants", pod->qpn_grants}});
  }
  for (const auto& [qpn, qp] : qps_) qps.push_back(ExportQp(state, *qp));
  state.doc["tables"] = {{"next_qpn", next_qpn_},
                         {"reserved", reserved_},
                         {"pods", std::move(pods)},
                         {"qps", std::move(qps)}};
}

namespace {

// [id, descriptor] pairs into `out`.
void ImportFds(HandoverState& state, const Json& list, FdKind kind,
               std::map<uint32_t, UniqueFd>* out) {
  for (const Json& e : list) {
    if (!e.is_array() || e.size() != 2 || !e[0].is_number_unsigned() ||
        e[0].get<uint64_t>() > UINT32_MAX)
      throw HandoverError("an [id, descriptor] pair is malformed");
    (*out)[e[0].get<uint32_t>()] = state.TakeFd(e[1], kind);
  }
}

uint32_t U32At(const Json& a, size_t i) {
  if (i >= a.size() || !a[i].is_number_unsigned() || a[i].get<uint64_t>() > UINT32_MAX)
    throw HandoverError("a record's number is missing or out of range");
  return a[i].get<uint32_t>();
}

}  // namespace

void ResourceTables::Import(HandoverState& state) {
  const Json& t = H::Object(state.doc, "tables");
  next_qpn_ = H::U32(t, "next_qpn");
  for (const uint32_t qpn : U32s(t, "reserved")) reserved_.insert(qpn);
  for (const Json& p : H::Array(t, "pods", kMaxRecords)) {
    const PodId id = H::U32(p, "id");
    if (id == 0 || FindPod(id) != nullptr) throw HandoverError("a pod's session id is 0 or twice");
    PodIdentity who;
    who.pid = static_cast<pid_t>(H::U32(p, "pid", INT32_MAX));
    who.ip = H::U32(p, "ip");
    who.netns = H::U64(p, "netns");
    Pod& pod = AddPod(id, who);
    pod.notify_seg = TakeOrEmpty(state, p, "notify_seg", FdKind::kMemfd);
    pod.wake_fd = TakeOrEmpty(state, p, "wake_fd", FdKind::kSocket);
    pod.netns = TakeOrEmpty(state, p, "netns_fd", FdKind::kAny);
    pod.mr.Import(state, H::Object(p, "mr"));
    pod.windows.Import(p.at("windows"));
    ImportFds(state, H::Array(p, "channels", kMaxRecords), FdKind::kSocket, &pod.channels);
    ImportFds(state, H::Array(p, "srqs", kMaxRecords), FdKind::kMemfd, &pod.srqs);
    for (const Json& c : H::Array(p, "cqs", kMaxRecords)) {
      if (!c.is_array()) throw HandoverError("a CQ is not a list");
      pod.cqs[U32At(c, 0)] = Cq{U32At(c, 1), U32At(c, 2)};
    }
    for (const Json& r : H::Array(p, "regions", kMaxRecords)) {
      if (!r.is_array() || r.size() != 5 || !r[2].is_number_unsigned())
        throw HandoverError("a region is malformed");
      Region& region = pod.regions[U32At(r, 0)];
      region.fd = state.TakeFd(r[1], FdKind::kMemfd);
      region.size = r[2].get<uint64_t>();
      region.remote_mrs = U32At(r, 3);
      region.writable_mrs = U32At(r, 4);
    }
    for (const uint32_t qpn : U32s(p, "qps")) pod.qps.insert(qpn);
    pod.qpn_grants = U32s(p, "qpn_grants");
  }
  for (const Json& q : H::Array(t, "qps", kMaxRecords)) ImportQp(state, q);
  for (const auto& [id, pod] : pods_) {
    for (const uint32_t qpn : pod->qps) {
      if (qps_.count(qpn) == 0) throw HandoverError("a pod holds a QP the state does not have");
    }
  }
}

}  // namespace ff::router
