// Memory windows as a pod that skips the library asks for them: every request that would
// make a window reach beyond a registration made for windows (IBV_ACCESS_MW_BIND) of its
// protection domain, or grant writes over one without local write, or confuse a
// window with a registration, is refused, and the MR table shows nothing it should not.
#include <gtest/gtest.h>

#include <cerrno>

#include "harness.h"

namespace ff::router::test {
namespace {

constexpr uint32_t kRead = IBV_ACCESS_REMOTE_READ;
constexpr uint32_t kMwMr =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND;

class WindowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(pod.Hello(), 0);
    ASSERT_EQ(MapSegment(pod.mr_table_fd(), kMrTableBytes, false, &table), 0);
    mr = pod.Register(1, 8192, kMwMr, 0x10000, &memory);
    ASSERT_NE(mr, 0u);
    qp = pod.CreateQp(IBV_QPT_RC);
    ASSERT_NE(qp.qpn, 0u);
  }
  uint32_t Alloc(uint32_t type, uint32_t pd = 0) {
    proto::AllocMw m{};
    m.type = type;
    m.pd = pd;
    const proto::Response r = pod.Call(m);
    return r.status == 0 ? r.u.reg_mr.key : 0;
  }
  int Bind(uint32_t key, uint32_t new_key, uint32_t mr_key, uint64_t addr, uint64_t length,
           uint32_t access, uint32_t qpn = 0) {
    proto::BindMw m{};
    m.key = key;
    m.new_key = new_key;
    m.mr_key = mr_key;
    m.addr = addr;
    m.length = length;
    m.access = access;
    m.qpn = qpn;
    return pod.Call(m).status;
  }
  // What a peer reading the table would find under `key` (length 0 when nothing).
  MrView Seen(uint32_t key) {
    MrView v{};
    if (!ReadMrEntry(table.as<MrEntry>(), key, &v)) v = MrView{};
    return v;
  }

  TestRouter router{TestRouter::Options{}};
  RawPod pod{router, Ip("10.0.0.1")};
  Mapping table, memory;
  uint32_t mr = 0;
  RawQp qp;
};

TEST_F(WindowsTest, ABoundWindowIsATableEntryInsideItsRegistration) {
  const uint32_t key = Alloc(IBV_MW_TYPE_1);
  ASSERT_NE(key, 0u);
  EXPECT_EQ(Seen(key).length, 0u);  // unbound: no range, no rights
  EXPECT_EQ(Seen(key).access, 0u);
  ASSERT_EQ(Bind(key, key + 1, mr, 0x11000, 256, kRead), 0);
  const MrView v = Seen(key + 1);
  EXPECT_EQ(v.addr, 0x11000u);
  EXPECT_EQ(v.length, 256u);
  EXPECT_EQ(v.access, kRead);
  EXPECT_EQ(v.region, 1u);
  EXPECT_EQ(v.region_offset, 0x1000u);
  EXPECT_EQ(v.qpn, 0u);
  EXPECT_EQ(Seen(key).length, 0u);  // the old key names nothing
}

