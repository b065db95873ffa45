// A pod's traffic ledger as its router reads it (pods/traffic_claims.h, docs/metrics.md
// "Traffic"): what a slot gained is taken once, by its key and kind; what a hostile library
// writes (counts that fall, keys that change, more than the time allows, a used count past
// the slots, a ledger it can shrink) is refused and counted, and moves nothing else; the
// router labels what it takes with its own knowledge; and a scrape shows it.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <thread>
#include <tuple>

#include "harness.h"
#include "scrape.h"
#include "traffic_totals.h"

namespace ff::router::test {
namespace {

// The pod's side of a ledger: a sealed segment it writes, and the router's reader of it.
class Ledger {
 public:
  Ledger() {
    EXPECT_EQ(CreateSegment("test-traffic", kTrafficLedgerBytes, &fd), 0);
    EXPECT_EQ(MapSegment(fd.get(), kTrafficLedgerBytes, true, &map), 0);
    EXPECT_EQ(claims.Take(fd.get(), now), 0);
  }
  TrafficSlot& Slot(uint32_t i) { return TrafficSlotsOf(map.get())[i]; }
  void Key(uint32_t i, uint32_t ip, TrafficPlacement p) {
    Slot(i).peer_ip.store(ip);
    Slot(i).placement.store(static_cast<uint32_t>(p));
  }
  void Set(uint32_t i, TrafficKind k, uint64_t ops, uint64_t bytes) {
    Slot(i).counts[static_cast<uint32_t>(k)].ops.store(ops);
    Slot(i).counts[static_cast<uint32_t>(k)].bytes.store(bytes);
  }
  void Used(uint32_t n) { map.as<TrafficLedgerHeader>()->used.store(n); }
  // A read `ns` after the last one.
  void Read(uint64_t ns = 1000000000) {
    now += ns;
    claims.Read(now, sink, refusals);
  }

  struct Sink final : TrafficSink {
    using Key = std::tuple<TrafficPlacement, uint32_t, TrafficKind>;
    void Claimed(TrafficPlacement p, uint32_t ip, TrafficKind k, uint64_t ops,
                 uint64_t bytes) override {
      auto& [o, b] = got[{p, ip, k}];
      o += ops;
      b += bytes;
    }
    std::pair<uint64_t, uint64_t> Of(TrafficPlacement p, uint32_t ip, TrafficKind k) {
      return got[{p, ip, k}];
    }
    std::map<Key, std::pair<uint64_t, uint64_t>> got;
  };

