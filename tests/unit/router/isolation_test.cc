// Attacks of a hostile pod on its neighbours through one router, each performed through the
// raw socket protocol or shared memory and each checked to fail (docs/security.md; issue 9
// findings 1, 3 and 5 — the wake and ring attacks across nodes are in cross_node_test.cc).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "base/table_store.h"
#include "harness.h"

namespace ff::router::test {
namespace {

constexpr uint32_t kReadOnly = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr uint32_t kReadWrite = kReadOnly | IBV_ACCESS_REMOTE_WRITE;

class IsolationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(victim.Hello(), 0);
    ASSERT_EQ(peer.Hello(), 0);
    ASSERT_EQ(attacker.Hello(), 0);
  }
  // Every region id the attacker might guess, through QP `qp` of its own.
  void ExpectNoRegionThrough(const RawQp& qp) {
    for (uint32_t id = 0; id < 16; ++id) {
      proto::GetRegion g{};
      g.qpn = qp.qpn;
      g.region_id = id;
      std::vector<UniqueFd> fds;
      EXPECT_NE(attacker.Call(g, {}, &fds).status, 0) << "region " << id;
      EXPECT_TRUE(fds.empty());
    }
  }

  TestRouter router{TestRouter::Options{}};
  RawPod victim{router, Ip("10.0.0.1")};
  RawPod peer{router, Ip("10.0.0.2")};
  RawPod attacker{router, Ip("10.0.0.66")};
};

// Finding 1: the attacker scans QP numbers for the victim's RC QP (in INIT, and later
// connected to its real peer) and its UD QP. It never gets a ring of the RC QP, and no
// region of the victim through either.
TEST_F(IsolationTest, NoPodAttachesToAQpWhoseOwnerDidNotNameIt) {
  Mapping secret;
  ASSERT_NE(victim.Register(1, 4096, kReadWrite, 0x1000, &secret), 0u);
  std::memcpy(secret.get(), "SECRET", 6);
  const RawQp rc = victim.CreateQp(IBV_QPT_RC);
  const RawQp ud = victim.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  const RawQp mine = attacker.CreateQp(IBV_QPT_RC);
  const RawQp mine_ud = attacker.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  for (uint32_t qpn = kFirstQpn; qpn < kFirstQpn + 0x40; ++qpn) {
    const RawLink l = attacker.Connect(mine, Ip("10.0.0.1"), qpn);
    EXPECT_TRUE(l.fds.empty()) << "QP " << qpn;
    EXPECT_NE(l.status, 0) << "QP " << qpn;
  }
  ExpectNoRegionThrough(mine);
  // A UD destination takes anyone's datagrams (as on a fabric), but shares no memory.
  EXPECT_EQ(attacker.Connect(mine_ud, Ip("10.0.0.1"), ud.qpn, true).status, 0);
  ExpectNoRegionThrough(mine_ud);
  // Connected to its real peer, the victim's QP still refuses the attacker.
  const RawQp theirs = peer.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(victim.Name(rc, Ip("10.0.0.2"), theirs.qpn), EINPROGRESS);
  ASSERT_EQ(peer.Connect(theirs, Ip("10.0.0.1"), rc.qpn).status, 0);
  EXPECT_EQ(attacker.Connect(mine, Ip("10.0.0.1"), rc.qpn).status, EINPROGRESS);
  ExpectNoRegionThrough(mine);
  EXPECT_EQ(std::string(secret.as<char>(), 6), "SECRET");
}

