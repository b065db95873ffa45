// Unit tests of the shared-memory record ring: ordering, wrap-around with padding,
// back-pressure, and refusal of indices or records a hostile peer could forge.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "freeflow/codec.h"
#include "freeflow/ring.h"
#include "ring_fixture.h"

namespace ff {
namespace {

bool Put(TestRing& r, uint32_t value, uint32_t payload) {
  RecordHeader h{};
  h.kind = kRecSend;
  h.msg_len = value;
  const RingStatus st = AppendRecord(r.producer, h, payload, [&](char* dst) {
    std::memset(dst, static_cast<int>(value & 0xff), payload);
  });
  if (st != RingStatus::kOk) return false;
  r.producer.Publish();
  return true;
}

TEST(Ring, DeliversRecordsInOrderAcrossWrapAround) {
  TestRing r(4096);
  uint32_t next_put = 0, next_get = 0;
  for (int round = 0; round < 1000; ++round) {
    while (Put(r, next_put, 100 + (next_put % 300))) ++next_put;
    RecordHeader h;
    const char* payload;
    for (int i = 0; i < 3 && r.consumer.Peek(&h, &payload) == RingStatus::kOk; ++i) {
      ASSERT_EQ(h.msg_len, next_get);
      ASSERT_EQ(h.frag_len, 100 + (next_get % 300));
      ASSERT_EQ(static_cast<uint8_t>(payload[h.frag_len - 1]), next_get & 0xff);
      r.consumer.Consume(h);
      ++next_get;
    }
    r.consumer.Release();
  }
  EXPECT_GT(next_get, 2000u);
}

TEST(Ring, ReportsFullAndEmpty) {
  TestRing r(4096);
  RecordHeader h;
  const char* payload;
  EXPECT_EQ(r.consumer.Peek(&h, &payload), RingStatus::kEmpty);
  int n = 0;
  while (Put(r, n, 960)) ++n;  // 1 KiB records
  EXPECT_EQ(n, 4);
  char* p;
  EXPECT_EQ(r.producer.Reserve(RecordBytes(960), &p), RingStatus::kFull);
}

TEST(Ring, RejectsForgedTail) {
  TestRing r(4096);
  r.header->tail.store(1u << 20);  // further ahead than the ring holds
  RecordHeader h;
  const char* payload;
  EXPECT_EQ(r.consumer.Peek(&h, &payload), RingStatus::kCorrupt);
}

TEST(Ring, RejectsForgedRecordLength) {
  TestRing r(4096);
  ASSERT_TRUE(Put(r, 1, 10));
  auto* h0 = reinterpret_cast<RecordHeader*>(RingData(r.header));
  h0->total = 8192;  // larger than the ring
  RecordHeader h;
  const char* payload;
  EXPECT_EQ(r.consumer.Peek(&h, &payload), RingStatus::kCorrupt);
  h0->total = 64;
  h0->frag_len = 4000;  // payload longer than the record
  EXPECT_EQ(r.consumer.Peek(&h, &payload), RingStatus::kCorrupt);
}

TEST(Ring, RejectsForgedHead) {
  TestRing r(4096);
  ASSERT_TRUE(Put(r, 1, 10));
  r.header->head.store(1u << 30);  // consumer claims to be past the producer
  char* p;
  // The producer reads the head only when its cached view has no room.
  EXPECT_EQ(r.producer.Reserve(RecordBytes(4050), &p), RingStatus::kCorrupt);
}

TEST(Ring, TwoThreadsTransferEveryRecordOnce) {
  TestRing r(64 * 1024);
  constexpr uint32_t kCount = 200000;
  // Both ends give up at one deadline: a consumer that stops early (a wrong record, or a
  // machine so busy that the producer hardly runs) must not leave the producer spinning on a
  // full ring forever.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::atomic<bool> stop{false};
  std::thread producer([&] {
    for (uint32_t i = 0; i < kCount && !stop.load(std::memory_order_relaxed);) {
      if (Put(r, i, 8 + i % 64)) ++i;
    }
  });
  uint32_t expect = 0;
  while (expect < kCount && std::chrono::steady_clock::now() < deadline) {
    RecordHeader h;
    const char* payload;
    if (r.consumer.Peek(&h, &payload) != RingStatus::kOk) continue;
    if (h.msg_len != expect) {
      ADD_FAILURE() << "record " << h.msg_len << " where " << expect << " was due";
      break;
    }
    r.consumer.Consume(h);
    r.consumer.Release();
    ++expect;
  }
  stop.store(true, std::memory_order_relaxed);
  producer.join();
  EXPECT_EQ(expect, kCount);
}

}  // namespace
}  // namespace ff
