// TCP mode's router side (TcpModeService): socket sessions, listeners, connection records and
// their claims, spoken by raw pods as a hostile pod would speak them. Garbage collection is
// in stream_gc_test.cc.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "freeflow/stream_claims.h"
#include "freeflow/stream_pods.h"
#include "log_capture.h"
#include "sock_pod.h"

namespace ff::router::test {
namespace {

const uint32_t kA = Ip("10.0.0.1");
const uint32_t kB = Ip("10.0.0.2");
const uint32_t kC = Ip("10.0.0.3");
constexpr uint16_t kServerPort = 5000;
constexpr uint16_t kClientPort = 40000;

// A table shared with pods that none of them can write or shrink: a file of the router's
// tmpfs on a read-only mount, or (without the mount API) a memfd sealed against both.
bool ReadOnlyForEveryHolder(int fd, uint64_t bytes) {
  return ReadOnlyView(fd, bytes) || (SealedReadOnly(fd) && SealedAtLeast(fd, bytes));
}

class SocketServiceTest : public ::testing::Test {
 protected:
  explicit SocketServiceTest(PodLimits limits = DefaultPodLimits())
      : router_(TestRouter::Options{.limits = limits}) {}

  // A socket session of the pod at `ip` (namespace `netns`), served.
  std::unique_ptr<SockPod> Pod(uint32_t ip, uint64_t netns = 0) {
    auto p = std::make_unique<SockPod>(router_, ip, netns);
    EXPECT_EQ(p->SockHello(), 0);
    return p;
  }
  // B listens on kServerPort; A connects to it from kClientPort.
  SockAnswer ConnectAToB(SockPod& a, SockPod& b) {
    EXPECT_EQ(b.Listen(kServerPort), 0);
    return a.Connect(kB, kClientPort, kServerPort);
  }

  // Pods A and B, and A's connect to B (in a_, b_ and c_): true when it got a record.
  bool Connected() {
    a_ = Pod(kA);
    b_ = Pod(kB);
    c_ = ConnectAToB(*a_, *b_);
    return c_.status == 0;
  }

