// Links: how a QP reaches its peer, chosen once when the QP connects.
//
// A link is either to a peer process on this node (its QP segment is mapped here; we copy
// straight into its rings and registered memory) or to a peer on another node (we produce
// requests into a proxy segment of our router, which answers on the segment's response
// ring). ConnectLink sets `PeerLink::ops` to kSameNodeOps or kRouterOps; everything that
// differs between the two goes through that table (one indirect call, as rdma-core's
// verbs_context_ops), and nothing else asks which kind a link is. State such as "this CQ is
// fed only by the router" is derived from the ops of the links that exist (completion.cc).
#pragma once

#include <arpa/inet.h>

#include <algorithm>
#include <memory>

#include "base/objects.h"
#include "session/session.h"

namespace ff::verbs {

// What executing one work request came to.
enum class Exec {
  kDone,      // finished here; its status is known
  kBlocked,   // cannot proceed yet (ring full, no receive credit, READ limit): retry later
  kInFlight,  // handed on; the outcome comes back later (LinkOps::collect)
};

// What a pass over the send queue found on a link, for LinkOps::await_room.
enum class Room {
  kLacking,     // a WQE is blocked on the link
  kEnough,      // none is
  kNudgeTaken,  // the event thread took the router's nudge (kProxyDrained) and will look
};

struct LinkOps {
  // Executes send WQE `w` (send-queue index `index`) of `qp` over `link`. With kDone, *st is
  // its status. May be called again for a WQE it blocked on: it resumes where it stopped.
  Exec (*execute)(Qp* qp, PeerLink* link, SendWqe& w, uint64_t index, ibv_wc_status* st);
  // Applies outcomes of in-flight WQEs that came back: marks them done, frees
  // SendQueue::inflight / SendQueue::reads_inflight, copies READ data and atomic results.
  void (*collect)(Qp* qp, PeerLink* link);
  // The peer went away (or its router did): takes in outcomes already delivered, before
  // the link is marked dead and the QP failed or kept.
  void (*peer_gone)(Qp* qp, PeerLink* link);
  // Another party than the peer process (the router, or for a direct connection our own
  // event thread) produces into the QP's rings and answers its requests, and it rings the
  // process wake word after each delivery (poll_cq may sleep).
  bool router_fed;
  // What feeds the QP wakes a thread asleep in poll_cq by itself (a direct connection's
  // socket, which that sleep waits on): a CQ empty for long may sleep (completion.cc).
  bool wakes_sleeper;
  // The router nudges the event thread once it made room a blocked WQE waits for
  // (kProxyDrained): such a WQE does not stall. Elsewhere it stalls and is ticked.
  bool room_nudged;
  // What a pass over the send queue found on `link`. Through the router: kLacking asks it
  // to nudge the event thread once it has made room (QpSegmentHeader::sends_waiting), and
  // returns true when that was newly asked, so that the caller looks once more (the router
  // may have made room just before); kEnough withdraws the request; kNudgeTaken lets the
  // next kLacking ask again. Same node: false, nothing (the peer process makes room).
  bool (*await_room)(PeerLink* link, Room room);
  // Makes what a pass produced visible to the peer (a ring's tail and the peer's wake-up,
  // or a connection's send buffer written), once per pass.
  void (*publish)(PeerLink* link);
  // Where the peer is, as the traffic ledger counts the link's work requests.
  ff::TrafficPlacement placement;
};

extern const LinkOps kSameNodeOps;  // link_same_node.cc
extern const LinkOps kRouterOps;    // link_router.cc
extern const LinkOps kDirectOps;    // link_direct.cc

// Publishes a ring link's records and wakes its consumer if it armed for them (send_queue.cc).
void PublishRing(PeerLink* link);
// Applies one checked response of the peer's router or process to `qp`'s send queue
// (link_router.cc). Responses for WQEs no longer in flight are ignored. `announced`: its
// writer fired the send CQ's event already (the router does; a direct connection's answers
// are read by this process, which fires it when it completes the WQE). ctx->lock held.
void ApplyProxyResponse(Qp* qp, const ff::ResponseView& v, bool announced);
// No answer will come on `link` any more: its WQEs in flight complete with
// IBV_WC_RETRY_EXC_ERR, and the link is dead (link_router.cc). ctx->lock held.
void FailInFlight(Qp* qp, PeerLink* link);

// ---- connecting (connect.cc) ---------------------------------------------------------------
// Asks the router to connect `qp` to QP `dest_qpn` at `dest_ip` (host order; 0: address by
// `dest_lid`) and maps what it answers. `ud`: resolve a UD destination instead; `again`: one
// the router refused before (proto::kResolveAgain). Without the context lock (a router round
// trip). 0 or a positive errno.
int ConnectLink(Qp* qp, uint32_t dest_ip, uint16_t dest_lid, uint32_t dest_qpn, bool ud,
                std::unique_ptr<PeerLink>* out, bool again = false);
// The link of an RC/UC QP whose peer had not named it at RTR (Connection::awaited), asked
// for again. kDone with qp->conn.link set when it is there; kBlocked while the peer still
// has not named us; kDone with *st = IBV_WC_RETRY_EXC_ERR once the QP's retry budget (at
// least kConsentMinWaitNs) is spent or the router refuses. ctx->lock held.
Exec AwaitPeer(Qp* qp, ibv_wc_status* st);
// When a WQE whose peer went away at `now_ns` may complete with IBV_WC_RETRY_EXC_ERR: once a
// real requester's retries would have run out, timeout x (retry_cnt + 1), but no later than
// kPeerErrorMaxDelayNs from now (also for timeout 0, which on a fabric retries forever).
uint64_t RetryExhaustedAt(const Qp* qp, uint64_t now_ns);
// Asks once for the awaited link of `qp`: 0 with qp->conn.link set, else the router's answer
// (EINPROGRESS while the peer has not named it); no deadline. ctx->lock held.
int TryAwaitedLink(Qp* qp);
// The link of a UD QP to the destination of `w`, connected on first use; nullptr when the
// destination cannot be reached. ctx->lock held.
PeerLink* UdLink(Qp* qp, const SendWqe& w);
// The peer's region `region_id`, mapped on first use (same-node links), for an access that
// needs `need` (ibv_access_flags): EACCES when it writes and the peer shared the region for
// reads only. ctx->lock held. 0 or a positive errno.
int PeerRegion(Qp* qp, PeerLink* link, uint32_t region_id, uint32_t need, Mapping** out);

// ---- shared by both kinds of link ----------------------------------------------------------
using OpHandler = Exec (*)(Qp* qp, PeerLink* link, SendWqe& w, uint64_t index, ibv_wc_status* st);
// How one kind of link carries out each class of work request.
struct OpHandlers {
  OpHandler send;    // SEND, SEND_WITH_IMM
  OpHandler write;   // RDMA_WRITE, RDMA_WRITE_WITH_IMM
  OpHandler read;    // RDMA_READ
  OpHandler atomic;  // ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD, ATOMIC_WRITE
};

// Runs the handler for `w`'s opcode (post_send admitted only these opcodes).
inline Exec Dispatch(const OpHandlers& h, Qp* qp, PeerLink* link, SendWqe& w, uint64_t index,
                     ibv_wc_status* st) {
  switch (w.opcode) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
    case IBV_WR_SEND_WITH_INV:
      return h.send(qp, link, w, index, st);
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return h.write(qp, link, w, index, st);
    case IBV_WR_RDMA_READ:
      return h.read(qp, link, w, index, st);
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
    case IBV_WR_ATOMIC_WRITE:
      return h.atomic(qp, link, w, index, st);
    default:
      *st = IBV_WC_LOC_QP_OP_ERR;
      return Exec::kDone;
  }
}