// Finding 1: memory registered without remote access has no region at all; a region whose
// registrations grant reads only reaches the connected peer read-only, even reopened.
TEST_F(IsolationTest, APeerGetsOnlyRemoteMemoryAndOnlyWithTheRightsGranted) {
  EXPECT_NE(victim.RegisterLocal(0x9000, 4096, IBV_ACCESS_LOCAL_WRITE), 0u);
  proto::RegMr local{};  // local access with a region memfd: refused
  local.addr = 0x9000;
  local.length = 4096;
  local.region_size = 4096;
  local.access = IBV_ACCESS_LOCAL_WRITE;
  local.region_id = 7;
  local.new_region = 1;
  UniqueFd fd;
  ASSERT_EQ(CreateSegment("local", 4096, &fd), 0);
  EXPECT_EQ(victim.Call(local, {fd.get()}).status, EINVAL);
  Mapping readable;
  ASSERT_NE(victim.Register(2, 4096, kReadOnly, 0x2000, &readable), 0u);
  std::memcpy(readable.get(), "READONLY", 8);
  const RawQp v = victim.CreateQp(IBV_QPT_RC), p = peer.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(victim.Name(v, Ip("10.0.0.2"), p.qpn), EINPROGRESS);
  ASSERT_EQ(peer.Connect(p, Ip("10.0.0.1"), v.qpn).status, 0);
  proto::GetRegion g{};
  g.qpn = p.qpn;
  g.region_id = 7;
  EXPECT_EQ(peer.Call(g).status, ENOENT);
  g.region_id = 2;
  std::vector<UniqueFd> got;
  const proto::Response r = peer.Call(g, {}, &got);
  ASSERT_EQ(r.status, 0);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(r.u.region.writable, 0u);
  // Write access through the descriptor, through a writable reopen of it, through write(2).
  EXPECT_EQ(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, got[0].get(), 0), MAP_FAILED);
  const std::string self = "/proc/self/fd/" + std::to_string(got[0].get());
  UniqueFd reopened(::open(self.c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(reopened);
  EXPECT_EQ(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, reopened.get(), 0),
            MAP_FAILED);
  EXPECT_EQ(::pwrite(reopened.get(), "EVIL", 4, 0), -1);
  void* ro = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, reopened.get(), 0);
  ASSERT_NE(ro, MAP_FAILED);
  EXPECT_NE(::mprotect(ro, 4096, PROT_READ | PROT_WRITE), 0);
  EXPECT_EQ(std::memcmp(ro, "READONLY", 8), 0);  // and reading works
  ::munmap(ro, 4096);
  EXPECT_EQ(std::string(readable.as<char>(), 8), "READONLY");
}

// A region that grants reads only must come sealed: a hostile owner (or a library bug)
// that hands over an unsealed one does not get it shared writable.
TEST_F(IsolationTest, AReadOnlyRegionThatIsNotSealedIsNotShared) {
  UniqueFd fd;
  ASSERT_EQ(CreateSegment("unsealed", 4096, &fd), 0);
  proto::RegMr m{};
  m.addr = 0x3000;
  m.length = 4096;
  m.region_size = 4096;
  m.access = kReadOnly;
  m.region_id = 3;
  m.new_region = 1;
  ASSERT_EQ(victim.Call(m, {fd.get()}).status, 0);
  const RawQp v = victim.CreateQp(IBV_QPT_RC), p = peer.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(victim.Name(v, Ip("10.0.0.2"), p.qpn), EINPROGRESS);
  ASSERT_EQ(peer.Connect(p, Ip("10.0.0.1"), v.qpn).status, 0);
  proto::GetRegion g{};
  g.qpn = p.qpn;
  g.region_id = 3;
  EXPECT_EQ(peer.Call(g).status, EACCES);
}