  TestRouter router_;
  std::unique_ptr<SockPod> a_, b_;
  SockAnswer c_;
};

// ---- sessions -----------------------------------------------------------------------------

TEST_F(SocketServiceTest, ASocketSessionIsServed) {
  SockPod a(router_, kA);
  ASSERT_EQ(a.SockHello(), 0);
  EXPECT_EQ(a.sock_hello().ip, htonl(kA));
  EXPECT_EQ(a.sock_hello().prefix_len, 8u);
  EXPECT_STREQ(a.sock_hello().node, "node-a");
  EXPECT_EQ(router_.Stat("sessions"), 1u);
  EXPECT_EQ(router_.Stat("pods"), 0u);  // no verbs context
}

TEST_F(SocketServiceTest, AnotherAbiIsRefusedWithTheReason) {
  SockPod a(router_, kA);
  EXPECT_EQ(a.SockHello(kAbiVersion + 1), EPROTO);
  EXPECT_NE(std::strstr(a.sock_hello().node, "does not match"), nullptr);
}

TEST_F(SocketServiceTest, ARefusedClientReadsWhyAtSockHello) {
  SockPod nobody(router_, 0);  // the fake identity refuses it (no overlay address)
  EXPECT_EQ(nobody.SockHello(), EACCES);
  EXPECT_NE(std::strstr(nobody.sock_hello().node, "no address inside the overlay"), nullptr);
}

TEST_F(SocketServiceTest, ANamespaceTheRouterCannotWatchIsRefused) {
  router_.streams().FailOpen("cannot enter the client's network namespace");
  SockPod a(router_, kA);
  EXPECT_EQ(a.SockHello(), EACCES);
  EXPECT_NE(std::strstr(a.sock_hello().node, "TCP mode unavailable"), nullptr);
  EXPECT_TRUE(a.Disconnected());
}

// Sends a SockListen the router must not take from `pod`: true when it drops the pod.
bool ListenDrops(RawPod& pod) {
  proto::SockListen m{};
  m.port = kServerPort;
  pod.SendRaw(&m, sizeof(m));
  return pod.Disconnected();
}

TEST_F(SocketServiceTest, AVerbsSessionThatSendsASocketRequestIsDropped) {
  RawPod v(router_, kA);
  ASSERT_EQ(v.Hello(), 0);
  EXPECT_TRUE(ListenDrops(v));
}

TEST_F(SocketServiceTest, ASocketSessionThatSendsAVerbsRequestIsDropped) {
  auto a = Pod(kA);
  proto::CreateCq m{};
  m.cq_id = 1;
  m.notify_slot = m.chan_id = proto::kNoId;
  a->SendRaw(&m, sizeof(m));
  EXPECT_TRUE(a->Disconnected());
}

TEST_F(SocketServiceTest, ASocketRequestBeforeSockHelloIsDropped) {
  SockPod a(router_, kA);
  EXPECT_TRUE(ListenDrops(a));
}

TEST_F(SocketServiceTest, ASecondHelloOfEitherKindIsDropped) {
  auto a = Pod(kA);
  proto::SockHello again{};
  again.abi = kAbiVersion;
  a->SendRaw(&again, sizeof(again));
  EXPECT_TRUE(a->Disconnected());
  auto b = Pod(kB);
  EXPECT_NE(b->Hello(), 0);  // a verbs HELLO on a socket session: no answer, dropped
  EXPECT_TRUE(b->Disconnected());
}

class SocketSessionQuotaTest : public SocketServiceTest {
 protected:
  SocketSessionQuotaTest() : SocketServiceTest(WithLimits({{Quota::kSessions, 1}})) {}
};

TEST_F(SocketSessionQuotaTest, SocketSessionsCountAgainstThePodsSessions) {
  auto a = Pod(kA);
  SockPod second(router_, kA);
  EXPECT_EQ(second.SockHello(), EMFILE);
  EXPECT_NE(std::strstr(second.sock_hello().node, "--max-sessions-per-pod"), nullptr);
  auto b = Pod(kB);  // another pod is served
}

// ---- listeners ----------------------------------------------------------------------------

TEST_F(SocketServiceTest, AListenerTakesConnectsUntilItIsUnregistered) {
  auto a = Pod(kA), b = Pod(kB);
  EXPECT_EQ(a->Connect(kB, kClientPort, kServerPort).status, ENOENT);
  ASSERT_EQ(b->Listen(kServerPort), 0);
  EXPECT_EQ(router_.Stat("listeners"), 1u);
  EXPECT_EQ(a->Connect(kB, kClientPort, kServerPort).status, 0);
  b->Unlisten(kServerPort);
  ASSERT_TRUE(b->Sync());
  EXPECT_EQ(router_.Stat("listeners"), 0u);
  EXPECT_EQ(a->Connect(kB, kClientPort + 1, kServerPort).status, ENOENT);
}

TEST_F(SocketServiceTest, ListenersGoWithTheirSession) {
  auto a = Pod(kA);
  auto b = Pod(kB);
  ASSERT_EQ(b->Listen(kServerPort), 0);
  ASSERT_EQ(b->Listen(kServerPort + 1), 0);
  b.reset();
  EXPECT_TRUE(WaitFor([&] { return router_.Stat("listeners") == 0; }));
  EXPECT_EQ(a->Connect(kB, kClientPort, kServerPort).status, ENOENT);
}

TEST_F(SocketServiceTest, EachSessionUnregistersOnlyItsOwnRegistrations) {
  auto a = Pod(kA);
  auto b1 = Pod(kB), b2 = Pod(kB);
  ASSERT_EQ(b1->Listen(kServerPort), 0);
  b2->Unlisten(kServerPort);  // not b2's
  ASSERT_TRUE(b2->Sync());
  EXPECT_EQ(router_.Stat("listeners"), 1u);
  ASSERT_EQ(b2->Listen(kServerPort), 0);
  b1.reset();  // b2's registration of the same port stays
  EXPECT_TRUE(WaitFor([&] { return router_.Stat("listeners") == 1; }));
  EXPECT_EQ(a->Connect(kB, kClientPort, kServerPort).status, 0);
}

TEST_F(SocketServiceTest, PortsOutsideOneTo65535AreInvalid) {
  auto a = Pod(kA), b = Pod(kB);
  EXPECT_EQ(b->Listen(0), EINVAL);
  EXPECT_EQ(b->Listen(65536), EINVAL);
  EXPECT_EQ(b->Listen(0xffffffffu), EINVAL);
  EXPECT_EQ(b->Listen(65535), 0);
  EXPECT_EQ(a->Connect(kB, 0, 65535).status, EINVAL);
  EXPECT_EQ(a->Connect(kB, kClientPort, 0).status, EINVAL);
  EXPECT_EQ(b->Claim(kA, 0, kClientPort).status, EINVAL);
  EXPECT_EQ(b->Claim(kA, 65535, 0).status, EINVAL);
  EXPECT_TRUE(a->Sync());  // nothing dropped the pods
}

class ListenerQuotaTest : public SocketServiceTest {
 protected:
  ListenerQuotaTest() : SocketServiceTest(WithLimits({{Quota::kListeners, 2}})) {}
};

TEST_F(ListenerQuotaTest, APodOverItsListenersIsRefusedAndLogged) {
  auto b1 = Pod(kB), b2 = Pod(kB), c = Pod(kC);
  ff::testing::LogCapture log;
  EXPECT_EQ(b1->Listen(1), 0);
  EXPECT_EQ(b2->Listen(2), 0);  // the pod's quota, over its sessions
  EXPECT_EQ(b2->Listen(3), ENOSPC);
  EXPECT_EQ(b1->Listen(4), ENOSPC);
  EXPECT_EQ(log.Count({"10.0.0.2", "TCP-mode listening ports", "--max-sock-listeners-per-pod"}), 1);
  EXPECT_EQ(c->Listen(1), 0);  // another pod is not affected
  b1->Unlisten(1);
  ASSERT_TRUE(b1->Sync());
  EXPECT_EQ(b2->Listen(3), 0);
}

// ---- the pod list -------------------------------------------------------------------------

// What a library sees of the pod list `fd`: is `ip` on it?
PodListed Listed(const UniqueFd& fd, uint32_t ip) {
  Mapping m;
  if (MapRouterTable(fd.get(), kStreamPodsBytes, &m) != 0) return PodListed::kUnknown;
  return FindStreamPod(m.get(), ip);
}

TEST_F(SocketServiceTest, TheHelloCarriesTheNodesPodList) {
  auto a = Pod(kA);
  auto b = Pod(kB);
  ASSERT_TRUE(a->pod_list());
  EXPECT_TRUE(ReadOnlyForEveryHolder(a->pod_list().get(), kStreamPodsBytes));
  EXPECT_EQ(Listed(a->pod_list(), kA), PodListed::kYes);
  EXPECT_EQ(Listed(a->pod_list(), kB), PodListed::kYes);  // one list: later sessions show
  EXPECT_EQ(Listed(a->pod_list(), kC), PodListed::kNo);
  RawPod v(router_, kC);  // a verbs session is no socket session
  ASSERT_EQ(v.Hello(), 0);
  EXPECT_EQ(Listed(a->pod_list(), kC), PodListed::kNo);
}

// A table the router shares read-only (`fd`, `bytes` long): whatever a pod does with the
// descriptor, it cannot write, shrink or reseal it.
void ExpectNoPodWrites(int fd, uint64_t bytes) {
  ASSERT_GE(fd, 0);
  EXPECT_EQ(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
  const char junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_LT(::pwrite(fd, junk, sizeof(junk), 0), 0);
  EXPECT_LT(::pwrite(fd, junk, sizeof(junk), 64), 0);
  EXPECT_NE(::fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL), 0) << "a pod resealed the table";
  EXPECT_NE(::ftruncate(fd, 0), 0);
  // Reopened read-write through /proc: the seal is the inode's, not the descriptor's.
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  UniqueFd rw(::open(self.c_str(), O_RDWR | O_CLOEXEC));
  if (rw) {
    EXPECT_EQ(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, rw.get(), 0), MAP_FAILED);
    EXPECT_LT(::pwrite(rw.get(), junk, sizeof(junk), 0), 0);
  }
}

// A pod that writes the list could make every other pod's connections skip the router (or
// ask it about everything): it must not be able to, whatever it does with the descriptor.
TEST_F(SocketServiceTest, APodCannotWriteThePodList) {
  auto a = Pod(kA);
  ExpectNoPodWrites(a->pod_list().get(), kStreamPodsBytes);
  EXPECT_EQ(Listed(a->pod_list(), kA), PodListed::kYes);
}

// An address stays listed while a record names it, even after its sessions closed: a server
// that accepts a connection whose client has exited must still claim it (its bytes are in
// the segment), so its library must not skip the router.
TEST_F(SocketServiceTest, AnAddressStaysListedWhileASessionOrARecordNamesIt) {
  ASSERT_TRUE(Connected());
  auto watcher = Pod(kC);
  const UniqueFd& list = watcher->pod_list();
  a_.reset();  // the client's session closes; its record stays
  ASSERT_TRUE(WaitFor([&] { return router_.Stat("sessions") == 2; }));
  EXPECT_EQ(Listed(list, kA), PodListed::kYes);
  auto a2 = Pod(kA);
  a2->Release(kB, kClientPort, kServerPort);  // unclaimed: the record goes
  ASSERT_TRUE(a2->Sync());
  EXPECT_EQ(router_.Stat("streams"), 0u);
  a2.reset();
  EXPECT_TRUE(WaitFor([&] { return Listed(list, kA) == PodListed::kNo; }));
  EXPECT_EQ(Listed(list, kB), PodListed::kYes);
  b_.reset();
  EXPECT_TRUE(WaitFor([&] { return Listed(list, kB) == PodListed::kNo; }));
  EXPECT_EQ(Listed(list, kC), PodListed::kYes);
}

// ---- the claims table -----------------------------------------------------------------------

// What a library sees in the claims table `fd` of the connection from `client`:`cport` to
// its own `sport`.
PodListed Pending(const UniqueFd& fd, uint32_t client, uint16_t cport, uint16_t sport) {
  Mapping m;
  if (MapRouterTable(fd.get(), kStreamClaimsBytes, &m) != 0) return PodListed::kUnknown;
  return FindStreamClaim(m.get(), StreamClaimKey(client, cport, sport));
}

// The server's library accepts a connection without asking the router when its table does
// not hold it: the record must be there from before the client's answer until the claim.
TEST_F(SocketServiceTest, TheServersTableHoldsItsConnectionsUntilItClaimsThem) {
  a_ = Pod(kA);
  b_ = Pod(kB);
  ASSERT_TRUE(b_->claims());
  EXPECT_TRUE(ReadOnlyForEveryHolder(b_->claims().get(), kStreamClaimsBytes));
  EXPECT_EQ(Pending(b_->claims(), kA, kClientPort, kServerPort), PodListed::kNo);
  c_ = ConnectAToB(*a_, *b_);
  ASSERT_EQ(c_.status, 0);
  auto b2 = Pod(kB);  // another session of the pod: the same table
  for (const UniqueFd* t : {&b_->claims(), &b2->claims()})
    EXPECT_EQ(Pending(*t, kA, kClientPort, kServerPort), PodListed::kYes);
  EXPECT_EQ(Pending(b_->claims(), kA, kClientPort + 1, kServerPort), PodListed::kNo);
  EXPECT_EQ(Pending(b_->claims(), kC, kClientPort, kServerPort), PodListed::kNo);
  // Only the server's pod: the client's table does not show who it connects to.
  EXPECT_EQ(Pending(a_->claims(), kA, kClientPort, kServerPort), PodListed::kNo);
  ASSERT_EQ(b_->Claim(kA, kServerPort, kClientPort).status, 0);
  EXPECT_EQ(Pending(b_->claims(), kA, kClientPort, kServerPort), PodListed::kNo);
  ASSERT_EQ(b_->Claim(kA, kServerPort, kClientPort).status, 0);  // a claim still repeats
}

TEST_F(SocketServiceTest, ARecordThatGoesLeavesTheTable) {
  ASSERT_TRUE(Connected());
  a_->Release(kB, kClientPort, kServerPort);
  ASSERT_TRUE(a_->Sync());
  EXPECT_EQ(Pending(b_->claims(), kA, kClientPort, kServerPort), PodListed::kNo);
  // Replaced by a connect of the same tuple: the new record is there.
  ASSERT_EQ(a_->Connect(kB, kClientPort, kServerPort).status, 0);
  ASSERT_EQ(a_->Connect(kB, kClientPort, kServerPort).status, 0);
  EXPECT_EQ(Pending(b_->claims(), kA, kClientPort, kServerPort), PodListed::kYes);
  b_->Closed(kA, kServerPort, kClientPort);
  a_->Closed(kB, kClientPort, kServerPort);
  ASSERT_TRUE(a_->Sync() && b_->Sync());
  EXPECT_EQ(router_.Stat("streams"), 0u);
  EXPECT_EQ(Pending(b_->claims(), kA, kClientPort, kServerPort), PodListed::kNo);
}

// Room for thousands of records of one pod (five descriptors each, in this process).
class ClaimsTableTest : public SocketServiceTest {
 protected:
  ClaimsTableTest()
      : SocketServiceTest(WithLimits({{Quota::kFds, 40000}, {Quota::kStreams, 8000}})) {}
  void SetUp() override {
    rlimit r{};
    ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &r), 0);
    r.rlim_cur = std::max<rlim_t>(r.rlim_cur, std::min<rlim_t>(r.rlim_max, 16384));
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &r), 0);
    ASSERT_GE(r.rlim_cur, 5u * (kStreamClaimsCapacity + 16) + 200)
        << "the test needs this many descriptors";
  }
};

