// Events for a pod whose event socket is full: they wait, an event replaces the one it makes
// stale, and what waits is charged to the pod; the attack of issue 37 (1), a third pod making
// a victim's events faster than it reads them, no longer costs the victim its session.
#include "pods/event_backlog.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <map>

#include "harness.h"

namespace ff::router::test {
namespace {

proto::Event UdRing(uint32_t qpn, uint32_t ring, uint32_t src_qpn) {
  proto::Event e{};
  e.type = proto::EventType::kUdRing;
  e.qpn = qpn;
  e.ring = ring;
  e.src_ip = 0x0a000001;
  e.src_qpn = src_qpn;
  return e;
}

struct Pair {
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds), 0);
    router_end.reset(fds[0]);
    pod_end.reset(fds[1]);
  }
  // The next event and the descriptor that came with it (-1: none; closed here).
  std::optional<proto::Event> Next(bool* had_fd = nullptr) {
    proto::Event e{};
    UniqueFd fds[1];
    int nfds = 0;
    size_t len = 0;
    if (RecvWithFds(pod_end.get(), &e, sizeof(e), fds, 1, &nfds, &len, MSG_DONTWAIT) != 0 ||
        len != sizeof(e))
      return std::nullopt;
    if (had_fd != nullptr) *had_fd = nfds == 1;
    return e;
  }
  UniqueFd router_end, pod_end;
};

// Open descriptors of this process.
size_t OpenFds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd"))
    ++n;
  return n;
}

TEST(EventBacklog, TheLatestSenderOfARingReplacesTheOnesBeforeAndTheirDescriptors) {
  EventBacklog b;
  UniqueFd memfd(::memfd_create("ring", MFD_CLOEXEC));
  const size_t before = OpenFds();
  for (uint32_t i = 0; i < 1000; ++i)
    ASSERT_TRUE(b.Push(UdRing(0x100, i % 2, 0x200 + i), memfd.get()));
  EXPECT_EQ(b.size(), 2u);  // one per ring
  EXPECT_EQ(b.fds(), 2u);
  EXPECT_EQ(b.replaced(), 998u);
  EXPECT_EQ(OpenFds(), before + 2) << "replaced events kept their descriptors";
  Pair p;
  ASSERT_EQ(b.Flush(p.router_end.get()), 0);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.fds(), 0u);
  bool had_fd = false;
  auto e = p.Next(&had_fd);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->ring, 0u);
  EXPECT_EQ(e->src_qpn, 0x200u + 998) << "not the latest sender of ring 0";
  EXPECT_TRUE(had_fd);
  e = p.Next();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->src_qpn, 0x200u + 999);
  EXPECT_FALSE(p.Next().has_value());
}

// Order is kept: an event that replaces another goes after those queued since.
TEST(EventBacklog, AReplacingEventGoesLastAndOthersKeepTheirOrder) {
  EventBacklog b;
  proto::Event gone{};
  gone.type = proto::EventType::kPeerGone;
  gone.qpn = 7;
  proto::Event conn{};
  conn.type = proto::EventType::kDirectConn;  // replaces nothing
  conn.conn = 1;
  ASSERT_TRUE(b.Push(UdRing(5, 0, 1), -1));
  ASSERT_TRUE(b.Push(gone, -1));
  ASSERT_TRUE(b.Push(conn, -1));
  ASSERT_TRUE(b.Push(conn, -1));
  ASSERT_TRUE(b.Push(UdRing(5, 0, 2), -1));
  ASSERT_TRUE(b.Push(gone, -1));
  Pair p;
  ASSERT_EQ(b.Flush(p.router_end.get()), 0);
  const std::vector<std::pair<proto::EventType, uint32_t>> want = {
      {proto::EventType::kDirectConn, 0},
      {proto::EventType::kDirectConn, 0},
      {proto::EventType::kUdRing, 2},
      {proto::EventType::kPeerGone, 0}};
  for (const auto& [type, src_qpn] : want) {
    const auto e = p.Next();
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->type, type);
    EXPECT_EQ(e->src_qpn, src_qpn);
  }
  EXPECT_FALSE(p.Next().has_value());
}

