// Per-pod quotas on one router: each test drives one pod to a limit, checks the errno it
// gets, and checks that another pod is fully served at the same time. Also the quota
// ledger itself, the clients that never say HELLO, and a router out of descriptors.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "harness.h"
#include "log_capture.h"
#include "options.h"

namespace ff::router::test {
namespace {

TestRouter::Options Limited(PodLimits limits) {
  TestRouter::Options o;
  o.limits = limits;
  return o;
}

// Two fresh pods open sessions, create QPs, register memory, connect and pass a message:
// what every pod must still be able to do while another one is at a limit.
void ExpectServed(TestRouter& router, const char* a_ip, const char* b_ip) {
  RawPod a(router, Ip(a_ip)), b(router, Ip(b_ip));
  ASSERT_EQ(a.Hello(), 0);
  ASSERT_EQ(b.Hello(), 0);
  const RawQp qa = a.CreateQp(IBV_QPT_RC), qb = b.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(qa.status, 0);
  ASSERT_EQ(qb.status, 0);
  Mapping memory;
  ASSERT_NE(b.Register(1, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, 0x1000, &memory),
            0u);
  ASSERT_EQ(b.Name(qb, Ip(a_ip), qa.qpn), EINPROGRESS);
  RawLink link = a.Connect(qa, Ip(b_ip), qb.qpn);
  ASSERT_EQ(link.status, 0);
  EXPECT_EQ(PassMessage(link, qb, "still served"), "still served");
}

int CreateCq(RawPod& pod, uint32_t id) {
  proto::CreateCq m{};
  m.cq_id = id;
  m.notify_slot = proto::kNoId;
  m.chan_id = proto::kNoId;
  return pod.Call(m).status;
}

int CreateChannel(RawPod& pod, uint32_t id) {
  UniqueFd rx, fd;
  if (CreateWakePair(&rx, &fd, true) != 0) return -1;
  proto::CreateChannel m{};
  m.id = id;
  return pod.Call(m, {fd.get()}).status;
}

// A registration that brings region `region` (of `bytes`) along; its status.
int RegisterRegion(RawPod& pod, uint32_t region, size_t bytes) {
  UniqueFd fd;
  if (CreateSegment("quota-region", bytes, &fd) != 0) return -1;
  proto::RegMr m{};
  m.addr = 0x100000ull * region;
  m.length = bytes;
  m.region_size = bytes;
  m.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  m.region_id = region;
  m.new_region = 1;
  return pod.Call(m, {fd.get()}).status;
}

TEST(QuotasTest, SessionsOfOnePodShareAnAccountThatEmptiesWhenTheyClose) {
  Quotas q(WithLimits({{Quota::kQps, 3}}));
  const uint32_t pod = Ip("10.0.0.1");
  ASSERT_EQ(q.Open(1, pod), 0);
  ASSERT_EQ(q.Open(2, pod), 0);
  EXPECT_EQ(q.used(pod, Quota::kSessions), 2u);
  EXPECT_EQ(q.Take(1, {{Quota::kQps, 2}}), 0);
  EXPECT_EQ(q.Take(2, {{Quota::kQps, 2}}), ENOSPC);  // the pod's, not the session's
  EXPECT_EQ(q.Take(2, {{Quota::kQps, 1}}), 0);
  q.Give(2, {{Quota::kQps, 5}});  // never more than the session holds
  EXPECT_EQ(q.used(pod, Quota::kQps), 2u);
  q.Close(1);
  EXPECT_EQ(q.used(pod, Quota::kQps), 0u);
  EXPECT_EQ(q.accounts(), 1u);
  q.Close(2);
  EXPECT_EQ(q.accounts(), 0u);
  EXPECT_EQ(q.Take(2, {{Quota::kQps, 1}}), EACCES);  // a closed session takes nothing
}

TEST(QuotasTest, ARefusalTakesNothingAndLogsOneLine) {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  auto capture = std::make_shared<spdlog::logger>("capture", sink);
  capture->set_level(spdlog::level::warn);
  const auto previous = spdlog::default_logger();
  spdlog::set_default_logger(capture);
  Quotas q(WithLimits({{Quota::kQps, 2}}));
  const uint32_t pod = Ip("10.0.0.7");
  ASSERT_EQ(q.Open(1, pod), 0);
  ASSERT_EQ(q.Take(1, {{Quota::kQps, 2}}), 0);
  const uint64_t fds = q.used(pod, Quota::kFds);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(q.Take(1, {{Quota::kFds, 1}, {Quota::kQps, 1}}), ENOSPC);
  EXPECT_EQ(q.used(pod, Quota::kFds), fds);
  {
    Held held(q, 1, Quota::kMappedBytes);
    EXPECT_EQ(held.Take(4096), 0);
    EXPECT_EQ(q.used(pod, Quota::kMappedBytes), 4096u);
  }
  EXPECT_EQ(q.used(pod, Quota::kMappedBytes), 0u);  // given back when it went
  spdlog::set_default_logger(previous);
  const std::vector<std::string> lines = sink->last_formatted();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("10.0.0.7"), std::string::npos);
  EXPECT_NE(lines[0].find("--max-qps-per-pod"), std::string::npos);
}

// A pod that holds nothing between its refusals (it opens sessions, is refused, closes them
// all, again and again) still gets one line per window: the flood of issue 37 (attack 2)
// made the router log a line per refused connection.
TEST(QuotasTest, APodThatComesBackWithinTheWindowLogsNoMoreLines) {
  ff::testing::LogCapture log;
  Quotas q(WithLimits({{Quota::kSessions, 1}}));
  const uint32_t pod = Ip("10.0.0.8");
  PodId next = 1;
  for (int round = 0; round < 100; ++round) {
    const PodId held = next++;
    ASSERT_EQ(q.Open(held, pod), 0);
    EXPECT_EQ(q.Open(next++, pod), EMFILE);
    q.Close(held);
    ASSERT_EQ(q.accounts(), 0u);
  }
  EXPECT_EQ(log.Count({"10.0.0.8", "--max-sessions-per-pod"}), 1);
}

TEST(PodQuotaTest, OpeningMoreSessionsDoesNotBuyMore) {
  TestRouter router(Limited(WithLimits({{Quota::kSessions, 3}, {Quota::kQps, 4}})));
  std::vector<std::unique_ptr<RawPod>> sessions;
  std::vector<RawQp> qps;
  for (int i = 0; i < 3; ++i) {
    sessions.push_back(std::make_unique<RawPod>(router, Ip("10.0.0.1")));
    ASSERT_EQ(sessions.back()->Hello(), 0);
  }
  RawPod extra(router, Ip("10.0.0.1"));
  EXPECT_EQ(extra.Hello(), EMFILE);
  EXPECT_NE(std::string(extra.hello().node).find("--max-sessions-per-pod"), std::string::npos);
  EXPECT_TRUE(extra.Disconnected());
  // QPs count for the pod whichever session creates them.
  for (int i = 0; i < 4; ++i) qps.push_back(sessions[i % 3]->CreateQp(IBV_QPT_RC));
  for (const RawQp& q : qps) EXPECT_EQ(q.status, 0);
  EXPECT_EQ(sessions[2]->CreateQp(IBV_QPT_RC).status, ENOSPC);
  ExpectServed(router, "10.0.0.2", "10.0.0.3");
  proto::DestroyQp d{};
  d.id = qps[0].qpn;
  ASSERT_EQ(sessions[0]->Call(d).status, 0);
  EXPECT_EQ(sessions[2]->CreateQp(IBV_QPT_RC).status, 0);
  sessions.pop_back();  // a process exits: its session and its QPs are free again
  EXPECT_TRUE(WaitFor([&] {
    RawPod again(router, Ip("10.0.0.1"));
    return again.Hello() == 0 && again.CreateQp(IBV_QPT_RC).status == 0;
  }));
}

TEST(PodQuotaTest, EveryDescriptorTheRouterKeepsCounts) {
  // The socket and HELLO's five, then three more.
  TestRouter router(Limited(WithLimits({{Quota::kFds, 9}})));
  RawPod pod(router, Ip("10.0.0.1"));
  ASSERT_EQ(pod.Hello(), 0);
  EXPECT_EQ(CreateChannel(pod, 1), 0);
  EXPECT_EQ(pod.CreateQp(IBV_QPT_RC).status, 0);
  EXPECT_EQ(RegisterRegion(pod, 1, 4096), 0);
  EXPECT_EQ(RegisterRegion(pod, 2, 4096), EMFILE);
  EXPECT_EQ(CreateChannel(pod, 2), EMFILE);
  EXPECT_EQ(pod.CreateQp(IBV_QPT_RC).status, EMFILE);
  RawPod second(router, Ip("10.0.0.1"));  // another process of the pod: its socket is one more
  EXPECT_EQ(second.Hello(), EMFILE);
  ExpectServed(router, "10.0.0.2", "10.0.0.3");
  proto::DestroyChannel d{};
  d.id = 1;
  ASSERT_EQ(pod.Call(d).status, 0);
  EXPECT_EQ(RegisterRegion(pod, 2, 4096), 0);
}

TEST(PodQuotaTest, AUdQpCountsTheRingEachOfItsSendersGets) {
  // The socket and HELLO's five, a UD QP's segment and one memfd per ring (a sender's own).
  TestRouter router(Limited(WithLimits({{Quota::kFds, 6 + 1 + 4}})));
  RawPod pod(router, Ip("10.0.0.1"));
  ASSERT_EQ(pod.Hello(), 0);
  EXPECT_EQ(pod.CreateQp(IBV_QPT_UD, 5, kUdRingBytes).status, EMFILE);
  const RawQp ud = pod.CreateQp(IBV_QPT_UD, 4, kUdRingBytes);
  ASSERT_EQ(ud.status, 0);
  EXPECT_EQ(pod.CreateQp(IBV_QPT_RC).status, EMFILE);
  // Four senders hold a ring each; the router lets go of each ring when its sender goes.
  const uint64_t before = router.Stat("fds");
  {
    const char* ips[] = {"10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"};
    std::vector<std::unique_ptr<RawPod>> senders;
    std::vector<RawQp> qps;
    std::vector<RawLink> links;
    for (const char* ip : ips) {  // a pod each: every pod has the same small quota
      senders.push_back(std::make_unique<RawPod>(router, Ip(ip)));
      ASSERT_EQ(senders.back()->Hello(), 0);
      qps.push_back(senders.back()->CreateQp(IBV_QPT_UD, 1, kUdRingBytes));
      links.push_back(senders.back()->Connect(qps.back(), Ip("10.0.0.1"), ud.qpn, true));
    }
    for (int i = 0; i < 4; ++i) EXPECT_EQ(links[i].status, 0) << i;
    const uint64_t four = router.Stat("fds");
    EXPECT_GT(four, before);
    // A fifth takes the ring held longest: the ring's memfd is replaced, not added to.
    EXPECT_EQ(links[4].status, 0);
    EXPECT_EQ(links[4].reply.ring_index, links[0].reply.ring_index);
    EXPECT_EQ(router.Stat("fds"), four);
  }
  EXPECT_TRUE(WaitFor([&] { return router.Stat("fds") <= before; })) << router.Stats();
}

TEST(PodQuotaTest, CqsChannelsAndSrqsShareOneQuota) {
  TestRouter router(Limited(WithLimits({{Quota::kObjects, 3}})));
  RawPod a(router, Ip("10.0.0.1")), b(router, Ip("10.0.0.1"));
  ASSERT_EQ(a.Hello(), 0);
  ASSERT_EQ(b.Hello(), 0);
  EXPECT_EQ(CreateCq(a, 1), 0);
  EXPECT_EQ(CreateChannel(a, 1), 0);
  UniqueFd srq;
  ASSERT_EQ(CreateSegment("quota-srq", sizeof(SrqSegment), &srq), 0);
  proto::CreateSrq s{};
  s.id = 1;
  EXPECT_EQ(b.Call(s, {srq.get()}).status, 0);
  EXPECT_EQ(CreateCq(b, 2), ENOSPC);
  EXPECT_EQ(CreateChannel(a, 2), ENOSPC);
  ExpectServed(router, "10.0.0.2", "10.0.0.3");
  proto::DestroyCq d{};
  d.id = 1;
  ASSERT_EQ(a.Call(d).status, 0);
  EXPECT_EQ(CreateCq(b, 2), 0);
}

TEST(PodQuotaTest, RegionsAndRegistrationsAreBounded) {
  TestRouter router(Limited(WithLimits({{Quota::kRegions, 2}, {Quota::kMrEntries, 3}})));
  RawPod pod(router, Ip("10.0.0.1"));
  ASSERT_EQ(pod.Hello(), 0);
  EXPECT_EQ(RegisterRegion(pod, 1, 8192), 0);
  EXPECT_EQ(RegisterRegion(pod, 2, 8192), 0);
  EXPECT_EQ(RegisterRegion(pod, 3, 8192), ENOSPC);
  // A registration inside region 1: no new region, one more entry.
  const proto::RegMr m{.addr = 0x100000,
                       .length = 4096,
                       .access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
                       .region_id = 1};
  const proto::Response third = pod.Call(m);
  ASSERT_EQ(third.status, 0);
  EXPECT_EQ(pod.Call(m).status, ENOSPC);
  ExpectServed(router, "10.0.0.2", "10.0.0.3");
  proto::DeregMr d{};
  d.key = third.u.reg_mr.key;
  ASSERT_EQ(pod.Call(d).status, 0);
  EXPECT_EQ(pod.Call(m).status, 0);
  EXPECT_EQ(router.Stat("mr_entries"), 3u);
}

TEST(PodQuotaTest, RefusedAndSilentClientsAreBoundedAndLeave) {
  TestRouter::Options o = Limited(WithLimits({{Quota::kSessions, 1}}));
  o.hello_timeout_ns = 1'000'000'000;
  TestRouter router(o);
  // Clients the router cannot identify are kept only until they read why, and few of them.
  std::vector<std::unique_ptr<RawPod>> refused;
  for (int i = 0; i < kMaxRefusedSessions + 8; ++i)
    refused.push_back(std::make_unique<RawPod>(router, 0));
  for (int i = kMaxRefusedSessions; i < kMaxRefusedSessions + 8; ++i)
    EXPECT_TRUE(refused[static_cast<size_t>(i)]->Disconnected(500)) << i;
  EXPECT_EQ(refused.front()->Hello(), EACCES);
  // A process that never says HELLO holds its pod's only session until the deadline.
  RawPod silent(router, Ip("10.0.0.1"));
  RawPod blocked(router, Ip("10.0.0.1"));
  EXPECT_EQ(blocked.Hello(), EMFILE);
  ExpectServed(router, "10.0.0.2", "10.0.0.3");
  EXPECT_TRUE(silent.Disconnected(3000));
  RawPod after(router, Ip("10.0.0.1"));
  EXPECT_EQ(after.Hello(), 0);
}

TEST(PodQuotaTest, WhatPodsHeldIsReleasedWhenTheyLeave) {
  TestRouter router(TestRouter::Options{});
  // The baseline is taken after a first pair came and went, when the router (and this
  // process: the count is of its descriptors) is past its start: a sanitized run once saw
  // one descriptor more right after the start than ever after.
  ExpectServed(router, "10.0.0.2", "10.0.0.3");
  ASSERT_TRUE(
      WaitFor([&] { return router.Stat("sessions") == 0 && router.Stat("accounts") == 0; }));
  const std::string baseline = router.Stats();
  for (int i = 0; i < 5; ++i) ExpectServed(router, "10.0.0.2", "10.0.0.3");
  // Everything but the resident size comes back to what it was.
  const auto without_rss = [](std::string s) { return s.substr(0, s.find(" rss_kib=")); };
  EXPECT_TRUE(WaitFor([&] { return without_rss(router.Stats()) == without_rss(baseline); }))
      << baseline << "\n"
      << router.Stats();
}

// ---- a router out of descriptors ------------------------------------------------------------

// Every client is a pod of its own, so that per-pod quotas stay out of the way.
class EachClientAPod final : public IdentityResolver {
 public:
  bool Resolve(int, PodIdentity* out, std::string*) override {
    out->pid = ::getpid();
    out->ip = Ip("10.1.0.0") + ++clients_;
    return true;
  }

