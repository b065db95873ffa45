// Unit tests of overlay addressing and the MR table's sequence-locked entries.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "freeflow/ipv4.h"
#include "freeflow/shm_layout.h"

namespace ff {
namespace {

TEST(Ipv4Prefix, ParsesAndMatches) {
  auto p = Ipv4Prefix::Parse("10.244.3.7/16");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->ToString(), "10.244.0.0/16");
  EXPECT_TRUE(p->Contains(*ParseIpv4("10.244.200.1")));
  EXPECT_FALSE(p->Contains(*ParseIpv4("10.245.0.1")));
  EXPECT_EQ(Ipv4Prefix::Parse("192.168.1.1")->length, 32u);
  EXPECT_TRUE(Ipv4Prefix::Parse("0.0.0.0/0")->Contains(*ParseIpv4("8.8.8.8")));
}

TEST(Ipv4Prefix, RejectsMalformedInput) {
  for (const char* bad : {"", "10.244.0.0/", "10.244.0.0/33", "10.244.0/16", "10.244.0.256/16",
                          "10.244.0.0/1a", "a.b.c.d", "10.244.0.0.0/8", "1.2.3.4/-1"}) {
    EXPECT_FALSE(Ipv4Prefix::Parse(bad)) << bad;
  }
}

TEST(Gid, Ipv4MappedRoundTrip) {
  uint8_t gid[16];
  const uint32_t ip = *ParseIpv4("10.244.1.12");
  Ipv4MappedGid(ip, gid);
  EXPECT_EQ(gid[10], 0xff);
  EXPECT_EQ(gid[11], 0xff);
  EXPECT_EQ(*IpFromGid(gid), ip);
  LinkLocalGid(ip, gid);
  EXPECT_EQ(gid[0], 0xfe);
  EXPECT_FALSE(IpFromGid(gid));
}

TEST(Lid, DerivedFromLow16BitsWhenValid) {
  EXPECT_EQ(LidForIp(*ParseIpv4("10.244.1.12")), 0x010c);
  EXPECT_EQ(LidForIp(*ParseIpv4("10.244.0.0")), 0);      // LID 0 is invalid
  EXPECT_EQ(LidForIp(*ParseIpv4("10.244.192.1")), 0);    // multicast range
}

TEST(MrTable, ReadsOnlyLiveMatchingKeys) {
  auto table = std::make_unique<MrEntry[]>(kMrTableSlots);
  MrEntry& e = table[5];
  e.key.store((5u << 8) | 3);
  e.access.store(7);
  e.addr.store(0x1000);
  e.length.store(4096);
  e.seq.store(2);
  MrView v{};
  EXPECT_TRUE(ReadMrEntry(table.get(), (5u << 8) | 3, &v));
  EXPECT_EQ(v.addr, 0x1000u);
  EXPECT_FALSE(ReadMrEntry(table.get(), (5u << 8) | 4, &v));  // stale tag
  EXPECT_FALSE(ReadMrEntry(table.get(), 0, &v));
  EXPECT_FALSE(ReadMrEntry(table.get(), kMrTableSlots << 8, &v));  // slot out of range
  e.seq.store(3);  // being rewritten: never read torn
  EXPECT_FALSE(ReadMrEntry(table.get(), (5u << 8) | 3, &v));
}

}  // namespace
}  // namespace ff