// Events that replace nothing are bounded; a full socket keeps the rest for later.
TEST(EventBacklog, WhatReplacesNothingIsBoundedAndAFullSocketKeepsTheRest) {
  EventBacklog b;
  proto::Event conn{};
  conn.type = proto::EventType::kDirectConn;
  for (size_t i = 0; i < kMaxQueuedEvents; ++i) ASSERT_TRUE(b.Push(conn, -1)) << i;
  EXPECT_FALSE(b.Push(conn, -1));
  EXPECT_FALSE(b.Push(UdRing(1, 0, 1), -1)) << "it replaces nothing queued: over the bound";
  EXPECT_EQ(b.size(), kMaxQueuedEvents);
  Pair p;
  const int sndbuf = 4096;
  ASSERT_EQ(::setsockopt(p.router_end.get(), SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)), 0);
  EXPECT_EQ(b.Flush(p.router_end.get()), EAGAIN);
  EXPECT_GT(b.size(), 0u);
  EXPECT_LT(b.size(), kMaxQueuedEvents);
  size_t read = 0;
  for (int turns = 0; !b.empty() && turns < 100000; ++turns) {
    while (p.Next()) ++read;
    const int rc = b.Flush(p.router_end.get());
    ASSERT_TRUE(rc == 0 || rc == EAGAIN) << rc;
  }
  while (p.Next()) ++read;
  EXPECT_EQ(read, kMaxQueuedEvents);
}

// Issue 37, attack 1: a third pod gives a victim's UD QP a new sender as fast as it can (one
// more UD QP of its own than the victim's QP has rings, resolving it in turn: each takes the
// ring held longest), while the victim is busy and does not read its events. The victim's
// event socket fills. Before, the router then closed it, and the library failed every QP of
// the victim's process. Now the victim keeps its events, and reading them it finds, after
// those its socket held, one per ring: the ring's latest sender.
TEST(PodEvents, AThirdPodCannotCostAPodItsEventsByGivingItsUdQpNewSenders) {
  TestRouter router{TestRouter::Options{}};
  RawPod victim(router, Ip("10.0.0.9"));
  ASSERT_EQ(victim.Hello(), 0);
  const RawQp ud = victim.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  RawPod attacker(router, Ip("10.0.0.66"));
  ASSERT_EQ(attacker.Hello(), 0);
  std::vector<RawQp> qps;
  for (uint32_t i = 0; i <= kUdRingsPerQp; ++i) {
    qps.push_back(attacker.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes));
    ASSERT_NE(qps.back().qpn, 0u);
  }
  constexpr int kResolves = 5000;
  std::map<uint32_t, uint32_t> sender_of;  // ring -> the QP that resolved it last
  for (int i = 0; i < kResolves; ++i) {
    const RawQp& q = qps[static_cast<size_t>(i) % qps.size()];
    const RawLink l = attacker.Connect(q, Ip("10.0.0.9"), ud.qpn, true);
    ASSERT_EQ(l.status, 0) << i;
    sender_of[l.reply.ring_index] = q.qpn;
  }
  EXPECT_GT(router.Stat("events_replaced"), 0u);
  EXPECT_LE(router.Stat("events_waiting"), 2 * (kUdRingsPerQp + 1)) << "not bounded by rings";
  // The victim reads: what its socket held, then what waited, the latest last.
  std::map<uint32_t, uint32_t> heard;
  size_t events = 0;
  while (auto e = victim.NextSetupEvent(500)) {
    ASSERT_EQ(e->event.type, proto::EventType::kUdRing);
    heard[e->event.ring] = e->event.src_qpn;
    ++events;
  }
  EXPECT_LT(events, static_cast<size_t>(kResolves) / 4) << "stale events were not replaced";
  EXPECT_EQ(heard, sender_of);
  // Its session and event socket serve on.
  EXPECT_FALSE(victim.Disconnected(0));
  RawPod late(router, Ip("10.0.0.67"));
  ASSERT_EQ(late.Hello(), 0);
  const RawQp q = late.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  ASSERT_EQ(late.Connect(q, Ip("10.0.0.9"), ud.qpn, true).status, 0);
  const auto e = victim.NextSetupEvent(2000);
  ASSERT_TRUE(e.has_value()) << "the victim lost its event socket";
  EXPECT_EQ(e->event.src_qpn, q.qpn);
}

}  // namespace
}  // namespace ff::router::test
