// The one codec for records that cross a process or node boundary on the data path:
// records in rings (same-node messages, proxied requests and their responses) and the
// router-to-router frames that carry proxied records between nodes. The library and the
// router encode, decode and validate these only through the functions below, so the two
// sides cannot disagree about a field.
//
// Ownership: an Append* function writes into a ring the caller produces into and commits
// the record; the caller still decides when to Publish(). A Decode* function copies the
// fixed-size headers out of memory a peer may change and checks every field before the
// caller uses it; the data pointer it returns still points into that memory.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "freeflow/protocol.h"
#include "freeflow/protocol/node_wire.h"
#include "freeflow/ring.h"
#include "freeflow/shm_layout.h"
#include "freeflow/tunables.h"

namespace ff {

// ---- proxy segments -----------------------------------------------------------------------
// A QP whose peer lives on another node produces into its router's proxy segment instead of
// the peer's QP segment. The segment has exactly two rings, with fixed roles.
inline constexpr uint32_t kProxyRequestRing = 0;   // library produces requests, router consumes
inline constexpr uint32_t kProxyResponseRing = 1;  // router produces responses, library consumes
inline constexpr uint32_t kProxyRings = 2;

// Follows the RecordHeader of every request record (kRecSend, kRecWrite, kRecWriteImm,
// kRecReadReq, kRecAtomicReq) in a proxy ring and on a node link.
struct ProxyRequest {
  uint64_t remote_addr;  // WRITE: target address of this fragment; READ/ATOMIC: of the request
  uint64_t compare_add;  // ATOMIC operands (ATOMIC_WRITE: the 8 bytes to store)
  uint64_t swap;
  uint32_t rkey;
  uint32_t seq;       // names the work request: the low 32 bits of its send-queue index
  uint32_t length;    // the whole request's length (READ: bytes wanted; ATOMIC: 8)
  uint8_t opcode;     // ibv_wr_opcode
  uint8_t last;       // 1 on the work request's last record
  uint8_t rnr_retry;  // SEND / WRITE_WITH_IMM: the requester's rnr_retry (7: retry forever)
  uint8_t reserved;
};
static_assert(sizeof(ProxyRequest) == 40 && alignof(ProxyRequest) == 8);

// Follows the RecordHeader of a kRecResp record: the outcome of one work request and, for a
// READ or an atomic, (a fragment of) its data.
struct ProxyResponse {
  uint64_t data_offset;  // where the data that follows belongs in the request's local buffer
  uint32_t seq;          // the work request, as in its ProxyRequest
  uint16_t status;       // ibv_wc_status
  uint8_t last;          // 1 when the work request is complete
  uint8_t reserved;
};
static_assert(sizeof(ProxyResponse) == 16 && alignof(ProxyResponse) == 8);

// Largest payload of a request and of a response record.
inline constexpr uint32_t kMaxRequestPayload = sizeof(ProxyRequest) + kMaxFragment;
inline constexpr uint32_t kMaxResponsePayload = sizeof(ProxyResponse) + kMaxFragment;

// ---- layout constants that depend on each other -------------------------------------------
inline constexpr bool IsPow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }
static_assert(IsPow2(kRcRingBytes) && IsPow2(kUdRingBytes) && IsPow2(kProxyRingBytes),
              "ring sizes must be powers of two");
static_assert(kRcRingBytes >= kMinRingBytes && kRcRingBytes <= kMaxRingBytes &&
              kUdRingBytes >= kMinRingBytes && kProxyRingBytes <= kMaxRingBytes);
static_assert(kUdRingsPerQp <= kMaxRingsPerQp && kProxyRings <= kMaxRingsPerQp);
static_assert(RecordBytes(kMaxFragment) <= kRcRingBytes / 4,
              "a full fragment must leave room for more in an RC ring");
static_assert(RecordBytes(kMtu) <= kUdRingBytes / 4, "a UD message must fit a UD ring");
static_assert(kMtu <= kMaxFragment, "a UD message is one record");
static_assert(kMaxInline <= kMaxFragment);
static_assert(RecordBytes(kMaxRequestPayload) <= kProxyRingBytes / 4 &&
                  RecordBytes(kMaxResponsePayload) <= kProxyRingBytes / 4,
              "proxied records must leave room for more in a proxy ring");
