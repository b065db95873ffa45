// CmService, the pod side: channels and the ucma commands.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <cstring>

#include "cm/cm_abi.h"
#include "cm/cm_service.h"
#include "freeflow/ipv4.h"
#include "freeflow/tunables.h"

namespace ff::router {

static_assert(sizeof(rdma_ucm_query_route_resp) <= proto::kCmMaxReply);
static_assert(sizeof(ib_uverbs_qp_attr) <= proto::kCmMaxReply);
static_assert(sizeof(rdma_ucm_accept) <= proto::kCmMaxBody);

CmService::~CmService() {
  for (auto& [key, ch] : channels_) p_.loop.Unwatch(ch.watch);
}

void CmService::OpenChannel(const Call& call, const proto::CmOpenChannel& m, UniqueFd sock) {
  const ChannelKey key{call.pod, m.channel};
  size_t held = 0;
  for (const auto& [k, ch] : channels_) held += k.first == call.pod ? 1 : 0;
  int type = 0;
  socklen_t len = sizeof(type);
  int status = 0;
  if (channels_.count(key) != 0) {
    status = EEXIST;
  } else if (held >= kMaxCmChannelsPerSession) {
    status = EMFILE;
  } else if (::getsockopt(sock.get(), SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
             type != SOCK_SEQPACKET) {
    status = EINVAL;  // events are datagrams: only a SEQPACKET socket keeps them whole
  } else {
    status = p_.quotas.Take(call.pod, {{Quota::kFds, 1}});
  }
  if (status != 0) return p_.sessions.Answer(call, status);
  const int flags = ::fcntl(sock.get(), F_GETFL);
  if (flags < 0 || ::fcntl(sock.get(), F_SETFL, flags | O_NONBLOCK) != 0) {
    p_.quotas.Give(call.pod, {{Quota::kFds, 1}});
    return p_.sessions.Answer(call, errno);
  }
  Channel& ch = channels_[key];
  ch.sock = std::move(sock);
  WatchChannel(key, ch);
  p_.sessions.Answer(call, 0);
}

void CmService::WatchChannel(const ChannelKey& key, Channel& ch) {
  // The program closing its end (or exiting) shows as a hang-up: its ids go then.
  ch.watch = p_.loop.Watch(ch.sock.get(), EPOLLRDHUP | (ch.backlog.empty() ? 0u : EPOLLOUT),
                           [this, key](uint32_t events) {
                             if (events & EPOLLOUT) Flush(key);
                             if (events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR))
                               CloseChannel(key, "closed by the program");
                           });
}

void CmService::Command(const Call& call, uint32_t pod_ip, proto::CmCommand m) {
  proto::Response r{};
  Ctx c{call, pod_ip, m, &r.u.cm};
  int status = 0;
  const bool flags_ok =
      m.flags == 0 || (m.flags == proto::kCmEventWritten && m.cmd == RDMA_USER_CM_CMD_DISCONNECT &&
                       call.seq != proto::kPostedSeq);
  if (m.in_len > proto::kCmMaxBody || !flags_ok || channels_.count({call.pod, m.channel}) == 0) {
    status = EINVAL;
  } else {
    // Bytes past what the program wrote are zero, whatever the request carried.
    std::memset(m.body + m.in_len, 0, proto::kCmMaxBody - m.in_len);
    status = Dispatch(c);
    if (const CmId* id = c.handle != 0 ? table_.Find(c.handle) : nullptr)
      FillState(*id, ++state_version_, &r.u.cm.state);
  }
  p_.sessions.Answer(call, status, r);
}

int CmService::Dispatch(Ctx& c) {
  switch (c.m.cmd) {
    case RDMA_USER_CM_CMD_CREATE_ID:
      return CreateId(c);
    case RDMA_USER_CM_CMD_DESTROY_ID:
      return DestroyIdCmd(c);
    case RDMA_USER_CM_CMD_BIND_IP:
      return BindIp(c);
    case RDMA_USER_CM_CMD_RESOLVE_IP:
      return ResolveIp(c);
    case RDMA_USER_CM_CMD_RESOLVE_ROUTE:
      return ResolveRoute(c);
    case RDMA_USER_CM_CMD_QUERY_ROUTE:
      return QueryRouteCmd(c);
    case RDMA_USER_CM_CMD_CONNECT:
      return Connect(c);
    case RDMA_USER_CM_CMD_LISTEN:
      return Listen(c);
    case RDMA_USER_CM_CMD_ACCEPT:
      return Accept(c);
    case RDMA_USER_CM_CMD_REJECT:
      return Reject(c);
    case RDMA_USER_CM_CMD_DISCONNECT:
      return Disconnect(c);
    case RDMA_USER_CM_CMD_INIT_QP_ATTR:
      return InitQpAttrCmd(c);
    case RDMA_USER_CM_CMD_NOTIFY:
      return Notify(c);
    case RDMA_USER_CM_CMD_SET_OPTION:
      return SetOption(c);
    case RDMA_USER_CM_CMD_MIGRATE_ID:
      return MigrateId(c);
    case RDMA_USER_CM_CMD_JOIN_IP_MCAST:
    case RDMA_USER_CM_CMD_JOIN_MCAST:
    case RDMA_USER_CM_CMD_LEAVE_MCAST: {
      uint64_t held_back = 0;
      if (log_.Allow(&held_back))
        spdlog::info("client {}: rdma_cm multicast is not supported by freeflow", c.call.pod);
      return EOPNOTSUPP;
    }
    case RDMA_USER_CM_CMD_BIND:
    case RDMA_USER_CM_CMD_RESOLVE_ADDR:
    case RDMA_USER_CM_CMD_QUERY:
    case RDMA_USER_CM_CMD_GET_OPTION:
      // The AF_IB commands: librdmacm finds them missing at start-up (its probe binds an
      // AF_IB address) and speaks the IP commands instead.
      return ENOSYS;
    default:
      return EINVAL;  // GET_EVENT is the library's; anything else is no command
  }
}

CmId* CmService::Named(Ctx& c, uint32_t handle, int* status) {
  CmId* id = table_.Find(handle);
  if (id == nullptr || id->pod != c.call.pod) {
    *status = ENOENT;
    return nullptr;
  }
  if (id->channel != c.m.channel) {
    *status = EINVAL;
    return nullptr;
  }
  c.handle = handle;
  // The program has seen this id: a listener's child now lives on its own.
  if (!id->touched) {
    id->touched = true;
    if (CmId* l = table_.Find(id->listener); l != nullptr && l->children > 0) --l->children;
  }
  *status = 0;
  return id;
}

int CmService::CreateId(Ctx& c) {
  const auto cmd = c.Body<rdma_ucm_create_id>();
  if (c.m.out_len < sizeof(rdma_ucm_create_id_resp)) return ENOSPC;
  const QpKind* kind = CmIdKind(cmd.ps, cmd.qp_type);
  if (kind == nullptr) return EINVAL;
  int status = ENOMEM;
  CmId* id = c.m.handle != 0 ? table_.CreateGranted(c.call.pod, c.m.channel, c.m.handle, &status)
                             : table_.Create(c.call.pod, c.m.channel);
  if (id == nullptr) return status;
  // Answered (not posted): the session may post its next CREATE_IDs.
  if (c.call.seq != proto::kPostedSeq &&
      table_.Grant(c.call.pod, c.m.channel, &c.reply->grant_first))
    c.reply->grant_count = kCmHandleGrant;
  id->uid = cmd.uid;
  id->ps = cmd.ps;
  id->qp_type = static_cast<uint8_t>(kind->type);
  id->qkey = kRdmaUdpQkey;
  id->psn = CmPsn(id->handle);
  rdma_ucm_create_id_resp r{};
  r.id = id->handle;
  c.handle = id->handle;
  return c.Out(r);
}

int CmService::DestroyIdCmd(Ctx& c) {
  const auto cmd = c.Body<rdma_ucm_destroy_id>();
  int status = 0;
  if (c.m.out_len < sizeof(rdma_ucm_destroy_id_resp)) return ENOSPC;
  if (Named(c, cmd.id, &status) == nullptr) return status;
  DestroyId(cmd.id);
  return c.Out(rdma_ucm_destroy_id_resp{});  // events_reported: the library's count
}

int CmService::BindTo(CmId& id, uint32_t pod_ip, const CmSockaddr& sa) {
  if (id.state != CmState::kIdle) return EINVAL;
  if (!sa.present) return EAFNOSUPPORT;
  uint32_t ip = sa.ip;
  if (sa.any || sa.loopback) {
    ip = pod_ip;  // a pod has one address: "any" is it, and so is its loopback device
  } else if (ip != pod_ip) {
    return EADDRNOTAVAIL;
  }
  if (const int rc = table_.Bind(id, ip, sa.port)) return rc;
  id.wildcard = sa.any;
  id.ipv6 = sa.ipv6;
  id.state = CmState::kBound;
  return 0;
}

int CmService::BindIp(Ctx& c) {
  const auto [cmd, id, status] = TakeNamed<rdma_ucm_bind_ip>(c);
  if (id == nullptr) return status;
  CmSockaddr sa;
  if (!ParseSockaddr(&cmd.addr, sizeof(cmd.addr), &sa)) return EAFNOSUPPORT;
  return BindTo(*id, c.pod_ip, sa);
}

int CmService::ResolveIp(Ctx& c) {
  const auto [cmd, id, status] = TakeNamed<rdma_ucm_resolve_ip>(c);
  if (id == nullptr) return status;
  CmSockaddr dst, src;
  if (!ParseSockaddr(&cmd.dst_addr, sizeof(cmd.dst_addr), &dst)) return EAFNOSUPPORT;
  if (id->state == CmState::kIdle) {
    if (!ParseSockaddr(&cmd.src_addr, sizeof(cmd.src_addr), &src)) src = CmSockaddr{};
    if (!src.present) {
      src.present = true;
      src.ipv6 = dst.ipv6;
      src.any = true;
    }
    if (const int rc = BindTo(*id, c.pod_ip, src)) return rc;
  } else if (id->state != CmState::kBound) {
    return EINVAL;
  }
  // Answered as an event, as the kernel does once its neighbour lookup ends.
  uint32_t ip = dst.any || dst.loopback ? c.pod_ip : dst.ip;
  // A group address (224.0.0.0/4) resolves, as a RoCE device maps it to a group MAC, so
  // that a multicast program (mckey) reaches rdma_join_multicast and hears what is missing:
  // EOPNOTSUPP, freeflow has no multicast. Nothing connects to it: no pod has it.
  const bool group = (ip >> 28) == 0xe;
  int error = 0;
  if (!group && !p_.overlay.Contains(ip)) {
    error = ENETUNREACH;  // freeflow routes the pod network only
  } else if (!group && ip != c.pod_ip && !p_.directory.Known(ip)) {
    error = EHOSTUNREACH;  // no pod has that address
  }
  if (error != 0) {
    Emit(*id, MakeEvent(id->handle, id->uid, id->handle, RDMA_CM_EVENT_ADDR_ERROR, -error));
    return 0;
  }
  id->remote = {ip, dst.port};
  id->wildcard = false;  // bound to the device now
  id->state = CmState::kAddrResolved;
  Emit(*id, MakeEvent(id->handle, id->uid, id->handle, RDMA_CM_EVENT_ADDR_RESOLVED, 0));
  return 0;
}

int CmService::ResolveRoute(Ctx& c) {
  const auto [cmd, id, status] = TakeNamed<rdma_ucm_resolve_route>(c);
  if (id == nullptr) return status;
  if (id->state != CmState::kAddrResolved) return EINVAL;
  id->state = CmState::kRouteResolved;
  // Posted: the library wrote ROUTE_RESOLVED into the channel itself (protocol.h).
  if (c.call.seq != proto::kPostedSeq)
    Emit(*id, MakeEvent(id->handle, id->uid, id->handle, RDMA_CM_EVENT_ROUTE_RESOLVED, 0));
  return 0;
}

int CmService::QueryRouteCmd(Ctx& c) {
  const auto [cmd, id, status] = TakeNamed<rdma_ucm_query>(c);
  if (id == nullptr) return status;
  return c.Out(QueryRoute(*id), offsetof(rdma_ucm_query_route_resp, ibdev_index));
}

int CmService::Listen(Ctx& c) {
  const auto [cmd, id, status] = TakeNamed<rdma_ucm_listen>(c);
  if (id == nullptr) return status;
  if (id->state == CmState::kIdle) {
    CmSockaddr any;
    any.present = true;
    any.any = true;
    if (const int rc = BindTo(*id, c.pod_ip, any)) return rc;
  }
  if (id->state != CmState::kBound) return EINVAL;
  if (const int rc = table_.CheckListen(*id)) return rc;
  id->backlog = cmd.backlog > 0 && cmd.backlog < kMaxCmRequests ? cmd.backlog : kMaxCmRequests;
  id->state = CmState::kListening;
  spdlog::info("client {}: rdma_cm listens on {}:{} (port space {:#x})", c.call.pod,
               FormatIpv4(id->local.ip), id->local.port, id->ps);
  return 0;
}

int CmService::InitQpAttrCmd(Ctx& c) {
  const auto [cmd, id, status] = TakeNamed<rdma_ucm_init_qp_attr>(c);
  if (id == nullptr) return status;
  if (c.m.out_len < sizeof(ib_uverbs_qp_attr)) return ENOSPC;
  ib_uverbs_qp_attr attr;
  if (const int rc = InitQpAttr(*id, cmd.qp_state, &attr)) return rc;
  return c.Out(attr);
}

int CmService::Notify(Ctx& c) {
  const auto [cmd, id, status] = TakeNamed<rdma_ucm_notify>(c);
  if (id == nullptr) return status;
  // Data arrived before the RTU: the connection is up (IB_EVENT_COMM_EST).
  if (cmd.event == IBV_EVENT_COMM_EST && id->state == CmState::kRepSent) Establish(*id);
  return 0;
}

int CmService::SetOption(Ctx& c) {
  const auto [cmd, id, status] = TakeNamed<rdma_ucm_set_option>(c);
  if (id == nullptr) return status;
  constexpr size_t kHead = sizeof(rdma_ucm_set_option);
  if (cmd.optlen > proto::kCmMaxBody - kHead || kHead + cmd.optlen > c.m.in_len) return EINVAL;
  const char* value = c.m.body + kHead;
  int v = 0;
  if (cmd.optlen == sizeof(int)) std::memcpy(&v, value, sizeof(v));
  if (cmd.level == RDMA_OPTION_ID) {
    switch (cmd.optname) {
      case RDMA_OPTION_ID_TOS:
        if (cmd.optlen != 1) return EINVAL;
        id->tos = static_cast<uint8_t>(value[0]);
        return 0;
      case RDMA_OPTION_ID_REUSEADDR:
      case RDMA_OPTION_ID_AFONLY:
        if (cmd.optlen != sizeof(int) || id->state != CmState::kIdle) return EINVAL;
        if (cmd.optname == RDMA_OPTION_ID_REUSEADDR) id->reuseaddr = v != 0;
        return 0;
      case RDMA_OPTION_ID_ACK_TIMEOUT:
        return cmd.optlen == 1 ? 0 : EINVAL;
      default:
        return ENOSYS;
    }
  }
  if (cmd.level == RDMA_OPTION_IB && cmd.optname == RDMA_OPTION_IB_PATH) {
    // A path the program resolved itself (ibacm): the route is resolved.
    if (cmd.optlen == 0 || cmd.optlen % sizeof(ib_path_rec_data) != 0) return EINVAL;
    if (id->state != CmState::kAddrResolved) return EINVAL;
    id->state = CmState::kRouteResolved;
    Emit(*id, MakeEvent(id->handle, id->uid, id->handle, RDMA_CM_EVENT_ROUTE_RESOLVED, 0));
    return 0;
  }
  return ENOSYS;
}

int CmService::MigrateId(Ctx& c) {
  const auto cmd = c.Body<rdma_ucm_migrate_id>();
  if (c.m.out_len < sizeof(rdma_ucm_migrate_resp)) return ENOSPC;
  CmId* id = table_.Find(cmd.id);
  if (id == nullptr || id->pod != c.call.pod) return ENOENT;
  if (id->channel != cmd.fd) return EINVAL;  // the library put the old channel here
  const ChannelKey from{id->pod, id->channel}, to{c.call.pod, c.m.channel};
  id->channel = c.m.channel;
  // Events queued for the id and not yet on the old socket follow it, as the kernel moves
  // them to the new file.
  auto old = channels_.find(from);
  if (old != channels_.end() && from != to) {
    std::deque<proto::CmEvent> keep, moved;
    for (const proto::CmEvent& e : old->second.backlog)
      (e.owner == id->handle ? moved : keep).push_back(e);
    old->second.backlog = std::move(keep);
    // Emit charges them again where they wait now.
    p_.quotas.Give(from.first, {{Quota::kQueuedBytes, moved.size() * sizeof(proto::CmEvent)}});
    for (const proto::CmEvent& e : moved) Emit(*id, e);
  }
  return c.Out(rdma_ucm_migrate_resp{});
}

}  // namespace ff::router
