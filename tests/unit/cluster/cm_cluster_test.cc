// rdma_cm between two pods through the real router(s): the library's device
// (verbs/src/rdmacm/cm_device.h) with the router as its kernel, on one node and across two. The
// commands are written as librdmacm writes them (ucma_client.h) and the events expected are
// those the kernel's rdma_cm gives a user-space id: address and route resolution, a
// connection request carrying the caller's private data, the response, ESTABLISHED on the
// passive side, DISCONNECTED on both; a rejection when nobody listens; DEVICE_REMOVAL when
// the router goes away. Each id's events_reported at DESTROY_ID matches the events read.
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>

#include <chrono>
#include <cstring>

#include "pods.h"
#include "rdmacm/cm_device.h"
#include "ucma_client.h"

namespace ff::cluster_test {
namespace {

using fftest::CmdErrno;
using fftest::Ptr;
constexpr uint16_t kPort = 20886;

// A sockaddr_in in the uapi's sockaddr_in6-sized slot, as librdmacm copies one there.
void PutIpv4(sockaddr_in6* slot, uint32_t ip, uint16_t port) {
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  sin.sin_addr.s_addr = htonl(ip);
  std::memset(slot, 0, sizeof(*slot));
  std::memcpy(slot, &sin, sizeof(sin));
}

// One pod's event channel.
class Channel {
 public:
  explicit Channel(Pod& pod) {
    ff::verbs::UseCmSession(pod.session());
    fd_ = ::open(ff::verbs::kCmDevicePath, O_RDWR | O_CLOEXEC);
    ff::verbs::UseProcessCmSession();
    EXPECT_GE(fd_, 0) << std::strerror(errno);
  }
  ~Channel() {
    if (fd_ >= 0) ::close(fd_);
  }
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  int fd() const { return fd_; }

  uint32_t CreateId(uint64_t uid) { return fftest::CreateId(fd_, uid); }
  uint32_t Destroy(uint32_t id) { return fftest::DestroyId(fd_, id); }
  // The next event within `limit`; event ~0u when none came.
  rdma_ucm_event_resp Next(std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    rdma_ucm_event_resp ev{};
    ev.event = ~0u;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(limit.count())) == 1) {
      EXPECT_EQ(fftest::GetEvent(fd_, &ev), 0);
    }
    return ev;
  }

 private:
  int fd_ = -1;
};

// The active side up to CONNECT: resolve the address and route of `ip`:kPort, then connect
// with qp_num 0x111 and private data "hello".
void Dial(Channel& client, uint32_t id, uint32_t ip) {
  rdma_ucm_resolve_ip r{};
  PutIpv4(&r.dst_addr, ip, kPort);
  r.id = id;
  r.timeout_ms = 1000;
  ASSERT_EQ(CmdErrno(client.fd(), RDMA_USER_CM_CMD_RESOLVE_IP, r), 0);
  auto ev = client.Next();
  ASSERT_EQ(ev.event, fftest::kAddrResolved);
  EXPECT_EQ(ev.id, id);
  EXPECT_EQ(ev.status, 0);
  rdma_ucm_resolve_route rr{id, 1000};
  ASSERT_EQ(CmdErrno(client.fd(), RDMA_USER_CM_CMD_RESOLVE_ROUTE, rr), 0);
  ev = client.Next();
  ASSERT_EQ(ev.event, fftest::kRouteResolved);
  rdma_ucm_connect c{};
  c.id = id;
  c.conn_param.qp_num = 0x111;
  c.conn_param.valid = 1;
  c.conn_param.responder_resources = 1;
  c.conn_param.initiator_depth = 1;
  c.conn_param.retry_count = 7;
  c.conn_param.rnr_retry_count = 7;
  std::memcpy(c.conn_param.private_data, "hello", 5);
  c.conn_param.private_data_len = 5;
  ASSERT_EQ(CmdErrno(client.fd(), RDMA_USER_CM_CMD_CONNECT, c), 0);
}