// Many connects and claims through the same slots: what is in the table is exactly the
// unclaimed records (a removed key's slot is passed over, reused, compacted).
TEST_F(ClaimsTableTest, TheTableFollowsManyRecordsComingAndGoing) {
  a_ = Pod(kA);
  b_ = Pod(kB);
  ASSERT_EQ(b_->Listen(kServerPort), 0);
  for (int round = 0; round < 3; ++round) {
    for (uint16_t p = 1000; p < 1600; ++p)
      ASSERT_EQ(a_->Connect(kB, p, kServerPort).status, 0) << p;
    for (uint16_t p = 1000; p < 1600; p += 2) ASSERT_EQ(b_->Claim(kA, kServerPort, p).status, 0);
    for (uint16_t p = 1000; p < 1600; ++p)
      EXPECT_EQ(Pending(b_->claims(), kA, p, kServerPort), p % 2 ? PodListed::kYes : PodListed::kNo)
          << p;
    for (uint16_t p = 1000; p < 1600; ++p) a_->Release(kB, p, kServerPort);
    ASSERT_TRUE(a_->Sync());
    for (uint16_t p = 1001; p < 1600; p += 2)
      EXPECT_EQ(Pending(b_->claims(), kA, p, kServerPort), PodListed::kNo) << p;
  }
}

