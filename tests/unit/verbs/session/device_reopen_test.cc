// The process-wide device after its router is lost (issue 41): the program gets
// IBV_EVENT_DEVICE_FATAL, the device drops out of the list, and once a router listens on the
// same socket again the same process lists a new device (the next index, another pointer),
// opens it and works, while what it held of the old one fails until destroyed. Opening the
// device waits (bounded, FFV_ROUTER_WAIT_MS) for a router being replaced, once per outage.
// A program of its own: the process-wide session is set up once per process, and these
// tests run in order on it.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "pod.h"
#include "proc_fds.h"

namespace fftest {
namespace {

constexpr int kRouterWaitMs = 1500;  // FFV_ROUTER_WAIT_MS of this program

std::string g_dir;  // FREEFLOW_DIR: where every router of these tests listens

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The devices listed now: the one (nullptr: none) and its count.
ibv_device* ListOne(int* count) {
  int n = -1;
  ibv_device** list = ibv_get_device_list(&n);
  *count = n;
  if (list == nullptr) return nullptr;
  ibv_device* d = n > 0 ? list[0] : nullptr;
  ibv_free_device_list(list);
  return d;
}

// Whether the next async event of `ctx` (within kWaitLimit) is IBV_EVENT_DEVICE_FATAL.
bool DeviceFatal(ibv_context* ctx) {
  ibv_async_event e{};
  return NextAsyncEvent(ctx, &e) == 0 && e.event_type == IBV_EVENT_DEVICE_FATAL;
}

// A socket file at the router's path that nobody listens on: what a router that was killed
// leaves (connect answers ECONNREFUSED).
void LeaveStaleSocket() {
  const std::string path = g_dir + "/ffrouter.sock";
  ff::UniqueFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
      << std::strerror(errno);
}

class DeviceReopen : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char dir[] = "/tmp/ffv-reopen-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    g_dir = dir;
    ::setenv("FREEFLOW_DIR", g_dir.c_str(), 1);
    ::setenv("FFR_NAME", "ffrouter", 1);
    ::setenv("FFV_ROUTER_WAIT_MS", std::to_string(kRouterWaitMs).c_str(), 1);
  }
  static void TearDownTestSuite() {
    ::unlink((g_dir + "/ffrouter.sock").c_str());
    ::rmdir(g_dir.c_str());
  }
};

