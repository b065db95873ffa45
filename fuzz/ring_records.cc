// Fuzz target: records and rings in shared memory that a hostile peer (or pod) writes.
//
// The first byte picks what reads them:
//   0  the record codec (core codec.h): a record carried whole in a buffer (SplitRecord),
//      checked as a request (DecodeRequest) and as a response (DecodeResponse);
//   1  the ring ends (core ring.h): a consumer drains a ring whose indices and bytes the
//      input wrote, decoding each record as the router and the library do; a producer then
//      appends into a ring whose consumer index the input wrote;
//   2  the library's receive path (verbs/src/datapath/recv_path.cc): a QP of libffverbs (against
//   the
//      fake router of tests/unit/verbs) whose inbound ring the input wrote as a same-node
//      peer would, with receives posted and the CQ polled.
// Each run builds its ring or QP anew, so every input replays the same way.
#include <fuzzer/FuzzedDataProvider.h>
#include <infiniband/verbs.h>
#include <poll.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "freeflow/codec.h"
#include "freeflow/ring.h"
#include "pod.h"

namespace {

using ff::RecordHeader;

// Reads every byte of [p, p + n) so that ASan checks the range a decoder vouched for.
void Touch(const char* p, size_t n) {
  volatile char sink = 0;
  for (size_t i = 0; i < n; ++i) sink = static_cast<char>(sink ^ p[i]);
}

// The decoders the router and the library run on one record, by its kind.
void DecodeAsReaders(const RecordHeader& h, const char* payload) {
  if (h.kind == ff::kRecResp) {
    ff::ResponseView v;
    if (ff::DecodeResponse(h, payload, &v)) Touch(v.data, v.data_len);
  } else if (h.kind == ff::kRecSend || h.kind == ff::kRecWriteImm) {
    Touch(payload, h.frag_len);  // same-node records: the library copies frag_len bytes
  }
  ff::RequestView r;
  if (ff::DecodeRequest(h, payload, &r)) Touch(r.data, r.data_len);
}

void FuzzCodec(const uint8_t* data, size_t size) {
  // A copy of exactly `size` bytes: a read past it is a heap overflow ASan reports.
  std::unique_ptr<char[]> buf(new char[size == 0 ? 1 : size]);
  if (size > 0) std::memcpy(buf.get(), data, size);
  RecordHeader h;
  const char* payload = nullptr;
  if (ff::SplitRecord(buf.get(), size, &h, &payload)) DecodeAsReaders(h, payload);
}

// A ring of `bytes` in its own allocation (header + data, nothing after it).
struct OwnRing {
  explicit OwnRing(uint32_t bytes) : size(bytes) {
    mem = static_cast<char*>(std::aligned_alloc(ff::kCacheLine, sizeof(ff::RingHeader) + bytes));
    std::memset(mem, 0, sizeof(ff::RingHeader) + bytes);
    header = new (mem) ff::RingHeader();
  }
  ~OwnRing() { std::free(mem); }
  uint32_t size;
  char* mem;
  ff::RingHeader* header;
};

void FuzzRingEnds(FuzzedDataProvider& in) {
  OwnRing ring(ff::kMinRingBytes << in.ConsumeIntegralInRange<int>(0, 1));
  const uint64_t head = in.ConsumeIntegral<uint64_t>();
  const bool relative = in.ConsumeBool();
  const uint64_t tail =
      relative ? head + in.ConsumeIntegral<uint32_t>() : in.ConsumeIntegral<uint64_t>();
  const uint64_t producer_tail = in.ConsumeIntegral<uint16_t>();
  const uint64_t consumer_head = in.ConsumeBool() ? producer_tail - in.ConsumeIntegral<uint16_t>()
                                                  : in.ConsumeIntegral<uint64_t>();
  const std::vector<uint8_t> appends = in.ConsumeBytes<uint8_t>(8);
  const std::vector<uint8_t> bytes = in.ConsumeRemainingBytes<uint8_t>();
  if (!bytes.empty())
    std::memcpy(ff::RingData(ring.header), bytes.data(), std::min<size_t>(bytes.size(), ring.size));

  // Consumer side: what the library (inbound rings) and the router (proxy requests) do.
  ring.header->head.store(head);
  ring.header->tail.store(tail);
  ff::RingConsumer consumer;
  consumer.Attach(ring.header, ring.size);
  for (uint32_t i = 0; i <= ring.size / ff::kCacheLine; ++i) {
    RecordHeader h;
    const char* payload = nullptr;
    if (consumer.Peek(&h, &payload) != ff::RingStatus::kOk) break;
    DecodeAsReaders(h, payload);
    consumer.Consume(h);
    if (i % 4 == 3) consumer.Release();
  }
  consumer.Release();

  // Producer side: the consumer's index is the peer's to write.
  ring.header->tail.store(producer_tail);
  ring.header->head.store(consumer_head);
  ff::RingProducer producer;
  producer.Attach(ring.header, ring.size);
  for (uint8_t a : appends) {
    const uint32_t len = a * (ring.size / 4 - sizeof(RecordHeader)) / 255;
    RecordHeader h{};
    h.kind = ff::kRecSend;
    const ff::RingStatus st =
        ff::AppendRecord(producer, h, len, [&](char* dst) { std::memset(dst, 0x5a, len); });
    if (st == ff::RingStatus::kCorrupt) break;
  }
  producer.Publish();
}

// ---- the library's receive path ----------------------------------------------------------

struct Library {
  fftest::Pod pod;
  fftest::SameNodePeer rc_peer{0x500, IBV_QPT_RC, 1 << 16};
  fftest::SameNodePeer uc_peer{0x501, IBV_QPT_UC, 1 << 16};
  std::unique_ptr<fftest::Buffer> buffer;
  Library() { buffer = std::make_unique<fftest::Buffer>(pod.pd, 1 << 17); }
};

Library& TheLibrary() {
  static Library* lib = new Library();  // lives as long as the process
  return *lib;
}

void DrainAsyncEvents(ibv_context* ctx) {
  pollfd p{ctx->async_fd, POLLIN, 0};
  while (::poll(&p, 1, 0) == 1) {
    ibv_async_event e;
    if (ibv_get_async_event(ctx, &e) != 0) break;
    ibv_ack_async_event(&e);
  }
}

ibv_qp* LibraryQp(Library& lib, ibv_qp_type type) {
  ibv_qp_init_attr init{};
  init.send_cq = lib.pod.cq;
  init.recv_cq = lib.pod.cq;
  init.qp_type = type;
  init.cap.max_send_wr = 8;
  init.cap.max_recv_wr = 16;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 2;
  ibv_qp* qp = ibv_create_qp(lib.pod.pd, &init);
  if (qp == nullptr) return nullptr;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = 0x1111;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  const int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                   (type == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS);
  if (ibv_modify_qp(qp, &a, mask) != 0) return qp;
  if (type == IBV_QPT_RC) lib.pod.router.AnswerSameNode(qp->qp_num, &lib.rc_peer);
  if (type == IBV_QPT_UC) lib.pod.router.AnswerSameNode(qp->qp_num, &lib.uc_peer);
  fftest::QpOptions o;
  o.type = type;
  lib.pod.Connect(qp, type == IBV_QPT_UC ? 0x501 : 0x500, o);
  return qp;
}

void FuzzLibraryRing(FuzzedDataProvider& in) {
  Library& lib = TheLibrary();
  static constexpr ibv_qp_type kTypes[] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD};
  const ibv_qp_type type = kTypes[in.ConsumeIntegralInRange<int>(0, 2)];
  ibv_qp* qp = LibraryQp(lib, type);
  if (qp == nullptr) return;
  // The QP's segment, as the peer the router gave one of its rings to maps it.
  ff::Mapping seg;
  const int fd = lib.pod.router.qp_segment_fd(qp->qp_num);
  const auto* hdr = fd >= 0 && ff::MapSegment(fd, sizeof(ff::QpSegmentHeader), false, &seg) == 0
                        ? seg.as<ff::QpSegmentHeader>()
                        : nullptr;
  const uint32_t rings = hdr != nullptr ? hdr->num_rings : 0;
  const uint32_t ring_bytes = hdr != nullptr ? hdr->ring_bytes : 0;
  if (rings > 0 && ff::MapSegment(fd, ff::QpSegmentBytes(rings, ring_bytes), true, &seg) == 0) {
    const uint32_t index = in.ConsumeIntegralInRange<uint32_t>(0, rings - 1);
    ff::RingHeader* ring = ff::QpRing(seg.get(), index, ring_bytes);
    const int receives = in.ConsumeIntegralInRange<int>(0, 16);
    for (int i = 0; i < receives; ++i) {
      const uint32_t len = in.ConsumeIntegralInRange<uint32_t>(0, 8192);
      fftest::PostRecv(qp, lib.buffer->Sge(static_cast<size_t>(i) * 4096, len), i);
    }
    seg.as<ff::QpSegmentHeader>()->credits.claimed.store(in.ConsumeIntegral<uint8_t>());
    const uint64_t tail = in.ConsumeBool() ? in.ConsumeIntegral<uint64_t>()
                                           : in.ConsumeIntegralInRange<uint64_t>(0, ring_bytes);
    const std::vector<uint8_t> bytes = in.ConsumeRemainingBytes<uint8_t>();
    if (!bytes.empty())
      std::memcpy(ff::RingData(ring), bytes.data(), std::min<size_t>(bytes.size(), ring_bytes));
    ring->tail.store(tail, std::memory_order_release);
    fftest::PollFew(lib.pod.cq, 4);
  }
  DrainAsyncEvents(lib.pod.ctx);
  ibv_destroy_qp(qp);
  fftest::PollFew(lib.pod.cq, 4);  // flushed receives
  DrainAsyncEvents(lib.pod.ctx);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  switch (data[0] % 3) {
    case 0:
      FuzzCodec(data + 1, size - 1);
      break;
    case 1: {
      FuzzedDataProvider in(data + 1, size - 1);
      FuzzRingEnds(in);
      break;
    }
    default: {
      FuzzedDataProvider in(data + 1, size - 1);
      FuzzLibraryRing(in);
      break;
    }
  }
  return 0;
}