// A hostile pod connects to a victim's listener far more often than the table holds: the
// victim's libraries are told to ask (slower), and every one of its connections is still
// claimed and served, the flood's too.
TEST_F(ClaimsTableTest, AFloodOfConnectsSpillsTheTableAndNothingIsMissed) {
  a_ = Pod(kA);
  b_ = Pod(kB);
  ASSERT_EQ(b_->Listen(kServerPort), 0);
  auto good = Pod(kC);
  ASSERT_EQ(good->Connect(kB, kClientPort, kServerPort).status, 0);
  const uint16_t first = 1024;
  for (uint32_t i = 0; i < kStreamClaimsCapacity + 8; ++i)
    ASSERT_EQ(a_->Connect(kB, static_cast<uint16_t>(first + i), kServerPort).status, 0) << i;
  EXPECT_EQ(Pending(b_->claims(), kC, kClientPort, kServerPort), PodListed::kUnknown);
  EXPECT_EQ(Pending(b_->claims(), kA, 1, kServerPort), PodListed::kUnknown);  // ask: ENOENT
  EXPECT_EQ(b_->Claim(kC, kServerPort, kClientPort).status, 0);
  EXPECT_EQ(
      b_->Claim(kA, kServerPort, static_cast<uint16_t>(first + kStreamClaimsCapacity + 7)).status,
      0);
  // The flood's records go: the table says what it holds again.
  for (uint32_t i = 0; i < kStreamClaimsCapacity + 8; ++i)
    a_->Release(kB, static_cast<uint16_t>(first + i), kServerPort);
  ASSERT_TRUE(a_->Sync());
  EXPECT_EQ(Pending(b_->claims(), kA, first, kServerPort), PodListed::kNo);
  EXPECT_EQ(Pending(b_->claims(), kC, kClientPort, kServerPort), PodListed::kNo);  // claimed
}

