#include "objects/memory_windows.h"

#include <infiniband/verbs.h>

#include <cerrno>

namespace ff::router {
namespace {

constexpr uint32_t kRemoteRights =
    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

// No QP has this number (QP numbers are 24 bits): what a type 2 window bound through a
// destroyed QP names.
constexpr uint32_t kNoQpn = 0xffffffffu;

bool Within(const MrView& mr, uint64_t addr, uint64_t length) {
  return addr >= mr.addr && length <= mr.length && addr - mr.addr <= mr.length - length;
}

}  // namespace

int Windows::Alloc(MrTable& table, uint32_t type, uint32_t pd, uint32_t* key) {
  if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) return EINVAL;
  if (const int rc = table.Add(MrView{0, 0, proto::kNoRegion, 0, 0, 0, 0, pd}, key)) return rc;
  windows_[MrSlotOfKey(*key)] = Window{type, 0, pd};
  return 0;
}

int Windows::Unbind(MrTable& table, uint32_t key, uint32_t new_key, Window& w) {
  if (const int rc = table.Rewrite(key, MrView{new_key, 0, proto::kNoRegion, 0, 0, 0, 0, w.pd}))
    return rc;
  w.mr_key = 0;
  return 0;
}

int Windows::Bind(MrTable& table, const proto::BindMw& m, bool qp_ok) {
  auto it = windows_.find(MrSlotOfKey(m.key));
  MrView cur;
  if (it == windows_.end() || !table.Find(m.key, &cur)) return EINVAL;
  Window& w = it->second;
  if (m.new_key == 0 || MrSlotOfKey(m.new_key) != MrSlotOfKey(m.key)) return EINVAL;
  // Type 2: bound through an RC QP of the pod, and only while unbound (invalidated first).
  if (w.type == IBV_MW_TYPE_2 && (!qp_ok || m.qpn == 0 || w.mr_key != 0)) return EINVAL;
  if (w.type == IBV_MW_TYPE_1 && m.qpn != 0) return EINVAL;
  if (m.length == 0) return Unbind(table, m.key, m.new_key, w);
  if (m.access & ~kRemoteRights) return EINVAL;
  MrView mr;
  if (IsWindow(m.mr_key) || !table.Find(m.mr_key, &mr) || mr.region == proto::kNoRegion)
    return EACCES;
  // As the verbs define a bind: the registration allows windows and is of the window's
  // protection domain; the window's rights are its own (the registration needs no remote
  // flag), but writes and atomics through it need the registration's local write.
  if (!(mr.access & IBV_ACCESS_MW_BIND) || mr.pd != w.pd) return EACCES;
  if ((m.access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(mr.access & IBV_ACCESS_LOCAL_WRITE))
    return EACCES;
  if (!Within(mr, m.addr, m.length)) return EINVAL;
  const MrView v{m.new_key,
                 m.access,
                 mr.region,
                 m.addr,
                 m.length,
                 mr.region_offset + (m.addr - mr.addr),
                 w.type == IBV_MW_TYPE_2 ? m.qpn : 0,
                 w.pd};
  if (const int rc = table.Rewrite(m.key, v)) return rc;
  w.mr_key = m.mr_key;
  return 0;
}

int Windows::Invalidate(MrTable& table, uint32_t key, uint32_t qpn) {
  auto it = windows_.find(MrSlotOfKey(key));
  MrView cur;
  if (it == windows_.end() || !table.Find(key, &cur)) return EINVAL;
  Window& w = it->second;
  if (w.type != IBV_MW_TYPE_2 || w.mr_key == 0 || (qpn != 0 && cur.qpn != qpn)) return EINVAL;
  return Unbind(table, key, key, w);
}

int Windows::Dealloc(MrTable& table, uint32_t key) {
  auto it = windows_.find(MrSlotOfKey(key));
  if (it == windows_.end()) return EINVAL;
  uint32_t region = 0;
  if (const int rc = table.Remove(key, &region)) return rc;
  windows_.erase(it);
  return 0;
}

bool Windows::Busy(uint32_t mr_key) const {
  for (const auto& [slot, w] : windows_)
    if (w.mr_key == mr_key) return true;
  return false;
}

void Windows::FollowMr(MrTable& table, uint32_t mr_key) {
  MrView mr;
  if (!table.Find(mr_key, &mr)) return;
  for (const auto& [slot, w] : windows_) {
    if (w.mr_key != mr_key) continue;
    MrView v;
    if (!table.FindSlot(slot, &v)) continue;
    v.region = mr.region;
    v.region_offset = mr.region_offset + (v.addr - mr.addr);
    table.Rewrite(v.key, v);
  }
}

void Windows::QpGone(MrTable& table, uint32_t qpn) {
  for (const auto& [slot, w] : windows_) {
    MrView v;
    if (w.type != IBV_MW_TYPE_2 || w.mr_key == 0 || !table.FindSlot(slot, &v) || v.qpn != qpn)
      continue;
    v.qpn = kNoQpn;
    table.Rewrite(v.key, v);
  }
}

}  // namespace ff::router
