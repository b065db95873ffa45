// rdma_cm on the pod socket: the library serves /dev/infiniband/rdma_cm in the process and
// the router is its kernel. The requests (CmOpenChannel, CmCommand), the answer (CmReply),
// the events written to a channel socket (CmEvent) and the id state both sides keep
// (CmIdState). The IB CM exchange between routers is in node_wire.h (wire::CmMessage).
#pragma once

#include <cstddef>
#include <cstdint>

#include "freeflow/protocol/common.h"

namespace ff::proto {

// rdma_cm. The library serves /dev/infiniband/rdma_cm in the process (librdmacm's kernel
// device, the ucma ABI of <rdma/rdma_user_cm.h>) and the router is its kernel: it keeps
// the ids, the ports and the connections, and queues the events.
// A channel is one open of the device: the library makes a SOCK_SEQPACKET socketpair,
// keeps one end as the descriptor the program sees, and hands the other to the router with
// CmOpenChannel. The router writes the channel's events there (CmEvent, one per
// datagram), so the program's poll/epoll and O_NONBLOCK work on it as on the kernel's
// device. When the program closes its end the router destroys the channel's ids.
// The library keeps a copy of the router's end too: it writes there the events of the
// commands it answers itself (ROUTE_RESOLVED of a posted RESOLVE_ROUTE, below). So a
// channel the router drops is shut down (shutdown(2)) before it is closed, and the library
// shuts its copies down when it loses the router: either way the program reads EOF, which
// the library turns into DEVICE_REMOVAL.
// fds: [the router's end of the channel socket]
struct CmOpenChannel {
  RequestHeader<Op::kCmOpenChannel> h;
  uint32_t channel;  // chosen by the library, unique in the session
  uint32_t reserved;
};
static_assert(sizeof(CmOpenChannel) == 16 && alignof(CmOpenChannel) == 4);
// One ucma command written to `channel`, as the program wrote it after its
// rdma_ucm_cmd_hdr: `in_len` bytes of `body` (the rest zero). Pointers in it mean nothing
// to the router: it never writes to the program's memory; the library copies the answer
// (CmReply) to the command's `response`. The library rewrites two fields before sending:
// MIGRATE_ID's `fd` becomes the channel id of that descriptor (kNoId when it is not an
// rdma_cm descriptor of this process), and SET_OPTION's option value follows its struct
// in `body` (optval ignored). GET_EVENT never comes here: the library reads the channel.
// A posted RESOLVE_ROUTE (kPostedSeq) resolves the route without an event: the library
// posts it only for an id whose ADDR_RESOLVED the program read and that no command since
// can have moved on (CONNECT, and a path set with SET_OPTION IB_PATH, would), and writes
// ROUTE_RESOLVED into the channel itself.
// An answered DISCONNECT with kCmEventWritten in `flags` (the library asks for it only for
// a connected RC/UC id whose end the program has not read) asks the router to leave the
// id's DISCONNECTED to the library: when the router has not reported the id's end itself,
// it sends the DREQ, ends the id without waiting for the DREP and without an event, and
// answers with kCmEventWritten in CmReply::flags; the library then writes DISCONNECTED into
// the channel. One of the two writes an id's end, never both. No other command, and no
// posted one, carries flags.
inline constexpr uint32_t kCmEventWritten = 1u;
inline constexpr uint32_t kCmMaxBody = 320;
inline constexpr uint32_t kCmMaxReply = 216;
inline constexpr uint32_t kCmRouteBytes = 208;  // sizeof(rdma_ucm_query_route_resp)
// What INIT_QP_ATTR is made of (freeflow/cm_qp_attr.h), as the router knows it.
struct CmQpInputs {
  uint32_t remote_ip;  // host byte order; 0 before a peer is known
  uint32_t remote_qpn;
  uint32_t remote_psn;
  uint32_t psn;
  uint32_t qkey;
  uint8_t qp_type;    // ibv_qp_type
  uint8_t connected;  // a REP was sent or received: the connection's attributes exist
  uint8_t responder_resources;
  uint8_t initiator_depth;
  uint8_t retry_count;
  uint8_t rnr_retry_count;
  uint8_t tos;
  uint8_t seen;  // the program has named the id (a listener's child is then its own)
};
static_assert(sizeof(CmQpInputs) == 28 && alignof(CmQpInputs) == 4);
// An id as the router left it after a command or an event: the library answers librdmacm's
// QUERY_ROUTE and INIT_QP_ATTR from the newest one (highest `version`) instead of asking
// the router again (three to five requests fewer per connection on each side).
struct CmIdState {
  uint32_t handle;                       // 0: none (the command named no id, or it is gone)
  uint32_t version;                      // the router's count of snapshots: a later one supersedes
  alignas(8) char route[kCmRouteBytes];  // the QUERY_ROUTE answer
  CmQpInputs qp;
};
static_assert(sizeof(CmIdState) == 248 && alignof(CmIdState) == 8);
static_assert(offsetof(CmIdState, route) == 8 && offsetof(CmIdState, qp) == 216);
struct CmCommand {
  RequestHeader<Op::kCmCommand> h;
  uint32_t channel;
  uint32_t cmd;      // RDMA_USER_CM_CMD_*
  uint32_t in_len;   // as in the command's header, at most kCmMaxBody
  uint32_t out_len;  // likewise: how many response bytes the program can take
  // CREATE_ID only: a handle the router granted this session (CmReply::grant_*), which the
  // new id takes: the library then posts the command and answers the program itself.
  // 0: the router picks the handle and answers it.
  uint32_t handle;
  uint32_t flags;  // kCmEventWritten (DISCONNECT only), else 0
  alignas(8) char body[kCmMaxBody];
};
static_assert(sizeof(CmCommand) == 352 && alignof(CmCommand) == 8);
static_assert(offsetof(CmCommand, body) == 32);
// The answer to a CmCommand: `out_len` bytes to copy to the command's response (0 for the
// commands without one). DESTROY_ID's and MIGRATE_ID's events_reported are the library's
// to fill: only it knows which events the program has read. An answered CREATE_ID may
// grant the handles [grant_first, grant_first + grant_count) to the CREATE_IDs the session
// posts on the same channel (kCmHandleGrant of them, when the channel holds none unused).
struct CmReply {
  uint32_t out_len;
  uint32_t grant_first;
  uint32_t grant_count;
  uint32_t flags;  // kCmEventWritten: the library writes the DISCONNECTED (see above)
  alignas(8) char out[kCmMaxReply];
  CmIdState state;  // of the id the command named (or created)
};
static_assert(sizeof(CmReply) == 480 && alignof(CmReply) == 8);
static_assert(offsetof(CmReply, out) == 16 && offsetof(CmReply, state) == 232);
// The numbers of rdma_ucm_event_resp.event, as both sides write and read them: librdmacm's
// enum rdma_cm_event_type (which the kernel's ucma uses too), whose header cannot be
// included beside <rdma/rdma_user_cm.h>. Spelled as librdmacm spells them.
enum CmEventType : uint32_t {
  RDMA_CM_EVENT_ADDR_RESOLVED = 0,
  RDMA_CM_EVENT_ADDR_ERROR = 1,
  RDMA_CM_EVENT_ROUTE_RESOLVED = 2,
  RDMA_CM_EVENT_ROUTE_ERROR = 3,
  RDMA_CM_EVENT_CONNECT_REQUEST = 4,
  RDMA_CM_EVENT_CONNECT_RESPONSE = 5,
  RDMA_CM_EVENT_CONNECT_ERROR = 6,
  RDMA_CM_EVENT_UNREACHABLE = 7,
  RDMA_CM_EVENT_REJECTED = 8,
  RDMA_CM_EVENT_ESTABLISHED = 9,
  RDMA_CM_EVENT_DISCONNECTED = 10,
  RDMA_CM_EVENT_DEVICE_REMOVAL = 11,
  RDMA_CM_EVENT_MULTICAST_JOIN = 12,
  RDMA_CM_EVENT_MULTICAST_ERROR = 13,
};
// One event on a channel socket: `resp` is struct rdma_ucm_event_resp as the kernel writes
// it. `owner` is the id it is counted against (the listener for CONNECT_REQUEST, whose
// resp.id is the new id); kernel-style accounting (events_reported) is kept by the library.
inline constexpr uint32_t kCmEventRespBytes = 336;  // sizeof(rdma_ucm_event_resp)
struct CmEvent {
  uint32_t owner;
  uint32_t reserved;
  alignas(8) char resp[kCmEventRespBytes];
  CmIdState state;  // of resp.id (for CONNECT_REQUEST: the new id)
};
static_assert(sizeof(CmEvent) == 592 && alignof(CmEvent) == 8);
static_assert(offsetof(CmEvent, resp) == 8 && offsetof(CmEvent, state) == 344);

}  // namespace ff::proto
