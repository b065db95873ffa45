// What a target does with the request records of one channel from an initiator on another
// node: claims receive credits (with the requester's RNR retries), puts SEND and
// WRITE_WITH_IMM records into the target QP's ring, checks WRITE, READ and ATOMIC accesses
// against the target's MR table and performs them on its registered memory, and answers
// every request once. A router executes so for relayed channels (router/src/nodes/
// executor.cc) and the target's own library for direct connections (verbs/src/direct/);
// the checks themselves are target_ops.h's, which the same-node path uses too. One
// implementation, so the paths cannot drift apart.
//
// The host says where answers go and how the target's memory is reached:
//   void Respond(uint32_t seq, uint32_t status, uint64_t offset, const char* data,
//                uint32_t len, bool last);         // one response record
//   bool CanAnswer();                             // false: READ data waits (the way back is full)
//   const MrEntry* MrTable();                     // the target's MR table
//   const M* MapRegion(uint32_t region, uint32_t need);  // the region, mapped (size(), as<char>())
// Everything about the target that a request might use is checked here or in target_ops.h
// before it is used; the records themselves were checked by DecodeRequest.
#pragma once

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "freeflow/clock.h"
#include "freeflow/codec.h"
#include "freeflow/qp_kind.h"
#include "freeflow/ring.h"
#include "freeflow/shm_layout.h"
#include "freeflow/target_ops.h"

namespace ff {

class TargetChannel {
 public:
  // The target QP as the executing party reaches it: its segment header and the receive
  // credits (its own or its SRQ's), the ring this channel produces into, and who the
  // initiator is (host byte order), which the records never decide.
  struct Setup {
    const QpKind* kind = nullptr;
    QpSegmentHeader* hdr = nullptr;
    RecvCredits* credits = nullptr;
    RingHeader* ring = nullptr;
    uint32_t ring_bytes = 0;
    uint32_t target_qpn = 0;
    uint32_t src_ip = 0;
    uint32_t src_qpn = 0;
  };
  void Init(const Setup& s) {
    s_ = s;
    producer_.Attach(s.ring, s.ring_bytes);
  }

  // Executes one checked request. false: it cannot proceed yet (no receive posted within
  // the RNR budget, the ring is full, READ data waits for CanAnswer): call again later
  // with the same record, which resumes where it stopped.
  template <typename Host>
  bool Apply(Host& host, const RequestView& v) {
    if (errored_) {
      // RC semantics: nothing after an error executes. The initiator's QP failed when the
      // error reached it, and ignores answers to what it flushed; a direct initiator still
      // counts one answer per work request to tell a silent peer from a busy one.
      if (v.req.last && s_.kind->answered && v.req.seq != failed_seq_)
        host.Respond(v.req.seq, IBV_WC_WR_FLUSH_ERR, 0, nullptr, 0, true);
      return true;
    }
    switch (v.h.kind) {
      case kRecSend:
        return ApplySend(host, v);
      case kRecWriteImm:
        return ApplyWriteImm(host, v);
      case kRecWrite:
        ApplyWrite(host, v);
        return true;
      case kRecReadReq:
        return ApplyRead(host, v);
      default:  // kRecAtomicReq: DecodeRequest admits no other kind
        ApplyAtomic(host, v);
        return true;
    }
  }

  // Records went into the target's ring since the last call: publishes them and says
  // whether a message marked solicited completed among them (*solicited), so that the
  // caller wakes the target. false: nothing to publish.
  bool Publish(bool* solicited) {
    if (!appended_) return false;
    appended_ = false;
    producer_.Publish();
    *solicited = solicited_;
    solicited_ = false;
    return true;
  }

  bool errored() const { return errored_; }
  const Setup& setup() const { return s_; }
  // While an RNR wait has started and not ended: when the next retry is due.
  uint64_t rnr_due_ns() const { return rnr_.deadline_ns; }

 private:
  enum class Claim { kHave, kDrop, kWait };

  template <typename Host>
  Claim ClaimCredit(Host& host, const RequestView& v) {
    if (have_credit_) return Claim::kHave;
    // A datagram claims nothing: its receiver takes a receive for it or drops it (the UD
    // QP's header is shared by all its senders; a counter there any of them could exhaust).
    if (s_.kind->datagram) return Claim::kHave;
    if (ff::ClaimCredit(s_.credits, &posted_cache_)) {
      have_credit_ = true;
      rnr_ = RnrState{};
      return Claim::kHave;
    }
    if (!s_.kind->rnr_retry) return Claim::kDrop;  // UC/UD: no receive, the message is dropped
    const uint32_t timer = s_.hdr->min_rnr_timer.load(std::memory_order_relaxed);
    if (RnrRetryExhausted(&rnr_, timer, v.req.rnr_retry, MonotonicNs())) {
      Fail(host, v.req.seq, IBV_WC_RNR_RETRY_EXC_ERR);
      return Claim::kDrop;
    }
    return Claim::kWait;
  }

  template <typename Host>
  bool ApplySend(Host& host, const RequestView& v) {
    if (v.h.flags & kRecFirst) {
      dropping_ = false;
      const Claim c = ClaimCredit(host, v);
      if (c == Claim::kWait) return false;
      dropping_ = c == Claim::kDrop;
      if (errored_) return true;
    }
    if (!dropping_) {
      RecordHeader out = v.h;
      out.src_qpn = s_.src_qpn;
      out.src_ip = htonl(s_.src_ip);
      const RingStatus st = AppendRecord(producer_, out, v.data, v.data_len);
      if (st == RingStatus::kFull) return false;
      if (st != RingStatus::kOk) {  // the target corrupted its own ring
        Fail(host, v.req.seq, IBV_WC_REM_OP_ERR);
        return true;
      } else {
        appended_ = true;
        if (v.data_len >= kMaxFragment) producer_.Publish();  // let it start on long messages
        if ((v.h.flags & (kRecLast | kRecSolicited)) == (kRecLast | kRecSolicited))
          solicited_ = true;
      }
    }
    if (v.h.flags & kRecLast) {
      have_credit_ = false;
      dropping_ = false;
      if (s_.kind->answered) Answer(host, v.req.seq);
    }
    return true;
  }

