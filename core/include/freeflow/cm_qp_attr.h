// INIT_QP_ATTR of rdma_cm, shared by the router (which answers it) and the library (which
// answers it from the id's last state, proto::CmIdState): the attributes that move an
// id's QP to a state, as the kernel's rdma_init_qp_attr gives them for a RoCE v2 port whose
// GID index 1 is the pod's IPv4-mapped address. Also the CM messages' private data sizes,
// which both check.
#pragma once

#include <netinet/in.h>
// After <netinet/in.h>: the uapi headers then leave glibc's socket types alone.
#include <rdma/ib_user_verbs.h>

#include <cstdint>

#include "freeflow/protocol.h"
#include "freeflow/qp_kind.h"

struct rdma_ucm_query_route_resp;  // <rdma/rdma_user_cm.h>, which not every includer can take

namespace ff {

// The IB CM's private data sizes; with an IP port space the REQs carry the rdma_cm header
// (36 bytes) before the program's data. A program may send at most this much, and the peer
// receives exactly this much (zero-padded), as on an IB or RoCE device. The router checks
// them; the library too, before it posts a CONNECT or ACCEPT (verbs/src/rdmacm/cm_commands.cc).
inline constexpr uint8_t kCmReqData = 92 - 36;
inline constexpr uint8_t kCmRepData = 196;
inline constexpr uint8_t kCmRejData = 148;
inline constexpr uint8_t kCmSidrReqData = 216 - 36;
inline constexpr uint8_t kCmSidrRepData = 136;

inline constexpr uint8_t kCmPort = 1;
inline constexpr uint8_t kCmMappedGidIndex = 1;  // GID 1 of a pod's port: ::ffff:a.b.c.d
inline constexpr uint8_t kCmHopLimit = 64;

// The kind of QP an rdma_cm id of port space `ps` (CREATE_ID) serves: RC for RDMA_PS_TCP, UD
// for RDMA_PS_UDP and RDMA_PS_IPOIB, the program's `qp_type` for RDMA_PS_IB; nullptr for
// another port space or type. The router refuses such a CREATE_ID; the library checks it
// before it posts one.
const QpKind* CmIdKind(uint16_t ps, uint8_t qp_type);
// Fills *out for `qp_state` (IBV_QPS_INIT, RTR or RTS). 0, or EINVAL when the id has no
// such attributes yet (RTR/RTS before a connection) or for any other state.
int CmInitQpAttr(const proto::CmQpInputs& in, uint32_t qp_state, ib_uverbs_qp_attr* out);
// An address handle to the pod at `remote_ip` (host order), by GID.
void CmFillAh(uint32_t remote_ip, uint8_t tos, ib_uverbs_ah_attr* ah);
// What a resolved route adds to QUERY_ROUTE's answer (one path, ib_route[0], with the
// id's type of service): the router's answer once the route is resolved, and the library's
// when it answers a RESOLVE_ROUTE itself (verbs/src/rdmacm/cm_commands.cc).
void CmFillRoutedPath(uint8_t tos, rdma_ucm_query_route_resp* r);

}  // namespace ff