// A pod that wrote its table could make its libraries skip claims of accelerated connections
// (they would hang), or other pods' entries visible: it cannot.
TEST_F(SocketServiceTest, APodCannotWriteItsClaimsTable) {
  ASSERT_TRUE(Connected());
  ExpectNoPodWrites(b_->claims().get(), kStreamClaimsBytes);
  EXPECT_EQ(Pending(b_->claims(), kA, kClientPort, kServerPort), PodListed::kYes);
}

// The pod's sessions all end (its server execs) and come back: the new table holds the
// records its namespace may still claim.
TEST_F(SocketServiceTest, ANewTableHoldsTheRecordsMadeBeforeIt) {
  ASSERT_TRUE(Connected());
  b_.reset();
  ASSERT_TRUE(WaitFor([&] { return router_.Stat("sessions") == 1; }));
  auto b2 = Pod(kB);
  EXPECT_EQ(Pending(b2->claims(), kA, kClientPort, kServerPort), PodListed::kYes);
  auto other = Pod(kC, 77);  // another pod's sessions never see it
  EXPECT_EQ(Pending(other->claims(), kA, kClientPort, kServerPort), PodListed::kNo);
}

// ---- connect ------------------------------------------------------------------------------

TEST_F(SocketServiceTest, AConnectToAnAddressWithoutASessionIsKernelTcp) {
  auto a = Pod(kA);
  EXPECT_EQ(a->Connect(kC, kClientPort, kServerPort).status, ENOENT);
  EXPECT_EQ(a->Connect(Ip("192.0.2.1"), kClientPort, kServerPort).status, ENOENT);
  EXPECT_EQ(router_.Stat("streams"), 0u);
}

TEST_F(SocketServiceTest, AVerbsSessionIsNotAListener) {
  auto a = Pod(kA);
  RawPod v(router_, kB);
  ASSERT_EQ(v.Hello(), 0);
  EXPECT_EQ(a->Connect(kB, kClientPort, kServerPort).status, ENOENT);
}

TEST_F(SocketServiceTest, AConnectGivesTwoSealedMemfdsOfTheRightSizes) {
  ASSERT_TRUE(Connected());
  EXPECT_EQ(c_.reply.role, proto::kStreamClient);
  EXPECT_EQ(c_.reply.ring_bytes, kStreamRingBytes);
  EXPECT_TRUE(ValidStreamRingBytes(c_.reply.ring_bytes));
  ASSERT_EQ(c_.fds.size(), 3u);  // segment, side, bell
  EXPECT_EQ(SizeOf(c_.fds[0].get()), StreamSegmentBytes(kStreamRingBytes));
  EXPECT_EQ(SizeOf(c_.fds[1].get()), kStreamSideBytes);
  for (int i = 0; i < 2; ++i) {
    const UniqueFd& fd = c_.fds[i];
    const int seals = ::fcntl(fd.get(), F_GET_SEALS);
    EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    EXPECT_EQ(seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE), 0);  // both ends write it
  }
  EXPECT_EQ(router_.Stat("streams"), 1u);
}

// A hostile end tries to pull the segment out from under the other end: shrink it (SIGBUS
// there), grow it, or seal it against the writes of an end that maps it later.
TEST_F(SocketServiceTest, AnEndCannotResizeOrResealTheSegment) {
  ASSERT_TRUE(Connected());
  for (int i = 0; i < 2; ++i) {
    const UniqueFd& fd = c_.fds[i];
    EXPECT_NE(::ftruncate(fd.get(), 0), 0);
    EXPECT_NE(::ftruncate(fd.get(), 64 << 20), 0);
    EXPECT_NE(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_FUTURE_WRITE), 0);
    EXPECT_EQ(errno, EPERM);
  }
  SockAnswer s = b_->Claim(kA, kServerPort, kClientPort);
  ASSERT_EQ(s.status, 0);
  EXPECT_EQ(SizeOf(s.fds[0].get()), StreamSegmentBytes(kStreamRingBytes));
  void* p =
      ::mmap(nullptr, kStreamHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, s.fds[0].get(), 0);
  EXPECT_NE(p, MAP_FAILED);
  if (p != MAP_FAILED) ::munmap(p, kStreamHeaderBytes);
}

TEST_F(SocketServiceTest, WhatOneEndWritesTheOtherEndsClaimSees) {
  ASSERT_TRUE(Connected());
  const uint64_t bytes = StreamSegmentBytes(kStreamRingBytes);
  Mapping client_map, server_map;
  ASSERT_EQ(MapPeerSegment(c_.fds[0].get(), bytes, true, &client_map), 0);
  const char text[] = "ring 0: from the client";
  std::memcpy(client_map.as<char>() + StreamRingData(kStreamRingBytes, 0), text, sizeof(text));
  SockAnswer s = b_->Claim(kA, kServerPort, kClientPort);
  ASSERT_EQ(s.status, 0);
  ASSERT_EQ(MapPeerSegment(s.fds[0].get(), bytes, true, &server_map), 0);
  EXPECT_STREQ(server_map.as<char>() + StreamRingData(kStreamRingBytes, 0), text);
  const char back[] = "ring 1: from the server";
  std::memcpy(server_map.as<char>() + StreamRingData(kStreamRingBytes, 1), back, sizeof(back));
  EXPECT_STREQ(client_map.as<char>() + StreamRingData(kStreamRingBytes, 1), back);
}

