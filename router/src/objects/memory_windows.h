// The memory windows of one pod connection. A window is an entry of the pod's MR table
// (mr_table.h): unbound it grants nothing (no range, no rights); bound, it names part of a
// live registration of the pod made for windows (IBV_ACCESS_MW_BIND, and so a region: see
// RegistrationReachable), with remote rights of its own (writes and atomics only over local
// write) and, for type 2, the QP it was bound through. Peers check it exactly as a
// registration (target_ops.h): a window reaches only memory its owner registered for
// windows and bound.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>

#include "freeflow/protocol.h"
#include "objects/mr_table.h"

namespace ff::router {

class HandoverState;

class Windows {
 public:
  // Hand-over: every window as [slot, type, mr_key, pd]; and back (objects/handover.cc).
  nlohmann::json Export() const;
  void Import(const nlohmann::json& j);
  // Publishes an unbound window of `type` (ibv_mw_type) in protection domain `pd` (MrEntry::pd)
  // in `table`; *key receives its key.
  // EINVAL for an unknown type, ENOMEM when the table is full.
  int Alloc(MrTable& table, uint32_t type, uint32_t pd, uint32_t* key);
  // Binds (or, length 0, unbinds) window m.key under m.new_key. `qp_ok`: m.qpn names an RC
  // QP of the pod (type 2). EINVAL for anything the rules refuse, EACCES for a registration
  // without IBV_ACCESS_MW_BIND or of another protection domain than the window's, or writes
  // or atomics over one without local write.
  int Bind(MrTable& table, const proto::BindMw& m, bool qp_ok);
  // Unbinds type 2 window `key` (LOCAL_INV, or with qpn != 0 a SEND_WITH_INV received on
  // QP `qpn`, which must be the one it is bound through). EINVAL otherwise.
  int Invalidate(MrTable& table, uint32_t key, uint32_t qpn);
  // Removes window `key` from the table. EINVAL when `key` names no window.
  int Dealloc(MrTable& table, uint32_t key);

  // Whether the entry of `key` (live or not) is a window's slot.
  bool IsWindow(uint32_t key) const { return windows_.count(MrSlotOfKey(key)) != 0; }
  // Whether a window is bound to registration `mr_key`.
  bool Busy(uint32_t mr_key) const;
  // Registration `mr_key` moved to another region: its windows follow.
  void FollowMr(MrTable& table, uint32_t mr_key);
  // QP `qpn` was destroyed: the type 2 windows bound through it stay bound (they must be
  // invalidated or freed, as on an HCA) but serve no QP, even one that reuses the number.
  void QpGone(MrTable& table, uint32_t qpn);

 private:
  struct Window {
    uint32_t type = 0;
    uint32_t mr_key = 0;  // the registration it is bound to; 0 when unbound
    uint32_t pd = 0;      // its protection domain, for its entry whether bound or not
  };
  int Unbind(MrTable& table, uint32_t key, uint32_t new_key, Window& w);

  std::map<uint32_t, Window> windows_;  // by table slot
};

}  // namespace ff::router