TEST_P(ClusterTest, RdmaCmConnectAcceptAndDisconnect) {
  Channel server(*a), client(*b);
  const uint32_t listener = server.CreateId(1);
  rdma_ucm_bind_ip bind{};
  PutIpv4(&bind.addr, Ip("10.1.0.1"), kPort);
  bind.id = listener;
  ASSERT_EQ(CmdErrno(server.fd(), RDMA_USER_CM_CMD_BIND_IP, bind), 0);
  rdma_ucm_listen listen{listener, 4};
  ASSERT_EQ(CmdErrno(server.fd(), RDMA_USER_CM_CMD_LISTEN, listen), 0);
  const uint32_t id = client.CreateId(2);
  ASSERT_NO_FATAL_FAILURE(Dial(client, id, Ip("10.1.0.1")));
  auto ev = server.Next();
  ASSERT_EQ(ev.event, fftest::kConnectRequest);
  EXPECT_EQ(ev.uid, 1u);
  const uint32_t child = ev.id;
  EXPECT_NE(child, listener);
  EXPECT_EQ(ev.param.conn.qp_num, 0x111u);
  EXPECT_EQ(std::memcmp(ev.param.conn.private_data, "hello", 5), 0);
  rdma_ucm_accept acc{};
  acc.uid = 3;
  acc.id = child;
  acc.conn_param.qp_num = 0x222;
  acc.conn_param.valid = 1;
  ASSERT_EQ(CmdErrno(server.fd(), RDMA_USER_CM_CMD_ACCEPT, acc), 0);
  ev = client.Next();
  ASSERT_EQ(ev.event, fftest::kConnectResponse);
  EXPECT_EQ(ev.param.conn.qp_num, 0x222u);
  rdma_ucm_accept established{};  // librdmacm's answer to the response (valid == 0)
  established.id = id;
  ASSERT_EQ(CmdErrno(client.fd(), RDMA_USER_CM_CMD_ACCEPT, established), 0);
  ev = server.Next();
  ASSERT_EQ(ev.event, fftest::kEstablished);
  EXPECT_EQ(ev.id, child);
  EXPECT_EQ(ev.uid, 3u);
  rdma_ucm_disconnect d{id};
  ASSERT_EQ(CmdErrno(client.fd(), RDMA_USER_CM_CMD_DISCONNECT, d), 0);
  EXPECT_EQ(client.Next().event, fftest::kDisconnected);
  ev = server.Next();
  EXPECT_EQ(ev.event, fftest::kDisconnected);
  EXPECT_EQ(ev.id, child);
  EXPECT_EQ(client.Destroy(id), 4u) << "addr, route, response, disconnected";
  EXPECT_EQ(server.Destroy(child), 2u) << "established, disconnected";
  EXPECT_EQ(server.Destroy(listener), 1u) << "the request";
}

TEST_P(ClusterTest, RdmaCmConnectWithoutAListenerFailsWithinASecond) {
  Channel client(*b);
  const uint32_t id = client.CreateId(2);
  ASSERT_NO_FATAL_FAILURE(Dial(client, id, Ip("10.1.0.1")));
  const auto start = std::chrono::steady_clock::now();
  const auto ev = client.Next(std::chrono::seconds(1));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  EXPECT_TRUE(ev.event == fftest::kRejected || ev.event == fftest::kUnreachable)
      << "event " << ev.event;
  EXPECT_EQ(client.Destroy(id), 3u);
}

TEST_P(ClusterTest, RdmaCmReportsDeviceRemovalWhenTheRouterGoes) {
  Channel channel(*a);
  const uint32_t id = channel.CreateId(7);
  a_router.reset();
  const auto ev = channel.Next();
  EXPECT_EQ(ev.event, fftest::kDeviceRemoval);
  EXPECT_EQ(ev.id, id);
  EXPECT_EQ(ev.uid, 7u);
  pollfd p{channel.fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 50), 0) << "idle afterwards, not EOF";
  EXPECT_EQ(channel.Destroy(id), 1u);
}

}  // namespace
}  // namespace ff::cluster_test
