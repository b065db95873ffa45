// TCP mode's claims table (freeflow/stream_claims.h): what a library concludes from memory
// the router writes, including memory in states a reader must not trust.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "freeflow/stream_claims.h"

namespace ff {
namespace {

struct Table {
  alignas(64) char mem[kStreamClaimsBytes] = {};
  StreamClaimsWriter w{mem};
  StreamClaimsHeader* h() { return reinterpret_cast<StreamClaimsHeader*>(mem); }
  PodListed Find(uint64_t key) { return FindStreamClaim(mem, key); }
};

uint64_t Key(uint32_t i) {
  return StreamClaimKey(0x0af4150b + i / 65534, static_cast<uint16_t>(1 + i % 65534), 8082);
}

TEST(StreamClaims, AnEmptyTableHoldsNothing) {
  Table t;
  EXPECT_EQ(t.Find(Key(1)), PodListed::kNo);
  EXPECT_EQ(t.Find(0), PodListed::kUnknown);  // no connection has that key
  EXPECT_EQ(t.Find(kStreamClaimGone), PodListed::kUnknown);
}

TEST(StreamClaims, WhatIsAddedIsFoundUntilRemoved) {
  Table t;
  const uint64_t a = StreamClaimKey(0x0af4150b, 59948, 8082);
  const uint64_t b = StreamClaimKey(0x0af4150b, 59962, 8082);
  ASSERT_TRUE(t.w.Add(a));
  ASSERT_TRUE(t.w.Add(b));
  EXPECT_EQ(t.Find(a), PodListed::kYes);
  EXPECT_EQ(t.Find(b), PodListed::kYes);
  EXPECT_EQ(t.Find(StreamClaimKey(0x0af4150b, 59948, 8083)), PodListed::kNo);
  EXPECT_EQ(t.Find(StreamClaimKey(0x0af4150c, 59948, 8082)), PodListed::kNo);
  t.w.Remove(a, true);
  EXPECT_EQ(t.Find(a), PodListed::kNo);
  EXPECT_EQ(t.Find(b), PodListed::kYes);
  EXPECT_EQ(t.h()->count.load(), 1u);
}

// A router that takes a table over from another (a hand-over) writes on with a writer of its
// own: it counts the slots the other marked gone, and compacts them when the other would
// have, so that lookups keep finding empty slots.
TEST(StreamClaims, AWriterOnATableAnotherWroteCountsItsGoneSlots) {
  Table t;
  for (uint32_t i = 0; i < kStreamClaimsCapacity; ++i) ASSERT_TRUE(t.w.Add(Key(i)));
  for (uint32_t i = 0; i < kStreamClaimsCapacity; ++i) t.w.Remove(Key(i), true);
  const auto gone = [&] {
    uint32_t n = 0;
    for (uint32_t i = 0; i < kStreamClaimsSlots; ++i)
      n += StreamClaimSlots(t.mem)[i].load() == kStreamClaimGone ? 1 : 0;
    return n;
  };
  ASSERT_EQ(gone(), kStreamClaimsCapacity);
  StreamClaimsWriter next{t.mem};
  ASSERT_TRUE(next.Add(Key(100000)));  // the slots gone and the one live reach the capacity
  EXPECT_EQ(gone(), 0u);
  EXPECT_EQ(t.Find(Key(100000)), PodListed::kYes);
  EXPECT_EQ(t.Find(Key(1)), PodListed::kNo);
  EXPECT_EQ(t.h()->count.load(), 1u);
}

// Random adds and removes far beyond the capacity in total: the table always holds exactly
// what was added and not removed (removed slots passed over, reused, compacted away).
TEST(StreamClaims, ManyAddsAndRemovesKeepExactlyTheLiveKeys) {
  Table t;
  std::mt19937 rng(7);
  std::set<uint64_t> live;
  std::vector<uint64_t> order;
  for (int step = 0; step < 60000; ++step) {
    const bool add = live.size() < kStreamClaimsCapacity / 2 ||
                     (rng() % 2 == 0 && live.size() < kStreamClaimsCapacity);
    if (add) {
      const uint64_t k = Key(rng() % 200000);
      if (live.count(k)) continue;
      ASSERT_TRUE(t.w.Add(k));
      live.insert(k);
      order.push_back(k);
    } else {
      const size_t at = rng() % order.size();
      const uint64_t k = order[at];
      order[at] = order.back();
      order.pop_back();
      t.w.Remove(k, true);
      live.erase(k);
    }
    if (step % 5000 == 0) {
      for (uint64_t k : live) ASSERT_EQ(t.Find(k), PodListed::kYes) << step;
      for (int i = 0; i < 500; ++i) {
        const uint64_t k = Key(200000 + i);
        ASSERT_EQ(t.Find(k), PodListed::kNo);
      }
    }
  }
  EXPECT_EQ(t.h()->count.load(), live.size());
}

TEST(StreamClaims, BeyondTheCapacityRecordsSpillAndReadersAsk) {
  Table t;
  for (uint32_t i = 0; i < kStreamClaimsCapacity; ++i) ASSERT_TRUE(t.w.Add(Key(2 * i)));
  EXPECT_FALSE(t.w.Add(Key(1)));
  EXPECT_EQ(t.Find(Key(0)), PodListed::kUnknown);
  EXPECT_EQ(t.Find(Key(3)), PodListed::kUnknown);
  t.w.Remove(Key(1), false);
  EXPECT_EQ(t.Find(Key(0)), PodListed::kYes);
  EXPECT_EQ(t.Find(Key(3)), PodListed::kNo);
}

TEST(StreamClaims, ATableBeingRewrittenSaysAsk) {
  Table t;
  t.w.Add(Key(5));
  t.h()->seq.fetch_add(1);
  EXPECT_EQ(t.Find(Key(5)), PodListed::kUnknown);
  EXPECT_EQ(t.Find(Key(6)), PodListed::kUnknown);
}

// The slots come from shared memory: a table with no empty slot (no writer makes one) must
// not send a probe past the mapping nor be read as "not there".
TEST(StreamClaims, ATableWithoutAnEmptySlotIsNotTrusted) {
  Table t;
  auto* slots = StreamClaimSlots(t.mem);
  for (uint32_t i = 0; i < kStreamClaimsSlots; ++i) slots[i].store(kStreamClaimGone);
  EXPECT_EQ(t.Find(Key(5)), PodListed::kUnknown);
}

// A reader racing the writer never gets "no" for a key that stays in the table throughout.
TEST(StreamClaims, AReaderRacingTheWriterNeverMissesAKeptKey) {
  Table t;
  const uint64_t kept = Key(99999);
  ASSERT_TRUE(t.w.Add(kept));
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint32_t round = 0; round < 200 && !stop.load(); ++round) {
      for (uint32_t i = 0; i < 1000; ++i) t.w.Add(Key(i));
      for (uint32_t i = 0; i < 1000; ++i) t.w.Remove(Key(i), true);
    }
    stop.store(true);
  });
  uint64_t looks = 0;
  while (!stop.load()) {
    ASSERT_NE(t.Find(kept), PodListed::kNo) << "after " << looks << " looks";
    ++looks;
  }
  writer.join();
  EXPECT_EQ(t.Find(kept), PodListed::kYes);
}

}  // namespace
}  // namespace ff
