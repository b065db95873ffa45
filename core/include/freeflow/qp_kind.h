// What each kind of QP freeflow serves (RC, UC, UD) is, as one record per kind: the facts the
// library acts on when it sends and receives, and the router when it connects, forwards and
// executes. Both take their answers from here, so the two sides cannot come to disagree on,
// say, whether a UC message without a receive is retried. A QP's kind is looked up once, when
// it is created (the library: ibv_create_qp; the router: CreateQp), and kept as a pointer.
// `ibv_qp_type` stays where the verbs ABI or freeflow's protocol carries a type.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "freeflow/tunables.h"

namespace ff {

struct QpKind {
  ibv_qp_type type;  // as the verbs ABI and the protocol carry it
  // Unconnected: each work request names its destination (an address handle, a QPN, a Q_Key)
  // and a peer of its own that goes away ends nothing. Each sender gets an inbound ring of its
  // own, which the router makes (proto::EventType::kUdRing) and may take back for a newer
  // sender; a receive begins with a GRH (IBV_WC_GRH). RC and UC are connected: one peer,
  // named at RTR, whose loss fails the QP.
  bool datagram;
  // The inbound rings of the QP's segment, and the bytes of each; 0 bytes: sized by the
  // depth of its receive queue (a bounce buffer: verbs-library.md).
  uint32_t rings;
  uint32_t ring_bytes;
  uint32_t max_fragment;  // the payload of one record of a SEND
  uint64_t max_message;   // the longest message a work request may carry
  uint32_t opcodes;       // the work requests it takes: bit (1 << ibv_wr_opcode)
  // A message for which no receive is posted: RC retries it (RNR, rnr_retry x the
  // receiver's min_rnr_timer); UC and UD drop it, as a fabric does.
  bool rnr_retry;
  // Through the router, each request is answered by the target's router (RC, UC: its WQE
  // stays in flight until then); a datagram completes once it left.
  bool answered;
  // A work request that fails, sending or receiving, moves the QP to ERR and flushes what
  // follows (RC, UC); UD completes it with its error and goes on.
  bool error_fails_qp;
  // Takes data only from the one peer its owner named at RTR, and a sender that asks before
  // then is told "ask again" (RC, UC); any QP may send to a UD QP.
  bool needs_consent;
  // May be created under a QP number the router granted, the create posted, not awaited
  // (proto::CreateQp, CreateQpReply::grant).
  bool posted_create;
  // What ibv_modify_qp requires of RESET -> INIT, INIT -> RTR and RTR -> RTS (ibv_qp_attr_mask).
  int init_attrs;
  int rtr_attrs;
  int rts_attrs;

  constexpr bool Allows(uint32_t opcode) const { return opcode < 32 && ((opcodes >> opcode) & 1); }
};

constexpr uint32_t OpcodeBit(ibv_wr_opcode op) { return 1u << op; }

namespace qp_kind_detail {
inline constexpr uint32_t kSends = OpcodeBit(IBV_WR_SEND) | OpcodeBit(IBV_WR_SEND_WITH_IMM);
inline constexpr uint32_t kWrites =
    OpcodeBit(IBV_WR_RDMA_WRITE) | OpcodeBit(IBV_WR_RDMA_WRITE_WITH_IMM);
inline constexpr uint32_t kReadsAndAtomics =
    OpcodeBit(IBV_WR_RDMA_READ) | OpcodeBit(IBV_WR_ATOMIC_CMP_AND_SWP) |
    OpcodeBit(IBV_WR_ATOMIC_FETCH_AND_ADD) | OpcodeBit(IBV_WR_ATOMIC_WRITE);
inline constexpr int kInitAttrs = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
inline constexpr int kUcRtrAttrs =
    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
}  // namespace qp_kind_detail

inline constexpr QpKind kRcQp{
    .type = IBV_QPT_RC,
    .datagram = false,
    .rings = 1,
    .ring_bytes = 0,
    .max_fragment = kMaxFragment,
    .max_message = kMaxMsgSize,
    .opcodes = qp_kind_detail::kSends | qp_kind_detail::kWrites | qp_kind_detail::kReadsAndAtomics |
               OpcodeBit(IBV_WR_SEND_WITH_INV) | OpcodeBit(IBV_WR_BIND_MW) |
               OpcodeBit(IBV_WR_LOCAL_INV),
    .rnr_retry = true,
    .answered = true,
    .error_fails_qp = true,
    .needs_consent = true,
    .posted_create = true,
    .init_attrs = qp_kind_detail::kInitAttrs | IBV_QP_ACCESS_FLAGS,
    .rtr_attrs = qp_kind_detail::kUcRtrAttrs | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
    .rts_attrs = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                 IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
};

inline constexpr QpKind kUcQp{
    .type = IBV_QPT_UC,
    .datagram = false,
    .rings = 1,
    .ring_bytes = 0,
    .max_fragment = kMaxFragment,
    .max_message = kMaxMsgSize,
    .opcodes = qp_kind_detail::kSends | qp_kind_detail::kWrites | OpcodeBit(IBV_WR_SEND_WITH_INV) |
               OpcodeBit(IBV_WR_LOCAL_INV),
    .rnr_retry = false,
    .answered = true,
    .error_fails_qp = true,
    .needs_consent = true,
    .posted_create = true,
    .init_attrs = qp_kind_detail::kInitAttrs | IBV_QP_ACCESS_FLAGS,
    .rtr_attrs = qp_kind_detail::kUcRtrAttrs,
    .rts_attrs = IBV_QP_STATE | IBV_QP_SQ_PSN,
};

// A UD message is one record of at most the path MTU.
inline constexpr QpKind kUdQp{
    .type = IBV_QPT_UD,
    .datagram = true,
    .rings = kUdRingsPerQp,
    .ring_bytes = kUdRingBytes,
    .max_fragment = kMtu,
    .max_message = kMtu,
    .opcodes = qp_kind_detail::kSends,
    .rnr_retry = false,
    .answered = false,
    .error_fails_qp = false,
    .needs_consent = false,
    .posted_create = false,
    .init_attrs = qp_kind_detail::kInitAttrs | IBV_QP_QKEY,
    .rtr_attrs = IBV_QP_STATE,
    .rts_attrs = IBV_QP_STATE | IBV_QP_SQ_PSN,
};

// The kind of QP type `type`; nullptr for a type freeflow does not serve (XRC, raw packet,
// or anything a socket may claim). Every type taken from outside goes through here.
constexpr const QpKind* QpKindOf(uint32_t type) {
  switch (type) {
    case IBV_QPT_RC:
      return &kRcQp;
    case IBV_QPT_UC:
      return &kUcQp;
    case IBV_QPT_UD:
      return &kUdQp;
    default:
      return nullptr;
  }
}

// True when `type` is a datagram kind; false for a connected one and for a type that is
// none of freeflow's.
constexpr bool IsDatagram(uint32_t type) {
  const QpKind* kind = QpKindOf(type);
  return kind != nullptr && kind->datagram;
}

// The type's name as people read it ("RC", "UC", "UD"), "other" for a type none of these.
constexpr const char* QpTypeName(uint32_t type) {
  return type == IBV_QPT_RC   ? "RC"
         : type == IBV_QPT_UC ? "UC"
         : type == IBV_QPT_UD ? "UD"
                              : "other";
}

}  // namespace ff
