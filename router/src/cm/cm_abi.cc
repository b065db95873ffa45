#include "cm/cm_abi.h"

#include <arpa/inet.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "freeflow/ipv4.h"
#include "freeflow/tunables.h"

namespace ff::router {
namespace {

constexpr uint8_t kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

bool Routed(const CmId& id) {
  switch (id.state) {
    case CmState::kRouteResolved:
    case CmState::kConnecting:
    case CmState::kRequested:
    case CmState::kRepSent:
    case CmState::kRepReceived:
    case CmState::kEstablished:
    case CmState::kDisconnecting:
    case CmState::kDone:
      return id.remote.ip != 0;
    default:
      return false;
  }
}

void CopyData(uint8_t* dst, uint8_t* dst_len, const wire::CmMessage& m, uint8_t data_len) {
  const size_t n = std::min<size_t>(m.private_data_len, data_len);
  std::memcpy(dst, m.private_data, n);
  *dst_len = data_len;
}

}  // namespace

bool ParseSockaddr(const void* buf, size_t len, CmSockaddr* out) {
  *out = CmSockaddr{};
  sa_family_t family = 0;
  if (len < sizeof(family)) return false;
  std::memcpy(&family, buf, sizeof(family));
  if (family == AF_INET && len >= sizeof(sockaddr_in)) {
    sockaddr_in sin;
    std::memcpy(&sin, buf, sizeof(sin));
    out->ip = ntohl(sin.sin_addr.s_addr);
    out->port = ntohs(sin.sin_port);
    out->any = out->ip == 0;
    out->loopback = (out->ip >> 24) == 127;
    out->present = true;
    return true;
  }
  if (family != AF_INET6 || len < sizeof(sockaddr_in6)) return false;
  sockaddr_in6 sin6;
  std::memcpy(&sin6, buf, sizeof(sin6));
  out->ipv6 = true;
  out->port = ntohs(sin6.sin6_port);
  const uint8_t* a = sin6.sin6_addr.s6_addr;
  static constexpr uint8_t kZero[16] = {};
  if (std::memcmp(a, kZero, 16) == 0) {
    out->any = true;
  } else if (std::memcmp(a, kZero, 15) == 0 && a[15] == 1) {
    out->loopback = true;
    out->ip = 0x7f000001;
  } else if (std::memcmp(a, kMappedPrefix, 12) == 0) {
    uint32_t v4;
    std::memcpy(&v4, a + 12, 4);
    out->ip = ntohl(v4);
    out->any = out->ip == 0;
    out->loopback = (out->ip >> 24) == 127;
  } else {
    return false;
  }
  out->present = true;
  return true;
}

void WriteSockaddr(void* buf, uint32_t ip, uint16_t port, bool ipv6, bool any) {
  if (!ipv6) {
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(port);
    sin.sin_addr.s_addr = htonl(any ? 0 : ip);
    std::memcpy(buf, &sin, sizeof(sin));
    return;
  }
  sockaddr_in6 sin6{};
  sin6.sin6_family = AF_INET6;
  sin6.sin6_port = htons(port);
  if (!any) {
    std::memcpy(sin6.sin6_addr.s6_addr, kMappedPrefix, 12);
    const uint32_t v4 = htonl(ip);
    std::memcpy(sin6.sin6_addr.s6_addr + 12, &v4, 4);
  }
  std::memcpy(buf, &sin6, sizeof(sin6));
}

uint64_t CmNodeGuid(uint32_t ip) {
  uint8_t gid[16];
  LinkLocalGid(ip, gid);
  uint64_t guid;
  std::memcpy(&guid, gid + 8, 8);  // network order, as ibv_get_device_guid returns it
  return guid;
}

rdma_ucm_query_route_resp QueryRoute(const CmId& id) {
  rdma_ucm_query_route_resp r;
  std::memset(&r, 0, sizeof(r));
  const bool on_device = id.remote.ip != 0 || (id.bound && !id.wildcard);
  if (on_device) {
    r.node_guid = CmNodeGuid(id.local.ip);
    r.port_num = kCmPort;
    r.ibdev_index = 0;
  }
  WriteSockaddr(&r.src_addr, id.local.ip, id.local.port, id.ipv6, id.wildcard && !on_device);
  WriteSockaddr(&r.dst_addr, id.remote.ip, id.remote.port, id.ipv6, id.remote.ip == 0);
  ib_user_path_rec& p = r.ib_route[0];
  Ipv4MappedGid(id.local.ip, p.sgid);
  if (id.remote.ip != 0) Ipv4MappedGid(id.remote.ip, p.dgid);
  p.pkey = htons(0xffff);
  if (Routed(id)) CmFillRoutedPath(id.tos, &r);
  return r;
}

proto::CmQpInputs QpInputs(const CmId& id) {
  proto::CmQpInputs in{};
  in.remote_ip = id.remote.ip;
  in.remote_qpn = id.remote_qpn;
  in.remote_psn = id.remote_psn;
  in.psn = id.psn;
  in.qkey = id.qkey;
  in.qp_type = id.qp_type;
  in.connected = id.remote_qpn != 0 || id.state == CmState::kRepSent ||
                 id.state == CmState::kRepReceived || id.state == CmState::kEstablished;
  in.responder_resources = id.responder_resources;
  in.initiator_depth = id.initiator_depth;
  in.retry_count = id.retry_count;
  in.rnr_retry_count = id.rnr_retry_count;
  in.tos = id.tos;
  in.seen = id.touched ? 1 : 0;
  return in;
}

int InitQpAttr(const CmId& id, uint32_t qp_state, ib_uverbs_qp_attr* out) {
  return CmInitQpAttr(QpInputs(id), qp_state, out);
}

void FillState(const CmId& id, uint32_t version, proto::CmIdState* out) {
  out->handle = id.handle;
  out->version = version;
  const rdma_ucm_query_route_resp r = QueryRoute(id);
  std::memcpy(out->route, &r, sizeof(r));
  out->qp = QpInputs(id);
}

proto::CmEvent MakeEvent(uint32_t owner, uint64_t uid, uint32_t id, uint32_t event,
                         int32_t status) {
  rdma_ucm_event_resp r;
  std::memset(&r, 0, sizeof(r));
  r.uid = uid;
  r.id = id;
  r.event = event;
  r.status = static_cast<uint32_t>(status);
  proto::CmEvent e{};
  e.owner = owner;
  std::memcpy(e.resp, &r, sizeof(r));
  return e;
}

void SetConnParam(proto::CmEvent* e, const wire::CmMessage& m, uint8_t data_len, bool swap) {
  rdma_ucm_event_resp r;
  std::memcpy(&r, e->resp, sizeof(r));
  rdma_ucm_conn_param& c = r.param.conn;
  c.qp_num = m.qpn;
  CopyData(c.private_data, &c.private_data_len, m, data_len);
  c.responder_resources = swap ? m.initiator_depth : m.responder_resources;
  c.initiator_depth = swap ? m.responder_resources : m.initiator_depth;
  c.flow_control = m.flow_control;
  c.retry_count = m.retry_count;
  c.rnr_retry_count = m.rnr_retry_count;
  c.srq = m.srq;
  std::memcpy(e->resp, &r, sizeof(r));
}

void SetUdParam(proto::CmEvent* e, const CmId& id, const wire::CmMessage& m, uint8_t data_len,
                bool with_ah) {
  rdma_ucm_event_resp r;
  std::memcpy(&r, e->resp, sizeof(r));
  rdma_ucm_ud_param& u = r.param.ud;
  CopyData(u.private_data, &u.private_data_len, m, data_len);
  if (with_ah) {
    u.qp_num = m.qpn;
    u.qkey = m.qkey;
    CmFillAh(id.remote.ip, id.tos, &u.ah_attr);
  }
  std::memcpy(e->resp, &r, sizeof(r));
}

}  // namespace ff::router
