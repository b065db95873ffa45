// The ucma ABI (<rdma/rdma_user_cm.h>) as the router writes and reads it: addresses in the
// commands, and the answers and events librdmacm expects from the kernel of a RoCE v2
// device whose GIDs are the pods' IPv4-mapped overlay addresses.
#pragma once

#include <netinet/in.h>
// After <netinet/in.h>: the uapi headers then leave glibc's socket types alone.
#include <infiniband/verbs.h>
#include <rdma/rdma_user_cm.h>

#include <cstdint>

#include "cm/cm_table.h"
#include "freeflow/cm_qp_attr.h"
#include "freeflow/codec.h"
#include "freeflow/protocol.h"

namespace ff::router {

static_assert(sizeof(rdma_ucm_event_resp) == proto::kCmEventRespBytes);
static_assert(sizeof(rdma_ucm_query_route_resp) == proto::kCmRouteBytes);

// The ucma event numbers, by librdmacm's names (proto::CmEventType).
using enum proto::CmEventType;

// IB CM reject reasons and SIDR statuses that freeflow gives.
inline constexpr uint8_t kRejNoResources = 3;
inline constexpr uint8_t kRejTimeout = 4;
inline constexpr uint8_t kRejInvalidCommId = 6;
inline constexpr uint8_t kRejInvalidServiceId = 8;
inline constexpr uint8_t kRejConsumerDefined = 28;
inline constexpr uint8_t kSidrUnsupported = 1;
inline constexpr uint8_t kSidrReject = 2;
// A DREQ's reason (IB CM's DREQ has none): its sender waits for no DREP, because its id is
// done (the library reported DISCONNECTED) or gone. Routers that predate it answer anyway.
inline constexpr uint8_t kDreqNoReply = 1;
inline constexpr uint32_t kRdmaUdpQkey = 0x01234567;  // RDMA_UDP_QKEY

// An address in a command: struct sockaddr_in or sockaddr_in6 in a buffer of `len` bytes.
struct CmSockaddr {
  bool present = false;  // family AF_INET or AF_INET6
  bool ipv6 = false;
  bool any = false;       // 0.0.0.0 or ::
  bool loopback = false;  // 127.0.0.0/8 or ::1
  uint32_t ip = 0;        // host order (IPv4, or IPv4-mapped IPv6)
  uint16_t port = 0;      // host order
};
// false: a family other than those, or an IPv6 address that is not IPv4-mapped, any or
// loopback (a pod has no other).
bool ParseSockaddr(const void* buf, size_t len, CmSockaddr* out);
// Writes ip:port as sockaddr_in (or sockaddr_in6, IPv4-mapped) into `buf` (>= 28 bytes).
void WriteSockaddr(void* buf, uint32_t ip, uint16_t port, bool ipv6, bool any);

// The node GUID of a pod's device (what ibv_get_device_guid says in the pod).
uint64_t CmNodeGuid(uint32_t ip);
// QUERY_ROUTE: the id's addresses, device and (once routed) its one path.
rdma_ucm_query_route_resp QueryRoute(const CmId& id);
// INIT_QP_ATTR: the attributes that move the id's QP to `qp_state`. 0, or EINVAL when the
// id has no such state yet (RTR/RTS before a connection).
int InitQpAttr(const CmId& id, uint32_t qp_state, ib_uverbs_qp_attr* out);
// The id as the library keeps it (QUERY_ROUTE and INIT_QP_ATTR answered in the pod).
void FillState(const CmId& id, uint32_t version, proto::CmIdState* out);

// An event for the program: `owner` is counted, `id` is resp.id, `uid` resp.uid.
proto::CmEvent MakeEvent(uint32_t owner, uint64_t uid, uint32_t id, uint32_t event, int32_t status);
// param.conn from a peer's message: its data padded to `data_len`; with `swap` (a REQ) its
// resources as seen from this side (the peer's initiator depth is our responder resources).
void SetConnParam(proto::CmEvent* e, const wire::CmMessage& m, uint8_t data_len, bool swap);
// param.ud: `qpn`, `qkey`, data padded to `data_len`, and with_ah an address handle to
// the id's remote pod.
void SetUdParam(proto::CmEvent* e, const CmId& id, const wire::CmMessage& m, uint8_t data_len,
                bool with_ah);

}  // namespace ff::router
