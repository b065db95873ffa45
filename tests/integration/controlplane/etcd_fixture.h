// What the etcd integration tests share: a real etcd per test (EtcdServer), control plane
// instances acting as routers, and the helper binary as a router in another process.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "etcd_server.h"
#include "freeflow/controlplane.h"
#include "freeflow/ipv4.h"

namespace ff::cp {

using namespace std::chrono_literals;
using testing::EtcdServer;
using Clock = std::chrono::steady_clock;

inline uint32_t Ip(const char* text) { return *ParseIpv4(text); }

const Endpoint kA{"node-a", 0x7f000001, 7471};
const Endpoint kB{"node-b", 0x7f000002, 7472};
const Endpoint kC{"node-c", 0x7f000003, 7473};
const Endpoint kPeer{"node-p", 0x7f000009, 7479};  // what controlplane_etcd_peer announces

template <typename F>
bool WaitFor(F done, std::chrono::milliseconds limit) {
  for (auto end = Clock::now() + limit; Clock::now() < end; std::this_thread::sleep_for(5ms))
    if (done()) return true;
  return done();
}

// Publishes `ips` on `cp` (made for `self`), starts it and waits (bounded) until it is
// connected.
inline std::unique_ptr<ControlPlane> Started(std::unique_ptr<ControlPlane> cp, const Endpoint& self,
                                             std::initializer_list<const char*> ips) {
  if (!cp) return cp;
  for (const char* ip : ips) cp->Publish(Ip(ip));
  std::string error;
  EXPECT_TRUE(cp->Start(&error)) << error;
  EXPECT_TRUE(WaitFor([&] { return cp->Healthy(); }, 5s)) << self.node << " never connected";
  return cp;
}

// The helper binary in a child process, with pipes on its stdin and stdout.
class Peer {
 public:
  Peer(const std::string& spec, int ttl_ms, const std::vector<std::string>& ips) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return;
    std::vector<std::string> args = {FFCP_PEER, spec, kPeer.node, std::to_string(ttl_ms)};
    args.insert(args.end(), ips.begin(), ips.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    if (::posix_spawn(&pid_, FFCP_PEER, &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
  }
  ~Peer() {
    Kill();
    if (stdin_ >= 0) ::close(stdin_);
    if (stdout_ >= 0) ::close(stdout_);
  }

  // Waits (bounded) for the helper's "ready" line.
  bool WaitReady(std::chrono::milliseconds limit) {
    std::string seen;
    for (auto end = Clock::now() + limit; Clock::now() < end;) {
      pollfd pfd{stdout_, POLLIN, 0};
      if (::poll(&pfd, 1, 50) <= 0) continue;
      char buf[64];
      const ssize_t n = ::read(stdout_, buf, sizeof(buf));
      if (n <= 0) return false;
      seen.append(buf, static_cast<size_t>(n));
      if (seen.find("ready\n") != std::string::npos) return true;
    }
    return false;
  }

  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1, stdout_ = -1;
};

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // scripts/install-deps.sh installs etcd-server: a missing binary is a failed install
    // step, not a reason to pass without testing.
    ASSERT_FALSE(EtcdServer::Binary().empty())
        << "etcd is not installed (run scripts/install-deps.sh, or set FF_ETCD)";
    std::string error;
    ASSERT_TRUE(etcd_.Start(&error)) << error;
    options_.lease_ttl = 2000ms;
    options_.backoff_min = 20ms;
    options_.backoff_max = 300ms;
    options_.rpc_timeout = 1000ms;
  }

  std::unique_ptr<ControlPlane> Make(const Endpoint& self, std::string spec = {}) {
    std::string error;
    auto cp = MakeControlPlane(spec.empty() ? "etcd:" + etcd_.url() : spec, self, options_, &error);
    EXPECT_NE(cp, nullptr) << error;
    return cp;
  }

  // Makes, starts and waits until connected.
  std::unique_ptr<ControlPlane> Router(const Endpoint& self,
                                       std::initializer_list<const char*> ips = {}) {
    return Started(Make(self), self, ips);
  }

  static bool Sees(const ControlPlane& cp, const char* ip, const Endpoint& where) {
    return cp.Lookup(Ip(ip)) == where;
  }
  static bool Unknown(const ControlPlane& cp, const char* ip) { return !cp.Lookup(Ip(ip)); }

  EtcdServer etcd_;
  Options options_;
};

}  // namespace ff::cp
