#include "freeflow/codec.h"

namespace ff {
namespace {

bool KindAllowsOpcode(uint8_t kind, uint8_t opcode) {
  switch (kind) {
    case kRecSend:
      return opcode == IBV_WR_SEND || opcode == IBV_WR_SEND_WITH_IMM ||
             opcode == IBV_WR_SEND_WITH_INV;
    case kRecWrite:
      return opcode == IBV_WR_RDMA_WRITE || opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    case kRecWriteImm:
      return opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    case kRecReadReq:
      return opcode == IBV_WR_RDMA_READ;
    case kRecAtomicReq:
      return opcode == IBV_WR_ATOMIC_CMP_AND_SWP || opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ||
             opcode == IBV_WR_ATOMIC_WRITE;
    default:
      return false;
  }
}

// Kinds whose request carries no data of its own.
bool DatalessKind(uint8_t kind) {
  return kind == kRecWriteImm || kind == kRecReadReq || kind == kRecAtomicReq;
}

}  // namespace

bool DecodeRequest(const RecordHeader& h, const char* payload, RequestView* out) {
  if (h.frag_len < sizeof(ProxyRequest) || h.frag_len > kMaxRequestPayload) return false;
  std::memcpy(&out->req, payload, sizeof(out->req));
  out->h = h;
  const ProxyRequest& r = out->req;
  if (!KindAllowsOpcode(h.kind, r.opcode) || r.last > 1) return false;
  out->data_len = h.frag_len - static_cast<uint32_t>(sizeof(ProxyRequest));
  out->data = out->data_len > 0 ? payload + sizeof(ProxyRequest) : nullptr;
  if (DatalessKind(h.kind) && out->data_len != 0) return false;
  if (h.kind == kRecAtomicReq && r.length != 8) return false;
  if (r.length > kMaxMsgSize) return false;
  return true;
}

bool DecodeResponse(const RecordHeader& h, const char* payload, ResponseView* out) {
  if (h.kind != kRecResp || h.frag_len < sizeof(ProxyResponse) || h.frag_len > kMaxResponsePayload)
    return false;
  std::memcpy(&out->resp, payload, sizeof(out->resp));
  if (out->resp.last > 1 || out->resp.status > IBV_WC_TM_RNDV_INCOMPLETE) return false;
  out->data_len = h.frag_len - static_cast<uint32_t>(sizeof(ProxyResponse));
  out->data = out->data_len > 0 ? payload + sizeof(ProxyResponse) : nullptr;
  return true;
}

bool SplitRecord(const char* buf, size_t len, RecordHeader* h, const char** payload) {
  if (len < sizeof(RecordHeader)) return false;
  std::memcpy(h, buf, sizeof(*h));
  if (h->frag_len != len - sizeof(RecordHeader)) return false;
  *payload = buf + sizeof(RecordHeader);
  return true;
}

namespace wire {

bool ValidFrame(const FrameHeader& h) {
  if (h.len > kMaxFrame) return false;
  constexpr uint32_t kRecordMin = sizeof(RecordHeader);
  switch (h.type) {
    case Type::kHello:
      return h.len == sizeof(Hello);
    case Type::kConnect:
      return h.len == sizeof(Connect);
    case Type::kConnectReply:
      return h.len == sizeof(ConnectReply);
    case Type::kRecord:
      return h.len >= kRecordMin + sizeof(ProxyRequest) && h.len <= kRecordMin + kMaxRequestPayload;
    case Type::kResp:
      return h.len >= kRecordMin + sizeof(ProxyResponse) &&
             h.len <= kRecordMin + kMaxResponsePayload;
    case Type::kCredit:
      return h.len == sizeof(Credit);
    case Type::kCm:
      return h.len == sizeof(CmMessage) && h.flags >= static_cast<uint16_t>(CmKind::kReq) &&
             h.flags < static_cast<uint16_t>(CmKind::kMaxKind);
    case Type::kResume:
    case Type::kResumed:
      return h.len % sizeof(uint32_t) == 0 && h.flags == 0 && h.chan == 0;
    case Type::kHandingOver:
      return h.len == 0 && h.flags == 0 && h.chan == 0;
    case Type::kClose:
    case Type::kPeerGone:
    case Type::kPing:
    case Type::kPong:
      return h.len == 0;
  }
  return false;
}

}  // namespace wire
}  // namespace ff
