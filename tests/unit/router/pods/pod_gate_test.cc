// The pod socket's gate: new connections are identified on its thread, never on the thread
// that serves identified pods; one namespace that connects again and again delays
// another's client by at most one identification of its own, and closes its own oldest
// connections when too many wait (issue 37, attacks 2 and 3).
#include "pods/pod_gate.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

namespace ff::router::test {
namespace {

using std::chrono::milliseconds;

std::string Unique(const std::string& what) {
  static std::atomic<int> n{0};
  return "ffgate-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + "/" + what;
}

sockaddr_un Abstract(const std::string& name, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

// The name a client bound (after the last '/'): what the tests call it.
std::string ClientName(int sock) {
  sockaddr_un a{};
  socklen_t len = sizeof(a);
  if (::getpeername(sock, reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
      len <= offsetof(sockaddr_un, sun_path) + 1)
    return "";
  const std::string name(a.sun_path + 1, len - offsetof(sockaddr_un, sun_path) - 1);
  return name.substr(name.rfind('/') + 1);
}

// The line of a client is its name up to a '-' ("f-12" is of line "f", "h0" of its own).
uint64_t LineOfName(int sock) {
  const std::string n = ClientName(sock);
  return std::hash<std::string>()(n.substr(0, n.find('-')));
}

// Identifies every client as 10.0.0.1, each after `slow`; while held, it waits (bounded)
// before each identification until released. Records the order.
class Resolver final : public IdentityResolver {
 public:
  bool Resolve(int sock, PodIdentity* out, std::string*) override {
    const std::string name = ClientName(sock);
    {
      std::unique_lock<std::mutex> lock(mu_);
      order_.push_back(name);
      thread_ = std::this_thread::get_id();
      released_.wait_for(lock, std::chrono::seconds(10), [&] { return !held_; });
    }
    std::this_thread::sleep_for(milliseconds(slow_ms.load()));
    out->pid = 1;
    out->ip = Ip("10.0.0.1");
    return true;
  }
  void Hold() {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = true;
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_ = false;
    }
    released_.notify_all();
  }
  std::vector<std::string> order() {
    std::lock_guard<std::mutex> lock(mu_);
    return order_;
  }
  size_t calls() { return order().size(); }
  std::thread::id thread() {
    std::lock_guard<std::mutex> lock(mu_);
    return thread_;
  }

  std::atomic<int> slow_ms{0};

 private:
  std::mutex mu_;
  std::condition_variable released_;
  bool held_ = false;
  std::vector<std::string> order_;
  std::thread::id thread_;
};

// The serving side: a loop on a thread of its own that records what the gate delivers.
class Server {
 public:
  Server() { EXPECT_EQ(loop_.Init(), 0); }
  ~Server() { Stop(); }
  void Run() {
    thread_ = std::thread([this] {
      id_ = std::this_thread::get_id();
      while (!loop_.stopped()) loop_.RunOnce(-1);
    });
  }
  void Stop() {
    if (!thread_.joinable()) return;
    loop_.Stop();
    thread_.join();
  }
  void Take(PodGate::Identified c) {
    std::lock_guard<std::mutex> lock(mu_);
    got_.push_back(ClientName(c.sock.get()));
    socks_.push_back(std::move(c.sock));
  }
  std::vector<std::string> got() {
    std::lock_guard<std::mutex> lock(mu_);
    return got_;
  }
  EventLoop& loop() { return loop_; }
  std::thread::id id() const { return id_; }

 private:
  EventLoop loop_;
  std::thread thread_;
  std::thread::id id_;
  std::mutex mu_;
  std::vector<std::string> got_;
  std::vector<UniqueFd> socks_;
};

class PodGateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    listen_.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    listen_name_ = Unique("listen");
    socklen_t len = 0;
    const sockaddr_un a = Abstract(listen_name_, &len);
    ASSERT_EQ(::bind(listen_.get(), reinterpret_cast<const sockaddr*>(&a), len), 0);
    ASSERT_EQ(::listen(listen_.get(), kPodListenBacklog), 0);
  }
  void Start(PodGate::Options options = PodGate::Options()) {
    if (!options.line_of) options.line_of = LineOfName;
    gate_ = std::make_unique<PodGate>(resolver_, options);
    std::string error;
    ASSERT_TRUE(gate_->Start(
        listen_.get(), server_.loop(),
        [this](PodGate::Identified c) {
          EXPECT_TRUE(c.error.empty()) << c.error;
          server_.Take(std::move(c));
        },
        &error))
        << error;
  }
  // A client named `name` connected to the gate's socket.
  UniqueFd Connect(const std::string& name) {
    UniqueFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    socklen_t len = 0;
    const sockaddr_un self = Abstract(Unique(name), &len);
    EXPECT_EQ(::bind(s.get(), reinterpret_cast<const sockaddr*>(&self), len), 0);
    const sockaddr_un to = Abstract(listen_name_, &len);
    EXPECT_EQ(::connect(s.get(), reinterpret_cast<const sockaddr*>(&to), len), 0)
        << std::strerror(errno);
    return s;
  }
  static bool ClosedByRouter(int sock) {
    pollfd p{sock, POLLIN | POLLRDHUP, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLRDHUP)) != 0;
  }
  bool Delivered(const std::string& name) {
    for (const std::string& n : server_.got())
      if (n == name) return true;
    return false;
  }

