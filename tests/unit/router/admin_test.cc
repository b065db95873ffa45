// The router's admin socket and ffctl (docs/metrics.md, "ffctl"): what a pod holds, its
// refusals and their reasons reach the admin, as JSON and as ffctl's tables; only root in the
// router's network namespace is answered; a client cannot hold the socket for long.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <regex>
#include <vector>

#include "harness.h"

namespace ff::router::test {
namespace {

using nlohmann::json;

// A connection to the admin socket of `router`; -1 when refused.
int AdminConnect(const TestRouter& router) {
  const std::string name = AdminSocketName(router.dir(), kDefaultRouterName);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path + 1, name.data(), name.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// Everything the router sends on `fd` until it closes.
std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  for (int i = 0; i < 4096; ++i) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

json Ask(const TestRouter& router, const std::string& request) {
  const int fd = AdminConnect(router);
  EXPECT_GE(fd, 0);
  const std::string line = request + "\n";
  EXPECT_EQ(::send(fd, line.data(), line.size(), MSG_NOSIGNAL), ssize_t(line.size()));
  const std::string text = ReadAll(fd);
  ::close(fd);
  return json::parse(text, nullptr, false);
}

// ffctl's output (stdout and stderr) and exit status, run against `router`.
std::pair<std::string, int> Ffctl(const TestRouter& router, const std::string& args) {
  const std::string command =
      std::string(FFCTL_BINARY) + " --dir " + router.dir() + " " + args + " 2>&1";
  std::FILE* p = ::popen(command.c_str(), "r");
  std::string out;
  char buf[1024];
  while (p != nullptr && std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  const int status = p != nullptr ? ::pclose(p) : -1;
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

TEST(AdminTest, PodsQpsQuotasAndRefusalsReachTheAdmin) {
  TestRouter::Options o;
  o.limits = WithLimits({{Quota::kQps, 2}});
  TestRouter router(o);
  RawPod pod(router, Ip("10.0.0.7"));
  ASSERT_EQ(pod.Hello(), 0);
  ASSERT_EQ(pod.CreateQp(IBV_QPT_RC).status, 0);
  ASSERT_EQ(pod.CreateQp(IBV_QPT_UD).status, 0);
  EXPECT_EQ(pod.CreateQp(IBV_QPT_RC).status, ENOSPC);

  const json pods = Ask(router, "pods");
  ASSERT_EQ(pods["pods"].size(), 1u) << pods.dump();
  const json& p = pods["pods"][0];
  EXPECT_EQ(p["address"], "10.0.0.7");
  EXPECT_EQ(p["sessions"].size(), 1u);
  EXPECT_EQ(p["qps"]["RC"], 1);
  EXPECT_EQ(p["qps"]["UD"], 1);
  EXPECT_EQ(p["held"]["qps"], 2);
  EXPECT_EQ(p["refused"]["qps"], 1);

  const json qps = Ask(router, "qps 10.0.0.7");
  ASSERT_EQ(qps["qps"].size(), 2u) << qps.dump();
  EXPECT_EQ(Ask(router, "qps 10.0.0.8")["qps"].size(), 0u);
  for (const json& q : qps["qps"]) {
    EXPECT_EQ(q["address"], "10.0.0.7");
    EXPECT_TRUE(q["type"] == "RC" || q["type"] == "UD") << q.dump();
    EXPECT_TRUE(q["peer"].is_null());
  }
  const json quotas = Ask(router, "quotas");
  EXPECT_EQ(quotas["limits"]["qps"], 2);
  EXPECT_EQ(quotas["refusals"]["qps"], 1);
  EXPECT_EQ(quotas["limits"]["mapped"], uint64_t{kDefaultPodMappedMiB} << 20);

  const json events = Ask(router, "events");
  ASSERT_EQ(events["events"].size(), 1u) << events.dump();
  EXPECT_EQ(events["events"][0]["address"], "10.0.0.7");
  EXPECT_EQ(events["events"][0]["what"], "quota qps");
  EXPECT_NE(events["events"][0]["reason"].get<std::string>().find("queue pairs"),
            std::string::npos);
  EXPECT_EQ(Ask(router, "links")["links"].size(), 0u);

  // ffctl's tables say the same.
  auto [table, rc] = Ffctl(router, "pods");
  EXPECT_EQ(rc, 0) << table;
  EXPECT_NE(table.find("10.0.0.7"), std::string::npos) << table;
  EXPECT_NE(table.find("RC:1 UD:1"), std::string::npos) << table;
  std::tie(table, rc) = Ffctl(router, "events");
  EXPECT_EQ(rc, 0);
  EXPECT_NE(table.find("quota qps"), std::string::npos) << table;
  std::tie(table, rc) = Ffctl(router, "-o json qps");
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(json::parse(table, nullptr, false)["qps"].size(), 2u) << table;
  std::tie(table, rc) = Ffctl(router, "quotas");
  EXPECT_EQ(rc, 0) << table;
  EXPECT_TRUE(std::regex_search(table, std::regex("\nmapped +65536\\.0 MiB +0 +-\n"))) << table;
  EXPECT_TRUE(std::regex_search(table, std::regex("\nqps +2 +1 +10\\.0\\.0\\.7 2\n"))) << table;
  std::tie(table, rc) = Ffctl(router, "qps not-an-address");
  EXPECT_EQ(rc, 1);
  EXPECT_NE(table.find("is not a pod address"), std::string::npos) << table;
}

// A pod that broke the protocol is named in ffctl events, with why; one that closed is not.
TEST(AdminTest, APodThatBreaksTheProtocolIsAnEvent) {
  TestRouter router(TestRouter::Options{});
  {
    RawPod bad(router, Ip("10.0.0.9"));
    ASSERT_EQ(bad.Hello(), 0);
    const char junk[3] = {7, 7, 7};
    bad.SendRaw(junk, sizeof(junk));
    ASSERT_TRUE(bad.Disconnected());
    RawPod good(router, Ip("10.0.0.10"));
    ASSERT_EQ(good.Hello(), 0);
  }
  json events;
  ASSERT_TRUE(WaitFor([&] {
    events = Ask(router, "events");
    return events["events"].size() == 1;
  })) << events.dump();
  EXPECT_EQ(events["events"][0]["address"], "10.0.0.9");
  EXPECT_EQ(events["events"][0]["what"], "session dropped");
  EXPECT_EQ(events["events"][0]["reason"], "malformed or unexpected message");
}

TEST(AdminTest, UnknownCommandsAndOverlongRequestsGetNothingButAnError) {
  TestRouter router(TestRouter::Options{});
  EXPECT_NE(Ask(router, "shutdown")["error"].get<std::string>().find("unknown command"),
            std::string::npos);
  EXPECT_TRUE(Ask(router, "pods extra").contains("error"));
  // A request without its end of line, longer than the router reads: the connection ends.
  const int fd = AdminConnect(router);
  ASSERT_GE(fd, 0);
  const std::string flood(AdminService::kMaxRequest * 4, 'x');
  ::send(fd, flood.data(), flood.size(), MSG_NOSIGNAL);
  EXPECT_EQ(ReadAll(fd), "");
  ::close(fd);
  EXPECT_TRUE(Ask(router, "pods").contains("pods"));  // still answering
}

TEST(AdminTest, IdleClientsGetTheirShareAndNoMore) {
  TestRouter router(TestRouter::Options{});
  std::vector<int> idle;
  for (size_t i = 0; i < AdminService::kMaxClients; ++i) idle.push_back(AdminConnect(router));
  // Accepted in the order they came: the first kMaxClients are the clients.
  const int extra = AdminConnect(router);
  ASSERT_GE(extra, 0);
  EXPECT_NE(ReadAll(extra).find("too many admin clients"), std::string::npos);
  ::close(extra);
  for (int fd : idle) ::close(fd);
  EXPECT_TRUE(WaitFor([&] { return Ask(router, "pods").contains("pods"); }));
}

// Who may ask: root only; a process of another network namespace (a pod) cannot even reach
// the socket. Each case is a child process that changes who it is.
TEST(AdminTest, OnlyRootInTheRoutersNetworkNamespaceIsAnswered) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become another user or namespace";
  TestRouter router(TestRouter::Options{});
  const auto child = [&](auto body) {
    const pid_t pid = ::fork();
    if (pid == 0) ::_exit(body());
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
  };
  // Another user: connected, then told why, and nothing of the router's.
  EXPECT_EQ(child([&] {
              if (::setgid(65534) != 0 || ::setuid(65534) != 0) return 10;
              const int fd = AdminConnect(router);
              if (fd < 0) return 11;
              ::send(fd, "pods\n", 5, MSG_NOSIGNAL);
              const std::string answer = ReadAll(fd);
              return answer.find("root only") != std::string::npos &&
                             answer.find("\"pods\"") == std::string::npos
                         ? 0
                         : 12;
            }),
            0);
  // Root of another network namespace, as a pod's root is: nothing answers there.
  EXPECT_EQ(child([&] {
              if (::unshare(CLONE_NEWNET) != 0) return 20;
              return AdminConnect(router) < 0 ? 0 : 21;
            }),
            0);
  EXPECT_EQ(Ffctl(router, "pods").second, 0);
}

}  // namespace
}  // namespace ff::router::test
