// CmService, the exchange: connect, accept, reject and disconnect, the IB CM messages they
// send to the other pod's router (or to this one), what arriving messages do, deadlines,
// and the events the programs read.
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <cstring>

#include "cm/cm_abi.h"
#include "cm/cm_service.h"
#include "freeflow/fd.h"
#include "freeflow/target_ops.h"
#include "freeflow/tunables.h"
#include "nodes/link_resume.h"

namespace ff::router {
namespace {

bool Ud(const CmId& id) { return IsDatagram(id.qp_type); }

// `id` is the one a message of the peer is for that names no id of ours (a REQ): the peer's
// id and both addresses match.
bool AnswersTo(const CmId& id, const wire::CmMessage& m) {
  return id.remote_comm == m.src_comm && id.remote.ip == m.src_ip && id.local.ip == m.dst_ip;
}

// Copies the program's private data into a message; false when it is longer than `max`.
bool TakeData(wire::CmMessage* m, const uint8_t* data, uint8_t len, uint8_t max) {
  if (len > max) return false;
  std::memcpy(m->private_data, data, len);
  m->private_data_len = len;
  return true;
}

// What the program's CONNECT or ACCEPT says of its QP.
void TakeConnParam(CmId* id, const rdma_ucm_conn_param& p) {
  id->qpn = p.qp_num;
  id->srq = p.srq;
  id->responder_resources = p.responder_resources;
  id->initiator_depth = p.initiator_depth;
  id->flow_control = p.flow_control;
  id->rnr_retry_count = p.rnr_retry_count;
}

}  // namespace

wire::CmMessage CmService::MessageFrom(const CmId& id) const {
  wire::CmMessage m{};
  m.src_ip = id.local.ip;
  m.dst_ip = id.remote.ip;
  m.src_comm = id.handle;
  m.dst_comm = id.remote_comm;
  m.src_port = id.local.port;
  m.dst_port = id.remote.port;
  m.ps = id.ps;
  m.qp_type = id.qp_type;
  m.qpn = id.qpn;
  m.qkey = id.qkey;
  m.psn = id.psn;
  m.responder_resources = id.responder_resources;
  m.initiator_depth = id.initiator_depth;
  m.flow_control = id.flow_control;
  m.retry_count = id.retry_count;
  m.rnr_retry_count = id.rnr_retry_count;
  m.srq = id.srq;
  return m;
}

int CmService::Send(CmId* id, wire::CmKind kind, const wire::CmMessage& m) {
  const std::optional<cp::Endpoint> ep =
      p_.directory.IsLocal(m.dst_ip) ? std::nullopt : p_.directory.Locate(m.dst_ip);
  if (!ep) {
    if (!p_.directory.Known(m.dst_ip)) return EHOSTUNREACH;
    // A pod of this node (one that runs no freeflow process now answers as a host with
    // no listener). After this turn, as a message from the network would come: the
    // sender's command is answered first, and no handler runs inside another.
    p_.loop.Defer([this, kind, m] { Receive(kind, m, ""); });
    if (id != nullptr) {
      id->link = kNoLink;
      id->remote_node.clear();
    }
    return 0;
  }
  // The node's router is being replaced and not reached yet: the message waits on the
  // node's parked link and goes when this router reaches the successor (ResendTo).
  const LinkId parked =
      p_.resume != nullptr && id != nullptr ? p_.resume->Parked(ep->node, true) : kNoLink;
  if (id != nullptr) sent_[id->handle] = {kind, m, parked != kNoLink};
  if (parked != kNoLink) {
    id->link = parked;
    id->remote_node = ep->node;
    return 0;
  }
  const LinkId link = p_.transport != nullptr ? p_.transport->Dial(*ep) : kNoLink;
  if (link == kNoLink) return EHOSTUNREACH;
  p_.transport->Send(link, wire::Type::kCm, 0, static_cast<uint16_t>(kind), {{&m, sizeof(m)}});
  if (id != nullptr) {
    id->link = link;
    id->remote_node = ep->node;
  }
  return 0;
}

// The command just served sent `id`'s message and its program waits for the answer (REP,
// RTU, DREP) in state `next`, until kCmResponseTimeoutNs from now. When the message went to
// another node, no polling window follows it (EventLoop::NoteRemoteWait).
void CmService::AwaitAnswer(CmId* id, CmState next) {
  if (id->link != kNoLink) p_.loop.NoteRemoteWait();
  id->state = next;
  id->deadline_ns = MonotonicNs() + kCmResponseTimeoutNs;
}

// An answer to a message whose sender has no id here (no listener, unknown comm id).
void CmService::Reply(wire::CmKind kind, const wire::CmMessage& to, uint8_t reason) {
  wire::CmMessage m{};
  m.src_ip = to.dst_ip;
  m.dst_ip = to.src_ip;
  m.src_comm = to.dst_comm;  // the id it was for, if any: the sender knows it by that
  m.dst_comm = to.src_comm;
  m.src_port = to.dst_port;
  m.dst_port = to.src_port;
  m.ps = to.ps;
  m.qp_type = to.qp_type;
  m.reason = reason;
  Send(nullptr, kind, m);
}

int CmService::Connect(Ctx& c) {
  const auto [cmd, id, status] = TakeNamed<rdma_ucm_connect>(c);
  if (id == nullptr) return status;
  if (id->state != CmState::kRouteResolved || !cmd.conn_param.valid) return EINVAL;
  const rdma_ucm_conn_param& p = cmd.conn_param;
  TakeConnParam(id, p);
  id->retry_count = p.retry_count;  // the passive side keeps the REQ's
  wire::CmMessage m = MessageFrom(*id);
  m.dst_comm = 0;
  if (!TakeData(&m, p.private_data, p.private_data_len, Ud(*id) ? kCmSidrReqData : kCmReqData))
    return EINVAL;
  const int rc = Send(id, Ud(*id) ? wire::CmKind::kSidrReq : wire::CmKind::kReq, m);
  if (rc != 0) {
    // The pod went away since its address resolved.
    Fail(*id, RDMA_CM_EVENT_UNREACHABLE, -rc);
    return 0;
  }
  AwaitAnswer(id, CmState::kConnecting);
  return 0;
}

int CmService::Accept(Ctx& c) {
  const auto [cmd, id, status] = TakeNamed<rdma_ucm_accept>(c);
  if (id == nullptr) return status;
  const rdma_ucm_conn_param& p = cmd.conn_param;
  if (id->state == CmState::kRepReceived) {
    // The active side's ACCEPT: its QP is ready, the RTU goes out.
    Send(id, wire::CmKind::kRtu, MessageFrom(*id));
    id->state = CmState::kEstablished;
    return 0;
  }
  if (id->state != CmState::kRequested || !p.valid) return EINVAL;
  id->uid = cmd.uid;
  TakeConnParam(id, p);
  wire::CmMessage m = MessageFrom(*id);
  if (!TakeData(&m, p.private_data, p.private_data_len, Ud(*id) ? kCmSidrRepData : kCmRepData))
    return EINVAL;
  if (Ud(*id)) {
    Send(id, wire::CmKind::kSidrRep, m);
    id->state = CmState::kEstablished;
    return 0;
  }
  Send(id, wire::CmKind::kRep, m);
  AwaitAnswer(id, CmState::kRepSent);
  return 0;
}

int CmService::Reject(Ctx& c) {
  const auto [cmd, id, status] = TakeNamed<rdma_ucm_reject>(c);
  if (id == nullptr) return status;
  if (id->state != CmState::kRequested && id->state != CmState::kRepReceived) return EINVAL;
  wire::CmMessage m = MessageFrom(*id);
  const bool ud = Ud(*id);
  if (!TakeData(&m, cmd.private_data, cmd.private_data_len, ud ? kCmSidrRepData : kCmRejData))
    return EINVAL;
  m.reason = ud ? kSidrReject : kRejConsumerDefined;
  Send(id, ud ? wire::CmKind::kSidrRep : wire::CmKind::kRej, m);
  id->state = CmState::kDone;
  return 0;
}

int CmService::Disconnect(Ctx& c) {
  const auto [cmd, id, status] = TakeNamed<rdma_ucm_disconnect>(c);
  if (id == nullptr) return status;
  switch (id->state) {
    case CmState::kEstablished:
    case CmState::kRepSent:
    case CmState::kRepReceived: {
      // With kCmEventWritten the library writes the DISCONNECTED (the answer tells it to):
      // nothing waits for a DREP, and the peer's own DREQ, if it crosses this one, ends
      // nothing more. An id whose end the router reported already is kDone, below.
      const bool written = (c.m.flags & proto::kCmEventWritten) != 0;
      wire::CmMessage m = MessageFrom(*id);
      if (written) m.reason = kDreqNoReply;
      Send(id, wire::CmKind::kDreq, m);
      if (written) {
        id->deadline_ns = 0;
        id->state = CmState::kDone;
        c.reply->flags = proto::kCmEventWritten;
        return 0;
      }
      AwaitAnswer(id, CmState::kDisconnecting);
      return 0;
    }
    case CmState::kDone:
    case CmState::kDisconnecting:
      return 0;  // the peer disconnected first (its DISCONNECTED event is out), or again
    default:
      return EINVAL;
  }
}

void CmService::ResendTo(const std::string& node) {
  std::vector<uint32_t> waiting;
  table_.ForEach([&](const CmId& id) {
    const auto it = sent_.find(id.handle);
    if (id.remote_node == node && it != sent_.end() && id.state != CmState::kDone &&
        (it->second.held || id.state == CmState::kConnecting || id.state == CmState::kRepSent ||
         id.state == CmState::kDisconnecting))
      waiting.push_back(id.handle);
  });
  for (uint32_t h : waiting) {
    const Sent again = sent_.at(h);
    Send(table_.Find(h), again.kind, again.m);
  }
  if (!waiting.empty())
    spdlog::info("sent {} rdma_cm messages again to router {} (replaced)", waiting.size(), node);
}

void CmService::DestroyId(uint32_t handle) {
  sent_.erase(handle);
  CmId* id = table_.Find(handle);
  if (id == nullptr) return;
  id->deadline_ns = 0;
  wire::CmMessage m = MessageFrom(*id);
  switch (id->state) {
    case CmState::kConnecting:
      m.reason = kRejTimeout;
      Send(nullptr, Ud(*id) ? wire::CmKind::kSidrRep : wire::CmKind::kRej, m);
      break;
    case CmState::kRequested:
      m.reason = Ud(*id) ? kSidrReject : kRejConsumerDefined;
      Send(nullptr, Ud(*id) ? wire::CmKind::kSidrRep : wire::CmKind::kRej, m);
      break;
    case CmState::kRepSent:
    case CmState::kRepReceived:
    case CmState::kEstablished:
      m.reason = kDreqNoReply;  // the id is gone
      if (!Ud(*id)) Send(nullptr, wire::CmKind::kDreq, m);
      break;
    case CmState::kListening: {
      // Requests the program never saw go with the listener.
      std::vector<uint32_t> orphans;
      table_.ForEach([&](const CmId& o) {
        if (o.listener == handle && !o.touched) orphans.push_back(o.handle);
      });
      for (uint32_t o : orphans) DestroyId(o);
      break;
    }
    default:
      break;
  }
  id = table_.Find(handle);  // the recursion above erased other ids only
  if (id != nullptr && !id->touched) {
    if (CmId* l = table_.Find(id->listener); l != nullptr && l->children > 0) --l->children;
  }
  table_.Erase(handle);
}

// ---- arriving messages ---------------------------------------------------------------

NodeTransport::Handler::Verdict CmService::OnMessage(LinkId link, const NodeMessage& nm) {
  if (nm.len != sizeof(wire::CmMessage)) return NodeTransport::Handler::Verdict::kMalformed;
  wire::CmMessage m;
  std::memcpy(&m, nm.body, sizeof(m));
  const auto kind = static_cast<wire::CmKind>(nm.flags);
  const std::string peer = p_.transport->PeerNode(link);
  // A request must come from a pod of the sending node; an answer is checked against the
  // id it names (Peer): only the node that id's exchange is with can answer it, even
  // after the pod that sent it is gone from the control plane.
  const bool request = kind == wire::CmKind::kReq || kind == wire::CmKind::kSidrReq;
  const std::optional<cp::Endpoint> from =
      request ? p_.directory.Locate(m.src_ip) : std::optional<cp::Endpoint>();
  const bool source_ok = !peer.empty() && (!request || (from && from->node == peer));
  if (!source_ok || (!request && !p_.directory.IsLocal(m.dst_ip))) {
    refusals_.Note(source_ok ? CmRefusal::kNotHere : CmRefusal::kNotItsPod);
    uint64_t held_back = 0;
    if (log_.Allow(&held_back)) {
      spdlog::warn("router {} sent an rdma_cm message from {} to {}, which {}: dropped", peer,
                   FormatIpv4(m.src_ip), FormatIpv4(m.dst_ip),
                   source_ok ? "is not a pod here" : "is not one of its pods");
    }
    return NodeTransport::Handler::Verdict::kConsumed;
  }
  if (m.private_data_len > wire::kCmMaxPrivateData) m.private_data_len = wire::kCmMaxPrivateData;
  Receive(kind, m, peer);
  return NodeTransport::Handler::Verdict::kConsumed;
}

// The id an answer is for: the receiver's comm id, the sender's address and node must match
// what the exchange set up (a REJ or SIDR REP may come before the sender knew our id).
CmId* CmService::Peer(const wire::CmMessage& m, const std::string& from) {
  CmId* found = nullptr;
  if (m.dst_comm != 0) {
    found = table_.Find(m.dst_comm);
    if (found != nullptr && found->remote_comm != 0 && found->remote_comm != m.src_comm)
      found = nullptr;
  } else {
    table_.ForEach([&](CmId& id) {
      if (AnswersTo(id, m)) found = &id;
    });
  }
  if (found == nullptr || found->local.ip != m.dst_ip || found->remote.ip != m.src_ip ||
      found->remote_node != from)
    return nullptr;
  return found;
}

void CmService::Receive(wire::CmKind kind, const wire::CmMessage& m, const std::string& from) {
  if (kind == wire::CmKind::kReq || kind == wire::CmKind::kSidrReq) return OnReq(kind, m, from);
  CmId* id = Peer(m, from);
  switch (kind) {
    case wire::CmKind::kRep:
      if (id == nullptr) return Reply(wire::CmKind::kRej, m, kRejInvalidCommId);
      return OnRep(*id, m);
    case wire::CmKind::kSidrRep:
      if (id != nullptr) OnSidrRep(*id, m);
      return;
    case wire::CmKind::kRtu:
      if (id != nullptr && id->state == CmState::kRepSent) Establish(*id);
      return;
    case wire::CmKind::kRej:
      if (id != nullptr) OnRej(*id, m);
      return;
    case wire::CmKind::kDreq:
      return OnDreq(id, m);
    case wire::CmKind::kDrep:
      if (id != nullptr && id->state == CmState::kDisconnecting)
        Fail(*id, RDMA_CM_EVENT_DISCONNECTED, 0);
      return;
    default:
      return;
  }
}

void CmService::OnReq(wire::CmKind kind, const wire::CmMessage& m, const std::string& from) {
  const bool sidr = kind == wire::CmKind::kSidrReq;
  const wire::CmKind no = sidr ? wire::CmKind::kSidrRep : wire::CmKind::kRej;
  // A request another node's router sent again (ResendTo, across a router's replacement)
  // whose first copy came: its child is still being set up, and the answer goes (or went)
  // from it. Only another node's request comes twice, so one of this node's costs no search.
  bool again = false;
  if (!from.empty())
    table_.ForEach([&](const CmId& id) {
      again = again || (AnswersTo(id, m) && id.remote_node == from &&
                        (id.state == CmState::kRequested || id.state == CmState::kRepSent));
    });
  if (again) return;
  CmId* l = table_.Listener(m.dst_ip, m.ps, m.dst_port);
  if (l == nullptr || Ud(*l) != sidr)
    return Reply(no, m, sidr ? kSidrUnsupported : kRejInvalidServiceId);
  if (l->children >= l->backlog) return Reply(no, m, sidr ? kSidrReject : kRejNoResources);
  CmId* child = table_.Create(l->pod, l->channel);
  if (child == nullptr) return Reply(no, m, sidr ? kSidrReject : kRejNoResources);
  child->ps = l->ps;
  child->qp_type = l->qp_type;
  child->state = CmState::kRequested;
  child->listener = l->handle;
  child->touched = false;
  child->ipv6 = l->ipv6;
  child->tos = l->tos;
  child->qkey = l->qkey;
  child->psn = CmPsn(child->handle);
  child->local = {m.dst_ip, m.dst_port};
  child->remote = {m.src_ip, m.src_port};
  child->remote_comm = m.src_comm;
  child->remote_node = from;
  child->remote_qpn = m.qpn;
  child->remote_psn = m.psn;
  child->responder_resources = m.initiator_depth;
  child->initiator_depth = m.responder_resources;
  child->retry_count = m.retry_count;
  child->rnr_retry_count = m.rnr_retry_count;
  ++l->children;
  proto::CmEvent e = MakeEvent(l->handle, l->uid, child->handle, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
  if (sidr) {
    SetUdParam(&e, *child, m, kCmSidrReqData, false);
  } else {
    SetConnParam(&e, m, kCmReqData, true);
  }
  Emit(*l, e);
}

void CmService::OnRep(CmId& id, const wire::CmMessage& m) {
  if (id.state != CmState::kConnecting || Ud(id)) return;
  id.deadline_ns = 0;
  id.remote_comm = m.src_comm;
  id.remote_qpn = m.qpn;
  id.remote_psn = m.psn;
  id.state = CmState::kRepReceived;
  proto::CmEvent e = MakeEvent(id.handle, id.uid, id.handle, RDMA_CM_EVENT_CONNECT_RESPONSE, 0);
  SetConnParam(&e, m, kCmRepData, false);
  Emit(id, e);
}

void CmService::OnSidrRep(CmId& id, const wire::CmMessage& m) {
  if (id.state != CmState::kConnecting || !Ud(id)) return;
  id.deadline_ns = 0;
  if (m.reason != 0) {
    id.state = CmState::kDone;
    Emit(id, MakeEvent(id.handle, id.uid, id.handle, RDMA_CM_EVENT_UNREACHABLE, m.reason));
    return;
  }
  id.remote_comm = m.src_comm;
  id.remote_qpn = m.qpn;
  id.state = CmState::kEstablished;
  proto::CmEvent e = MakeEvent(id.handle, id.uid, id.handle, RDMA_CM_EVENT_ESTABLISHED, 0);
  SetUdParam(&e, id, m, kCmSidrRepData, true);
  Emit(id, e);
}

void CmService::OnRej(CmId& id, const wire::CmMessage& m) {
  switch (id.state) {
    case CmState::kConnecting:
    case CmState::kRepSent:
    case CmState::kRepReceived:
    case CmState::kRequested:
      break;
    default:
      return;
  }
  id.deadline_ns = 0;
  id.state = CmState::kDone;
  if (!id.touched) return;  // a request the program has not seen: nobody to tell
  proto::CmEvent e = MakeEvent(id.handle, id.uid, id.handle, RDMA_CM_EVENT_REJECTED, m.reason);
  SetConnParam(&e, m, kCmRejData, false);
  Emit(id, e);
}

void CmService::OnDreq(CmId* id, const wire::CmMessage& m) {
  // A DREP goes back unless the sender waits for none: it stops waiting even for an id that
  // is gone here.
  if (m.reason != kDreqNoReply) Reply(wire::CmKind::kDrep, m, 0);
  if (id == nullptr) return;
  switch (id->state) {
    case CmState::kEstablished:
    case CmState::kRepSent:
    case CmState::kRepReceived:
    case CmState::kDisconnecting:
      // After the DREP (queued before this, on the link or for this node): the side that
      // disconnected waits for it, while this one learns of the DREQ in the same turn.
      Fail(*id, RDMA_CM_EVENT_DISCONNECTED, 0, /*after_turn=*/true);
      return;
    default:
      return;
  }
}

void CmService::Establish(CmId& id) {
  id.deadline_ns = 0;
  id.state = CmState::kEstablished;
  proto::CmEvent e = MakeEvent(id.handle, id.uid, id.handle, RDMA_CM_EVENT_ESTABLISHED, 0);
  wire::CmMessage none{};
  none.qpn = id.remote_qpn;
  SetConnParam(&e, none, 0, false);
  Emit(id, e);
}

// The id's exchange ends with `event` (UNREACHABLE, DISCONNECTED): told once.
void CmService::Fail(CmId& id, uint32_t event, int32_t status, bool after_turn) {
  id.deadline_ns = 0;
  id.state = CmState::kDone;
  if (!id.touched) return;
  const proto::CmEvent e = MakeEvent(id.handle, id.uid, id.handle, event, status);
  if (!after_turn) return Emit(id, e);
  p_.loop.Defer([this, handle = id.handle, e] {
    if (const CmId* now = table_.Find(handle)) Emit(*now, e);
  });
}

void CmService::Tick() {
  const uint64_t now = MonotonicNs();
  std::vector<uint32_t> late;
  table_.ForEach([&](const CmId& id) {
    if (id.deadline_ns != 0 && id.deadline_ns <= now) late.push_back(id.handle);
  });
  for (uint32_t h : late) {
    CmId* id = table_.Find(h);
    if (id == nullptr) continue;
    spdlog::info("rdma_cm id {:#x} of client {}: no answer from {} while {}", h, id->pod,
                 FormatIpv4(id->remote.ip), CmStateName(id->state));
    if (id->state == CmState::kDisconnecting) {
      Fail(*id, RDMA_CM_EVENT_DISCONNECTED, 0);
    } else {
      wire::CmMessage m = MessageFrom(*id);
      m.reason = kRejTimeout;
      Send(nullptr, Ud(*id) ? wire::CmKind::kSidrRep : wire::CmKind::kRej, m);
      Fail(*id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
    }
  }
}

void CmService::OnLinkDown(LinkId link) {
  std::vector<uint32_t> cut;
  table_.ForEach([&](const CmId& id) {
    if (id.link == link) cut.push_back(id.handle);
  });
  for (uint32_t h : cut) {
    CmId* id = table_.Find(h);
    if (id == nullptr) continue;
    id->link = kNoLink;
    switch (id->state) {
      case CmState::kConnecting:
      case CmState::kRepSent:
        Fail(*id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
        break;
      case CmState::kRepReceived:
      case CmState::kEstablished:
      case CmState::kDisconnecting:
        Fail(*id, RDMA_CM_EVENT_DISCONNECTED, 0);
        break;
      default:
        break;
    }
  }
}

void CmService::OnPodGone(PodId pod) {
  for (uint32_t h : table_.IdsOf(pod)) DestroyId(h);
  table_.ForgetGrants(pod);
  std::vector<ChannelKey> gone;
  for (const auto& [key, ch] : channels_)
    if (key.first == pod) gone.push_back(key);
  for (const ChannelKey& key : gone) CloseChannel(key, "process gone");
}

// ---- events ----------------------------------------------------------------------------

void CmService::Emit(const CmId& id, const proto::CmEvent& event) {
  const ChannelKey key{id.pod, id.channel};
  auto it = channels_.find(key);
  if (it == channels_.end()) return;
  Channel& ch = it->second;
  proto::CmEvent e = event;
  uint32_t subject = 0;  // resp.id: the id the event is about
  std::memcpy(&subject, e.resp + offsetof(rdma_ucm_event_resp, id), sizeof(subject));
  const CmId* about = table_.Find(subject);
  if (about != nullptr) FillState(*about, ++state_version_, &e.state);
  if (ch.backlog.empty()) {
    const ssize_t n = ::send(ch.sock.get(), &e, sizeof(e), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(sizeof(e))) {
      // Between pods of this node: what the program does next comes to us.
      if (about != nullptr && about->link == kNoLink && p_.directory.IsLocal(about->remote.ip))
        p_.loop.StayAwake(event_spin_ns_);
      return;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return;  // closed: its hang-up follows
  }
  // What waits is the pod's memory in the router: charged to its queued-mib, so that many
  // channels that are not read cannot add up to more than the pod may hold.
  if (ch.backlog.size() >= kMaxCmBacklog ||
      !p_.quotas.TryTake(id.pod, {Quota::kQueuedBytes, sizeof(e)})) {
    // Deferred: the caller may hold ids of this channel.
    p_.loop.Defer([this, key] {
      CloseChannel(key, "does not read its rdma_cm events (its backlog or the pod's queued-mib "
                        "quota is full)");
    });
    return;
  }
  ch.backlog.push_back(e);
  p_.loop.Modify(ch.watch, EPOLLRDHUP | EPOLLOUT);
}

void CmService::Flush(const ChannelKey& key) {
  auto it = channels_.find(key);
  if (it == channels_.end()) return;
  Channel& ch = it->second;
  while (!ch.backlog.empty()) {
    const ssize_t n = ::send(ch.sock.get(), &ch.backlog.front(), sizeof(proto::CmEvent),
                             MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n != static_cast<ssize_t>(sizeof(proto::CmEvent))) break;
    ch.backlog.pop_front();
    p_.quotas.Give(key.first, {{Quota::kQueuedBytes, sizeof(proto::CmEvent)}});
  }
  if (ch.backlog.empty()) p_.loop.Modify(ch.watch, EPOLLRDHUP);
}

void CmService::CloseChannel(const ChannelKey& key, const char* why) {
  auto it = channels_.find(key);
  if (it == channels_.end()) return;
  for (uint32_t h : table_.IdsOn(key.first, key.second)) DestroyId(h);
  table_.ForgetGrants(key.first, key.second);
  spdlog::info("client {}: rdma_cm channel {} closed: {}", key.first, key.second, why);
  p_.loop.Unwatch(it->second.watch);
  const uint64_t queued = it->second.backlog.size() * sizeof(proto::CmEvent);
  channels_.erase(it);
  p_.quotas.Give(key.first, {{Quota::kFds, 1}, {Quota::kQueuedBytes, queued}});
}

}  // namespace ff::router