// READ and the atomics: they write the local buffer and count against max_rd_atomic.
inline bool IsReadOrAtomic(uint32_t opcode) {
  return opcode == IBV_WR_RDMA_READ || opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
         opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

// The RecordHeader of a message record of `w` (kind, flags); sizes are the codec's. Inline:
// built in registers rather than returned through memory that AppendRecord copies again.
inline ff::RecordHeader MessageHeader(const Qp* qp, const SendWqe& w, uint8_t kind, uint8_t flags) {
  // In field order; total and frag_len are the codec's to fill in.
  return ff::RecordHeader{0,
                          kind,
                          flags,
                          0,
                          static_cast<uint32_t>(w.length),
                          w.imm,
                          qp->qpx.qp_base.qp_num,
                          htonl(qp->ctx->session->ip),
                          0,
                          w.remote_qkey};
}

// The ProxyRequest of work request `w` (send-queue index `index`) of `qp`, as the relay and
// a direct connection carry it; each record sets `last` and, for WRITE fragments, its
// remote_addr.
inline ff::ProxyRequest RequestOf(const Qp* qp, const SendWqe& w, uint64_t index) {
  ff::ProxyRequest op{};
  op.seq = static_cast<uint32_t>(index);
  op.opcode = static_cast<uint8_t>(w.opcode);
  op.length = static_cast<uint32_t>(w.length);
  op.rkey = w.rkey;
  op.remote_addr = w.remote_addr;
  op.compare_add = w.compare_add;
  op.swap = w.swap;
  op.rnr_retry = static_cast<uint8_t>(qp->attr.rnr_retry);
  return op;
}

// Flags of a SEND fragment.
inline uint8_t SendFlags(const SendWqe& w, bool first, bool last) {
  return static_cast<uint8_t>((first ? ff::kRecFirst : 0) | (last ? ff::kRecLast : 0) |
                              (w.opcode == IBV_WR_SEND_WITH_IMM ? ff::kRecImm : 0) |
                              (w.opcode == IBV_WR_SEND_WITH_INV ? ff::kRecInv : 0) |
                              ((w.flags & IBV_SEND_SOLICITED) ? ff::kRecSolicited : 0));
}

// Flags of WRITE_WITH_IMM's record (the one that completes a receive).
inline uint8_t WriteImmFlags(const SendWqe& w) {
  return static_cast<uint8_t>(ff::kRecFirst | ff::kRecLast | ff::kRecImm |
                              ((w.flags & IBV_SEND_SOLICITED) ? ff::kRecSolicited : 0));
}

// Writes the rest of `w`'s payload as records of at most `max_frag` bytes (at least one
// record, for an empty message). append(frag, first, last) writes one through the codec
// and returns its RingStatus. A full ring blocks (progress is kept in `w`); a corrupt one
// ends the WQE with IBV_WC_REM_OP_ERR. Long messages are published as they go, so that the
// receiver can copy out while we copy in.
template <typename Append>
[[gnu::always_inline]] inline Exec PutFragments(PeerLink* link, SendWqe& w, uint32_t max_frag,
                                                ibv_wc_status* st, Append&& append) {
  while (w.sent < w.length || !w.started) {
    const auto frag = static_cast<uint32_t>(std::min<uint64_t>(w.length - w.sent, max_frag));
    const ff::RingStatus rs = append(frag, !w.started, w.sent + frag == w.length);
    if (rs == ff::RingStatus::kFull) return Exec::kBlocked;
    if (rs != ff::RingStatus::kOk) {
      *st = IBV_WC_REM_OP_ERR;
      return Exec::kDone;
    }
    link->dirty = true;
    w.sent += frag;
    w.started = true;
    if (frag == max_frag) link->producer.Publish();
  }
  return Exec::kDone;
}

}  // namespace ff::verbs