TEST_F(WindowsTest, AWindowNeverReachesMoreThanARegistrationForWindows) {
  const uint32_t key = Alloc(IBV_MW_TYPE_1);
  ASSERT_NE(key, 0u);
  // A registration for windows is shared memory: one that claims to be local-only is
  // refused, and local-only memory (no region) takes no window.
  EXPECT_EQ(pod.RegisterLocal(0x40000, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND), 0u);
  const uint32_t local = pod.RegisterLocal(0x40000, 4096, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(local, 0u);
  EXPECT_EQ(Bind(key, key + 1, local, 0x40000, 64, kRead), EACCES);
  // More than the registration: past its end, before its start, an overflowing length.
  EXPECT_EQ(Bind(key, key + 1, mr, 0x11f00, 512, kRead), EINVAL);
  EXPECT_EQ(Bind(key, key + 1, mr, 0xff00, 512, kRead), EINVAL);
  EXPECT_EQ(Bind(key, key + 1, mr, 0x11000, ~0ull, kRead), EINVAL);
  // Rights that are not remote rights.
  EXPECT_EQ(Bind(key, key + 1, mr, 0x10000, 64, kRead | IBV_ACCESS_MW_BIND), EINVAL);
  // Another window, or a key of no registration, as the registration.
  const uint32_t other = Alloc(IBV_MW_TYPE_1);
  EXPECT_EQ(Bind(key, key + 1, other, 0, 64, kRead), EACCES);
  EXPECT_EQ(Bind(key, key + 1, mr ^ 0x100, 0x10000, 64, kRead), EACCES);
  EXPECT_EQ(Seen(key).length, 0u);
}

// As on an HCA, binding a window is how the owner grants remote access: the registration
// needs IBV_ACCESS_MW_BIND only, and local write for a window that grants writes or atomics.
TEST_F(WindowsTest, AWindowGrantsRightsOfItsOwnOverARegistrationForWindows) {
  Mapping bind_only, bind_write;
  const uint32_t ro = pod.Register(2, 4096, IBV_ACCESS_MW_BIND, 0x50000, &bind_only);
  ASSERT_NE(ro, 0u);
  const uint32_t rw =
      pod.Register(3, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND, 0x60000, &bind_write);
  ASSERT_NE(rw, 0u);
  const uint32_t key = Alloc(IBV_MW_TYPE_1);
  ASSERT_NE(key, 0u);
  EXPECT_EQ(Bind(key, key + 1, ro, 0x50000, 64, IBV_ACCESS_REMOTE_WRITE), EACCES);
  EXPECT_EQ(Bind(key, key + 1, ro, 0x50000, 64, IBV_ACCESS_REMOTE_ATOMIC), EACCES);
  EXPECT_EQ(Seen(key + 1).length, 0u);
  ASSERT_EQ(Bind(key, key + 1, ro, 0x50000, 64, kRead), 0);
  EXPECT_EQ(Seen(key + 1).access, kRead);
  EXPECT_EQ(Seen(key + 1).region, 2u);
  const uint32_t key2 = Alloc(IBV_MW_TYPE_1);
  ASSERT_NE(key2, 0u);
  const uint32_t all = kRead | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
  ASSERT_EQ(Bind(key2, key2 + 1, rw, 0x60000, 128, all), 0);
  EXPECT_EQ(Seen(key2 + 1).access, all);
  EXPECT_EQ(Seen(key2 + 1).region, 3u);
}

// A window and the registration it is bound over are of one protection domain; the window's
// entry names its domain, bound or not, so that only QPs of that domain serve its key.
TEST_F(WindowsTest, AWindowBindsOnlyOverARegistrationOfItsProtectionDomain) {
  const uint32_t key = Alloc(IBV_MW_TYPE_1, 7);  // the registration's domain is 0
  ASSERT_NE(key, 0u);
  EXPECT_EQ(Seen(key).pd, 7u);
  EXPECT_EQ(Bind(key, key + 1, mr, 0x10000, 64, kRead), EACCES);
  EXPECT_EQ(Seen(key).length, 0u) << "nothing bound";
  const uint32_t same = Alloc(IBV_MW_TYPE_1, 0);
  ASSERT_NE(same, 0u);
  ASSERT_EQ(Bind(same, same + 1, mr, 0x10000, 64, kRead), 0);
  EXPECT_EQ(Seen(same + 1).length, 64u);
  EXPECT_EQ(Seen(same + 1).pd, 0u);
}

TEST_F(WindowsTest, ARegistrationWithoutMwBindTakesNoWindow) {
  Mapping other;
  const uint32_t plain = pod.Register(2, 4096, IBV_ACCESS_LOCAL_WRITE | kRead, 0x50000, &other);
  ASSERT_NE(plain, 0u);
  const uint32_t key = Alloc(IBV_MW_TYPE_1);
  EXPECT_EQ(Bind(key, key + 1, plain, 0x50000, 64, kRead), EACCES);
}

TEST_F(WindowsTest, KeysStayInTheirSlotAndKindsAreNotMixed) {
  const uint32_t key = Alloc(IBV_MW_TYPE_1);
  ASSERT_NE(key, 0u);
  EXPECT_EQ(Bind(key, mr, mr, 0x10000, 64, kRead), EINVAL);  // the registration's slot
  EXPECT_EQ(Bind(key, 0, mr, 0x10000, 64, kRead), EINVAL);
  EXPECT_EQ(Bind(mr, mr + 1, mr, 0x10000, 64, kRead), EINVAL);        // a registration is no window
  EXPECT_EQ(Bind(key + 5, key + 6, mr, 0x10000, 64, kRead), EINVAL);  // not its current key
  proto::DeregMr d{};
  d.key = key;
  EXPECT_EQ(pod.Call(d).status, EINVAL);  // a window is not deregistered
  proto::MoveMr move{};
  move.key = key;
  move.region_id = 1;
  EXPECT_EQ(pod.Call(move).status, EINVAL);
  proto::DeallocMw free{};
  free.key = mr;
  EXPECT_EQ(pod.Call(free).status, EINVAL);  // nor a registration freed as a window
  EXPECT_EQ(Seen(mr).length, 8192u);
  EXPECT_EQ(Alloc(7), 0u);  // no such type
}

TEST_F(WindowsTest, TypeTwoNeedsAnRcQpOfThePodAndAnInvalidationBeforeARebind) {
  const uint32_t key = Alloc(IBV_MW_TYPE_2);
  ASSERT_NE(key, 0u);
  EXPECT_EQ(Bind(key, key + 1, mr, 0x10000, 64, kRead), EINVAL);  // no QP
  EXPECT_EQ(Bind(key, key + 1, mr, 0x10000, 64, kRead, qp.qpn + 77), EINVAL);
  RawPod other(router, Ip("10.0.0.2"));
  ASSERT_EQ(other.Hello(), 0);
  const RawQp theirs = other.CreateQp(IBV_QPT_RC);
  EXPECT_EQ(Bind(key, key + 1, mr, 0x10000, 64, kRead, theirs.qpn), EINVAL);
  const RawQp ud = pod.CreateQp(IBV_QPT_UD);
  EXPECT_EQ(Bind(key, key + 1, mr, 0x10000, 64, kRead, ud.qpn), EINVAL);
  ASSERT_EQ(Bind(key, key + 1, mr, 0x10000, 64, kRead, qp.qpn), 0);
  EXPECT_EQ(Seen(key + 1).qpn, qp.qpn);
  EXPECT_EQ(Bind(key + 1, key + 2, mr, 0x10000, 64, kRead, qp.qpn), EINVAL);
  proto::DeregMr d{};
  d.key = mr;
  EXPECT_EQ(pod.Call(d).status, EBUSY);
  proto::InvalidateMw inv{};
  inv.key = key + 1;
  inv.qpn = qp.qpn + 1;  // a SEND_WITH_INV on another QP
  EXPECT_EQ(pod.Call(inv).status, EINVAL);
  inv.qpn = qp.qpn;
  EXPECT_EQ(pod.Call(inv).status, 0);
  EXPECT_EQ(Seen(key + 1).length, 0u);
  EXPECT_EQ(pod.Call(inv).status, EINVAL);  // not bound any more
  EXPECT_EQ(pod.Call(d).status, 0);
}

TEST_F(WindowsTest, ATypeTwoWindowServesNoQpOnceItsQpIsDestroyed) {
  const uint32_t key = Alloc(IBV_MW_TYPE_2);
  ASSERT_EQ(Bind(key, key + 1, mr, 0x10000, 64, kRead, qp.qpn), 0);
  proto::DestroyQp d{};
  d.id = qp.qpn;
  ASSERT_EQ(pod.Call(d).status, 0);
  const MrView v = Seen(key + 1);
  EXPECT_EQ(v.length, 64u);  // still bound: it must be invalidated or freed
  EXPECT_NE(v.qpn, qp.qpn);
  EXPECT_NE(v.qpn, 0u);  // and not open to every QP
  proto::DeregMr dereg{};
  dereg.key = mr;
  EXPECT_EQ(pod.Call(dereg).status, EBUSY);
}

TEST_F(WindowsTest, AWindowFollowsItsRegistrationIntoAnotherRegion) {
  const uint32_t key = Alloc(IBV_MW_TYPE_1);
  ASSERT_EQ(Bind(key, key + 1, mr, 0x11000, 64, kRead), 0);
  UniqueFd merged;
  ASSERT_EQ(CreateSegment("merged", 3 * 4096, &merged), 0);
  proto::MoveMr m{};
  m.key = mr;
  m.region_id = 9;
  m.region_offset = 4096;
  m.region_size = 3 * 4096;
  m.new_region = 1;
  ASSERT_EQ(pod.Call(m, {merged.get()}).status, 0);
  const MrView v = Seen(key + 1);
  EXPECT_EQ(v.region, 9u);
  EXPECT_EQ(v.region_offset, 4096u + 0x1000u);
}

}  // namespace
}  // namespace ff::router::test