  Resolver resolver_;
  Server server_;
  UniqueFd listen_;
  std::string listen_name_;
  std::unique_ptr<PodGate> gate_;
};

TEST_F(PodGateTest, IdentifiesOnItsOwnThreadWhileTheServingLoopGoesOn) {
  server_.Run();
  resolver_.Hold();
  Start();
  UniqueFd c = Connect("h0");
  ASSERT_TRUE(WaitFor([&] { return resolver_.calls() == 1; }));
  // The resolver is stuck in the middle of an identification: the serving loop still runs.
  std::atomic<bool> ran{false};
  server_.loop().Post([&] { ran = true; });
  EXPECT_TRUE(WaitFor([&] { return ran.load(); }));
  EXPECT_TRUE(server_.got().empty());
  EXPECT_NE(resolver_.thread(), server_.id());
  EXPECT_NE(resolver_.thread(), std::this_thread::get_id());
  resolver_.Release();
  EXPECT_TRUE(WaitFor([&] { return Delivered("h0"); }));
}

TEST_F(PodGateTest, ANamespaceThatFloodsDelaysAnotherByOneIdentificationOfItsOwn) {
  server_.Run();
  resolver_.slow_ms = 10;
  Start();
  std::vector<UniqueFd> flood;
  for (int i = 0; i < 60; ++i) flood.push_back(Connect("f-" + std::to_string(i)));
  ASSERT_TRUE(WaitFor([&] { return resolver_.calls() >= 3; }));
  const size_t before = resolver_.calls();
  UniqueFd honest = Connect("h0");
  ASSERT_TRUE(WaitFor([&] { return Delivered("h0"); }));
  const std::vector<std::string> order = resolver_.order();
  const auto at = std::find(order.begin(), order.end(), "h0") - order.begin();
  // The identification in progress when it connected, and at most one more of the flood
  // (and one for the accept that may come after the next identification began).
  EXPECT_LE(static_cast<size_t>(at), before + 2) << "identified after " << at << " of the flood";
  EXPECT_LT(static_cast<size_t>(at), 20u);
}