TEST_F(SocketServiceTest, ASocketFacingItselfIsKernelTcp) {
  auto a = Pod(kA);
  ASSERT_EQ(a->Listen(kServerPort), 0);
  EXPECT_EQ(a->Connect(kA, kServerPort, kServerPort).status, ENOENT);
}

TEST_F(SocketServiceTest, AConnectOfTheSameTupleReplacesTheRecord) {
  auto a = Pod(kA), b = Pod(kB);
  SockAnswer first = ConnectAToB(*a, *b);
  SockAnswer second = a->Connect(kB, kClientPort, kServerPort);
  ASSERT_EQ(first.status, 0);
  ASSERT_EQ(second.status, 0);
  EXPECT_FALSE(SameMemfd(first.fds[0], second.fds[0]));
  EXPECT_EQ(router_.Stat("streams"), 1u);
  SockAnswer s = b->Claim(kA, kServerPort, kClientPort);
  ASSERT_EQ(s.status, 0);
  EXPECT_TRUE(SameMemfd(s.fds[0], second.fds[0]));
}

// ---- claim --------------------------------------------------------------------------------

TEST_F(SocketServiceTest, TheServerClaimsItsEnd) {
  ASSERT_TRUE(Connected());
  SockAnswer s = b_->Claim(kA, kServerPort, kClientPort);
  ASSERT_EQ(s.status, 0);
  EXPECT_EQ(s.reply.role, proto::kStreamServer);
  EXPECT_EQ(s.reply.ring_bytes, kStreamRingBytes);
  ASSERT_EQ(s.fds.size(), 3u);
  EXPECT_TRUE(SameMemfd(s.fds[0], c_.fds[0]));   // one segment
  EXPECT_FALSE(SameMemfd(s.fds[1], c_.fds[1]));  // a side each
  EXPECT_EQ(SizeOf(s.fds[1].get()), kStreamSideBytes);
}

// The two ends hold the two sides of one bell pair (stream_segment.h): a byte the client
// sends reaches the server's side only, and back; an end never reads its own wake-ups' echo,
// and neither shares an open file with the other (whose flags it could change).
TEST_F(SocketServiceTest, TheEndsHoldTheTwoSidesOfTheirBellPair) {
  ASSERT_TRUE(Connected());
  SockAnswer s = b_->Claim(kA, kServerPort, kClientPort);
  ASSERT_EQ(s.status, 0);
  ASSERT_EQ(s.fds.size(), 3u);
  const int client = c_.fds[2].get(), server = s.fds[2].get();
  EXPECT_FALSE(SameMemfd(c_.fds[2], s.fds[2])) << "one open file for both ends";
  char b = 'D';
  ASSERT_EQ(::send(client, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL), 1);
  char got = 0;
  EXPECT_EQ(::recv(server, &got, 1, MSG_DONTWAIT), 1);
  EXPECT_EQ(got, 'D');
  EXPECT_EQ(::recv(client, &got, 1, MSG_DONTWAIT), -1) << "the client's own bell rang";
  b = 'S';
  ASSERT_EQ(::send(server, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL), 1);
  EXPECT_EQ(::recv(client, &got, 1, MSG_DONTWAIT), 1);
  EXPECT_EQ(got, 'S');
  // A claim again (after exec) gives the same side.
  SockAnswer again = a_->Claim(kB, kClientPort, kServerPort);
  ASSERT_EQ(again.fds.size(), 3u);
  EXPECT_TRUE(SameMemfd(again.fds[2], c_.fds[2]));
}

TEST_F(SocketServiceTest, ClaimsRepeatWithTheSameMemfds) {
  ASSERT_TRUE(Connected());
  for (int i = 0; i < 3; ++i) {
    SockAnswer again = a_->Claim(kB, kClientPort, kServerPort);  // a client after exec
    ASSERT_EQ(again.status, 0);
    EXPECT_EQ(again.reply.role, proto::kStreamClient);
    EXPECT_TRUE(SameMemfd(again.fds[0], c_.fds[0]));
    EXPECT_TRUE(SameMemfd(again.fds[1], c_.fds[1]));
    SockAnswer s1 = b_->Claim(kA, kServerPort, kClientPort);
    SockAnswer s2 = b_->Claim(kA, kServerPort, kClientPort);  // a forked server
    ASSERT_EQ(s1.status, 0);
    ASSERT_EQ(s2.status, 0);
    EXPECT_TRUE(SameMemfd(s1.fds[1], s2.fds[1]));
  }
}

TEST_F(SocketServiceTest, ANewSessionOfThePodClaimsAfterExec) {
  ASSERT_TRUE(Connected());
  a_.reset();  // the program execs: its session closes, the record stays
  auto exec = Pod(kA);
  SockAnswer again = exec->Claim(kB, kClientPort, kServerPort);
  ASSERT_EQ(again.status, 0);
  EXPECT_TRUE(SameMemfd(again.fds[0], c_.fds[0]));
}

