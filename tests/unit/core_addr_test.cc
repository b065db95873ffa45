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

// Either GID of a pod's port names it as a destination: index 1 whatever the address,
// index 0 (which keeps the low 24 bits) inside an overlay of /8 or longer.
TEST(Gid, EitherGidOfAPodsPortNamesItsAddress) {
  const Ipv4Prefix slash16 = *Ipv4Prefix::Parse("10.244.0.0/16");
  const Ipv4Prefix slash8 = *Ipv4Prefix::Parse("10.0.0.0/8");
  const Ipv4Prefix slash7 = *Ipv4Prefix::Parse("10.0.0.0/7");
  uint8_t gid[16];
  const uint32_t pod = *ParseIpv4("10.244.1.12");
  LinkLocalGid(pod, gid);
  EXPECT_EQ(IpFromPodGid(gid, slash16), pod);
  EXPECT_EQ(IpFromPodGid(gid, slash8), pod);
  EXPECT_FALSE(IpFromPodGid(gid, slash7)) << "the top byte is not known";
  LinkLocalGid(*ParseIpv4("10.245.1.12"), gid);
  EXPECT_FALSE(IpFromPodGid(gid, slash16)) << "its low 24 bits give an address outside";
  LinkLocalGid(pod, gid);
  gid[9] = 'G';  // another interface id: not a freeflow port's
  EXPECT_FALSE(IpFromPodGid(gid, slash16));
  LinkLocalGid(pod, gid);
  gid[1] = 0x81;  // not fe80::/64
  EXPECT_FALSE(IpFromPodGid(gid, slash16));
  const uint32_t outside = *ParseIpv4("192.0.2.7");
  Ipv4MappedGid(outside, gid);
  EXPECT_EQ(IpFromPodGid(gid, slash16), outside) << "index 1 names any address, as before";
}

TEST(Lid, IsTheOffsetInTheOverlayWhenThatIsAUnicastLid) {
  const Ipv4Prefix slash16 = *Ipv4Prefix::Parse("10.244.0.0/16");
  EXPECT_EQ(LidForIp(*ParseIpv4("10.244.1.12"), slash16), 0x010c);  // the low 16 bits
  EXPECT_EQ(LidForIp(*ParseIpv4("10.244.0.0"), slash16), 0);        // LID 0 is invalid
  EXPECT_EQ(LidForIp(*ParseIpv4("10.244.192.1"), slash16), 0);      // multicast range
  EXPECT_EQ(LidForIp(*ParseIpv4("10.245.1.12"), slash16), 0);       // not a pod address
  // A wider overlay: addresses that share their low 16 bits never share a LID.
  const Ipv4Prefix slash8 = *Ipv4Prefix::Parse("10.0.0.0/8");
  EXPECT_EQ(LidForIp(*ParseIpv4("10.0.1.12"), slash8), 0x010c);
  EXPECT_EQ(LidForIp(*ParseIpv4("10.1.1.12"), slash8), 0);
  // A narrower one starts at its own network.
  const Ipv4Prefix slash20 = *Ipv4Prefix::Parse("10.244.16.0/20");
  EXPECT_EQ(LidForIp(*ParseIpv4("10.244.17.2"), slash20), 0x0102);
}

TEST(Lid, TurnsBackIntoTheAddressOnEveryNode) {
  const Ipv4Prefix slash16 = *Ipv4Prefix::Parse("10.244.0.0/16");
  for (const char* a : {"10.244.0.1", "10.244.21.10", "10.244.191.255"}) {
    const uint32_t ip = *ParseIpv4(a);
    EXPECT_EQ(IpForLid(LidForIp(ip, slash16), slash16), ip) << a;
  }
  EXPECT_EQ(IpForLid(0, slash16), 0u);
  EXPECT_EQ(IpForLid(0xc001, slash16), 0u);  // multicast: no pod
  const Ipv4Prefix slash24 = *Ipv4Prefix::Parse("10.244.7.0/24");
  EXPECT_EQ(IpForLid(0x20, slash24), *ParseIpv4("10.244.7.32"));
  EXPECT_EQ(IpForLid(0x100, slash24), 0u);  // past the overlay
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
