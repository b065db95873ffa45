// The target side of a cross-node channel (freeflow/target_channel.h), which the router's
// executor and the library's direct connections run: a message is answered only once what
// it put into the target's ring is published, so that the sender's completion never comes
// before the target can find the message (a target that moves its QP to ERR right after the
// sender's completion must still receive it).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "freeflow/target_channel.h"

namespace ff {
namespace {

constexpr uint32_t kRingBytes = 4096;

// The target QP's ring, its receive credits and segment header.
struct Target {
  Target() {
    void* p = std::aligned_alloc(kCacheLine, sizeof(RingHeader) + kRingBytes);
    std::memset(p, 0, sizeof(RingHeader) + kRingBytes);
    ring = new (p) RingHeader();
  }
  ~Target() {
    ring->~RingHeader();
    std::free(ring);
  }
  Target(const Target&) = delete;
  Target& operator=(const Target&) = delete;
  // What the target's program would find in its ring now: how many whole records.
  size_t Visible() const {
    RingConsumer c;
    c.Attach(ring, kRingBytes);
    size_t n = 0;
    RecordHeader h;
    const char* payload = nullptr;
    while (c.Peek(&h, &payload) == RingStatus::kOk) {
      c.Consume(h);
      ++n;
    }
    return n;
  }
  RingHeader* ring = nullptr;
  RecvCredits credits;
  QpSegmentHeader hdr;
};

struct NoMemory {
  uint64_t size() const { return 0; }
  template <typename T>
  T* as() const {
    return nullptr;
  }
};

// Records, for each answer, its status and how many records the target could see then.
struct Host {
  const Target* target;
  std::vector<uint32_t> statuses;
  std::vector<size_t> visible;
  void Respond(uint32_t, uint32_t status, uint64_t, const char*, uint32_t, bool) {
    statuses.push_back(status);
    visible.push_back(target->Visible());
  }
  bool CanAnswer() { return true; }
  const MrEntry* MrTable() { return nullptr; }
  const NoMemory* MapRegion(uint32_t, uint32_t) { return nullptr; }
};

TargetChannel Channel(Target& t) {
  TargetChannel c;
  TargetChannel::Setup s;
  s.kind = &kRcQp;
  s.hdr = &t.hdr;
  s.credits = &t.credits;
  s.ring = t.ring;
  s.ring_bytes = kRingBytes;
  s.target_qpn = 0x42;
  s.src_ip = 0x0a000001;
  s.src_qpn = 0x43;
  c.Init(s);
  return c;
}

RequestView Request(uint8_t kind, uint8_t opcode, uint32_t seq, const char* data, uint32_t len) {
  RequestView v{};
  v.h.kind = kind;
  v.h.flags = kRecFirst | kRecLast;
  v.h.msg_len = len;
  v.h.frag_len = len;
  v.req.opcode = opcode;
  v.req.seq = seq;
  v.req.length = len;
  v.req.last = 1;
  v.req.rnr_retry = 7;
  v.data = len != 0 ? data : nullptr;
  v.data_len = len;
  return v;
}

TEST(TargetChannel, ASendIsAnsweredOnlyOnceTheTargetCanSeeIt) {
  Target t;
  t.credits.posted.store(2);
  TargetChannel c = Channel(t);
  Host host{&t, {}, {}};
  const std::vector<char> data(64, 'm');
  ASSERT_TRUE(c.Apply(host, Request(kRecSend, IBV_WR_SEND, 7, data.data(), 64)));
  ASSERT_TRUE(c.Apply(host, Request(kRecSend, IBV_WR_SEND, 8, data.data(), 16)));
  ASSERT_EQ(host.statuses, (std::vector<uint32_t>{IBV_WC_SUCCESS, IBV_WC_SUCCESS}));
  EXPECT_EQ(host.visible, (std::vector<size_t>{1, 2})) << "records the target saw at each answer";
  bool solicited = true;
  EXPECT_TRUE(c.Publish(&solicited)) << "the caller still wakes the target after the batch";
  EXPECT_FALSE(solicited);
}

TEST(TargetChannel, AWriteWithImmediateIsAnsweredOnlyOnceTheTargetCanSeeIt) {
  Target t;
  t.credits.posted.store(1);
  TargetChannel c = Channel(t);
  Host host{&t, {}, {}};
  ASSERT_TRUE(c.Apply(host, Request(kRecWriteImm, IBV_WR_RDMA_WRITE_WITH_IMM, 3, nullptr, 0)));
  ASSERT_EQ(host.statuses, (std::vector<uint32_t>{IBV_WC_SUCCESS}));
  EXPECT_EQ(host.visible, (std::vector<size_t>{1}));
}

}  // namespace
}  // namespace ff