TEST_F(SocketServiceTest, BothEndsInOnePodAreToldApartByTheirPorts) {
  auto a = Pod(kA);
  ASSERT_EQ(a->Listen(kServerPort), 0);
  SockAnswer c = a->Connect(kA, kClientPort, kServerPort);
  ASSERT_EQ(c.status, 0);
  SockAnswer s = a->Claim(kA, kServerPort, kClientPort);
  ASSERT_EQ(s.status, 0);
  EXPECT_EQ(s.reply.role, proto::kStreamServer);
  SockAnswer again = a->Claim(kA, kClientPort, kServerPort);
  ASSERT_EQ(again.status, 0);
  EXPECT_EQ(again.reply.role, proto::kStreamClient);
  EXPECT_TRUE(SameMemfd(again.fds[1], c.fds[1]));
  EXPECT_FALSE(SameMemfd(s.fds[1], c.fds[1]));
}

// A third pod names someone else's connection, as either end, with its own address (the
// router never takes an address from a request).
TEST_F(SocketServiceTest, AThirdPodCannotClaimSomeoneElsesRecord) {
  auto a = Pod(kA), b = Pod(kB), c = Pod(kC);
  ASSERT_EQ(ConnectAToB(*a, *b).status, 0);
  EXPECT_EQ(c->Claim(kA, kServerPort, kClientPort).status, ENOENT);  // as the server
  EXPECT_EQ(c->Claim(kB, kClientPort, kServerPort).status, ENOENT);  // as the client
  EXPECT_EQ(c->Claim(kC, kServerPort, kClientPort).status, ENOENT);
  EXPECT_EQ(a->Claim(kA, kServerPort, kClientPort).status, ENOENT);  // the client as server
  EXPECT_EQ(b->Claim(kB, kClientPort, kServerPort).status, ENOENT);  // the server as client
  EXPECT_EQ(b->Claim(kA, kClientPort, kServerPort).status, ENOENT);  // ports swapped
}

// The server's pod is gone and another namespace now holds its address (a pod that took it,
// or a new pod given it): it is not the end the record names.
TEST_F(SocketServiceTest, AnotherNamespaceWithTheSameAddressCannotClaim) {
  auto a = Pod(kA, 1);
  auto b = Pod(kB, 2);
  ASSERT_EQ(ConnectAToB(*a, *b).status, 0);
  b.reset();
  EXPECT_TRUE(WaitFor([&] { return router_.Stat("sessions") == 1; }));
  auto impostor = Pod(kB, 3);
  EXPECT_EQ(impostor->Claim(kA, kServerPort, kClientPort).status, ENOENT);
  auto a_elsewhere = Pod(kC, 1);
  EXPECT_EQ(a_elsewhere->Claim(kB, kClientPort, kServerPort).status, ENOENT);
}

// ---- release ------------------------------------------------------------------------------

TEST_F(SocketServiceTest, TheClientReleasesAnUnclaimedRecord) {
  auto a = Pod(kA), b = Pod(kB);
  ASSERT_EQ(ConnectAToB(*a, *b).status, 0);
  a->Release(kB, kClientPort, kServerPort);
  ASSERT_TRUE(a->Sync());
  EXPECT_EQ(router_.Stat("streams"), 0u);
  EXPECT_EQ(b->Claim(kA, kServerPort, kClientPort).status, ENOENT);
}

TEST_F(SocketServiceTest, AClaimedRecordIsNotReleased) {
  auto a = Pod(kA), b = Pod(kB);
  ASSERT_EQ(ConnectAToB(*a, *b).status, 0);
  ASSERT_EQ(b->Claim(kA, kServerPort, kClientPort).status, 0);
  a->Release(kB, kClientPort, kServerPort);
  ASSERT_TRUE(a->Sync());
  EXPECT_EQ(router_.Stat("streams"), 1u);
  EXPECT_EQ(b->Claim(kA, kServerPort, kClientPort).status, 0);
}

TEST_F(SocketServiceTest, OnlyTheClientReleases) {
  auto a = Pod(kA), b = Pod(kB), c = Pod(kC);
  ASSERT_EQ(ConnectAToB(*a, *b).status, 0);
  b->Release(kA, kServerPort, kClientPort);  // the server, from its side
  b->Release(kB, kClientPort, kServerPort);
  c->Release(kB, kClientPort, kServerPort);  // a third pod with the client's ports
  ASSERT_TRUE(b->Sync());
  ASSERT_TRUE(c->Sync());
  EXPECT_EQ(router_.Stat("streams"), 1u);
  EXPECT_EQ(b->Claim(kA, kServerPort, kClientPort).status, 0);
}

// ---- closes -------------------------------------------------------------------------------

