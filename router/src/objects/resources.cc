#include "objects/resources.h"

#include <infiniband/verbs.h>

#include <algorithm>

#include "base/find.h"
#include "freeflow/ipv4.h"
#include "freeflow/target_ops.h"

namespace ff::router {

NotifySlot* Pod::NotifySlots() {
  if (!notify_map_.get() &&
      MapSegment(notify_seg.get(), kNotifySegmentBytes, true, &notify_map_) != 0)
    return nullptr;
  return notify_map_.as<NotifySlot>();
}

bool Pod::CqChannel(uint32_t cq_id, uint32_t* slot, int* fd) const {
  auto cq = cqs.find(cq_id);
  if (cq == cqs.end() || cq->second.notify_slot == proto::kNoId) return false;
  auto ch = channels.find(cq->second.chan_id);
  if (ch == channels.end()) return false;
  *slot = cq->second.notify_slot;
  *fd = ch->second.get();
  return true;
}

int Qp::FreezeSegment() {
  if (seg_frozen) return 0;
  if (const int rc = FreezeSeals(seg.get())) return rc;
  seg_frozen = true;
  return 0;
}

WakeTarget Pod::CqWake(uint32_t cq_id) {
  uint32_t slot = 0;
  int fd = -1;
  if (!CqChannel(cq_id, &slot, &fd)) return {};
  NotifySlot* slots = NotifySlots();
  if (slots == nullptr) return {};
  return {slots + slot, fd};
}

void Pod::WakeProcess() {
  NotifySlot* slots = wake_fd ? NotifySlots() : nullptr;
  if (slots != nullptr) WakeIfArmed(slots + proto::kWakeSlot, wake_fd.get(), true);
}

Region* Pod::MappedRegion(uint32_t region_id, uint32_t need) {
  auto it = regions.find(region_id);
  if (it == regions.end()) return nullptr;
  Region& r = it->second;
  if (!r.map.get()) {
    // A region the owner sealed read-only can only be mapped so; the MR table may still
    // claim write access (a hostile owner), and this is what keeps the router from
    // writing through a read-only mapping.
    r.map_writable = !SealedReadOnly(r.fd.get());
    if (MapSegment(r.fd.get(), r.size, r.map_writable, &r.map) != 0) return nullptr;
  }
  if ((need & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !r.map_writable)
    return nullptr;
  return &r;
}

bool Qp::TakeAsked() {
  if (!asked || !kind->needs_consent) return false;
  asked = false;
  return true;
}

bool Qp::Consents(uint32_t ip, uint32_t qpn) const {
  if (!kind->needs_consent) return true;
  if (named.qpn != qpn) return false;
  return named.ip == ip;
}

int Qp::RingFor(Producer p) const {
  int free_ring = -1;
  for (size_t i = 0; i < producers.size(); ++i) {
    if (producers[i] == p) return static_cast<int>(i);
    if (free_ring < 0 && producers[i].kind == Producer::Kind::kNone)
      free_ring = static_cast<int>(i);
  }
  if (free_ring >= 0 || !kind->datagram || producers.empty() || given_at.size() != producers.size())
    return free_ring;
  // The router sees no same-node traffic, so "longest held" stands in for "least used".
  return static_cast<int>(std::min_element(given_at.begin(), given_at.end()) - given_at.begin());
}

void Qp::GiveRing(size_t ring, Producer p) {
  producers[ring] = p;
  given_at.resize(producers.size());
  given_at[ring] = ++rings_given;
}

int Qp::NewUdRing(uint32_t ring, uint32_t src_ip, uint32_t src_qpn, proto::Event* event) {
  if (ring >= num_rings) return EINVAL;
  if (ud_rings.size() < num_rings) ud_rings.resize(num_rings);
  UniqueFd fd;
  if (const int rc = CreateSegment("ffrouter-udring", UdRingBytes(ring_bytes), &fd)) return rc;
  ud_rings[ring] = std::move(fd);
  *event = proto::Event{proto::EventType::kUdRing, qpn, ring, src_ip, src_qpn, 0};
  return 0;
}

void Qp::ReleaseRingsOf(Producer p) {
  for (size_t i = 0; i < producers.size(); ++i)
    if (producers[i] == p) FreeRing(i);
}

void Qp::FreeRing(size_t ring) {
  producers[ring] = Producer{};
  // A UD sender's own ring: the owner and the sender hold it; the next sender gets a new one.
  if (ring < ud_rings.size()) ud_rings[ring].reset();
}

Pod& ResourceTables::AddPod(PodId id, const PodIdentity& who) {
  auto pod = std::make_unique<Pod>();
  pod->id = id;
  pod->who = who;
  return *(pods_[id] = std::move(pod));
}

Pod* ResourceTables::FindPod(PodId id) { return FindIn(pods_, id); }

const Pod* ResourceTables::FindPod(PodId id) const { return FindIn(pods_, id); }

std::map<std::pair<uint32_t, uint32_t>, uint64_t> ResourceTables::QpsByAddressAndType() const {
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> counts;
  for (const auto& [qpn, q] : qps_) {
    const Pod* owner = FindPod(q->owner);
    if (owner != nullptr && q->kind != nullptr) ++counts[{owner->who.ip, q->kind->type}];
  }
  return counts;
}

ResourceTables::QpStates ResourceTables::QpsByState() const {
  QpStates s;
  for (const auto& [qpn, q] : qps_) {
    if (q->kind != nullptr && q->kind->datagram)
      ++s.datagram;
    else if (q->named.qpn != proto::kNoId)
      ++s.connected;
    else
      ++s.unconnected;
  }
  return s;
}

void ResourceTables::ErasePod(PodId id) { pods_.erase(id); }

uint32_t ResourceTables::FreshQpn() {
  uint32_t qpn = next_qpn_;
  for (uint32_t tries = 0; tries <= kQpnMask; ++tries) {
    qpn = next_qpn_;
    next_qpn_ = (next_qpn_ + 1) & kQpnMask;
    if (next_qpn_ < kFirstQpn) next_qpn_ = kFirstQpn;
    if (!qps_.count(qpn) && !reserved_.count(qpn)) break;
  }
  return qpn;
}

Qp& ResourceTables::AddQp(std::unique_ptr<Qp> qp, uint32_t reserved) {
  const uint32_t qpn = reserved != 0 && reserved_.erase(reserved) != 0 ? reserved : FreshQpn();
  qp->qpn = qpn;
  return *(qps_[qpn] = std::move(qp));
}

uint32_t ResourceTables::ReserveQpn() {
  const uint32_t qpn = FreshQpn();
  reserved_.insert(qpn);
  return qpn;
}

void ResourceTables::ReleaseQpn(uint32_t qpn) { reserved_.erase(qpn); }

Qp* ResourceTables::FindQp(uint32_t qpn) { return FindIn(qps_, qpn); }

Qp* ResourceTables::FindOwnedQp(const Pod& pod, uint32_t qpn) {
  Qp* qp = FindQp(qpn);
  return qp != nullptr && qp->owner == pod.id ? qp : nullptr;
}

void ResourceTables::EraseQp(uint32_t qpn) { qps_.erase(qpn); }

Qp* ResourceTables::FindDest(uint32_t ip, uint32_t qpn) {
  Qp* qp = FindQp(qpn);
  if (qp == nullptr) return nullptr;
  const Pod* owner = FindPod(qp->owner);
  if (owner == nullptr) return nullptr;
  if (owner->who.ip != ip) return nullptr;
  return qp;
}

std::vector<uint32_t> ResourceTables::Unlink(Qp& src, const Qp* keep) {
  std::vector<uint32_t> left;
  for (auto it = src.produces_into.begin(); it != src.produces_into.end();) {
    Qp* dest = FindQp(*it);
    if (dest == keep && keep != nullptr) {
      ++it;
      continue;
    }
    if (dest != nullptr) dest->ReleaseRingsOf(Producer::Local(src.qpn));
    left.push_back(*it);
    it = src.produces_into.erase(it);
  }
  return left;
}

ResourceTables::Totals ResourceTables::totals() const {
  Totals t;
  t.pods = pods_.size();
  t.qps = qps_.size();
  for (const auto& [id, pod] : pods_) {
    t.objects += pod->channels.size() + pod->cqs.size() + pod->srqs.size();
    t.regions += pod->regions.size();
    for (const auto& [rid, r] : pod->regions) t.mapped_regions += r.map.get() != nullptr ? 1 : 0;
    t.mr_entries += pod->mr.size();
  }
  return t;
}

}  // namespace ff::router
