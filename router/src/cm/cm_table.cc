#include "cm/cm_table.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>

#include "freeflow/tunables.h"

namespace ff::router {

const char* CmStateName(CmState s) {
  switch (s) {
    case CmState::kIdle:
      return "idle";
    case CmState::kBound:
      return "bound";
    case CmState::kAddrResolved:
      return "address resolved";
    case CmState::kRouteResolved:
      return "route resolved";
    case CmState::kListening:
      return "listening";
    case CmState::kConnecting:
      return "connecting";
    case CmState::kRequested:
      return "requested";
    case CmState::kRepSent:
      return "accepted";
    case CmState::kRepReceived:
      return "connect response";
    case CmState::kEstablished:
      return "established";
    case CmState::kDisconnecting:
      return "disconnecting";
    case CmState::kDone:
      return "done";
  }
  return "?";
}

CmId* CmTable::Insert(PodId pod, uint32_t channel, uint32_t handle) {
  auto id = std::make_unique<CmId>();
  id->handle = handle;
  id->pod = pod;
  id->channel = channel;
  CmId* raw = id.get();
  ids_[handle] = std::move(id);
  ++per_pod_[pod];
  return raw;
}

CmId* CmTable::Create(PodId pod, uint32_t channel) {
  if (per_pod_[pod] >= kMaxCmIdsPerSession) return nullptr;
  // Handles are not reused while the router runs (a wrap would take 2^32 ids): an event of
  // an id the program destroyed can never be taken for a newer id's.
  while (next_handle_ == 0 || ids_.count(next_handle_) != 0) ++next_handle_;
  return Insert(pod, channel, next_handle_++);
}

bool CmTable::Grant(PodId pod, uint32_t channel, uint32_t* first) {
  std::set<uint32_t>& g = granted_[{pod, channel}];
  if (!g.empty()) return false;
  // A run of free handles, not wrapping; taken as Create takes them (never reused).
  for (uint32_t h = next_handle_; g.size() < kCmHandleGrant; ++h) {
    if (h == 0 || ids_.count(h) != 0) {
      g.clear();
      next_handle_ = h + 1;
      return false;
    }
    g.insert(h);
  }
  *first = next_handle_;
  next_handle_ += kCmHandleGrant;
  return true;
}

CmId* CmTable::CreateGranted(PodId pod, uint32_t channel, uint32_t handle, int* error) {
  auto g = granted_.find({pod, channel});
  if (g == granted_.end() || g->second.erase(handle) == 0) {
    *error = ENOENT;
    return nullptr;
  }
  if (per_pod_[pod] >= kMaxCmIdsPerSession) {
    *error = ENOMEM;
    return nullptr;
  }
  return Insert(pod, channel, handle);
}

void CmTable::ForgetGrants(PodId pod, uint32_t channel) { granted_.erase({pod, channel}); }

void CmTable::ForgetGrants(PodId pod) {
  granted_.erase(granted_.lower_bound({pod, 0}), granted_.upper_bound({pod, UINT32_MAX}));
}

CmId* CmTable::Find(uint32_t handle) {
  auto it = ids_.find(handle);
  return it == ids_.end() ? nullptr : it->second.get();
}

void CmTable::Erase(uint32_t handle) {
  auto it = ids_.find(handle);
  if (it == ids_.end()) return;
  CmId& id = *it->second;
  Unbind(id);
  auto held = per_pod_.find(id.pod);
  if (held != per_pod_.end() && --held->second == 0) per_pod_.erase(held);
  ids_.erase(it);
}

std::vector<uint32_t> CmTable::IdsOf(PodId pod) const {
  std::vector<uint32_t> out;
  for (const auto& [h, id] : ids_)
    if (id->pod == pod) out.push_back(h);
  return out;
}

std::vector<uint32_t> CmTable::IdsOn(PodId pod, uint32_t channel) const {
  std::vector<uint32_t> out;
  for (const auto& [h, id] : ids_)
    if (id->pod == pod && id->channel == channel) out.push_back(h);
  return out;
}

int CmTable::Bind(CmId& id, uint32_t ip, uint16_t port) {
  if (port == 0) {
    constexpr uint32_t kSpan = kCmLastEphemeralPort - kCmFirstEphemeralPort + 1;
    for (uint32_t tries = 0; tries < kSpan; ++tries) {
      const uint16_t p = static_cast<uint16_t>(kCmFirstEphemeralPort + next_ephemeral_ % kSpan);
      next_ephemeral_ = static_cast<uint16_t>((next_ephemeral_ + 1) % kSpan);
      if (ports_.count({ip, id.ps, p}) == 0) {
        port = p;
        break;
      }
    }
    if (port == 0) return EADDRNOTAVAIL;
  } else {
    auto it = ports_.find({ip, id.ps, port});
    if (it != ports_.end()) {
      // Shared only by ids that all asked for it (RDMA_OPTION_ID_REUSEADDR) and none listens.
      for (uint32_t other : it->second) {
        const CmId* o = Find(other);
        if (o != nullptr && (!o->reuseaddr || !id.reuseaddr || o->state == CmState::kListening))
          return EADDRINUSE;
      }
    }
  }
  ports_[{ip, id.ps, port}].push_back(id.handle);
  id.local = {ip, port};
  id.bound = true;
  return 0;
}

void CmTable::Unbind(CmId& id) {
  if (!id.bound) return;
  auto it = ports_.find({id.local.ip, id.ps, id.local.port});
  if (it != ports_.end()) {
    auto& v = it->second;
    v.erase(std::remove(v.begin(), v.end(), id.handle), v.end());
    if (v.empty()) ports_.erase(it);
  }
  id.bound = false;
}

int CmTable::CheckListen(const CmId& id) const {
  auto it = ports_.find({id.local.ip, id.ps, id.local.port});
  if (it == ports_.end()) return 0;
  for (uint32_t other : it->second) {
    auto o = ids_.find(other);
    if (other != id.handle && o != ids_.end() && o->second->state == CmState::kListening)
      return EADDRINUSE;
  }
  return 0;
}

CmId* CmTable::Listener(uint32_t ip, uint16_t ps, uint16_t port) {
  auto it = ports_.find({ip, ps, port});
  if (it == ports_.end()) return nullptr;
  for (uint32_t h : it->second) {
    CmId* id = Find(h);
    if (id != nullptr && id->state == CmState::kListening) return id;
  }
  return nullptr;
}

}  // namespace ff::router