static_assert(kMaxMsgSize <= UINT32_MAX,
              "RecordHeader::msg_len and ProxyRequest::length are 32-bit");
static_assert(kMaxQpWr < (1u << 31), "ProxyRequest::seq must tell in-flight requests apart");
static_assert(kMrTableSlots <= (1u << 24), "a key is slot << 8 | tag in 32 bits");
static_assert(kNotifySegmentBytes == sizeof(NotifySlot) * kNotifySlots);
static_assert(kMaxRdAtomic <= 255);

// ---- encoding into a ring -----------------------------------------------------------------
// Reserves and writes one record: `h` with total and frag_len derived from `payload_len`,
// then the payload, which fill(char* dst) writes. kFull and kCorrupt write nothing.
template <typename Fill>
RingStatus AppendRecord(RingProducer& ring, RecordHeader h, uint32_t payload_len, Fill&& fill) {
  h.total = RecordBytes(payload_len);
  h.frag_len = payload_len;
  h.reserved = 0;
  char* dst = nullptr;
  const RingStatus st = ring.Reserve(h.total, &dst);
  if (st != RingStatus::kOk) return st;
  std::memcpy(dst, &h, sizeof(h));
  fill(dst + sizeof(h));
  ring.Commit(h.total);
  return RingStatus::kOk;
}

// A record whose payload is `len` bytes at `data`.
inline RingStatus AppendRecord(RingProducer& ring, const RecordHeader& h, const char* data,
                               uint32_t len) {
  return AppendRecord(ring, h, len, [&](char* dst) {
    if (len > 0) std::memcpy(dst, data, len);
  });
}

// A request record: `h`, the ProxyRequest, then `data_len` bytes that fill(char*) writes.
template <typename Fill>
RingStatus AppendRequest(RingProducer& ring, const RecordHeader& h, const ProxyRequest& req,
                         uint32_t data_len, Fill&& fill) {
  return AppendRecord(ring, h, static_cast<uint32_t>(sizeof(req)) + data_len, [&](char* dst) {
    std::memcpy(dst, &req, sizeof(req));
    if (data_len > 0) fill(dst + sizeof(req));
  });
}

// The RecordHeader of a response; with `data_len`, sized for a response that carries that
// many bytes of data (as a frame body carries it).
inline RecordHeader ResponseHeader() {
  RecordHeader h{};
  h.kind = kRecResp;
  return h;
}
inline RecordHeader ResponseHeader(uint32_t data_len) {
  RecordHeader h = ResponseHeader();
  h.frag_len = static_cast<uint32_t>(sizeof(ProxyResponse)) + data_len;
  h.total = RecordBytes(h.frag_len);
  return h;
}

// ---- decoding and validation ----------------------------------------------------------------
// A request record, checked: every field below may be used as it is.
struct RequestView {
  RecordHeader h;
  ProxyRequest req;
  const char* data;  // data_len bytes (WRITE and SEND payloads); nullptr when none
  uint32_t data_len;
};

// Checks a request record whose header was copied to `h` and whose payload (h.frag_len
// bytes) is at `payload`. false: malformed (unknown kind, an opcode that does not belong
// to the kind, sizes out of range).
bool DecodeRequest(const RecordHeader& h, const char* payload, RequestView* out);

// A response record, checked.
struct ResponseView {
  ProxyResponse resp;
  const char* data;
  uint32_t data_len;
};
bool DecodeResponse(const RecordHeader& h, const char* payload, ResponseView* out);

// A record carried whole in a buffer (a frame body): the header, then exactly h.frag_len
// bytes. false when `len` does not match the header.
bool SplitRecord(const char* buf, size_t len, RecordHeader* h, const char** payload);

// ---- router-to-router frames (protocol/node_wire.h) ------------------------------------------
namespace wire {

static_assert(sizeof(RecordHeader) + kMaxRequestPayload <= kMaxFrame &&
                  sizeof(RecordHeader) + kMaxResponsePayload <= kMaxFrame,
              "a frame must carry any proxied record");

// True when a frame header is acceptable: a known type whose body length is what that type
// carries (records are checked further by DecodeRequest / DecodeResponse).
bool ValidFrame(const FrameHeader& h);

}  // namespace wire
}  // namespace ff