// A QP that goes back to RESET takes its rings back: the old peer hears kPeerClosed and
// gets no more memory through that connection; a new peer it names may connect.
TEST_F(IsolationTest, AQpThatResetsRevokesItsOldPeer) {
  Mapping memory;
  ASSERT_NE(victim.Register(4, 4096, kReadWrite, 0x4000, &memory), 0u);
  const RawQp v = victim.CreateQp(IBV_QPT_RC), p = peer.CreateQp(IBV_QPT_RC);
  const RawQp a = attacker.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(victim.Name(v, Ip("10.0.0.2"), p.qpn), EINPROGRESS);
  ASSERT_EQ(peer.Connect(p, Ip("10.0.0.1"), v.qpn).status, 0);
  proto::DisconnectQp reset{};
  reset.id = v.qpn;
  ASSERT_EQ(victim.Call(reset).status, 0);
  const auto e = peer.NextEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->type, proto::EventType::kPeerClosed);
  EXPECT_EQ(e->qpn, p.qpn);
  proto::GetRegion g{};
  g.qpn = p.qpn;
  g.region_id = 4;
  EXPECT_EQ(peer.Call(g).status, ENOENT);
  EXPECT_EQ(peer.Connect(p, Ip("10.0.0.1"), v.qpn).status, EINPROGRESS);  // named nobody now
  ASSERT_EQ(victim.Name(v, Ip("10.0.0.66"), a.qpn), EINPROGRESS);
  EXPECT_EQ(attacker.Connect(a, Ip("10.0.0.1"), v.qpn).status, 0);  // this one it named
  // Naming another peer without a RESET (only a pod speaking the protocol itself can) drops
  // the connection just the same.
  ASSERT_EQ(victim.Name(v, Ip("10.0.0.2"), p.qpn), 0);
  const auto gone = attacker.NextEvent();
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->qpn, a.qpn);
  g.qpn = a.qpn;
  EXPECT_EQ(attacker.Call(g).status, ENOENT);
}

// UD senders: each gets a ring memfd of its own and nothing of another sender's; the
// receiver is told by the router who produces into each ring.
TEST_F(IsolationTest, EachUdSenderGetsARingOfItsOwnAndTheReceiverLearnsWhoItIs) {
  const RawQp ud = victim.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  const RawQp a = attacker.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  const RawQp p = peer.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  RawLink from_attacker = attacker.Connect(a, Ip("10.0.0.1"), ud.qpn, true);
  RawLink from_peer = peer.Connect(p, Ip("10.0.0.1"), ud.qpn, true);
  ASSERT_EQ(from_attacker.status, 0);
  ASSERT_EQ(from_peer.status, 0);
  auto inode = [](int fd) {
    struct stat st {};
    return ::fstat(fd, &st) == 0 ? st.st_ino : 0;
  };
  const ino_t peer_ring = inode(from_peer.fds.back().get());
  for (const UniqueFd& fd : from_attacker.fds) EXPECT_NE(inode(fd.get()), peer_ring);
  for (const auto& [ip, qpn] :
       {std::pair{Ip("10.0.0.66"), a.qpn}, std::pair{Ip("10.0.0.2"), p.qpn}}) {
    auto e = victim.NextSetupEvent();
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->event.type, proto::EventType::kUdRing);
    EXPECT_EQ(e->event.qpn, ud.qpn);
    EXPECT_EQ(e->event.src_ip, ip);
    EXPECT_EQ(e->event.src_qpn, qpn);
    EXPECT_TRUE(SealedAtLeast(e->fd.get(), UdRingBytes(kUdRingBytes)));
  }
  // Asking again gives the same ring, not a second one.
  RawLink again = attacker.Connect(a, Ip("10.0.0.1"), ud.qpn, true);
  ASSERT_EQ(again.status, 0);
  EXPECT_EQ(inode(again.fds.back().get()), inode(from_attacker.fds.back().get()));
  EXPECT_FALSE(victim.NextSetupEvent(100).has_value());
}

