// The real librdmacm (Debian librdmacm1, linked into this executable) on the library's
// rdma_cm device, with the fake router as its kernel. The executable defines the library's
// ibv_* and libc interposers, so librdmacm's calls reach them as in a preloaded program:
// ucma_init lists the devices (the process-wide session, found through FREEFLOW_DIR),
// probes AF_IB with a throwaway id, then opens the device and checks it with fstat.
//
// What this proves that the unit tests of the device cannot: librdmacm's own accounting
// (rdma_destroy_id and rdma_migrate_id wait for as many acks as events_reported says)
// agrees with the library's counts, CONNECT_REQUEST children become ids librdmacm can
// destroy, and a router that drops a channel gives rdma_get_cm_event DEVICE_REMOVAL.
// Every librdmacm call that could wait runs under a time limit: a hang fails the test.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_cma_abi.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "cm_event.h"
#include "pod.h"
#include "rdmacm/cm_device.h"

namespace fftest {
namespace {

// A command's body as librdmacm's own ABI structs have it (they start with the header).
template <typename Abi>
Abi FromBody(const ff::proto::CmCommand& c) {
  Abi a{};
  constexpr size_t kHeader = sizeof(ucma_abi_cmd_hdr);
  std::memcpy(reinterpret_cast<char*>(&a) + kHeader, c.body, sizeof(a) - kHeader);
  return a;
}

// The fake router's rdma_cm side: handles from 500 on, each live one remembered with its
// uid.
struct CmKernel {
  std::mutex mu;
  uint32_t next = 500;
  std::map<uint32_t, uint64_t> uids;
  uint32_t migrated_from = 0;  // MIGRATE_ID's rewritten `fd`

  int Answer(const ff::proto::CmCommand& c, ff::proto::CmReply* r) {
    std::lock_guard<std::mutex> g(mu);
    switch (c.cmd) {
      case UCMA_CMD_CREATE_ID: {
        const auto b = FromBody<ucma_abi_create_id>(c);
        const uint32_t id = next++;
        uids[id] = b.uid;
        std::memcpy(r->out, &id, sizeof(id));
        r->out_len = sizeof(id);
        return 0;
      }
      case UCMA_CMD_DESTROY_ID:  // its uid (an address) may come back for a new id
        uids.erase(FromBody<ucma_abi_destroy_id>(c).id);
        r->out_len = sizeof(ucma_abi_destroy_id_resp);
        return 0;
      case UCMA_CMD_BIND:
        return EAFNOSUPPORT;  // librdmacm's AF_IB probe: not here
      case UCMA_CMD_MIGRATE_ID:
        migrated_from = FromBody<ucma_abi_migrate_id>(c).fd;
        r->out_len = sizeof(ucma_abi_migrate_resp);
        return 0;
      case UCMA_CMD_QUERY_ROUTE:  // no paths, no device: what a new id needs
        r->out_len = sizeof(ucma_abi_query_route_resp);
        return 0;
      default:
        r->out_len = c.out_len < ff::proto::kCmMaxReply ? c.out_len : ff::proto::kCmMaxReply;
        return 0;
    }
  }
  uint64_t uid(uint32_t id) {
    std::lock_guard<std::mutex> g(mu);
    return uids[id];
  }
};

ListeningRouter* g_router = nullptr;
FakeRouter* g_fake = nullptr;
CmKernel g_kernel;

// Runs `fn` on its own thread; a call still running after kWaitLimit is a hang, which ends
// the test program (its thread cannot be taken back).
template <typename T>
T Bounded(const char* what, std::function<T()> fn) {
  auto task = std::make_shared<std::packaged_task<T()>>(std::move(fn));
  std::future<T> result = task->get_future();
  std::thread([task] { (*task)(); }).detach();
  if (result.wait_for(kWaitLimit) != std::future_status::ready) {
    ADD_FAILURE() << what << " hung";
    std::fprintf(stderr, "%s did not return within the limit\n", what);
    std::_Exit(1);
  }
  return result.get();
}

class Librdmacm : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_router = new ListeningRouter();
    ::setenv("FREEFLOW_DIR", g_router->dir().c_str(), 1);
    ::setenv("FFR_NAME", "ffrouter", 1);
    int n = 0;
    ibv_device** devs = ibv_get_device_list(&n);  // connects the process-wide session
    ASSERT_NE(devs, nullptr);
    ibv_free_device_list(devs);
    g_fake = g_router->Accepted();
    ASSERT_NE(g_fake, nullptr);
    g_fake->OnCmCommand(
        [](const ff::proto::CmCommand& c, ff::proto::CmReply* r) { return g_kernel.Answer(c, r); });
  }
  static void TearDownTestSuite() {
    delete g_router;
    g_router = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(g_fake, nullptr);
    // The first one runs ucma_init, whose AF_IB probe creates and destroys an id.
    channel_ = Bounded<rdma_event_channel*>("rdma_create_event_channel",
                                            [] { return rdma_create_event_channel(); });
    ASSERT_NE(channel_, nullptr) << std::strerror(errno);
    channel_id_ = g_fake->last_cm_channel();
  }
  void TearDown() override {
    if (channel_ != nullptr) rdma_destroy_event_channel(channel_);
  }

