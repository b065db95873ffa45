// ucma commands written to an rdma_cm descriptor (cm_device.h): parsed as the kernel's
// ucma_write parses them, GET_EVENT served from the channel (cm_events.cc), every other
// command sent to the router as a CmCommand and its answer copied to the command's
// `response`. The library rewrites what only this process can resolve (MIGRATE_ID's
// descriptor, SET_OPTION's value) and fills the events_reported answers from its own
// counts (cm_table.h).
//
// Like the kernel, it copies the answer to the program's pointer as given: a bad pointer
// faults in the program (the kernel would answer EFAULT); a null one is EFAULT.
#include <rdma/rdma_user_cm.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstring>

#include "base/exports.h"
#include "freeflow/cm_qp_attr.h"
#include "rdmacm/cm_channel.h"
#include "rdmacm/cm_device.h"
#include "session/session.h"

namespace ff::verbs {
namespace {

using ff::proto::kCmMaxBody;
using ff::proto::kCmMaxReply;

// A command as the program wrote it: its header and `in` bytes of body (the rest zero).
struct Command {
  rdma_ucm_cmd_hdr hdr;
  uint32_t in_len;  // what the router is told: `in`, or more for SET_OPTION's value
  alignas(8) char body[kCmMaxBody];
};

template <typename T>
T Get(const char* bytes, size_t offset) {
  T v;
  std::memcpy(&v, bytes + offset, sizeof(v));
  return v;
}
template <typename T>
void Put(char* bytes, size_t offset, T v) {
  std::memcpy(bytes + offset, &v, sizeof(v));
}

// Where the command's `response` pointer is in its body, for the commands whose answer the
// kernel writes there; -1 for the others.
constexpr int kNoResponse = -1;
constexpr std::array<int, RDMA_USER_CM_CMD_JOIN_MCAST + 1> ResponseTable() {
  std::array<int, RDMA_USER_CM_CMD_JOIN_MCAST + 1> at{};
  at.fill(kNoResponse);
  at[RDMA_USER_CM_CMD_CREATE_ID] = offsetof(rdma_ucm_create_id, response);
  at[RDMA_USER_CM_CMD_DESTROY_ID] = offsetof(rdma_ucm_destroy_id, response);
  at[RDMA_USER_CM_CMD_QUERY_ROUTE] = offsetof(rdma_ucm_query, response);
  at[RDMA_USER_CM_CMD_INIT_QP_ATTR] = offsetof(rdma_ucm_init_qp_attr, response);
  at[RDMA_USER_CM_CMD_GET_EVENT] = offsetof(rdma_ucm_get_event, response);
  at[RDMA_USER_CM_CMD_JOIN_IP_MCAST] = offsetof(rdma_ucm_join_ip_mcast, response);
  at[RDMA_USER_CM_CMD_LEAVE_MCAST] = offsetof(rdma_ucm_destroy_id, response);
  at[RDMA_USER_CM_CMD_MIGRATE_ID] = offsetof(rdma_ucm_migrate_id, response);
  at[RDMA_USER_CM_CMD_QUERY] = offsetof(rdma_ucm_query, response);
  at[RDMA_USER_CM_CMD_JOIN_MCAST] = offsetof(rdma_ucm_join_mcast, response);
  return at;
}
constexpr auto kResponseAt = ResponseTable();

// The kernel's checks, in its order (ucma_write), and GET_OPTION, which it never had.
int Parse(const void* buf, size_t len, Command* c) {
  if (len < sizeof(c->hdr)) return EINVAL;
  if (buf == nullptr) return EFAULT;
  std::memcpy(&c->hdr, buf, sizeof(c->hdr));
  if (c->hdr.cmd > RDMA_USER_CM_CMD_JOIN_MCAST) return EINVAL;
  if (c->hdr.in + sizeof(c->hdr) > len) return EINVAL;
  if (c->hdr.in > kCmMaxBody) return EINVAL;
  if (c->hdr.cmd == RDMA_USER_CM_CMD_GET_OPTION) return ENOSYS;
  std::memset(c->body, 0, sizeof(c->body));
  std::memcpy(c->body, static_cast<const char*>(buf) + sizeof(c->hdr), c->hdr.in);
  c->in_len = c->hdr.in;
  return 0;
}

// What the router cannot resolve: MIGRATE_ID names the id's current channel by this
// process's descriptor; SET_OPTION's value is in this process's memory.
int Rewrite(const CmChannel& ch, Command* c) {
  if (c->hdr.cmd == RDMA_USER_CM_CMD_MIGRATE_ID) {
    const size_t at = offsetof(rdma_ucm_migrate_id, fd);
    const int fd = static_cast<int>(Get<uint32_t>(c->body, at));
    std::shared_ptr<CmChannel> from = MaybeCmFd(fd) ? cmtable::Find(fd) : nullptr;
    const bool ours = from != nullptr && from->session == ch.session;
    Put<uint32_t>(c->body, at, ours ? from->id : ff::proto::kNoId);
  } else if (c->hdr.cmd == RDMA_USER_CM_CMD_SET_OPTION) {
    const auto optval = Get<uint64_t>(c->body, offsetof(rdma_ucm_set_option, optval));
    const auto optlen = Get<uint32_t>(c->body, offsetof(rdma_ucm_set_option, optlen));
    if (optlen > kCmMaxBody - sizeof(rdma_ucm_set_option)) return EINVAL;
    if (optlen > 0 && optval == 0) return EFAULT;
    if (optlen > 0)
      std::memcpy(c->body + sizeof(rdma_ucm_set_option),
                  reinterpret_cast<const void*>(static_cast<uintptr_t>(optval)), optlen);
    c->in_len = static_cast<uint32_t>(sizeof(rdma_ucm_set_option) + optlen);
  }
  return 0;
}

ff::proto::CmCommand Request(const CmChannel& ch, const Command& c, uint32_t handle = 0,
                             uint32_t flags = 0) {
  ff::proto::CmCommand req{};
  req.handle = handle;
  req.flags = flags;
  req.channel = ch.id;
  req.cmd = c.hdr.cmd;
  req.in_len = c.in_len;
  req.out_len = c.hdr.out;
  std::memcpy(req.body, c.body, sizeof(req.body));
  return req;
}

// The command sent without waiting (Session::Post): for commands whose outcome the library
// knows. The router's answer, had it sent one, would carry nothing the program reads.
int Post(const CmChannel& ch, const Command& c, uint32_t handle = 0, uint32_t flags = 0) {
  const ff::proto::CmCommand req = Request(ch, c, handle, flags);
  return ch.session->Post(&req, sizeof(req));
}

// The router's answer; *gone when none came back because the router is gone.
int Send(const CmChannel& ch, const Command& c, ff::proto::CmReply* reply, bool* gone,
         uint32_t flags = 0) {
  const ff::proto::CmCommand req = Request(ch, c, 0, flags);
  ff::proto::Response resp{};
  const int rc = ch.session->Call(&req, sizeof(req), nullptr, 0, &resp);
  *gone = rc == ENOTCONN && resp.h.op != ff::proto::Op::kCmCommand;
  if (rc != 0) return rc;
  *reply = resp.u.cm;
  if (reply->out_len > kCmMaxReply) {
    LogError("the router answered rdma_cm command %u with %u bytes; using %u", c.hdr.cmd,
             reply->out_len, kCmMaxReply);
    reply->out_len = kCmMaxReply;
  }
  return 0;
}

// With the router gone, destroying an id or leaving a group still works, as it does on a
// removed kernel device: librdmacm frees its id only when DESTROY_ID succeeds.
int AnswerLocally(const Command& c, ff::proto::CmReply* reply) {
  if (c.hdr.cmd != RDMA_USER_CM_CMD_DESTROY_ID && c.hdr.cmd != RDMA_USER_CM_CMD_LEAVE_MCAST)
    return ENODEV;
  if (c.hdr.out < sizeof(rdma_ucm_destroy_id_resp)) return ENOSPC;
  reply->out_len = 0;
  return 0;
}

void PutReported(ff::proto::CmReply* reply, uint32_t reported) {
  Put<uint32_t>(reply->out, 0, reported);
  reply->out_len = std::max<uint32_t>(reply->out_len, sizeof(reported));
}

// The handle a CREATE_ID or JOIN_* answer carries (rdma_ucm_create_id_resp).
int NewHandle(const Command& c, const ff::proto::CmReply& reply, uint32_t* handle) {
  if (reply.out_len < sizeof(rdma_ucm_create_id_resp)) {
    LogError("the router answered rdma_cm command %u without a handle", c.hdr.cmd);
    return EPROTO;
  }
  *handle = Get<uint32_t>(reply.out, offsetof(rdma_ucm_create_id_resp, id));
  return 0;
}

// What the library keeps of a command that succeeded (cm_table.h).
int Account(const CmChannel& ch, const Command& c, ff::proto::CmReply* reply) {
  const char* b = c.body;
  uint32_t handle = 0;
  switch (c.hdr.cmd) {
    case RDMA_USER_CM_CMD_CREATE_ID:
      if (const int rc = NewHandle(c, *reply, &handle)) return rc;
      cmtable::IdCreated(ch, handle, Get<uint64_t>(b, offsetof(rdma_ucm_create_id, uid)));
      return 0;
    case RDMA_USER_CM_CMD_DESTROY_ID:
      handle = Get<uint32_t>(b, offsetof(rdma_ucm_destroy_id, id));
      PutReported(reply, cmtable::IdDestroyed(ch.session, handle));
      return 0;
    case RDMA_USER_CM_CMD_LEAVE_MCAST:
      handle = Get<uint32_t>(b, offsetof(rdma_ucm_destroy_id, id));
      PutReported(reply, cmtable::JoinLeft(ch.session, handle));
      return 0;
    case RDMA_USER_CM_CMD_MIGRATE_ID:
      handle = Get<uint32_t>(b, offsetof(rdma_ucm_migrate_id, id));
      PutReported(reply, cmtable::IdMigrated(ch, handle));
      return 0;
    case RDMA_USER_CM_CMD_SET_OPTION:
      // A path the program resolved itself resolves the route (the router's ROUTE_RESOLVED
      // follows): a RESOLVE_ROUTE after it is the router's to refuse.
      if (Get<uint32_t>(b, offsetof(rdma_ucm_set_option, level)) == RDMA_OPTION_IB &&
          Get<uint32_t>(b, offsetof(rdma_ucm_set_option, optname)) == RDMA_OPTION_IB_PATH)
        cmtable::SetPhase(ch.session, Get<uint32_t>(b, offsetof(rdma_ucm_set_option, id)),
                          CmPhase::kUnknown);
      return 0;
    case RDMA_USER_CM_CMD_ACCEPT:
      if (Get<uint8_t>(b, offsetof(rdma_ucm_accept, conn_param.valid)) != 0)
        cmtable::IdAccepted(ch.session, Get<uint32_t>(b, offsetof(rdma_ucm_accept, id)),
                            Get<uint64_t>(b, offsetof(rdma_ucm_accept, uid)));
      return 0;
    case RDMA_USER_CM_CMD_JOIN_IP_MCAST:
    case RDMA_USER_CM_CMD_JOIN_MCAST: {
      if (const int rc = NewHandle(c, *reply, &handle)) return rc;
      static_assert(offsetof(rdma_ucm_join_ip_mcast, id) != offsetof(rdma_ucm_join_mcast, id));
      const size_t at = c.hdr.cmd == RDMA_USER_CM_CMD_JOIN_MCAST
                            ? offsetof(rdma_ucm_join_mcast, id)
                            : offsetof(rdma_ucm_join_ip_mcast, id);
      cmtable::JoinCreated(ch.session, Get<uint32_t>(b, at), handle);
      return 0;
    }
    default:
      return 0;
  }
}

// QUERY_ROUTE and INIT_QP_ATTR, answered from the id's last state as the router would
// (cm_table.h); false when the router must answer.
bool AnswerFromState(const CmChannel& ch, const Command& c, ff::proto::CmReply* reply, int* rc) {
  const bool route = c.hdr.cmd == RDMA_USER_CM_CMD_QUERY_ROUTE;
  if (!route && c.hdr.cmd != RDMA_USER_CM_CMD_INIT_QP_ATTR) return false;
  const uint32_t handle = Get<uint32_t>(
      c.body, route ? offsetof(rdma_ucm_query, id) : offsetof(rdma_ucm_init_qp_attr, id));
  ff::proto::CmIdState st;
  if (!cmtable::LastState(ch, handle, &st)) return false;
  if (!st.qp.seen) {
    // A listener's child the router does not know the program holds: this command, posted,
    // tells it (the child then lives on its own), and the answer is the same from here.
    if (Post(ch, c) != 0) return false;
    cmtable::MarkSeen(ch.session, handle);
  }
  if (route) {
    if (c.hdr.out < offsetof(rdma_ucm_query_route_resp, ibdev_index)) {
      *rc = ENOSPC;
      return true;
    }
    reply->out_len = std::min<uint32_t>(c.hdr.out, sizeof(st.route));
    std::memcpy(reply->out, st.route, reply->out_len);
    *rc = 0;
    return true;
  }
  if (c.hdr.out < sizeof(ib_uverbs_qp_attr)) {
    *rc = ENOSPC;
    return true;
  }
  ib_uverbs_qp_attr attr;
  const auto state = Get<uint32_t>(c.body, offsetof(rdma_ucm_init_qp_attr, qp_state));
  *rc = ff::CmInitQpAttr(st.qp, state, &attr);
  // The RTR that follows names its peer without linking (cmtable::NoteUnnamedPeer): on the
  // passive side (kRequested), whose peer cannot have named it yet, and on the active side
  // (kRtuDue), which links when it first sends.
  const CmPhase phase = cmtable::Phase(ch, handle);
  if (*rc == 0 && state == IBV_QPS_RTR && !ff::IsDatagram(st.qp.qp_type) &&
      (phase == CmPhase::kRequested || phase == CmPhase::kRtuDue))
    cmtable::NoteUnnamedPeer(ch.session, st.qp.remote_ip, st.qp.remote_qpn);
  reply->out_len = sizeof(attr);
  std::memcpy(reply->out, &attr, sizeof(attr));
  return true;
}

// DESTROY_ID of an id of this process on `ch`: the router cannot refuse it, and what the
// program gets back (events_reported) is the library's to count, so it is not waited for.
bool PostedDestroy(const CmChannel& ch, const Command& c) {
  if (c.hdr.cmd != RDMA_USER_CM_CMD_DESTROY_ID || c.hdr.out < sizeof(rdma_ucm_destroy_id_resp))
    return false;
  return cmtable::Owns(ch, Get<uint32_t>(c.body, offsetof(rdma_ucm_destroy_id, id))) &&
         Post(ch, c) == 0;
}

// The id a CONNECT, ACCEPT, REJECT or DISCONNECT names (false: another command, or too
// short).
bool ConnectionCommand(const Command& c, uint32_t* handle) {
  size_t at = 0;
  switch (c.hdr.cmd) {
    case RDMA_USER_CM_CMD_CONNECT:
      at = offsetof(rdma_ucm_connect, id);
      break;
    case RDMA_USER_CM_CMD_ACCEPT:
      at = offsetof(rdma_ucm_accept, id);
      break;
    case RDMA_USER_CM_CMD_REJECT:
      at = offsetof(rdma_ucm_reject, id);
      break;
    case RDMA_USER_CM_CMD_DISCONNECT:
      at = offsetof(rdma_ucm_disconnect, id);
      break;
    default:
      return false;
  }
  if (c.hdr.in < at + sizeof(uint32_t)) return false;
  *handle = Get<uint32_t>(c.body, at);
  return true;
}

// What the router checks of a CONNECT's or a passive ACCEPT's connection parameters: that
// they are given, and that the private data fits the REQ or REP (SIDR for a UD id).
bool ConnParamFits(const CmChannel& ch, const Command& c, uint32_t handle) {
  const bool connect = c.hdr.cmd == RDMA_USER_CM_CMD_CONNECT;
  const size_t at =
      connect ? offsetof(rdma_ucm_connect, conn_param) : offsetof(rdma_ucm_accept, conn_param);
  if (c.hdr.in < at + sizeof(rdma_ucm_conn_param)) return false;
  const auto p = Get<rdma_ucm_conn_param>(c.body, at);
  ff::proto::CmIdState st;
  if (p.valid == 0 || !cmtable::LastState(ch, handle, &st)) return false;
  const bool ud = ff::IsDatagram(st.qp.qp_type);
  const uint8_t max = connect ? (ud ? ff::kCmSidrReqData : ff::kCmReqData)
                              : (ud ? ff::kCmSidrRepData : ff::kCmRepData);
  return p.private_data_len <= max;
}

// Commands whose outcome follows from the events the program has read (cmtable::CmPhase),
// posted:
//   - CONNECT of a resolved id, and ACCEPT of a request: each starts an exchange whose
//     outcome the program reads as events (CONNECT_RESPONSE, REJECTED, UNREACHABLE;
//     ESTABLISHED), so its answer would only delay the peer, who waits on it;
//   - ACCEPT as the active side's RTU, on the path of every connection the program makes
//     (ESTABLISHED waits for it);
//   - DISCONNECT of a connected id.
// The router may still refuse one only when the peer ended the exchange meanwhile (or the
// request timed out), whose DISCONNECTED, REJECTED or UNREACHABLE event the program then
// reads next; it logs the refusal.
bool PostedByPhase(const CmChannel& ch, const Command& c) {
  uint32_t handle = 0;
  if (!ConnectionCommand(c, &handle)) return false;
  const CmPhase phase = cmtable::Phase(ch, handle);
  bool known = false;
  CmPhase next = CmPhase::kUnknown;  // after a posted CONNECT or passive ACCEPT: events tell
  switch (c.hdr.cmd) {
    case RDMA_USER_CM_CMD_CONNECT:
      known = phase == CmPhase::kRouteResolved && ConnParamFits(ch, c, handle);
      break;
    case RDMA_USER_CM_CMD_ACCEPT:
      known = phase == CmPhase::kRtuDue ||
              (phase == CmPhase::kRequested && ConnParamFits(ch, c, handle));
      if (phase == CmPhase::kRtuDue) next = CmPhase::kConnected;
      break;
    case RDMA_USER_CM_CMD_DISCONNECT:
      known = phase == CmPhase::kConnected;
      next = CmPhase::kConnected;
      break;
    default:
      break;
  }
  if (known && Post(ch, c) == 0) {
    cmtable::SetPhase(ch.session, handle, next);
    return true;
  }
  // Sent and answered: what it does to the connection is the router's to say.
  cmtable::SetPhase(ch.session, handle, CmPhase::kUnknown);
  return false;
}

// RESOLVE_ROUTE of an id whose ADDR_RESOLVED the program read and that no command since
// moved on (kAddrResolved), answered here: the router can only resolve that route (its state
// is the one ADDR_RESOLVED reported), so the command is posted and the library writes
// ROUTE_RESOLVED into the channel itself, one router round trip fewer per connection.
// Posted first: a thread that reads the event and goes on to CONNECT is behind it.
bool ResolvedRouteHere(CmChannel& ch, const Command& c) {
  constexpr size_t at = offsetof(rdma_ucm_resolve_route, id);
  if (c.hdr.cmd != RDMA_USER_CM_CMD_RESOLVE_ROUTE || c.hdr.in < at + sizeof(uint32_t) ||
      !ch.router_end)
    return false;
  ff::proto::CmEvent ev;
  if (!cmtable::TakeRouteResolution(ch, Get<uint32_t>(c.body, at), &ev)) return false;
  if (const int rc = Post(ch, c)) {
    // Sent instead, and answered ENODEV when the router is gone (DEVICE_REMOVAL follows).
    if (rc != ENOTCONN) LogError("cannot post RESOLVE_ROUTE to the router: %s", std::strerror(rc));
    return false;
  }
  CmQueueEvent(ch, ev);
  return true;
}

// DISCONNECT of a connected RC/UC id whose end the program has not read, sent with
// kCmEventWritten: unless the router reported the id's end already (the peer disconnected
// first), it sends the DREQ, ends the id without waiting for the DREP and answers with the
// flag, and the library writes DISCONNECTED into the channel itself, as it writes
// ROUTE_RESOLVED. The program then waits neither for its router to write the event (on one
// node) nor for the DREP to cross the node link, as a real device's CM answers a DREQ at
// once; the router's answer decides who writes, so an id's end is written once even when
// the peers' DREQs cross. A DISCONNECT of an id whose DISCONNECTED the program has read is
// not sent at all: the router's id is done then, and DISCONNECT would do nothing there but
// answer 0 (a server that disconnects when its client did saves a message a connection).
// True when it dealt with the command (*rc: its status).
bool DisconnectedHere(CmChannel& ch, const Command& c, int* rc) {
  uint32_t handle = 0;
  if (c.hdr.cmd != RDMA_USER_CM_CMD_DISCONNECT || !ConnectionCommand(c, &handle)) return false;
  *rc = 0;
  if (cmtable::DisconnectionRead(ch, handle)) return true;
  ff::proto::CmEvent ev;
  if (!ch.router_end || !cmtable::DisconnectionEvent(ch, handle, &ev)) return false;
  ff::proto::CmReply reply{};
  bool gone = false;
  *rc = Send(ch, c, &reply, &gone, ff::proto::kCmEventWritten);
  if (gone) *rc = ENODEV;  // DEVICE_REMOVAL follows
  if (*rc == 0) cmtable::NoteState(ch.session, reply.state);
  if (*rc == 0 && (reply.flags & ff::proto::kCmEventWritten) != 0) CmQueueEvent(ch, ev);
  return true;
}

// CREATE_ID under a handle the router granted (cmtable::TakeGrantedHandle), posted: what the
// router checks is checked here first (the answer's room; the port space and QP type, by the
// router's own rule, ff::CmIdKind), so the answer would only be that handle, which the
// program gets from here.
bool PostedCreate(CmChannel& ch, const Command& c, ff::proto::CmReply* reply) {
  if (c.hdr.cmd != RDMA_USER_CM_CMD_CREATE_ID || c.hdr.out < sizeof(rdma_ucm_create_id_resp))
    return false;
  const auto cmd = Get<rdma_ucm_create_id>(c.body, 0);
  uint32_t handle = 0;
  if (ff::CmIdKind(cmd.ps, cmd.qp_type) == nullptr || !cmtable::TakeGrantedHandle(ch, &handle) ||
      Post(ch, c, handle) != 0)
    return false;
  rdma_ucm_create_id_resp r{};
  r.id = handle;
  std::memcpy(reply->out, &r, sizeof(r));
  reply->out_len = sizeof(r);
  return true;
}

// The router refuses every multicast join (freeflow has no multicast): said once in the
// program's own output, where its user looks first, beside the EOPNOTSUPP it gets.
void SayJoinsAreRefused(const Command& c, int rc) {
  if (rc != EOPNOTSUPP ||
      (c.hdr.cmd != RDMA_USER_CM_CMD_JOIN_IP_MCAST && c.hdr.cmd != RDMA_USER_CM_CMD_JOIN_MCAST))
    return;
  static std::atomic<bool> said{false};
  if (!said.exchange(true))
    LogError("rdma_join_multicast: freeflow has no multicast (Operation not supported)");
}

// A route that leads to the device names it by this channel's session's device index
// (session.h Device), which the router cannot know: librdmacm finds the device by GUID and
// index, and a process whose router was replaced must find the new device, not the old.
void StampDeviceIndex(const CmChannel& ch, ff::proto::CmReply* reply) {
  constexpr size_t kAt = offsetof(rdma_ucm_query_route_resp, ibdev_index);
  if (ch.session == nullptr || reply->out_len < kAt + sizeof(uint32_t) ||
      Get<uint64_t>(reply->out, offsetof(rdma_ucm_query_route_resp, node_guid)) == 0)
    return;
  Put<uint32_t>(reply->out, kAt, static_cast<uint32_t>(ch.session->device.index));
}

// Every command but GET_EVENT.
int Forward(CmChannel& ch, Command* c) {
  // Those the router is not asked for too (a connect may be posted): what the program's polls
  // held back goes first, as Session::Call says.
  if (ch.session->direct_conns.load(std::memory_order_relaxed) != 0) FlushDirectAnswers(ch.session);
  void* response = nullptr;
  if (const int at = kResponseAt[c->hdr.cmd]; at != kNoResponse) {
    response = reinterpret_cast<void*>(static_cast<uintptr_t>(Get<uint64_t>(c->body, at)));
    if (response == nullptr && c->hdr.out > 0) return EFAULT;
  }
  if (const int rc = Rewrite(ch, c)) return rc;
  ff::proto::CmReply reply{};
  bool gone = ch.removed.load();
  int rc = 0;
  if (!gone && (AnswerFromState(ch, *c, &reply, &rc) || DisconnectedHere(ch, *c, &rc))) {
    if (rc != 0) return rc;
  } else if (!gone &&
             (PostedDestroy(ch, *c) || PostedByPhase(ch, *c) || ResolvedRouteHere(ch, *c))) {
    reply.out_len = 0;
  } else if (gone || !PostedCreate(ch, *c, &reply)) {
    rc = gone ? 0 : Send(ch, *c, &reply, &gone);
    if (gone) rc = AnswerLocally(*c, &reply);
    SayJoinsAreRefused(*c, rc);
    if (!gone) cmtable::NoteState(ch.session, reply.state);
    if (rc == 0 && !gone && c->hdr.cmd == RDMA_USER_CM_CMD_CREATE_ID)
      cmtable::NoteGrant(ch, reply.grant_first, reply.grant_count);
  }
  if (rc == 0) rc = Account(ch, *c, &reply);
  if (rc != 0) return rc;
  if (c->hdr.cmd == RDMA_USER_CM_CMD_QUERY_ROUTE) StampDeviceIndex(ch, &reply);
  if (response != nullptr)
    std::memcpy(response, reply.out, std::min<uint32_t>(c->hdr.out, reply.out_len));
  return 0;
}

int Execute(CmChannel& ch, const void* buf, size_t len) {
  Command c;
  if (const int rc = Parse(buf, len, &c)) return rc;
  if (ch.session == nullptr) return ENODEV;  // the parent's channel, in a forked child
  if (c.hdr.cmd == RDMA_USER_CM_CMD_GET_EVENT)
    return CmGetEvent(ch, c.hdr.out, Get<uint64_t>(c.body, offsetof(rdma_ucm_get_event, response)));
  return Forward(ch, &c);
}

}  // namespace

bool CmWrite(int fd, const void* buf, size_t len, ssize_t* result) {
  std::shared_ptr<CmChannel> ch = cmtable::Find(fd);
  if (ch == nullptr) return false;
  const int saved = errno;
  const int rc = Guarded([&] { return Execute(*ch, buf, len); });
  if (rc != 0) {
    errno = rc;
    *result = -1;
  } else {
    errno = saved;
    *result = static_cast<ssize_t>(len);
  }
  return true;
}

}  // namespace ff::verbs