TEST_F(DeviceReopen, ALostRouterIsReplacedAndTheSameProcessOpensTheDeviceAgain) {
  auto first = std::make_unique<ListeningRouter>(g_dir);
  int n = 0;
  ibv_device* old_dev = ListOne(&n);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(ibv_get_device_index(old_dev), 0);
  ibv_context* old_ctx = ibv_open_device(old_dev);
  ASSERT_NE(old_ctx, nullptr);
  ibv_pd* old_pd = ibv_alloc_pd(old_ctx);
  ibv_cq* old_cq = ibv_create_cq(old_ctx, 8, nullptr, nullptr, 0);
  ASSERT_NE(old_pd, nullptr);
  ASSERT_NE(old_cq, nullptr);
  FakeRouter* router = first->Accepted();
  ASSERT_NE(router, nullptr);

  router->Close();  // the router dies
  ASSERT_TRUE(DeviceFatal(old_ctx)) << "no IBV_EVENT_DEVICE_FATAL";
  first.reset();  // its socket goes: the new router has not bound yet

  // The new router comes 300 ms later; the list waits for it.
  std::unique_ptr<ListeningRouter> second;
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    second = std::make_unique<ListeningRouter>(g_dir);
  });
  const auto t0 = Clock::now();
  ibv_device* new_dev = ListOne(&n);
  const double waited = MsSince(t0);
  starter.join();
  ASSERT_EQ(n, 1) << "no device after " << waited << " ms";
  EXPECT_GE(waited, 250.0);
  EXPECT_LT(waited, kRouterWaitMs);
  EXPECT_NE(new_dev, old_dev) << "the new device is another device";
  EXPECT_EQ(ibv_get_device_index(new_dev), 1) << "as a device registered again";
  EXPECT_EQ(ibv_get_device_guid(new_dev), ibv_get_device_guid(old_dev)) << "the same pod";

  // The old device is gone: it does not open, and its objects fail but can be destroyed.
  errno = 0;
  EXPECT_EQ(ibv_open_device(old_dev), nullptr);
  EXPECT_EQ(errno, ENODEV);
  errno = 0;
  EXPECT_EQ(ibv_create_cq(old_ctx, 4, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, ENOTCONN);
  EXPECT_EQ(ibv_destroy_cq(old_cq), 0);
  EXPECT_EQ(ibv_dealloc_pd(old_pd), 0);
  EXPECT_EQ(ibv_close_device(old_ctx), 0);

  // The new one works, and listing again finds the same device.
  ibv_context* ctx = ibv_open_device(new_dev);
  ASSERT_NE(ctx, nullptr) << std::strerror(errno);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 8, nullptr, nullptr, 0);
  EXPECT_NE(pd, nullptr);
  EXPECT_NE(cq, nullptr) << std::strerror(errno);
  ibv_port_attr port{};
  EXPECT_EQ(ibv_query_port(ctx, 1, &port), 0);
  EXPECT_EQ(ListOne(&n), new_dev);
  ASSERT_NE(second->Accepted(), nullptr);
  if (cq != nullptr) {
    EXPECT_EQ(ibv_destroy_cq(cq), 0);
  }
  if (pd != nullptr) {
    EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  }
  EXPECT_EQ(ibv_close_device(ctx), 0);

  // Lost again, and this time nobody comes back: the socket stays, refusing (a killed
  // router's). The first list waits the whole bound, the next ones not at all.
  ibv_context* watcher = ibv_open_device(new_dev);
  ASSERT_NE(watcher, nullptr);
  second->Accepted()->Close();
  ASSERT_TRUE(DeviceFatal(watcher));
  second.reset();
  LeaveStaleSocket();
  const auto t1 = Clock::now();
  EXPECT_EQ(ListOne(&n), nullptr);
  EXPECT_EQ(n, 0);
  EXPECT_GE(MsSince(t1), kRouterWaitMs * 0.9) << "a router being replaced was not waited for";
  const auto t2 = Clock::now();
  EXPECT_EQ(ListOne(&n), nullptr);
  EXPECT_EQ(n, 0);
  EXPECT_LT(MsSince(t2), 200.0) << "a second list of the same outage waited again";
  errno = 0;
  EXPECT_EQ(ibv_open_device(new_dev), nullptr);
  EXPECT_EQ(errno, ENODEV);
  EXPECT_EQ(ibv_close_device(watcher), 0);

  // A router that comes back later is found by the next list, which connects at once.
  ASSERT_EQ(::unlink((g_dir + "/ffrouter.sock").c_str()), 0);
  ListeningRouter third(g_dir);
  ibv_device* third_dev = ListOne(&n);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(ibv_get_device_index(third_dev), 2);
  ibv_context* third_ctx = ibv_open_device(third_dev);
  ASSERT_NE(third_ctx, nullptr);
  ASSERT_NE(third.Accepted(), nullptr);
  EXPECT_EQ(ibv_close_device(third_ctx), 0);
}

// The memfds a session hands the router are the router's to keep: the library keeps only its
// mappings of them, so a session lost in each router restart of a long job does not hold
// them on. (The notify words here; this fake refuses the request ring, whose memfd the
// library closes the same way, integration.verbs_faults' reopen program checks that one.)
TEST_F(DeviceReopen, ALostSessionKeepsNoSegmentItHandedTheRouter) {
  auto listening = std::make_unique<ListeningRouter>(g_dir);
  int n = 0;
  ibv_device* dev = ListOne(&n);
  ASSERT_EQ(n, 1);
  ibv_context* ctx = ibv_open_device(dev);
  ASSERT_NE(ctx, nullptr);
  FakeRouter* router = listening->Accepted();
  ASSERT_NE(router, nullptr);
  router->Close();
  ASSERT_TRUE(DeviceFatal(ctx));
  listening.reset();  // the fake router's copies (it runs in this process) go with it
  EXPECT_EQ(DescriptorsNamed("/memfd:ffverbs-notify"), 0);
  EXPECT_EQ(ibv_close_device(ctx), 0);
}

}  // namespace
}  // namespace fftest