  // The router queues an event of `id` on channel `channel`.
  static void Queue(uint32_t channel, uint32_t owner, rdma_cm_event_type type, uint32_t id,
                    uint64_t uid) {
    const ff::proto::CmEvent ev = MakeCmEvent(owner, type, id, uid);
    ASSERT_EQ(::send(g_fake->cm_channel_fd(channel), &ev, sizeof(ev), MSG_DONTWAIT),
              static_cast<ssize_t>(sizeof(ev)));
  }
  static uint32_t Handle(rdma_cm_id* id) {
    // librdmacm's private id starts with the public one; its handle is not public. The
    // router numbered it, and the uid it recorded is the private id's address.
    std::lock_guard<std::mutex> g(g_kernel.mu);
    for (const auto& [handle, uid] : g_kernel.uids)
      if (uid == reinterpret_cast<uintptr_t>(id)) return handle;
    return 0;
  }
  rdma_cm_event* NextEvent(rdma_event_channel* ch) {
    return Bounded<rdma_cm_event*>("rdma_get_cm_event", [ch] {
      rdma_cm_event* ev = nullptr;
      return rdma_get_cm_event(ch, &ev) == 0 ? ev : nullptr;
    });
  }
  static int Destroy(rdma_cm_id* id) {
    return Bounded<int>("rdma_destroy_id", [id] { return rdma_destroy_id(id); });
  }

  rdma_event_channel* channel_ = nullptr;
  uint32_t channel_id_ = ff::proto::kNoId;
};

TEST_F(Librdmacm, TheEventChannelIsTheLibrarysDevice) {
  EXPECT_TRUE(ff::verbs::IsCmFd(channel_->fd));
  EXPECT_NE(channel_id_, ff::proto::kNoId);
}

TEST_F(Librdmacm, AnEventIsDeliveredAndDestroyWaitsForItsAck) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(channel_, &id, this, RDMA_PS_TCP), 0) << std::strerror(errno);
  const uint32_t handle = Handle(id);
  ASSERT_NE(handle, 0u);
  Queue(channel_id_, handle, RDMA_CM_EVENT_ESTABLISHED, handle, g_kernel.uid(handle));
  pollfd p{channel_->fd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 1000), 1) << "poll sees the event";
  rdma_cm_event* ev = NextEvent(channel_);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(ev->id, id);
  EXPECT_EQ(::poll(&p, 1, 0), 0) << "and nothing after it";
  ASSERT_EQ(rdma_ack_cm_event(ev), 0);
  EXPECT_EQ(Destroy(id), 0);
}

TEST_F(Librdmacm, ANonBlockingChannelSaysEagain) {
  ASSERT_EQ(::fcntl(channel_->fd, F_SETFL, O_NONBLOCK), 0);  // as rsocket does
  rdma_cm_event* ev = nullptr;
  EXPECT_EQ(rdma_get_cm_event(channel_, &ev), -1);
  EXPECT_EQ(errno, EAGAIN);
}

TEST_F(Librdmacm, AConnectRequestGivesANewIdBothCanBeDestroyed) {
  rdma_cm_id* listener = nullptr;
  ASSERT_EQ(rdma_create_id(channel_, &listener, this, RDMA_PS_TCP), 0);
  const uint32_t handle = Handle(listener);
  const uint32_t child = 9000;
  Queue(channel_id_, handle, RDMA_CM_EVENT_CONNECT_REQUEST, child, g_kernel.uid(handle));
  rdma_cm_event* ev = NextEvent(channel_);
  ASSERT_NE(ev, nullptr);
  ASSERT_EQ(ev->event, RDMA_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(ev->listen_id, listener);
  rdma_cm_id* conn = ev->id;
  ASSERT_NE(conn, nullptr);
  EXPECT_NE(conn, listener);
  ASSERT_EQ(rdma_ack_cm_event(ev), 0);
  EXPECT_EQ(Destroy(conn), 0);
  EXPECT_EQ(Destroy(listener), 0);
}

TEST_F(Librdmacm, MigrateNamesTheOldChannelAndWaitsForItsAcks) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(channel_, &id, this, RDMA_PS_TCP), 0);
  const uint32_t handle = Handle(id);
  Queue(channel_id_, handle, RDMA_CM_EVENT_ESTABLISHED, handle, g_kernel.uid(handle));
  rdma_cm_event* ev = NextEvent(channel_);
  ASSERT_NE(ev, nullptr);
  ASSERT_EQ(rdma_ack_cm_event(ev), 0);
  rdma_event_channel* other = rdma_create_event_channel();
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(Bounded<int>("rdma_migrate_id", [&] { return rdma_migrate_id(id, other); }), 0);
  EXPECT_EQ(g_kernel.migrated_from, channel_id_);
  EXPECT_EQ(id->channel, other);
  EXPECT_EQ(Destroy(id), 0);
  rdma_destroy_event_channel(other);
}

TEST_F(Librdmacm, ARouterThatDropsTheChannelGivesDeviceRemoval) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(channel_, &id, this, RDMA_PS_TCP), 0);
  g_fake->DropCmChannel(channel_id_);
  rdma_cm_event* ev = NextEvent(channel_);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_DEVICE_REMOVAL);
  EXPECT_EQ(ev->id, id);
  ASSERT_EQ(rdma_ack_cm_event(ev), 0);
  pollfd p{channel_->fd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 50), 0) << "idle afterwards";
  EXPECT_EQ(rdma_listen(id, 1), -1);
  EXPECT_EQ(errno, ENODEV);
  EXPECT_EQ(Destroy(id), 0);
}

}  // namespace
}  // namespace fftest