TEST_F(PodGateTest, AFloodClosesItsOwnOldestConnectionsNotAnothersWaitingOnes) {
  server_.Run();
  resolver_.slow_ms = 5;
  Start();
  // Twenty namespaces with a client each and one more: the last waits twenty turns.
  std::vector<UniqueFd> others;
  for (int i = 0; i < 20; ++i) others.push_back(Connect("s" + std::to_string(i)));
  others.push_back(Connect("h0"));
  // Meanwhile one namespace connects more than the gate holds.
  std::vector<UniqueFd> flood;
  for (size_t i = 0; i < kMaxUnidentifiedClients + 40; ++i)
    flood.push_back(Connect("f-" + std::to_string(i)));
  ASSERT_TRUE(WaitFor([&] { return gate_->evicted() >= 20; }));
  EXPECT_LE(gate_->waiting(), kMaxUnidentifiedClients);
  EXPECT_TRUE(ClosedByRouter(flood.front().get()));  // the flood's oldest
  EXPECT_FALSE(ClosedByRouter(flood.back().get()));  // its newest waits
  ASSERT_TRUE(WaitFor([&] { return Delivered("h0"); }, milliseconds(5000)));
  for (size_t i = 0; i < others.size(); ++i) {
    EXPECT_FALSE(ClosedByRouter(others[i].get())) << i;
    EXPECT_TRUE(Delivered(i + 1 < others.size() ? "s" + std::to_string(i) : "h0")) << i;
  }
}

TEST_F(PodGateTest, AProbeThatHungUpIsNotIdentified) {
  server_.Run();
  resolver_.Hold();
  Start();
  UniqueFd first = Connect("h-first");
  ASSERT_TRUE(WaitFor([&] { return resolver_.calls() == 1; }));
  Connect("p-probe").reset();  // connects and hangs up without a word
  UniqueFd last = Connect("h-last");
  resolver_.Release();
  ASSERT_TRUE(WaitFor([&] { return Delivered("h-last"); }));
  EXPECT_EQ(resolver_.order(), (std::vector<std::string>{"h-first", "h-last"}));
}

TEST_F(PodGateTest, AConnectionThatWaitedTooLongIsClosedUnidentified) {
  server_.Run();
  resolver_.Hold();
  PodGate::Options options;
  options.stale_ns = 50'000'000;
  Start(options);
  UniqueFd first = Connect("h-first");
  ASSERT_TRUE(WaitFor([&] { return resolver_.calls() == 1; }));
  // Both wait in the backlog and are taken together once "h-first" is identified; "a"
  // then takes 100 ms, longer than "b" may wait.
  UniqueFd a = Connect("a");
  UniqueFd b = Connect("b");
  resolver_.slow_ms = 100;
  resolver_.Release();
  EXPECT_TRUE(WaitFor([&] { return ClosedByRouter(b.get()); }));
  EXPECT_TRUE(WaitFor([&] { return Delivered("a"); }));
  EXPECT_EQ(resolver_.order(), (std::vector<std::string>{"h-first", "a"}));
  EXPECT_FALSE(Delivered("b"));
}

TEST_F(PodGateTest, WaitsWhileTheServingLoopHasNotTakenWhatItIdentified) {
  Start();  // the serving loop does not run yet
  std::vector<UniqueFd> clients;
  for (size_t i = 0; i < kMaxIdentifiedInFlight + 30; ++i)
    clients.push_back(Connect("h" + std::to_string(i)));
  ASSERT_TRUE(WaitFor([&] { return resolver_.calls() == kMaxIdentifiedInFlight; }));
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(resolver_.calls(), kMaxIdentifiedInFlight);
  server_.Run();
  EXPECT_TRUE(WaitFor([&] { return server_.got().size() == clients.size(); }));
}

TEST_F(PodGateTest, NothingIsDeliveredOnceTheGateIsGone) {
  Start();  // the serving loop does not run: what the gate identifies waits for it
  UniqueFd c = Connect("h0");
  ASSERT_TRUE(WaitFor([&] { return resolver_.calls() == 1; }));
  gate_.reset();
  server_.Run();
  EXPECT_TRUE(WaitFor([&] { return ClosedByRouter(c.get()); }));
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_TRUE(server_.got().empty());
}

}  // namespace
}  // namespace ff::router::test