  // A message's success, once what it put into the target's ring is published: the sender's
  // completion says the message arrived, so a target that moves its QP to ERR right after
  // must find it there (as on a NIC, where the receive has completed by then). Answered
  // first, the sender could complete and the target fail its QP before the publish, which
  // flushed the receive the sender counted as done.
  template <typename Host>
  void Answer(Host& host, uint32_t seq) {
    if (appended_) producer_.Publish();  // Publish() still wakes the target: appended_ stays
    host.Respond(seq, IBV_WC_SUCCESS, 0, nullptr, 0, true);
  }

  template <typename Host>
  bool ApplyWriteImm(Host& host, const RequestView& v) {
    const Claim c = ClaimCredit(host, v);
    if (c == Claim::kWait) return false;
    if (errored_) return true;
    if (c == Claim::kHave) {
      RecordHeader out{};
      out.kind = kRecWriteImm;
      out.flags = kRecFirst | kRecLast | kRecImm | (v.h.flags & kRecSolicited);
      out.msg_len = v.req.length;
      out.imm = v.h.imm;
      out.src_qpn = s_.src_qpn;
      out.src_ip = htonl(s_.src_ip);
      const RingStatus st = AppendRecord(producer_, out, nullptr, 0);
      if (st == RingStatus::kFull) return false;
      if (st != RingStatus::kOk) {
        Fail(host, v.req.seq, IBV_WC_REM_OP_ERR);
        return true;
      }
      appended_ = true;
      if (out.flags & kRecSolicited) solicited_ = true;
    }
    have_credit_ = false;
    Answer(host, v.req.seq);
    return true;
  }

  // The target's memory behind an access (*out; nullptr for zero bytes, after checking the
  // target QP's access flags alone); false after answering the error.
  template <typename Host>
  bool Target(Host& host, const RequestView& v, uint64_t len, uint32_t need, char** out) {
    *out = nullptr;
    const ibv_wc_status st = ResolveTarget(
        s_.hdr, s_.target_qpn, host.MrTable(), v.req.rkey, v.req.remote_addr, len, need,
        [&](uint32_t region, uint32_t access) { return host.MapRegion(region, access); }, out);
    if (st != IBV_WC_SUCCESS) {
      Fail(host, v.req.seq, st);
      return false;
    }
    return true;
  }

  template <typename Host>
  void ApplyWrite(Host& host, const RequestView& v) {
    // Every fragment is checked; a zero-length WRITE checks only the target QP's access.
    if (v.data_len > 0 || v.req.length == 0) {
      char* dst = nullptr;
      if (!Target(host, v, v.data_len, IBV_ACCESS_REMOTE_WRITE, &dst)) return;
      if (v.data_len > 0) std::memcpy(dst, v.data, v.data_len);
    }
    if (v.req.last) host.Respond(v.req.seq, IBV_WC_SUCCESS, 0, nullptr, 0, true);
  }

  // Answers while the host takes them; false leaves the rest of the READ for later.
  template <typename Host>
  bool ApplyRead(Host& host, const RequestView& v) {
    char* src = nullptr;  // a zero-length READ checks only the target QP's access
    if (!Target(host, v, v.req.length, IBV_ACCESS_REMOTE_READ, &src)) {
      read_sent_ = 0;
      return true;
    }
    do {
      if (!host.CanAnswer()) return false;
      const uint64_t at = read_sent_;
      const auto frag = static_cast<uint32_t>(std::min<uint64_t>(v.req.length - at, kMaxFragment));
      host.Respond(v.req.seq, IBV_WC_SUCCESS, at, src + at, frag, at + frag == v.req.length);
      read_sent_ += frag;
    } while (read_sent_ < v.req.length);
    read_sent_ = 0;
    return true;
  }

  template <typename Host>
  void ApplyAtomic(Host& host, const RequestView& v) {
    if ((v.req.remote_addr & 7) != 0) return Fail(host, v.req.seq, IBV_WC_REM_INV_REQ_ERR);
    char* word = nullptr;
    if (!Target(host, v, 8, AtomicAccess(v.req.opcode), &word)) return;
    const uint64_t old =
        AtomicOp(reinterpret_cast<uint64_t*>(word), v.req.opcode, v.req.compare_add, v.req.swap);
    const bool returns = AtomicReturnsOriginal(v.req.opcode);
    host.Respond(v.req.seq, IBV_WC_SUCCESS, 0,
                 returns ? reinterpret_cast<const char*>(&old) : nullptr, returns ? 8 : 0, true);
  }

  // An error completes the request that caused it; RC semantics: nothing after it executes.
  template <typename Host>
  void Fail(Host& host, uint32_t seq, ibv_wc_status status) {
    host.Respond(seq, status, 0, nullptr, 0, true);
    errored_ = true;
    failed_seq_ = seq;
  }

  Setup s_;
  RingProducer producer_;
  uint64_t posted_cache_ = 0;
  uint64_t read_sent_ = 0;  // answered bytes of the READ being answered
  bool have_credit_ = false;
  bool dropping_ = false;  // UC/UD message without a receive: drop its fragments
  bool errored_ = false;
  uint32_t failed_seq_ = 0;  // the work request the error answered
  bool appended_ = false;
  bool solicited_ = false;
  RnrState rnr_;
};

}  // namespace ff
