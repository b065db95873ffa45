// Unit tests of the codec that library and router share: records survive a trip through a
// ring unchanged, and every malformed record, frame or request is refused.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "freeflow/codec.h"
#include "freeflow/protocol.h"
#include "ring_fixture.h"

namespace ff {
namespace {

RecordHeader SendHeader() {
  RecordHeader h{};
  h.kind = kRecSend;
  h.flags = kRecFirst | kRecLast;
  h.msg_len = 5;
  h.src_qpn = 0x123;
  return h;
}

ProxyRequest SendRequest(uint32_t seq) {
  ProxyRequest r{};
  r.opcode = IBV_WR_SEND;
  r.seq = seq;
  r.length = 5;
  r.last = 1;
  r.rnr_retry = 7;
  return r;
}

// Takes the next record of the ring; fails the test when there is none.
void Next(TestRing& ring, RecordHeader* h, const char** payload) {
  ASSERT_EQ(ring.consumer.Peek(h, payload), RingStatus::kOk);
  ring.consumer.Consume(*h);
}

TEST(Codec, RequestRoundTripsThroughARing) {
  TestRing ring(64 * 1024);
  const ProxyRequest req = SendRequest(41);
  ASSERT_EQ(AppendRequest(ring.producer, SendHeader(), req, 5,
                          [](char* dst) { std::memcpy(dst, "hello", 5); }),
            RingStatus::kOk);
  ring.producer.Publish();
  RecordHeader h;
  const char* payload;
  Next(ring, &h, &payload);
  EXPECT_EQ(h.frag_len, sizeof(ProxyRequest) + 5);
  EXPECT_EQ(h.total, RecordBytes(sizeof(ProxyRequest) + 5));
  RequestView v;
  ASSERT_TRUE(DecodeRequest(h, payload, &v));
  EXPECT_EQ(v.req.seq, 41u);
  EXPECT_EQ(v.req.rnr_retry, 7);
  EXPECT_EQ(v.h.src_qpn, 0x123u);
  ASSERT_EQ(v.data_len, 5u);
  EXPECT_EQ(std::memcmp(v.data, "hello", 5), 0);
}

TEST(Codec, ResponseRoundTripsThroughARing) {
  TestRing ring(64 * 1024);
  ProxyResponse r{};
  r.seq = 9;
  r.status = IBV_WC_SUCCESS;
  r.data_offset = 4096;
  r.last = 1;
  const uint64_t value = 0x1122334455667788ull;
  std::vector<char> body(sizeof(r) + sizeof(value));
  std::memcpy(body.data(), &r, sizeof(r));
  std::memcpy(body.data() + sizeof(r), &value, sizeof(value));
  ASSERT_EQ(AppendRecord(ring.producer, ResponseHeader(), body.data(),
                         static_cast<uint32_t>(body.size())),
            RingStatus::kOk);
  ring.producer.Publish();
  RecordHeader h;
  const char* payload;
  Next(ring, &h, &payload);
  ResponseView v;
  ASSERT_TRUE(DecodeResponse(h, payload, &v));
  EXPECT_EQ(v.resp.seq, 9u);
  EXPECT_EQ(v.resp.data_offset, 4096u);
  ASSERT_EQ(v.data_len, 8u);
  uint64_t got;
  std::memcpy(&got, v.data, 8);
  EXPECT_EQ(got, value);
}

TEST(Codec, FullRingWritesNothing) {
  TestRing ring(4096);
  const ProxyRequest req = SendRequest(1);
  int appended = 0;
  while (AppendRequest(ring.producer, SendHeader(), req, 1000, [](char*) {}) == RingStatus::kOk)
    ++appended;
  ring.producer.Publish();
  EXPECT_GT(appended, 0);
  RecordHeader h;
  const char* payload;
  for (int i = 0; i < appended; ++i) Next(ring, &h, &payload);
  EXPECT_EQ(ring.consumer.Peek(&h, &payload), RingStatus::kEmpty);
}

// Encodes `req` after `h` into a buffer, as a frame body carries it.
std::vector<char> Body(const RecordHeader& h, const ProxyRequest& req, uint32_t data_len) {
  RecordHeader hh = h;
  hh.frag_len = static_cast<uint32_t>(sizeof(req)) + data_len;
  std::vector<char> b(sizeof(hh) + hh.frag_len, 'x');
  std::memcpy(b.data(), &hh, sizeof(hh));
  std::memcpy(b.data() + sizeof(hh), &req, sizeof(req));
  return b;
}

bool DecodeBody(const std::vector<char>& b) {
  RecordHeader h;
  const char* payload;
  RequestView v;
  return SplitRecord(b.data(), b.size(), &h, &payload) && DecodeRequest(h, payload, &v);
}

TEST(Codec, AcceptsEveryKindWithItsOpcodes) {
  struct Case {
    uint8_t kind;
    uint8_t opcode;
    uint32_t length;
    uint32_t data;
  };
  const Case ok[] = {{kRecSend, IBV_WR_SEND, 5, 5},
                     {kRecSend, IBV_WR_SEND_WITH_IMM, 5, 5},
                     {kRecWrite, IBV_WR_RDMA_WRITE, 100, 100},
                     {kRecWrite, IBV_WR_RDMA_WRITE_WITH_IMM, 100, 100},
                     {kRecWriteImm, IBV_WR_RDMA_WRITE_WITH_IMM, 100, 0},
                     {kRecReadReq, IBV_WR_RDMA_READ, 1 << 20, 0},
                     {kRecAtomicReq, IBV_WR_ATOMIC_FETCH_AND_ADD, 8, 0},
                     {kRecAtomicReq, IBV_WR_ATOMIC_CMP_AND_SWP, 8, 0}};
  for (const Case& c : ok) {
    RecordHeader h{};
    h.kind = c.kind;
    ProxyRequest r{};
    r.opcode = c.opcode;
    r.length = c.length;
    EXPECT_TRUE(DecodeBody(Body(h, r, c.data))) << int(c.kind) << "/" << int(c.opcode);
  }
}

TEST(Codec, RefusesMalformedRequests) {
  RecordHeader h{};
  h.kind = kRecSend;
  const ProxyRequest good = SendRequest(1);
  ASSERT_TRUE(DecodeBody(Body(h, good, 5)));

  ProxyRequest r = good;
  r.opcode = IBV_WR_RDMA_READ;  // not an opcode of a SEND record
  EXPECT_FALSE(DecodeBody(Body(h, r, 5)));
  r = good;
  r.last = 2;
  EXPECT_FALSE(DecodeBody(Body(h, r, 5)));
  r = good;
  r.length = static_cast<uint32_t>(kMaxMsgSize) + 1;
  EXPECT_FALSE(DecodeBody(Body(h, r, 5)));
  EXPECT_FALSE(DecodeBody(Body(h, good, kMaxFragment + 1)));  // oversized fragment

  RecordHeader bad = h;
  bad.kind = kRecResp;  // a response is not a request
  EXPECT_FALSE(DecodeBody(Body(bad, good, 5)));
  bad.kind = 0x7f;
  EXPECT_FALSE(DecodeBody(Body(bad, good, 5)));

  RecordHeader read{};
  read.kind = kRecReadReq;
  ProxyRequest rr{};
  rr.opcode = IBV_WR_RDMA_READ;
  EXPECT_FALSE(DecodeBody(Body(read, rr, 8)));  // a READ request carries no data
  RecordHeader atomic{};
  atomic.kind = kRecAtomicReq;
  ProxyRequest ar{};
  ar.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  ar.length = 16;
  EXPECT_FALSE(DecodeBody(Body(atomic, ar, 0)));  // atomics are 8 bytes

  // A header whose frag_len disagrees with the body, and a body shorter than a header.
  std::vector<char> b = Body(h, good, 5);
  b.pop_back();
  EXPECT_FALSE(DecodeBody(b));
  RecordHeader tiny{};
  tiny.kind = kRecSend;
  tiny.frag_len = 8;  // too short for a ProxyRequest
  std::vector<char> t(sizeof(tiny) + 8);
  std::memcpy(t.data(), &tiny, sizeof(tiny));
  EXPECT_FALSE(DecodeBody(t));
  EXPECT_FALSE(DecodeBody(std::vector<char>(10)));
}

TEST(Codec, RefusesMalformedResponses) {
  RecordHeader h = ResponseHeader();
  ProxyResponse r{};
  r.last = 1;
  std::vector<char> payload(sizeof(r));
  auto decode = [&](const RecordHeader& hh, const ProxyResponse& rr) {
    std::memcpy(payload.data(), &rr, sizeof(rr));
    ResponseView v;
    return DecodeResponse(hh, payload.data(), &v);
  };
  h.frag_len = sizeof(r);
  EXPECT_TRUE(decode(h, r));
  ProxyResponse bad = r;
  bad.last = 3;
  EXPECT_FALSE(decode(h, bad));
  bad = r;
  bad.status = 200;
  EXPECT_FALSE(decode(h, bad));
  RecordHeader short_h = h;
  short_h.frag_len = sizeof(r) - 1;
  EXPECT_FALSE(decode(short_h, r));
  RecordHeader wrong = h;
  wrong.kind = kRecSend;
  EXPECT_FALSE(decode(wrong, r));
}

TEST(Codec, FramesHaveTheLengthTheirTypeCarries) {
  using wire::FrameHeader;
  using wire::Type;
  auto frame = [](Type t, uint32_t len) { return FrameHeader{len, t, 0, 1, 0}; };
  EXPECT_TRUE(wire::ValidFrame(frame(Type::kHello, sizeof(wire::Hello))));
  EXPECT_FALSE(wire::ValidFrame(frame(Type::kHello, sizeof(wire::Hello) + 1)));
  EXPECT_TRUE(wire::ValidFrame(frame(Type::kConnect, sizeof(wire::Connect))));
  EXPECT_FALSE(wire::ValidFrame(frame(Type::kConnectReply, 0)));
  EXPECT_TRUE(wire::ValidFrame(frame(Type::kPing, 0)));
  EXPECT_FALSE(wire::ValidFrame(frame(Type::kClose, 4)));
  const uint32_t min_record = sizeof(RecordHeader) + sizeof(ProxyRequest);
  EXPECT_TRUE(wire::ValidFrame(frame(Type::kRecord, min_record)));
  EXPECT_FALSE(wire::ValidFrame(frame(Type::kRecord, min_record - 1)));
  EXPECT_FALSE(wire::ValidFrame(frame(Type::kRecord, min_record + kMaxFragment + 1)));
  EXPECT_FALSE(wire::ValidFrame(frame(Type::kResp, sizeof(RecordHeader))));
  EXPECT_FALSE(wire::ValidFrame(frame(static_cast<Type>(99), 0)));
  EXPECT_FALSE(wire::ValidFrame(frame(Type::kRecord, kMaxFrame + 1)));
}

TEST(PodProtocol, AcceptsOnlyTheSizeAndDescriptorsOfEachOp) {
  proto::CreateQp m{};
  EXPECT_EQ(m.h.op, proto::OpOf<proto::CreateQp>);  // value-initialised requests name their op
  const char* buf = reinterpret_cast<const char*>(&m);
  proto::Op op;
  EXPECT_TRUE(proto::DecodeRequest(buf, sizeof(m), 1, &op));
  EXPECT_EQ(op, proto::Op::kCreateQp);
  EXPECT_FALSE(proto::DecodeRequest(buf, sizeof(m), 0, &op));  // the QP segment is missing
  EXPECT_FALSE(proto::DecodeRequest(buf, sizeof(m), 2, &op));
  EXPECT_FALSE(proto::DecodeRequest(buf, sizeof(m) - 1, 1, &op));
  EXPECT_FALSE(proto::DecodeRequest(buf, 4, 0, &op));
  m.h.op = static_cast<proto::Op>(0x7f);
  EXPECT_FALSE(proto::DecodeRequest(buf, sizeof(m), 1, &op));
  m.h.op = proto::Op::kMaxOp;
  EXPECT_FALSE(proto::DecodeRequest(buf, sizeof(m), 1, &op));

  proto::RegMr reg{};
  const char* rb = reinterpret_cast<const char*>(&reg);
  EXPECT_TRUE(proto::DecodeRequest(rb, sizeof(reg), 0, &op));  // a known region
  EXPECT_TRUE(proto::DecodeRequest(rb, sizeof(reg), 1, &op));  // a new region's memfd
  EXPECT_FALSE(proto::DecodeRequest(rb, sizeof(reg), 2, &op));
}

TEST(PodProtocol, ConnectReplyNamesItsDescriptors) {
  proto::ConnectReply c{};
  c.num_rings = 1;
  c.ring_bytes = kRcRingBytes;
  c.notify_slot = proto::kNoId;
  EXPECT_EQ(proto::ConnectReplyFds(c), 3);
  c.notify_slot = 5;
  c.has_srq = 1;
  EXPECT_EQ(proto::ConnectReplyFds(c), 5);
  c.notify_slot = proto::kWakeSlot;  // the wake word is not a CQ's slot
  EXPECT_EQ(proto::ConnectReplyFds(c), -1);
  c.notify_slot = proto::kNoId;
  c.ring_index = 1;  // outside the segment
  EXPECT_EQ(proto::ConnectReplyFds(c), -1);
  c.ring_index = 0;
  c.ring_bytes = 5000;  // not a power of two
  EXPECT_EQ(proto::ConnectReplyFds(c), -1);
  proto::ConnectReply remote{};
  remote.flags = proto::kConnectRemote;
  remote.num_rings = kProxyRings;
  remote.ring_bytes = kProxyRingBytes;
  EXPECT_EQ(proto::ConnectReplyFds(remote), 2);
  remote.num_rings = 3;
  EXPECT_EQ(proto::ConnectReplyFds(remote), -1);
}

}  // namespace
}  // namespace ff
