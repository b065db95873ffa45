// The router's side of an rdma_cm channel for tests: one CmEvent (freeflow/protocol.h) as
// the router writes it. Kept apart from ucma_client.h, which needs the uapi header that
// librdmacm's own header cannot stand beside.
#pragma once

#include <cstdint>
#include <cstring>

#include "freeflow/protocol.h"

namespace fftest {

// An event of `event` for id `id` (uid `uid`) counted against `owner`. resp is struct
// rdma_ucm_event_resp: uid at 0, id at 8, event at 12, status at 16 (0 here).
inline ff::proto::CmEvent MakeCmEvent(uint32_t owner, uint32_t event, uint32_t id, uint64_t uid) {
  ff::proto::CmEvent ev{};
  ev.owner = owner;
  std::memcpy(ev.resp, &uid, sizeof(uid));
  std::memcpy(ev.resp + 8, &id, sizeof(id));
  std::memcpy(ev.resp + 12, &event, sizeof(event));
  return ev;
}

}  // namespace fftest
