// TCP mode's pod list (freeflow/stream_pods.h): what a library concludes from memory the
// router writes, including memory in states a reader must not trust.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "freeflow/stream_pods.h"

namespace ff {
namespace {

struct List {
  alignas(64) char mem[kStreamPodsBytes] = {};
  StreamPodsHeader* h() { return reinterpret_cast<StreamPodsHeader*>(mem); }
  void Write(const std::vector<uint32_t>& ips) {
    WriteStreamPods(mem, ips.data(), static_cast<uint32_t>(ips.size()));
  }
};

TEST(StreamPods, AnEmptyListHoldsNobody) {
  List l;
  l.Write({});
  EXPECT_EQ(FindStreamPod(l.mem, 0x0a000001), PodListed::kNo);
  EXPECT_EQ(FindStreamPod(l.mem, 0), PodListed::kNo);
}

TEST(StreamPods, EveryListedAddressIsFoundAndNoOther) {
  List l;
  std::vector<uint32_t> ips;
  for (uint32_t i = 1; i <= 1000; ++i) ips.push_back(0x0a000000 + 3 * i);
  l.Write(ips);
  for (uint32_t ip : ips) EXPECT_EQ(FindStreamPod(l.mem, ip), PodListed::kYes) << ip;
  for (uint32_t ip : ips) EXPECT_EQ(FindStreamPod(l.mem, ip + 1), PodListed::kNo) << ip;
  EXPECT_EQ(FindStreamPod(l.mem, 0x0a000000), PodListed::kNo);
  EXPECT_EQ(FindStreamPod(l.mem, 0xffffffff), PodListed::kNo);
  l.Write({ips[5]});
  EXPECT_EQ(FindStreamPod(l.mem, ips[5]), PodListed::kYes);
  EXPECT_EQ(FindStreamPod(l.mem, ips[6]), PodListed::kNo);
}

TEST(StreamPods, AListTooLongForItsCapacitySaysAsk) {
  List l;
  std::vector<uint32_t> ips(kStreamPodsCapacity + 1);
  for (uint32_t i = 0; i < ips.size(); ++i) ips[i] = i + 1;
  l.Write(ips);
  EXPECT_EQ(FindStreamPod(l.mem, 1), PodListed::kUnknown);
  EXPECT_EQ(FindStreamPod(l.mem, 0x0a000000), PodListed::kUnknown);
  ips.pop_back();
  l.Write(ips);
  EXPECT_EQ(FindStreamPod(l.mem, kStreamPodsCapacity), PodListed::kYes);
  EXPECT_EQ(FindStreamPod(l.mem, kStreamPodsCapacity + 1), PodListed::kNo);
}

TEST(StreamPods, AListBeingRewrittenSaysAsk) {
  List l;
  l.Write({7});
  l.h()->seq.fetch_add(1);  // odd: a writer is in the middle
  EXPECT_EQ(FindStreamPod(l.mem, 7), PodListed::kUnknown);
  EXPECT_EQ(FindStreamPod(l.mem, 8), PodListed::kUnknown);
}

// The count comes from shared memory: one beyond the capacity must not send the search
// past the mapping.
TEST(StreamPods, ACountBeyondTheCapacityIsNotTrusted) {
  List l;
  l.Write({7});
  l.h()->count.store(kStreamPodsCapacity + 1);
  EXPECT_EQ(FindStreamPod(l.mem, 7), PodListed::kUnknown);
  l.h()->count.store(0xffffffffu);
  EXPECT_EQ(FindStreamPod(l.mem, 7), PodListed::kUnknown);
}

// A reader racing the writer sees either list, or is told to ask, never a wrong "no" for
// an address that is on both.
TEST(StreamPods, AReaderRacingTheWriterNeverMissesAnAddressOnEveryList) {
  List l;
  const uint32_t always = 500;
  l.Write({always});
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    std::vector<uint32_t> ips;
    for (uint32_t round = 0; round < 20000 && !stop.load(); ++round) {
      ips.clear();
      for (uint32_t i = 0; i < round % 900; ++i) ips.push_back(i < always ? i : i + 1);
      ips.push_back(always);
      std::sort(ips.begin(), ips.end());
      l.Write(ips);
    }
    stop.store(true);
  });
  uint64_t misses = 0, looks = 0;
  while (!stop.load() && looks < 5'000'000) {
    ++looks;
    if (FindStreamPod(l.mem, always) == PodListed::kNo) ++misses;
  }
  stop.store(true);
  writer.join();
  EXPECT_EQ(misses, 0u) << "of " << looks;
}

}  // namespace
}  // namespace ff