// Finding 3: every memfd a pod hands over must be sealed against shrinking, so that it can
// never turn the router's (or a peer's) access into SIGBUS.
TEST_F(IsolationTest, AMemfdThatCouldShrinkIsRefused) {
  auto unsealed = [](size_t bytes) {
    UniqueFd fd(::memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
    return fd;
  };
  RawPod fresh(router, Ip("10.0.0.9"));
  UniqueFd notify = unsealed(kNotifySegmentBytes);
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd ours(sv[0]), theirs(sv[1]), rx, tx;
  ASSERT_EQ(CreateWakePair(&rx, &tx, true), 0);
  proto::Hello h{};
  h.abi = kAbiVersion;
  EXPECT_EQ(fresh.Call(h, {notify.get(), theirs.get(), tx.get()}).status, EINVAL);
  // Sealed ones cannot shrink at all: the attack itself fails.
  UniqueFd sealed;
  ASSERT_EQ(CreateSegment("sealed", 4096, &sealed), 0);
  EXPECT_NE(::ftruncate(sealed.get(), 0), 0);
  // A QP segment, an SRQ segment and a region: each refused unsealed.
  const size_t qp_bytes = QpSegmentBytes(1, kRcRingBytes);
  UniqueFd seg = unsealed(qp_bytes);
  proto::CreateQp q{};
  q.qp_type = IBV_QPT_RC;
  q.num_rings = 1;
  q.ring_bytes = kRcRingBytes;
  q.srq_id = proto::kNoId;
  ASSERT_EQ(victim.CreateCq(9), 9u);
  q.recv_cq_id = q.send_cq_id = 9;
  EXPECT_EQ(victim.Call(q, {seg.get()}).status, EINVAL);
  proto::CreateSrq s{};
  s.id = 1;
  UniqueFd srq = unsealed(sizeof(SrqSegment));
  EXPECT_EQ(victim.Call(s, {srq.get()}).status, EINVAL);
  proto::RegMr m{};
  m.length = 4096;
  m.region_size = 4096;
  m.access = kReadWrite;
  m.region_id = 5;
  m.new_region = 1;
  UniqueFd region = unsealed(4096);
  EXPECT_EQ(victim.Call(m, {region.get()}).status, EINVAL);
}

// Finding 2 (same node): an eventfd is never accepted where the router would wake through
// it — at HELLO and for a completion channel.
TEST_F(IsolationTest, EventfdsAreRefusedWhereverTheRouterWouldWriteThem) {
  RawPod fresh(router, Ip("10.0.0.10"));
  UniqueFd notify;
  ASSERT_EQ(CreateSegment("notify", kNotifySegmentBytes, &notify), 0);
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd ours(sv[0]), theirs(sv[1]);
  UniqueFd efd(::eventfd(0, EFD_CLOEXEC));
  proto::Hello h{};
  h.abi = kAbiVersion;
  EXPECT_EQ(fresh.Call(h, {notify.get(), theirs.get(), efd.get()}).status, EINVAL);
  proto::CreateChannel c{};
  c.id = 1;
  EXPECT_EQ(victim.Call(c, {efd.get()}).status, EINVAL);
}

// Finding 5: the MR table the router shares cannot be written by anyone but the router,
// even through a read-write reopen of the descriptor.
TEST_F(IsolationTest, TheMrTableCannotBeReopenedWritable) {
  const std::string self = "/proc/self/fd/" + std::to_string(attacker.mr_table_fd());
  errno = 0;
  UniqueFd rw(::open(self.c_str(), O_RDWR | O_CLOEXEC));
  if (RouterTables().movable()) {
    // A file of the router's tmpfs, handed out through a read-only mount: no reopen at all.
    EXPECT_FALSE(rw);
    EXPECT_EQ(errno, EROFS);
  } else {
    ASSERT_TRUE(rw);  // a sealed memfd reopens...
    EXPECT_EQ(::mmap(nullptr, kMrTableBytes, PROT_READ | PROT_WRITE, MAP_SHARED, rw.get(), 0),
              MAP_FAILED);  // ...but gives no way to write
    const uint32_t odd = 1;
    EXPECT_EQ(::pwrite(rw.get(), &odd, sizeof(odd), 0), -1);
    EXPECT_NE(::fallocate(rw.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), 0);
  }
  // The router still publishes registrations.
  Mapping memory;
  EXPECT_NE(attacker.Register(1, 4096, kReadWrite, 0x1000, &memory), 0u);
}

}  // namespace
}  // namespace ff::router::test