TEST_F(SocketServiceTest, TheRecordGoesAtOnceWhenBothEndsClosedIt) {
  ASSERT_TRUE(Connected());
  ASSERT_EQ(b_->Claim(kA, kServerPort, kClientPort).status, 0);
  a_->Closed(kB, kClientPort, kServerPort);
  a_->Closed(kB, kClientPort, kServerPort);  // another process of the pod: still one end
  ASSERT_TRUE(a_->Sync());
  EXPECT_EQ(router_.Stat("streams"), 1u);
  EXPECT_EQ(b_->Claim(kA, kServerPort, kClientPort).status, 0) << "the server may still exec";
  b_->Closed(kA, kServerPort, kClientPort);
  ASSERT_TRUE(b_->Sync());
  EXPECT_EQ(router_.Stat("streams"), 0u);
  EXPECT_EQ(b_->Claim(kA, kServerPort, kClientPort).status, ENOENT);
}

// A pod can say only that its own end closed: not the other end, not another pod's.
TEST_F(SocketServiceTest, NoPodClosesAnEndThatIsNotItsOwn) {
  ASSERT_TRUE(Connected());
  auto c = Pod(kC);
  c->Closed(kB, kClientPort, kServerPort);   // as the client
  c->Closed(kA, kServerPort, kClientPort);   // as the server
  a_->Closed(kA, kServerPort, kClientPort);  // the client, as the server
  a_->Closed(kB, kServerPort, kClientPort);  // ports swapped
  b_->Closed(kA, kServerPort, kClientPort);  // the server's own end: one of two
  ASSERT_TRUE(c->Sync());
  ASSERT_TRUE(a_->Sync());
  ASSERT_TRUE(b_->Sync());
  EXPECT_EQ(router_.Stat("streams"), 1u);
  EXPECT_EQ(a_->Claim(kB, kClientPort, kServerPort).status, 0);
}

// ---- quotas -------------------------------------------------------------------------------

class StreamQuotaTest : public SocketServiceTest {
 protected:
  StreamQuotaTest() : SocketServiceTest(WithLimits({{Quota::kStreams, 2}})) {}
};

TEST_F(StreamQuotaTest, APodOverItsRecordsIsRefusedAndLogged) {
  auto a = Pod(kA), b = Pod(kB), c = Pod(kC);
  ASSERT_EQ(b->Listen(kServerPort), 0);
  ff::testing::LogCapture log;
  EXPECT_EQ(a->Connect(kB, 1, kServerPort).status, 0);
  EXPECT_EQ(a->Connect(kB, 2, kServerPort).status, 0);
  EXPECT_EQ(a->Connect(kB, 3, kServerPort).status, ENOSPC);
  EXPECT_EQ(a->Connect(kB, 4, kServerPort).status, ENOSPC);
  EXPECT_EQ(log.Count({"10.0.0.1", "TCP-mode connections", "--max-streams-per-pod"}), 1);
  EXPECT_EQ(c->Connect(kB, 1, kServerPort).status, 0);  // another pod is served
  EXPECT_EQ(a->Connect(kB, 2, kServerPort).status, 0);  // a replaced record costs nothing more
  a->Release(kB, 1, kServerPort);
  ASSERT_TRUE(a->Sync());
  EXPECT_EQ(a->Connect(kB, 3, kServerPort).status, 0);
}

// Records outlive the session that made them, and so does their charge: a pod cannot get
// past its quota by closing sessions.
TEST_F(StreamQuotaTest, RecordsStayChargedAfterTheirSessionCloses) {
  auto b = Pod(kB);
  ASSERT_EQ(b->Listen(kServerPort), 0);
  for (uint16_t port : {1, 2}) {
    auto a = Pod(kA);
    EXPECT_EQ(a->Connect(kB, port, kServerPort).status, 0);
  }
  auto a = Pod(kA);
  EXPECT_EQ(a->Connect(kB, 3, kServerPort).status, ENOSPC);
  EXPECT_EQ(router_.Stat("streams"), 2u);
}

// A pod that makes short connections one after another (an HTTP client without keep-alive)
// gives each record back as it closes: it never runs into its quota, and its connections
// stay accelerated.
TEST_F(StreamQuotaTest, ShortConnectionsDoNotUseUpTheQuota) {
  auto a = Pod(kA), b = Pod(kB);
  ASSERT_EQ(b->Listen(kServerPort), 0);
  for (uint16_t port = 1; port <= 20; ++port) {
    ASSERT_EQ(a->Connect(kB, port, kServerPort).status, 0) << port;
    ASSERT_EQ(b->Claim(kA, kServerPort, port).status, 0) << port;
    a->Closed(kB, port, kServerPort);
    b->Closed(kA, kServerPort, port);
  }
  ASSERT_TRUE(a->Sync());
  ASSERT_TRUE(b->Sync());
  EXPECT_EQ(router_.Stat("streams"), 0u);
}

class StreamFdQuotaTest : public SocketServiceTest {
 protected:
  // The session's socket and two records' segment, sides and bell pair (5 each).
  StreamFdQuotaTest() : SocketServiceTest(WithLimits({{Quota::kFds, 11}})) {}
};

TEST_F(StreamFdQuotaTest, RecordsCountAgainstThePodsDescriptors) {
  auto a = Pod(kA), b = Pod(kB);
  ASSERT_EQ(b->Listen(kServerPort), 0);
  EXPECT_EQ(a->Connect(kB, 1, kServerPort).status, 0);
  EXPECT_EQ(a->Connect(kB, 2, kServerPort).status, 0);
  EXPECT_EQ(a->Connect(kB, 3, kServerPort).status, EMFILE);
}

}  // namespace
}  // namespace ff::router::test