 private:
  uint32_t clients_ = 0;
};

// Runs a router with RLIMIT_NOFILE `limit` in a child process; returns its pid.
pid_t ForkRouter(const std::string& dir, rlim_t limit) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  const rlimit r{limit, limit};
  ::setrlimit(RLIMIT_NOFILE, &r);
  RouterConfig config;
  config.dir = dir;
  config.overlay = *Ipv4Prefix::Parse("10.0.0.0/8");
  RouterDeps deps;
  deps.identity = std::make_unique<EachClientAPod>();
  Router router(config, std::move(deps));
  std::string error;
  if (!router.Start(&error)) ::_exit(3);
  router.Run();
  ::_exit(0);
}

// What a process did over some time: CPU used, and how often it went to sleep by itself (a
// loop that spins never does, however busy the machine is).
struct Activity {
  uint64_t cpu_ns = 0;
  uint64_t sleeps = 0;
};

Activity ActivityOf(pid_t pid) {
  Activity a;
  std::ifstream sched("/proc/" + std::to_string(pid) + "/schedstat");
  sched >> a.cpu_ns;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("voluntary_ctxt_switches:", 0) == 0) a.sleeps = std::stoull(line.substr(24));
  return a;
}

// Kills and reaps a child process when the scope ends.
struct KillOnExit {
  pid_t pid;
  ~KillOnExit() {
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
};

UniqueFd ConnectTo(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return UniqueFd();
  return fd;
}

TEST(PodQuotaTest, ARouterOutOfDescriptorsWaitsInsteadOfSpinningAndRecovers) {
  char tmpl[] = "/tmp/ff-emfile-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const pid_t child = ForkRouter(dir, 48);
  // The router goes with the test however it ends: a failed assertion must not leave it
  // running (it would hold the test's output open, and ctest would wait for it).
  const KillOnExit reap{child};
  const std::string path = dir + "/ffrouter.sock";
  // The socket file appears at bind, before the listen: the first connect that succeeds
  // says the router listens.
  std::vector<UniqueFd> clients;  // more than 48 descriptors: the last wait in the backlog
  ASSERT_TRUE(WaitFor([&] {
    UniqueFd first = ConnectTo(path);
    if (first) clients.push_back(std::move(first));
    return !clients.empty();
  }));
  while (clients.size() < 80) clients.push_back(ConnectTo(path));
  for (const UniqueFd& c : clients) ASSERT_TRUE(c);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const Activity before = ActivityOf(child);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const Activity after = ActivityOf(child);
  const uint64_t cpu_ms = (after.cpu_ns - before.cpu_ns) / 1'000'000;
  EXPECT_LT(cpu_ms, 100u) << "the router spun on its listener";
  EXPECT_GE(after.sleeps - before.sleeps, 5u) << "the router never slept in 1 s";
  // Clients leave: the router accepts again, and a client that waited is served.
  RawPod waited(std::move(clients.back()));
  clients.resize(10);
  EXPECT_EQ(waited.Hello(), 0);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace ff::router::test
