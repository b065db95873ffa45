// The pod socket: messages between a pod's library and its router over a SOCK_SEQPACKET Unix
// socket (one message per datagram, file descriptors as SCM_RIGHTS), or, once a verbs session
// has handed over its request ring (request_ring.h), as records in that ring. Every message
// is a fixed-size POD: the router rejects any size, op or descriptor count it does not expect
// (kOpSpecs, checked by DecodeRequest) and disconnects the sender. Requests are answered in
// order with a Response whose status is 0 or a positive errno value.
//
// This header holds what the requests of both kinds of session (verbs, TCP mode) share: the
// answer, the table of what the router accepts, and its check. The requests are in
// verbs_session.h, request_ring.h, cm.h (rdma_cm) and tcp_mode.h; docs/protocol.md states
// the contract.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "freeflow/protocol/cm.h"
#include "freeflow/protocol/common.h"
#include "freeflow/protocol/request_ring.h"
#include "freeflow/protocol/tcp_mode.h"
#include "freeflow/protocol/verbs_session.h"

namespace ff::proto {

struct Response {
  Header h;
  int32_t status;  // 0 or a positive errno value
  uint32_t reserved;
  union {
    HelloReply hello;
    CreateQpReply create_qp;
    ConnectReply connect;
    RegMrReply reg_mr;
    GetRegionReply region;
    CmReply cm;
    SockReply sock;
    char raw[160];
  } u;
};
static_assert(sizeof(Response) == 496 && alignof(Response) == 8);
static_assert(offsetof(Response, status) == 8 && offsetof(Response, u) == 16);

// What the router accepts for each request: its exact size and how many descriptors come
// with it.
struct OpSpec {
  Op op;
  uint32_t size;
  uint8_t min_fds;
  uint8_t max_fds;
};
inline constexpr OpSpec kOpSpecs[] = {{Op::kHello, sizeof(Hello), 3, 3},
                                      {Op::kCreateChannel, sizeof(CreateChannel), 1, 1},
                                      {Op::kDestroyChannel, sizeof(DestroyChannel), 0, 0},
                                      {Op::kCreateCq, sizeof(CreateCq), 0, 0},
                                      {Op::kDestroyCq, sizeof(DestroyCq), 0, 0},
                                      {Op::kCreateSrq, sizeof(CreateSrq), 1, 1},
                                      {Op::kDestroySrq, sizeof(DestroySrq), 0, 0},
                                      {Op::kCreateQp, sizeof(CreateQp), 1, 1},
                                      {Op::kDestroyQp, sizeof(DestroyQp), 0, 0},
                                      {Op::kConnectQp, sizeof(ConnectQp), 0, 0},
                                      {Op::kDisconnectQp, sizeof(DisconnectQp), 0, 0},
                                      {Op::kResolveUd, sizeof(ConnectQp), 0, 0},
                                      {Op::kRegMr, sizeof(RegMr), 0, 1},
                                      {Op::kDeregMr, sizeof(DeregMr), 0, 0},
                                      {Op::kGetRegion, sizeof(GetRegion), 0, 0},
                                      {Op::kMoveMr, sizeof(MoveMr), 0, 1},
                                      {Op::kAllocMw, sizeof(AllocMw), 0, 0},
                                      {Op::kBindMw, sizeof(BindMw), 0, 0},
                                      {Op::kInvalidateMw, sizeof(InvalidateMw), 0, 0},
                                      {Op::kDeallocMw, sizeof(DeallocMw), 0, 0},
                                      {Op::kCmOpenChannel, sizeof(CmOpenChannel), 1, 1},
                                      {Op::kCmCommand, sizeof(CmCommand), 0, 0},
                                      {Op::kSockHello, sizeof(SockHello), 0, 0},
                                      {Op::kSockListen, sizeof(SockListen), 0, 0},
                                      {Op::kSockUnlisten, sizeof(SockUnlisten), 0, 0},
                                      {Op::kSockConnect, sizeof(SockConnect), 0, 0},
                                      {Op::kSockClaim, sizeof(SockClaim), 0, 0},
                                      {Op::kSockRelease, sizeof(SockRelease), 0, 0},
                                      {Op::kSockClosed, sizeof(SockClosed), 0, 0},
                                      {Op::kNameQp, sizeof(NameQp), 0, 0},
                                      {Op::kRequestRing, sizeof(RequestRing), 1, 1},
                                      {Op::kDoorbell, sizeof(Doorbell), 0, 0},
                                      {Op::kDirectEnded, sizeof(DirectEnded), 0, 0},
                                      {Op::kTrafficLedger, sizeof(TrafficLedger), 1, 1}};
static_assert(sizeof(kOpSpecs) / sizeof(kOpSpecs[0]) == static_cast<size_t>(Op::kMaxOp) - 1,
              "every op has a spec");
static_assert(sizeof(Response) <= static_cast<size_t>(kMaxMessage));

constexpr const OpSpec* SpecOf(Op op) {
  for (const OpSpec& s : kOpSpecs)
    if (s.op == op) return &s;
  return nullptr;
}
constexpr bool SpecsFitMessages() {
  for (const OpSpec& s : kOpSpecs)
    if (s.size > static_cast<uint32_t>(kMaxMessage) || s.max_fds > kMaxFds) return false;
  return true;
}
static_assert(SpecsFitMessages());

// Whether a request of `op` may be posted (kPostedSeq): rdma_cm commands, whose outcome
// the library can know in advance (DESTROY_ID of its own id, for one), DestroyQp (which
// cannot fail for the library's own QP, and whose answer it never used), NameQp (a real
// QP's RTR never fails for want of its peer; a refusal shows when the link is first made),
// CreateQp under a granted number (the router then checks the number: see CreateQp), and
// the socket session's hints that answer nothing, DirectEnded (a report), and TrafficLedger
// (the session works the same without it). A posted request that answers descriptors would
// leave them nowhere.
constexpr bool IsPostable(Op op) {
  return op == Op::kCmCommand || op == Op::kCreateQp || op == Op::kDestroyQp || op == Op::kNameQp ||
         op == Op::kDoorbell || op == Op::kSockUnlisten || op == Op::kSockRelease ||
         op == Op::kSockClosed || op == Op::kDirectEnded || op == Op::kTrafficLedger;
}
// The requests of a socket session (after kSockHello); a verbs session sends only the others.
constexpr bool IsSocketOp(Op op) {
  return op == Op::kSockListen || op == Op::kSockUnlisten || op == Op::kSockConnect ||
         op == Op::kSockClaim || op == Op::kSockRelease || op == Op::kSockClosed;
}

// Checks one datagram from a pod: a known op with the size and descriptor count its spec
// names, posted only if the op may be. On success *op is the request's op; false means a
// protocol violation.
inline bool DecodeRequest(const char* buf, size_t len, int nfds, Op* op) {
  if (len < sizeof(Header)) return false;
  Header h;
  std::memcpy(&h, buf, sizeof(h));
  const OpSpec* spec = SpecOf(h.op);
  if (spec == nullptr || len != spec->size || nfds < spec->min_fds || nfds > spec->max_fds)
    return false;
  if (h.seq == kPostedSeq && !IsPostable(h.op)) return false;
  *op = h.op;
  return true;
}

// The request of a datagram DecodeRequest accepted, as its type.
template <typename M>
M As(const char* buf) {
  M m;
  std::memcpy(&m, buf, sizeof(m));
  return m;
}

}  // namespace ff::proto