  UniqueFd fd;
  Mapping map;
  TrafficClaims claims;
  uint64_t now = 1000;
  Sink sink;
  ClaimRefusals refusals{kClaimRefusalNames};
};

using P = TrafficPlacement;
using K = TrafficKind;
using Figures = std::pair<uint64_t, uint64_t>;

TEST(TrafficClaimsTest, WhatASlotGainedIsTakenOnceByKeyAndKind) {
  Ledger l;
  l.Key(3, 0x0a000002, P::kSameNode);
  l.Key(4, 0x0b000002, P::kDirect);
  l.Key(5, 0x0a000002, P::kSameNode);  // a second link to the same peer: summed
  l.Used(6);
  l.Set(3, K::kWrite, 2, 200);
  l.Set(4, K::kRead, 1, 4096);
  l.Set(5, K::kWrite, 1, 50);
  l.Read();
  EXPECT_EQ(l.sink.Of(P::kSameNode, 0x0a000002, K::kWrite), Figures(3, 250));
  EXPECT_EQ(l.sink.Of(P::kDirect, 0x0b000002, K::kRead), Figures(1, 4096));
  l.Read();  // nothing new: nothing more
  EXPECT_EQ(l.sink.Of(P::kSameNode, 0x0a000002, K::kWrite), Figures(3, 250));
  l.Set(3, K::kWrite, 5, 500);
  l.Read();
  EXPECT_EQ(l.sink.Of(P::kSameNode, 0x0a000002, K::kWrite), Figures(6, 550));
  EXPECT_EQ(l.refusals.total(), 0u);
}

TEST(TrafficClaimsTest, ACountThatFallsIsNotBelievedUntilItPassesTheHighestTaken) {
  Ledger l;
  l.Key(3, 0x0a000002, P::kSameNode);
  l.Used(4);
  l.Set(3, K::kSend, 10, 1000);
  l.Read();
  l.Set(3, K::kSend, 0, 0);  // as if to take it all again later
  l.Read();
  EXPECT_EQ(l.refusals.count(ClaimRefusal::kDecrease), 1u);
  l.Set(3, K::kSend, 10, 1000);
  l.Read();
  EXPECT_EQ(l.sink.Of(P::kSameNode, 0x0a000002, K::kSend), Figures(10, 1000));
  l.Set(3, K::kSend, 12, 1100);
  l.Read();
  EXPECT_EQ(l.sink.Of(P::kSameNode, 0x0a000002, K::kSend), Figures(12, 1100));
}

TEST(TrafficClaimsTest, ASlotThatChangesKeyOrNamesNoPlacementIsRefused) {
  Ledger l;
  l.Key(3, 0x0a000002, P::kSameNode);
  l.Slot(4).placement.store(7);  // no such placement
  l.Used(5);
  l.Set(3, K::kSend, 1, 10);
  l.Set(4, K::kSend, 1, 10);
  l.Read();
  EXPECT_EQ(l.refusals.count(ClaimRefusal::kKey), 1u);
  EXPECT_EQ(l.sink.got.size(), 1u);
  // Counts taken for one peer do not move to another.
  l.Key(3, 0x0a000003, P::kSameNode);
  l.Set(3, K::kSend, 2, 20);
  l.Read();
  EXPECT_EQ(l.refusals.count(ClaimRefusal::kKey), 3u);
  EXPECT_EQ(l.sink.Of(P::kSameNode, 0x0a000003, K::kSend), Figures(0, 0));
  EXPECT_EQ(l.sink.Of(P::kSameNode, 0x0a000002, K::kSend), Figures(1, 10));
}

TEST(TrafficClaimsTest, MoreThanTheTimeSinceTheLastReadAllowsIsCutAndNeverTaken) {
  Ledger l;
  l.Key(3, 0x0a000002, P::kSameNode);
  l.Key(4, 0x0a000003, P::kSameNode);
  l.Used(5);
  l.Set(3, K::kWrite, 1, uint64_t{1} << 50);
  l.Set(4, K::kWrite, 1, uint64_t{1} << 50);
  l.Read(1000);  // 1 us: 256,000 bytes and 1,000 operations for the whole session
  EXPECT_EQ(l.sink.Of(P::kSameNode, 0x0a000002, K::kWrite), Figures(1, 256000));
  EXPECT_EQ(l.sink.Of(P::kSameNode, 0x0a000003, K::kWrite), Figures(1, 0));
  EXPECT_EQ(l.refusals.count(ClaimRefusal::kRate), 2u);
  l.Read();  // what was cut is gone
  EXPECT_EQ(l.sink.Of(P::kSameNode, 0x0a000002, K::kWrite), Figures(1, 256000));
  EXPECT_EQ(l.sink.Of(P::kSameNode, 0x0a000003, K::kWrite), Figures(1, 0));
}

TEST(TrafficClaimsTest, AUsedCountPastTheSlotsReadsTheSlotsOnly) {
  Ledger l;
  l.Key(kTrafficSlots - 1, 0x0a000002, P::kRelay);
  l.Set(kTrafficSlots - 1, K::kAtomic, 1, 8);
  l.Used(0xffffffffu);
  l.Read();
  EXPECT_EQ(l.sink.Of(P::kRelay, 0x0a000002, K::kAtomic), Figures(1, 8));
}

TEST(TrafficClaimsTest, OnlyASealedLedgerOfItsSizeIsTakenAndOnlyOnce) {
  TrafficClaims claims;
  // Not sealed: the pod could shrink it under the router's mapping.
  UniqueFd loose(::memfd_create("loose", MFD_CLOEXEC));
  ASSERT_TRUE(loose);
  ASSERT_EQ(::ftruncate(loose.get(), kTrafficLedgerBytes), 0);
  EXPECT_EQ(claims.Take(loose.get(), 1), EINVAL);
  UniqueFd small;
  ASSERT_EQ(CreateSegment("small", 4096, &small), 0);
  EXPECT_EQ(claims.Take(small.get(), 1), EINVAL);
  EXPECT_FALSE(claims.taken());
  Ledger l;
  EXPECT_EQ(l.claims.Take(l.fd.get(), 1), EINVAL);  // a second one
}

TEST(TrafficTotalsTest, LabelsAreTheRoutersOwn) {
  TrafficTotals totals("node-a", [](uint32_t ip) {
    return ip == 0x0b000002 ? std::string("node-b") : std::string();
  });
  totals.Claimed(P::kSameNode, 0x0b000002, K::kSend, 1, 10);  // same node is this node's
  totals.Claimed(P::kDirect, 0x0b000002, K::kSend, 2, 20);
  totals.Claimed(P::kDirect, 0x0c000002, K::kSend, 3, 30);  // no node holds it
  totals.Claimed(P::kRelay, 0, K::kRead, 4, 40);            // several peers
  const auto& t = totals.totals();
  auto of = [&](P p, const char* node, K k) {
    const auto it = t.find({p, node, k});
    return it == t.end() ? Figures(0, 0) : Figures(it->second.ops, it->second.bytes);
  };
  EXPECT_EQ(of(P::kSameNode, "node-a", K::kSend), Figures(1, 10));
  EXPECT_EQ(of(P::kDirect, "node-b", K::kSend), Figures(2, 20));
  EXPECT_EQ(of(P::kDirect, "unknown", K::kSend), Figures(3, 30));
  EXPECT_EQ(of(P::kRelay, "unknown", K::kRead), Figures(4, 40));
  EXPECT_EQ(t.size(), 4u);
}

TEST(TrafficTotalsTest, PeerNodesPastTheBoundAreCountedAsOther) {
  uint32_t next = 0;
  TrafficTotals totals("node-a", [&](uint32_t) { return "node-" + std::to_string(next++); });
  for (size_t i = 0; i < TrafficTotals::kMaxPeerNodes + 10; ++i)
    totals.Claimed(P::kDirect, 0x0b000002, K::kSend, 1, 1);
  EXPECT_EQ(totals.totals().size(), TrafficTotals::kMaxPeerNodes + 1);
  EXPECT_EQ(totals.totals().at({P::kDirect, "other", K::kSend}).ops, 10u);
}

// ---- through the router ------------------------------------------------------------------

std::string Scrape(TestRouter& router) {
  return ff::test::HttpRequest(router.MetricsPort(), "GET", "/metrics").body;
}
using ff::test::SampleValue;

TEST(TrafficClaimsTest, APodsLedgerMovesTheNodesOperationFamilies) {
  TestRouter::Options o;
  o.metrics_address = "127.0.0.1:0";
  TestRouter router(o);
  const std::string writes =
      "freeflow_router_operations_total{placement=\"same_node\",peer_node=\"node-a\","
      "kind=\"write\"}";
  const std::string write_bytes =
      "freeflow_router_operation_bytes_total{placement=\"same_node\",peer_node=\"node-a\","
      "kind=\"write\"}";
  const std::string ledger_refusals =
      "freeflow_router_traffic_claims_refused_total{reason=\"ledger\"}";
  {
    RawPod pod(router, Ip("10.0.0.1"));
    ASSERT_EQ(pod.Hello(), 0);
    UniqueFd fd;
    Mapping map;
    ASSERT_EQ(CreateSegment("test-traffic", kTrafficLedgerBytes, &fd), 0);
    ASSERT_EQ(MapSegment(fd.get(), kTrafficLedgerBytes, true, &map), 0);
    proto::TrafficLedger m{};
    m.bytes = kTrafficLedgerBytes;
    ASSERT_EQ(pod.Call(m, {fd.get()}).status, 0);
    EXPECT_EQ(pod.Call(m, {fd.get()}).status, EINVAL);  // one a session
    TrafficSlot* slots = TrafficSlotsOf(map.get());
    slots[0].peer_ip.store(Ip("10.0.0.2"));
    slots[0].placement.store(static_cast<uint32_t>(P::kSameNode));
    slots[0].counts[static_cast<uint32_t>(K::kWrite)].ops.store(3);
    slots[0].counts[static_cast<uint32_t>(K::kWrite)].bytes.store(3000);
    map.as<TrafficLedgerHeader>()->used.store(1);
    std::string text = Scrape(router);
    EXPECT_EQ(SampleValue(text, writes), 3) << text;
    EXPECT_EQ(SampleValue(text, write_bytes), 3000);
    EXPECT_EQ(SampleValue(text, "freeflow_router_traffic_ledgers"), 1);
    EXPECT_EQ(SampleValue(text, ledger_refusals), 1);
    std::string report;
    EXPECT_EQ(ff::test::PromtoolCheck(text, &report), 0) << report << text;
    // What the library counted after the last scrape is read when its session ends.
    slots[0].counts[static_cast<uint32_t>(K::kWrite)].ops.store(5);
    slots[0].counts[static_cast<uint32_t>(K::kWrite)].bytes.store(5000);
    ASSERT_TRUE(pod.Flush());  // the refused second ledger left the session as it was
  }
  for (int i = 0; i < 200 && SampleValue(Scrape(router), "freeflow_router_sessions") != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const std::string text = Scrape(router);
  EXPECT_EQ(SampleValue(text, writes), 5) << text;
  EXPECT_EQ(SampleValue(text, write_bytes), 5000);
  EXPECT_EQ(SampleValue(text, "freeflow_router_traffic_ledgers"), 0);
}

}  // namespace
}  // namespace ff::router::test
