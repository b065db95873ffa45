// rdma_cm in the router, driven by pods that speak the protocol themselves (what the
// library sends for librdmacm, or what a hostile pod sends): ids, ports, addresses, the
// connect / accept / disconnect exchange on one node and across two, the events a real
// stack gives for failures, and what a pod must not be able to do to another's ids.
#include <netinet/in.h>
// After <netinet/in.h>.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_user_cm.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "cm/cm_abi.h"
#include "harness.h"
#include "links/link_test_util.h"
#include "scrape.h"

namespace ff::router::test {
namespace {

constexpr uint32_t kCh = 1;

struct Event {
  uint32_t owner;
  rdma_ucm_event_resp r;
};

sockaddr_in6 Addr(uint32_t ip, uint16_t port) {
  sockaddr_in6 out{};
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  sin.sin_addr.s_addr = htonl(ip);
  std::memcpy(&out, &sin, sizeof(sin));
  return out;
}

// A pod process with rdma_cm channels, speaking the protocol as the library does.
class CmPod {
 public:
  CmPod(TestRouter& r, uint32_t ip) : ip_(ip) { pod_.emplace(r, ip); }
  int Hello() { return pod_->Hello(); }
  int Open(uint32_t ch) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return errno;
    UniqueFd theirs(sv[1]);
    channels_[ch] = UniqueFd(sv[0]);
    proto::CmOpenChannel m{};
    m.channel = ch;
    return pod_->Call(m, {theirs.get()}).status;
  }
  void Close(uint32_t ch) { channels_.erase(ch); }
  template <typename T>
  static proto::CmCommand Command(uint32_t cmd, const T& body, uint32_t out_len, uint32_t ch) {
    return ff::test::CmCommandOf(cmd, body, out_len, ch);
  }
  template <typename T>
  proto::Response Cmd(uint32_t cmd, const T& body, uint32_t out_len = 0, uint32_t ch = kCh) {
    return pod_->Call(Command(cmd, body, out_len, ch));
  }
  // The command posted (as the library posts some): no answer comes. `handle`: a posted
  // CREATE_ID's granted handle.
  template <typename T>
  void Post(uint32_t cmd, const T& body, uint32_t out_len = 0, uint32_t ch = kCh,
            uint32_t handle = 0) {
    proto::CmCommand m = Command(cmd, body, out_len, ch);
    m.h.seq = proto::kPostedSeq;
    m.handle = handle;
    pod_->SendRaw(&m, sizeof(m));
  }
  // DISCONNECT with `flags` (kCmEventWritten: the library would write DISCONNECTED),
  // answered, or posted (which the router refuses with a flag).
  proto::Response DisconnectFlagged(uint32_t id, uint32_t flags, bool posted = false) {
    rdma_ucm_disconnect d{};
    d.id = id;
    proto::CmCommand m = Command(RDMA_USER_CM_CMD_DISCONNECT, d, 0, kCh);
    m.flags = flags;
    if (!posted) return pod_->Call(m);
    m.h.seq = proto::kPostedSeq;
    pod_->SendRaw(&m, sizeof(m));
    return proto::Response{};
  }
  uint32_t CreateId(uint16_t ps, uint64_t uid, uint32_t ch = kCh) {
    rdma_ucm_create_id c{};
    c.uid = uid;
    c.ps = ps;
    const proto::Response r =
        Cmd(RDMA_USER_CM_CMD_CREATE_ID, c, sizeof(rdma_ucm_create_id_resp), ch);
    if (r.status != 0) return 0;
    rdma_ucm_create_id_resp resp;
    std::memcpy(&resp, r.u.cm.out, sizeof(resp));
    return resp.id;
  }
  int Bind(uint32_t id, uint32_t ip, uint16_t port) {
    rdma_ucm_bind_ip b{};
    b.id = id;
    b.addr = Addr(ip, port);
    return Cmd(RDMA_USER_CM_CMD_BIND_IP, b).status;
  }
  int Listen(uint32_t id) {
    rdma_ucm_listen l{};
    l.id = id;
    return Cmd(RDMA_USER_CM_CMD_LISTEN, l).status;
  }
  int Resolve(uint32_t id, uint32_t ip, uint16_t port) {
    rdma_ucm_resolve_ip r{};
    r.id = id;
    r.dst_addr = Addr(ip, port);
    return Cmd(RDMA_USER_CM_CMD_RESOLVE_IP, r).status;
  }
  int ResolveRoute(uint32_t id) {
    rdma_ucm_resolve_route r{};
    r.id = id;
    return Cmd(RDMA_USER_CM_CMD_RESOLVE_ROUTE, r).status;
  }
  int Connect(uint32_t id, uint32_t qpn, const std::string& data) {
    rdma_ucm_connect c{};
    c.id = id;
    c.conn_param.valid = 1;
    c.conn_param.qp_num = qpn;
    c.conn_param.responder_resources = 1;
    c.conn_param.initiator_depth = 1;
    c.conn_param.private_data_len = static_cast<uint8_t>(data.size());
    std::memcpy(c.conn_param.private_data, data.data(), data.size());
    return Cmd(RDMA_USER_CM_CMD_CONNECT, c).status;
  }
  int Accept(uint32_t id, uint64_t uid, uint32_t qpn, const std::string& data) {
    rdma_ucm_accept a{};
    a.id = id;
    a.uid = uid;
    a.conn_param.valid = uid != 0 ? 1 : 0;
    a.conn_param.qp_num = qpn;
    a.conn_param.private_data_len = static_cast<uint8_t>(data.size());
    std::memcpy(a.conn_param.private_data, data.data(), data.size());
    return Cmd(RDMA_USER_CM_CMD_ACCEPT, a).status;
  }
  int Disconnect(uint32_t id) {
    rdma_ucm_disconnect d{};
    d.id = id;
    return Cmd(RDMA_USER_CM_CMD_DISCONNECT, d).status;
  }
  int Destroy(uint32_t id) {
    rdma_ucm_destroy_id d{};
    d.id = id;
    return Cmd(RDMA_USER_CM_CMD_DESTROY_ID, d, sizeof(rdma_ucm_destroy_id_resp)).status;
  }
  rdma_ucm_query_route_resp Route(uint32_t id) {
    rdma_ucm_query q{};
    q.id = id;
    const proto::Response r =
        Cmd(RDMA_USER_CM_CMD_QUERY_ROUTE, q, sizeof(rdma_ucm_query_route_resp));
    rdma_ucm_query_route_resp out{};
    EXPECT_EQ(r.status, 0);
    std::memcpy(&out, r.u.cm.out, sizeof(out));
    return out;
  }
  int QpAttr(uint32_t id, uint32_t state, ib_uverbs_qp_attr* out) {
    rdma_ucm_init_qp_attr q{};
    q.id = id;
    q.qp_state = state;
    const proto::Response r = Cmd(RDMA_USER_CM_CMD_INIT_QP_ATTR, q, sizeof(ib_uverbs_qp_attr));
    std::memcpy(out, r.u.cm.out, sizeof(*out));
    return r.status;
  }
  // The next event on channel `ch`, within `ms`.
  std::optional<Event> Next(int ms = 3000, uint32_t ch = kCh) {
    pollfd p{channels_[ch].get(), POLLIN, 0};
    if (::poll(&p, 1, ms) != 1) return std::nullopt;
    proto::CmEvent e;
    if (::recv(channels_[ch].get(), &e, sizeof(e), MSG_DONTWAIT) != sizeof(e)) return std::nullopt;
    Event out{e.owner, {}};
    std::memcpy(&out.r, e.resp, sizeof(out.r));
    return out;
  }
  // The next event, which must be `type`.
  Event Expect(uint32_t type, int ms = 3000) {
    std::optional<Event> e = Next(ms);
    if (!e) {
      ADD_FAILURE() << "no event (expected " << type << ")";
      return Event{};
    }
    EXPECT_EQ(e->r.event, type);
    return *e;
  }
  void Kill() { pod_.reset(); }  // the process exits: its session closes
  uint32_t ip() const { return ip_; }
  RawPod& raw() { return *pod_; }

 private:
  std::optional<RawPod> pod_;
  uint32_t ip_;
  std::map<uint32_t, UniqueFd> channels_;
};

// The exchange between a server pod and a client pod, wherever they are.
class CmBase : public ::testing::Test {
 protected:
  virtual CmPod& S() = 0;
  virtual CmPod& C() = 0;
  void SetUp() override {
    for (CmPod* p : {&S(), &C()}) {
      ASSERT_EQ(p->Hello(), 0);
      ASSERT_EQ(p->Open(kCh), 0);
    }
  }
  // A listener on the server's port `port`; its handle.
  uint32_t Listen(uint16_t port = 7000) {
    const uint32_t l = S().CreateId(RDMA_PS_TCP, 0x5e);
    EXPECT_NE(l, 0u);
    EXPECT_EQ(S().Bind(l, 0, port), 0);
    EXPECT_EQ(S().Listen(l), 0);
    return l;
  }
  // A client id whose route to the server's port `port` is resolved.
  uint32_t Routed(uint16_t port = 7000) { return RoutedTo(S().ip(), port); }
  // A client id whose route to ip:port is resolved.
  uint32_t RoutedTo(uint32_t ip, uint16_t port = 7000) {
    const uint32_t id = C().CreateId(RDMA_PS_TCP, 0xc1);
    EXPECT_EQ(C().Resolve(id, ip, port), 0);
    C().Expect(RDMA_CM_EVENT_ADDR_RESOLVED);
    EXPECT_EQ(C().ResolveRoute(id), 0);
    C().Expect(RDMA_CM_EVENT_ROUTE_RESOLVED);
    return id;
  }
  // Connects the client to a new listener of the server on `port`: the client's id and the
  // server's.
  std::pair<uint32_t, uint32_t> Establish(uint16_t port = 7000) {
    CmPod& srv = S();
    CmPod& cli = C();
    const uint32_t l = Listen(port);
    const uint32_t id = Routed(port);
    EXPECT_EQ(cli.Connect(id, 0x11, "hello"), 0);
    const Event req = srv.Expect(RDMA_CM_EVENT_CONNECT_REQUEST);
    EXPECT_EQ(req.owner, l);
    EXPECT_EQ(req.r.uid, 0x5eu);
    EXPECT_EQ(req.r.param.conn.qp_num, 0x11u);
    EXPECT_EQ(req.r.param.conn.private_data_len, kCmReqData);  // padded, as IB CM does
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(req.r.param.conn.private_data), 5),
              "hello");
    const uint32_t child = req.r.id;
    EXPECT_NE(srv.Route(child).node_guid, 0u);
    EXPECT_EQ(srv.Accept(child, 0xacc, 0x22, "world"), 0);
    const Event rep = cli.Expect(RDMA_CM_EVENT_CONNECT_RESPONSE);
    EXPECT_EQ(rep.r.param.conn.qp_num, 0x22u);
    EXPECT_EQ(rep.r.param.conn.private_data_len, kCmRepData);
    ib_uverbs_qp_attr attr;
    EXPECT_EQ(cli.QpAttr(id, IBV_QPS_RTR, &attr), 0);
    EXPECT_EQ(attr.dest_qp_num, 0x22u);
    uint8_t gid[16];
    Ipv4MappedGid(srv.ip(), gid);
    EXPECT_EQ(std::memcmp(attr.ah_attr.grh.dgid, gid, 16), 0);
    EXPECT_EQ(cli.Accept(id, 0, 0, ""), 0);  // the RTU
    const Event est = srv.Expect(RDMA_CM_EVENT_ESTABLISHED);
    EXPECT_EQ(est.r.uid, 0xaccu);
    EXPECT_EQ(srv.QpAttr(child, IBV_QPS_RTR, &attr), 0);
    EXPECT_EQ(attr.dest_qp_num, 0x11u);
    return {id, child};
  }
};

class CmTest : public CmBase {
 protected:
  CmPod& S() override { return server; }
  CmPod& C() override { return client; }
  TestRouter router{{}};
  CmPod server{router, Ip("10.1.0.1")};
  CmPod client{router, Ip("10.1.0.2")};
};

TEST_F(CmTest, ConnectAcceptAndDisconnectOnOneNode) {
  const auto [id, child] = Establish();
  EXPECT_EQ(client.Disconnect(id), 0);
  server.Expect(RDMA_CM_EVENT_DISCONNECTED);
  client.Expect(RDMA_CM_EVENT_DISCONNECTED);
  EXPECT_EQ(server.Destroy(child), 0);
  EXPECT_EQ(client.Destroy(id), 0);
  EXPECT_EQ(router.Stat("cm_ids"), 1u);  // the listener
}

// The DREP is delivered before the side that received the DREQ hears DISCONNECTED: the
// side that disconnected waits for it, the other only learns of it. One process holding
// both ends on one channel sees that order.
TEST_F(CmTest, TheSideThatDisconnectsHearsItsDrepFirst) {
  const uint32_t l = server.CreateId(RDMA_PS_TCP, 0x5e);
  ASSERT_EQ(server.Bind(l, 0, 7000), 0);
  ASSERT_EQ(server.Listen(l), 0);
  const uint32_t id = server.CreateId(RDMA_PS_TCP, 0xc1);
  ASSERT_EQ(server.Resolve(id, server.ip(), 7000), 0);
  server.Expect(RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_EQ(server.ResolveRoute(id), 0);
  server.Expect(RDMA_CM_EVENT_ROUTE_RESOLVED);
  ASSERT_EQ(server.Connect(id, 0x11, ""), 0);
  const uint32_t child = server.Expect(RDMA_CM_EVENT_CONNECT_REQUEST).r.id;
  ASSERT_EQ(server.Accept(child, 0xacc, 0x22, ""), 0);
  server.Expect(RDMA_CM_EVENT_CONNECT_RESPONSE);
  ASSERT_EQ(server.Accept(id, 0, 0, ""), 0);  // the RTU
  server.Expect(RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_EQ(server.Disconnect(child), 0);
  EXPECT_EQ(server.Expect(RDMA_CM_EVENT_DISCONNECTED).r.id, child) << "the DREP came second";
  EXPECT_EQ(server.Expect(RDMA_CM_EVENT_DISCONNECTED).r.id, id);
}

TEST_F(CmTest, NobodyListeningIsRejectedAtOnceAsInvalidServiceId) {
  const uint32_t id = Routed();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(client.Connect(id, 0x11, ""), 0);
  const Event e = client.Expect(RDMA_CM_EVENT_REJECTED, 1000);
  EXPECT_EQ(e.r.status, kRejInvalidServiceId);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

TEST_F(CmTest, AddressesOutsideThePodNetworkOrOfNoPodDoNotResolve) {
  const uint32_t id = client.CreateId(RDMA_PS_TCP, 1);
  EXPECT_EQ(client.Resolve(id, Ip("192.0.2.7"), 7000), 0);
  EXPECT_EQ(static_cast<int32_t>(client.Expect(RDMA_CM_EVENT_ADDR_ERROR).r.status), -ENETUNREACH);
  EXPECT_EQ(client.Resolve(id, Ip("10.1.9.9"), 7000), 0);
  EXPECT_EQ(static_cast<int32_t>(client.Expect(RDMA_CM_EVENT_ADDR_ERROR).r.status), -EHOSTUNREACH);
}

// A group address resolves, as on a RoCE device, so that a multicast program gets as far as
// its join; freeflow has no multicast, so the join says EOPNOTSUPP. Nothing connects to it.
TEST_F(CmTest, AGroupAddressResolvesButItsJoinIsNotSupportedAndNothingConnectsToIt) {
  const uint32_t ud = client.CreateId(RDMA_PS_UDP, 1);
  ASSERT_EQ(client.Resolve(ud, Ip("239.1.1.1"), 0), 0);
  client.Expect(RDMA_CM_EVENT_ADDR_RESOLVED);
  rdma_ucm_join_ip_mcast j{};
  j.id = ud;
  j.uid = 0x77;
  j.addr = Addr(Ip("239.1.1.1"), 0);
  EXPECT_EQ(client.Cmd(RDMA_USER_CM_CMD_JOIN_IP_MCAST, j, sizeof(rdma_ucm_create_id_resp)).status,
            EOPNOTSUPP);
  EXPECT_EQ(client.Resolve(client.CreateId(RDMA_PS_TCP, 2), Ip("224.0.0.1"), 7000), 0);
  client.Expect(RDMA_CM_EVENT_ADDR_RESOLVED);
  const uint32_t rc = RoutedTo(Ip("239.255.255.250"));
  ASSERT_EQ(client.Connect(rc, 0x11, ""), 0);
  client.Expect(RDMA_CM_EVENT_UNREACHABLE, 1000);
  // Past the group range, outside the pod network, as before.
  ASSERT_EQ(client.Resolve(client.CreateId(RDMA_PS_TCP, 4), Ip("240.0.0.1"), 7000), 0);
  EXPECT_EQ(static_cast<int32_t>(client.Expect(RDMA_CM_EVENT_ADDR_ERROR).r.status), -ENETUNREACH);
}

TEST_F(CmTest, APodBindsOnlyItsOwnAddressAndPortsAreExclusive) {
  const uint32_t a = client.CreateId(RDMA_PS_TCP, 1);
  EXPECT_EQ(client.Bind(a, server.ip(), 7000), EADDRNOTAVAIL);  // another pod's address
  EXPECT_EQ(client.Bind(a, client.ip(), 7000), 0);
  const uint32_t b = client.CreateId(RDMA_PS_TCP, 2);
  EXPECT_EQ(client.Bind(b, 0, 7000), EADDRINUSE);
  EXPECT_EQ(client.Bind(b, 0, 0), 0);  // an ephemeral port
  const rdma_ucm_query_route_resp r = client.Route(b);
  sockaddr_in sin;
  std::memcpy(&sin, &r.src_addr, sizeof(sin));
  EXPECT_GE(ntohs(sin.sin_port), kCmFirstEphemeralPort);
  EXPECT_EQ(r.node_guid, 0u);  // bound to "any": no device yet, as the kernel says
}

TEST_F(CmTest, AnIdOfAnotherProcessOrChannelCannotBeNamed) {
  const uint32_t l = Listen();
  EXPECT_EQ(client.Destroy(l), ENOENT);
  EXPECT_EQ(client.Listen(l), ENOENT);
  ASSERT_EQ(server.Open(2), 0);
  rdma_ucm_destroy_id d{};
  d.id = l;
  EXPECT_EQ(server.Cmd(RDMA_USER_CM_CMD_DESTROY_ID, d, 4, 2).status, EINVAL);
  EXPECT_EQ(server.Destroy(l), 0);
}

TEST_F(CmTest, TheServerProcessExitingDisconnectsTheClient) {
  const auto [id, child] = Establish();
  server.Kill();
  client.Expect(RDMA_CM_EVENT_DISCONNECTED);
  EXPECT_EQ(client.Destroy(id), 0);
}

TEST_F(CmTest, ClosingTheChannelDestroysItsIds) {
  Listen();
  server.Close(kCh);
  ASSERT_TRUE(WaitFor([&] { return router.Stat("cm_ids") == 0; }, std::chrono::seconds(3)));
  const uint32_t id = Routed();
  EXPECT_EQ(client.Connect(id, 0x11, ""), 0);
  EXPECT_EQ(client.Expect(RDMA_CM_EVENT_REJECTED).r.status, kRejInvalidServiceId);
}

TEST_F(CmTest, PrivateDataLongerThanTheCmCarriesIsRefused) {
  Listen();
  const uint32_t id = Routed();
  EXPECT_EQ(client.Connect(id, 0x11, std::string(kCmReqData + 1, 'x')), EINVAL);
  EXPECT_EQ(client.Connect(id, 0x11, std::string(kCmReqData, 'x')), 0);
  server.Expect(RDMA_CM_EVENT_CONNECT_REQUEST);
}

TEST_F(CmTest, MalformedCommandsAreErrorsNotCrashes) {
  proto::CmCommand m{};
  m.channel = kCh;
  m.cmd = RDMA_USER_CM_CMD_JOIN_MCAST + 1;
  EXPECT_EQ(server.raw().Call(m).status, EINVAL);
  m.cmd = RDMA_USER_CM_CMD_GET_EVENT;
  EXPECT_EQ(server.raw().Call(m).status, EINVAL);
  m.cmd = RDMA_USER_CM_CMD_CREATE_ID;
  m.in_len = proto::kCmMaxBody + 1;
  EXPECT_EQ(server.raw().Call(m).status, EINVAL);
  m.in_len = 0;
  m.channel = 99;  // never opened
  EXPECT_EQ(server.raw().Call(m).status, EINVAL);
  m.channel = kCh;
  m.out_len = 0;  // no room for the answer
  EXPECT_EQ(server.raw().Call(m).status, ENOSPC);
  m.out_len = sizeof(rdma_ucm_create_id_resp);  // port space 0
  EXPECT_EQ(server.raw().Call(m).status, EINVAL);
  m.cmd = RDMA_USER_CM_CMD_JOIN_IP_MCAST;
  EXPECT_EQ(server.raw().Call(m).status, EOPNOTSUPP);
  EXPECT_NE(server.CreateId(RDMA_PS_TCP, 1), 0u);  // still served
}

// A command the library posts (seq kPostedSeq) is carried out in its turn and never
// answered; one that fails is only logged. The next request's answer is its own.
TEST_F(CmTest, APostedCommandIsCarriedOutAndNotAnswered) {
  const uint32_t l = Listen();
  const uint32_t id = client.CreateId(RDMA_PS_TCP, 0xc1);
  ASSERT_NE(id, 0u);
  rdma_ucm_destroy_id d{};
  d.id = l;  // the server's: refused, and the refusal is not sent
  client.Post(RDMA_USER_CM_CMD_DESTROY_ID, d, sizeof(rdma_ucm_destroy_id_resp));
  d.id = id;
  client.Post(RDMA_USER_CM_CMD_DESTROY_ID, d, sizeof(rdma_ucm_destroy_id_resp));
  rdma_ucm_resolve_route r{};
  r.id = id;
  proto::CmCommand next{};
  next.h.seq = 7;
  next.channel = kCh;
  next.cmd = RDMA_USER_CM_CMD_RESOLVE_ROUTE;
  next.in_len = sizeof(r);
  std::memcpy(next.body, &r, sizeof(r));
  const proto::Response answer = client.raw().Call(next);
  EXPECT_EQ(answer.h.seq, 7u);
  EXPECT_EQ(answer.status, ENOENT);      // the posted DESTROY_ID came first
  EXPECT_EQ(router.Stat("cm_ids"), 1u);  // the server's listener is still there
  EXPECT_EQ(server.Destroy(l), 0);
}

// A posted RESOLVE_ROUTE (the library answers it and writes ROUTE_RESOLVED itself) resolves
// the route without an event; the CONNECT that follows goes out. An answered one still
// brings ROUTE_RESOLVED.
// Issue 37, attack 4: events a pod does not read wait in the router, and one pod with many
// channels made it hold 2.4 GB (4096 events of 592 bytes per channel, 996 channels). What
// waits is now charged to the pod's queued-mib: here 1 MiB, about 1770 events, across
// three channels that are never read. Once it is full, the channel whose event does not fit
// is closed (as one that reached kMaxCmBacklog), the pod's session and its other channels go
// on, and what the closed channel held is given back.
TEST(CmQuota, EventsNobodyReadsCountAgainstThePodsQueuedBytes) {
  TestRouter router{TestRouter::Options{.limits = WithLimits({{Quota::kQueuedBytes, 1}})}};
  CmPod server(router, Ip("10.0.0.2"));
  CmPod client(router, Ip("10.0.0.3"));
  ASSERT_EQ(server.Hello(), 0);
  ASSERT_EQ(client.Hello(), 0);
  for (uint32_t ch = 1; ch <= 3; ++ch) ASSERT_EQ(client.Open(ch), 0);
  constexpr int kPerChannel = 1500;  // 4500 events: far more than 1 MiB and the sockets hold
  int resolved = 0;
  for (uint32_t ch = 1; ch <= 3; ++ch) {
    for (int i = 0; i < kPerChannel; ++i) {
      const uint32_t id = client.CreateId(RDMA_PS_TCP, 0x100000 * ch + i, ch);
      if (id == 0) break;  // its channel was closed
      rdma_ucm_resolve_ip r{};
      r.id = id;
      r.dst_addr = Addr(server.ip(), 7000);
      if (client.Cmd(RDMA_USER_CM_CMD_RESOLVE_IP, r, 0, ch).status != 0) break;
      ++resolved;
    }
  }
  EXPECT_LT(resolved, 3 * kPerChannel) << "no channel was closed";
  EXPECT_GT(resolved, 1500) << "closed before the quota was full";
  // The session serves on: a new channel, an id, a resolve, its event.
  ASSERT_EQ(client.Open(4), 0);
  const uint32_t id = client.CreateId(RDMA_PS_TCP, 0x900000, 4);
  ASSERT_NE(id, 0u);
  rdma_ucm_resolve_ip r{};
  r.id = id;
  r.dst_addr = Addr(server.ip(), 7000);
  EXPECT_EQ(client.Cmd(RDMA_USER_CM_CMD_RESOLVE_IP, r, 0, 4).status, 0);
  const auto e = client.Next(3000, 4);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->r.event, RDMA_CM_EVENT_ADDR_RESOLVED);
}

TEST_F(CmTest, APostedResolveRouteResolvesWithoutAnEvent) {
  const uint32_t l = Listen();
  const uint32_t id = client.CreateId(RDMA_PS_TCP, 0xc1);
  ASSERT_EQ(client.Resolve(id, server.ip(), 7000), 0);
  client.Expect(RDMA_CM_EVENT_ADDR_RESOLVED);
  rdma_ucm_resolve_route r{};
  r.id = id;
  client.Post(RDMA_USER_CM_CMD_RESOLVE_ROUTE, r);
  EXPECT_EQ(client.ResolveRoute(id), EINVAL) << "resolved already";
  EXPECT_EQ(client.Connect(id, 0x11, "hi"), 0);
  const Event req = server.Expect(RDMA_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(req.owner, l);
  EXPECT_FALSE(client.Next(50).has_value()) << "no ROUTE_RESOLVED from the router";
}

// A DISCONNECT flagged kCmEventWritten, of an id whose end the router has not reported,
// sends the DREQ (the peer hears DISCONNECTED), ends the id with no event of its own (not
// at the DREP, not when the peer's DREQ crosses it) and answers with the flag: the library
// writes the event. Asked again, the answer has no flag.
TEST_F(CmTest, ADisconnectFlaggedEventWrittenLeavesTheEventToTheLibrary) {
  const auto [id, child] = Establish();
  const proto::Response r = client.DisconnectFlagged(id, proto::kCmEventWritten);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.u.cm.flags, proto::kCmEventWritten) << "the library writes DISCONNECTED";
  EXPECT_EQ(server.Expect(RDMA_CM_EVENT_DISCONNECTED).r.id, child);
  EXPECT_EQ(server.Disconnect(child), 0) << "its DREQ crosses nothing: the client's id is done";
  const proto::Response again = client.DisconnectFlagged(id, proto::kCmEventWritten);
  EXPECT_EQ(again.status, 0);
  EXPECT_EQ(again.u.cm.flags, 0u) << "written once";
  EXPECT_FALSE(client.Next(50).has_value()) << "no DISCONNECTED from the router";
  EXPECT_EQ(client.Destroy(id), 0);
  EXPECT_EQ(server.Destroy(child), 0);
}

// The peer's DREQ first: the router reported the end (read or not), so the flagged
// DISCONNECT's answer has no flag and nothing more comes: the program reads one DISCONNECTED.
TEST_F(CmTest, AfterThePeersDreqTheRouterKeepsTheEvent) {
  const auto [id, child] = Establish();
  EXPECT_EQ(server.Disconnect(child), 0);
  ASSERT_EQ(server.Expect(RDMA_CM_EVENT_DISCONNECTED).r.id, child);  // its DREP
  const proto::Response r = client.DisconnectFlagged(id, proto::kCmEventWritten);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.u.cm.flags, 0u);
  EXPECT_EQ(client.Expect(RDMA_CM_EVENT_DISCONNECTED).r.id, id) << "the router's";
  EXPECT_FALSE(client.Next(50).has_value());
}

// The flag on an id that is not connected, an unknown flag, the flag on another command or
// on a posted DISCONNECT (whose answer nobody reads): refused, and nothing done.
TEST_F(CmTest, TheEventWrittenFlagIsOnlyForAnAnsweredDisconnect) {
  const uint32_t idle = client.CreateId(RDMA_PS_TCP, 0x99);
  EXPECT_EQ(client.DisconnectFlagged(idle, proto::kCmEventWritten).status, EINVAL)
      << "not connected";
  EXPECT_EQ(client.DisconnectFlagged(idle, 2).status, EINVAL) << "an unknown flag";
  rdma_ucm_create_id c{};
  c.ps = RDMA_PS_TCP;
  proto::CmCommand m =
      CmPod::Command(RDMA_USER_CM_CMD_CREATE_ID, c, sizeof(rdma_ucm_create_id_resp), kCh);
  m.flags = proto::kCmEventWritten;
  EXPECT_EQ(client.raw().Call(m).status, EINVAL) << "on another command";
  const auto [id, child] = Establish();
  client.DisconnectFlagged(id, proto::kCmEventWritten, /*posted=*/true);
  EXPECT_FALSE(server.Next(50).has_value()) << "a posted one is refused: no DREQ";
  EXPECT_EQ(client.DisconnectFlagged(id, proto::kCmEventWritten).u.cm.flags,
            proto::kCmEventWritten);
  EXPECT_EQ(server.Expect(RDMA_CM_EVENT_DISCONNECTED).r.id, child);
}

// An answered CREATE_ID grants the channel kCmHandleGrant handles (while it holds none
// unused) for the CREATE_IDs the session posts on it. A handle is taken once, and only on
// the channel it was granted to: another pod naming it, another channel, or a handle never
// granted is refused (the posted command only logged), and the grant stays its owner's.
TEST_F(CmTest, PostedCreateIdsTakeOnlyTheSessionsOwnGrantedHandles) {
  rdma_ucm_create_id c{};
  c.uid = 0x77;
  c.ps = RDMA_PS_TCP;
  const proto::Response first =
      client.Cmd(RDMA_USER_CM_CMD_CREATE_ID, c, sizeof(rdma_ucm_create_id_resp));
  ASSERT_EQ(first.status, 0);
  ASSERT_EQ(first.u.cm.grant_count, kCmHandleGrant);
  const uint32_t g = first.u.cm.grant_first;
  const proto::Response second =
      client.Cmd(RDMA_USER_CM_CMD_CREATE_ID, c, sizeof(rdma_ucm_create_id_resp));
  EXPECT_EQ(second.u.cm.grant_count, 0u) << "granted again while the grant is unused";
  auto posted = [&](CmPod& p, uint32_t handle, uint32_t ch = kCh) {
    p.Post(RDMA_USER_CM_CMD_CREATE_ID, c, sizeof(rdma_ucm_create_id_resp), ch, handle);
  };
  posted(server, g);         // another pod's grant
  posted(client, g + 1000);  // never granted
  ASSERT_EQ(client.Open(2), 0);
  posted(client, g + 2, 2);  // granted to channel kCh
  posted(client, g + 1);
  posted(client, g + 1);  // taken already
  EXPECT_EQ(server.Destroy(g), ENOENT) << "the server made an id under the client's handle";
  EXPECT_EQ(client.Destroy(g + 1000), ENOENT);
  EXPECT_EQ(client.Destroy(g + 2), ENOENT) << "taken on another channel";
  EXPECT_EQ(router.Stat("cm_ids"), 3u) << "two answered, one posted";
  EXPECT_EQ(client.Destroy(g + 1), 0);
  posted(client, g);  // the server's try left it the client's
  EXPECT_EQ(client.Destroy(g), 0);
}

// Only what proto::IsPostable names may be posted (rdma_cm commands, DestroyQp, NameQp): another
// verbs request without an answer would leave its descriptors nowhere and its failure
// unseen. A pod that posts one is dropped.
TEST_F(CmTest, AVerbsRequestCannotBePosted) {
  proto::DestroyCq m{};
  m.h.seq = proto::kPostedSeq;
  m.id = 1;
  client.raw().SendRaw(&m, sizeof(m));
  EXPECT_TRUE(client.raw().Disconnected());
  EXPECT_NE(server.CreateId(RDMA_PS_TCP, 1), 0u);  // the others are still served
}

// Node-a's router serves /metrics (the refusals it counts).
TestRouter::Options Scraped(TestRouter::Options o) {
  o.metrics_address = "127.0.0.1:0";
  return o;
}

class CmCrossNodeTest : public CmBase {
 protected:
  CmPod& S() override { return server; }
  CmPod& C() override { return client; }
  LoopbackNetwork net;
  FakeCluster cluster;
  TestRouter a{Scraped({"node-a", Ip("192.168.0.1"), &net, &cluster})};
  TestRouter b{{"node-b", Ip("192.168.0.2"), &net, &cluster}};
  CmPod server{a, Ip("10.1.0.1")};
  CmPod client{b, Ip("10.2.0.1")};
};

TEST_F(CmCrossNodeTest, ConnectAcceptAndDisconnectAcrossNodes) {
  const auto [id, child] = Establish();
  EXPECT_EQ(server.Disconnect(child), 0);
  client.Expect(RDMA_CM_EVENT_DISCONNECTED);
  server.Expect(RDMA_CM_EVENT_DISCONNECTED);
}

// Across nodes too: the DREQ reaches the server, marked as waiting for no DREP, and is the
// only message on the link; a DISCONNECT without the flag still gets its DREP.
TEST_F(CmCrossNodeTest, ADisconnectFlaggedEventWrittenLeavesTheEventToTheLibrary) {
  const auto [id, child] = Establish();
  const uint64_t before = net.messages_sent();
  EXPECT_EQ(client.DisconnectFlagged(id, proto::kCmEventWritten).u.cm.flags,
            proto::kCmEventWritten);
  EXPECT_EQ(server.Expect(RDMA_CM_EVENT_DISCONNECTED).r.id, child);
  EXPECT_FALSE(client.Next(100).has_value()) << "no DISCONNECTED from the router";
  EXPECT_EQ(net.messages_sent() - before, 1u) << "the DREQ, and no DREP";
  EXPECT_EQ(client.Destroy(id), 0);
  EXPECT_EQ(server.Destroy(child), 0);
}

TEST_F(CmCrossNodeTest, AnAnsweredDisconnectGetsItsDrepAndADestroyedIdNone) {
  const auto [id, child] = Establish();
  uint64_t before = net.messages_sent();
  EXPECT_EQ(client.Disconnect(id), 0);
  EXPECT_EQ(server.Expect(RDMA_CM_EVENT_DISCONNECTED).r.id, child);
  EXPECT_EQ(client.Expect(RDMA_CM_EVENT_DISCONNECTED).r.id, id) << "at the DREP";
  EXPECT_EQ(net.messages_sent() - before, 2u);
  EXPECT_EQ(client.Destroy(id), 0);
  EXPECT_EQ(server.Destroy(child), 0);
  // A connected id destroyed: its DREQ tells the peer, which answers nothing.
  const auto [id2, child2] = Establish(7001);
  before = net.messages_sent();
  EXPECT_EQ(client.Destroy(id2), 0);
  EXPECT_EQ(server.Expect(RDMA_CM_EVENT_DISCONNECTED).r.id, child2);
  EXPECT_FALSE(server.Next(100).has_value());
  EXPECT_EQ(net.messages_sent() - before, 1u) << "the DREQ, and no DREP";
}

TEST_F(CmCrossNodeTest, NobodyListeningIsRejectedAtOnce) {
  const uint32_t id = Routed();
  EXPECT_EQ(client.Connect(id, 0x11, ""), 0);
  EXPECT_EQ(client.Expect(RDMA_CM_EVENT_REJECTED, 1000).r.status, kRejInvalidServiceId);
}

// A pod the control plane places on node-a, none of whose processes opened the device: a
// host with no listener, as on a real network (not a silence that times out).
TEST_F(CmCrossNodeTest, APodThatRunsNothingRejectsAtOnce) {
  cluster.Set(Ip("10.1.0.7"), a.endpoint());
  const uint32_t id = RoutedTo(Ip("10.1.0.7"));
  EXPECT_EQ(client.Connect(id, 0x11, ""), 0);
  EXPECT_EQ(client.Expect(RDMA_CM_EVENT_REJECTED, 1000).r.status, kRejInvalidServiceId);
}

TEST_F(CmCrossNodeTest, TheServerProcessExitingDisconnectsTheClient) {
  const uint32_t id = Establish().first;
  server.Kill();
  client.Expect(RDMA_CM_EVENT_DISCONNECTED);
  EXPECT_EQ(client.Destroy(id), 0);
}

TEST_F(CmCrossNodeTest, ALostNodeDisconnectsItsPeers) {
  const uint32_t child = Establish().second;
  net.Sever("node-a", "node-b");
  client.Expect(RDMA_CM_EVENT_DISCONNECTED);
  server.Expect(RDMA_CM_EVENT_DISCONNECTED);
  EXPECT_EQ(server.Destroy(child), 0);
}

// A router (node-c, hostile or confused) sends rdma_cm messages in the name of pods of
// node-b: a connect request, and a disconnect of a connection node-b's pod holds. Node-a
// takes neither.
TEST_F(CmCrossNodeTest, ARouterCannotSpeakForAnotherNodesPods) {
  const auto [id, child] = Establish();
  EventLoop loop;
  ASSERT_EQ(loop.Init(), 0);
  Recorder heard;
  std::unique_ptr<NodeTransport> c = net.Attach({"node-c", Ip("192.168.0.3"), 7471});
  std::string error;
  ASSERT_TRUE(c->Start(loop, heard, &error)) << error;
  const LinkId link = c->Dial(a.endpoint());
  ASSERT_NE(link, kNoLink);
  wire::CmMessage m{};
  m.src_ip = client.ip();
  m.dst_ip = server.ip();
  m.src_comm = id;
  m.dst_port = 7000;
  m.ps = RDMA_PS_TCP;
  m.qp_type = IBV_QPT_RC;
  m.qpn = 0x33;
  c->Send(link, wire::Type::kCm, 0, static_cast<uint16_t>(wire::CmKind::kReq), {{&m, sizeof(m)}});
  m.dst_comm = child;  // the connection's ids, which a router on the path could know
  c->Send(link, wire::Type::kCm, 0, static_cast<uint16_t>(wire::CmKind::kDreq), {{&m, sizeof(m)}});
  for (int i = 0; i < 20; ++i) loop.RunOnce(10);
  EXPECT_FALSE(server.Next(300)) << "a forged message reached the pod";
  // The request in the name of node-b's pod is counted (the disconnect names an id of a
  // pod here and is dropped later, as an answer from a node the exchange is not with).
  const std::string text = ff::test::HttpRequest(a.MetricsPort(), "GET", "/metrics").body;
  EXPECT_NE(
      text.find(
          "freeflow_router_peer_refused_total{request=\"rdma_cm\",reason=\"not_its_pod\"} 1\n"),
      std::string::npos)
      << text;
  // The connection is intact: its real peer still ends it.
  EXPECT_EQ(client.Disconnect(id), 0);
  server.Expect(RDMA_CM_EVENT_DISCONNECTED);
  client.Expect(RDMA_CM_EVENT_DISCONNECTED);
}

// A router of node-p the test plays, its pod 10.7.0.1 the active side of an rdma_cm
// connection to a pod of node-a, on its own loop; destroying it breaks its links, and a
// successor attaches at the same endpoint.
class CmPeerRouter final : public NodeTransport::Handler {
 public:
  static constexpr uint32_t kPod = 0x0a070001;  // 10.7.0.1
  static constexpr uint32_t kComm = 0x9001;

  explicit CmPeerRouter(LoopbackNetwork& net) {
    EXPECT_EQ(loop_.Init(), 0);
    transport_ = net.Attach({"node-p", Ip("192.168.0.7"), 7471});
    std::string error;
    EXPECT_TRUE(transport_->Start(loop_, *this, &error)) << error;
  }
  Verdict OnMessage(LinkId link, const NodeMessage& m) override {
    if (m.type == wire::Type::kCm) {
      answered_on_ = link;  // node-a's router answers on the link it dialled
      wire::CmMessage c{};
      std::memcpy(&c, m.body, sizeof(c));
      cm_.push_back({static_cast<wire::CmKind>(m.flags), c});
    }
    if (m.type == wire::Type::kResume) {
      resume_link_ = link;
      transport_->Send(link, wire::Type::kResumed, 0, 0, {});  // it held no channel
    }
    return Verdict::kConsumed;
  }
  void OnDrained(LinkId) override {}
  void OnLinkDown(LinkId, const std::string&) override {}

  // Sends CM message `kind` from its pod to `to` at node-a's router, on the link it dialled.
  void SendCm(const TestRouter& to, wire::CmKind kind, const wire::CmMessage& m) {
    const LinkId link = transport_->Dial(to.endpoint());
    transport_->Send(link, wire::Type::kCm, 0, static_cast<uint16_t>(kind), {{&m, sizeof(m)}});
    loop_.RunOnce(10);
  }
  // Says on both links with `to`'s router that it is being replaced.
  void Announce(const TestRouter& to) {
    transport_->Send(transport_->Dial(to.endpoint()), wire::Type::kHandingOver, 0, 0, {});
    transport_->Send(answered_on_, wire::Type::kHandingOver, 0, 0, {});
    loop_.RunOnce(10);
  }
  // The first CM message of `kind` heard (within 3 s), or nullopt.
  std::optional<wire::CmMessage> Heard(wire::CmKind kind) {
    std::optional<wire::CmMessage> found;
    WaitFor([&] {
      loop_.RunOnce(5);
      for (const auto& [k, m] : cm_)
        if (k == kind) found = m;
      return found.has_value();
    });
    return found;
  }
  LinkId resume_link() const { return resume_link_; }
  void Idle(int ms) {
    for (int i = 0; i < ms / 10; ++i) loop_.RunOnce(10);
  }

 private:
  EventLoop loop_;
  std::unique_ptr<NodeTransport> transport_;
  std::vector<std::pair<wire::CmKind, wire::CmMessage>> cm_;
  LinkId resume_link_ = kNoLink;
  LinkId answered_on_ = kNoLink;
};

// An rdma_cm connection between a pod of node-a and one of node-p, whose router is
// replaced: node-a's router parks the id when the announced link drops (the pod hears
// nothing), holds the DREQ its pod's disconnect makes meanwhile, and sends it to the
// successor once it reaches it; the successor's DREP ends the disconnect as usual. A copy
// of the REQ that came before makes no second request.
TEST(CmResumeTest, ADisconnectWhileAPeerRouterIsReplacedReachesItsSuccessor) {
  LoopbackNetwork net;
  FakeCluster cluster;
  TestRouter::Options o{"node-a", Ip("192.168.0.1"), &net, &cluster};
  TestRouter a{o};
  cluster.Set(CmPeerRouter::kPod, {"node-p", Ip("192.168.0.7"), 7471});
  CmPod server{a, Ip("10.1.0.1")};
  ASSERT_EQ(server.Hello(), 0);
  ASSERT_EQ(server.Open(kCh), 0);
  const uint32_t l = server.CreateId(RDMA_PS_TCP, 0x5e);
  ASSERT_EQ(server.Bind(l, 0, 7000), 0);
  ASSERT_EQ(server.Listen(l), 0);
  auto old = std::make_unique<CmPeerRouter>(net);
  wire::CmMessage req{};
  req.src_ip = CmPeerRouter::kPod;
  req.dst_ip = server.ip();
  req.src_comm = CmPeerRouter::kComm;
  req.src_port = 40000;
  req.dst_port = 7000;
  req.ps = RDMA_PS_TCP;
  req.qp_type = IBV_QPT_RC;
  req.qpn = 0x33;
  old->SendCm(a, wire::CmKind::kReq, req);
  const uint32_t child = server.Expect(RDMA_CM_EVENT_CONNECT_REQUEST).r.id;
  old->SendCm(a, wire::CmKind::kReq, req);  // sent again, as across a replacement
  ASSERT_EQ(server.Accept(child, 0xacc, 0x22, ""), 0);
  const std::optional<wire::CmMessage> rep = old->Heard(wire::CmKind::kRep);
  ASSERT_TRUE(rep.has_value());
  wire::CmMessage rtu = req;
  rtu.dst_comm = rep->src_comm;
  old->SendCm(a, wire::CmKind::kRtu, rtu);
  server.Expect(RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_FALSE(server.Next(100).has_value()) << "one request, not two";

  old->Announce(a);
  old->Idle(50);
  old.reset();  // its links break
  EXPECT_FALSE(server.Next(200).has_value()) << "a parked id ends nothing";
  ASSERT_EQ(server.Disconnect(child), 0);  // its DREQ waits for the successor
  CmPeerRouter successor(net);
  const std::optional<wire::CmMessage> dreq = successor.Heard(wire::CmKind::kDreq);
  ASSERT_TRUE(dreq.has_value()) << "the held DREQ reached the successor";
  EXPECT_NE(successor.resume_link(), kNoLink) << "after node-a resumed";
  EXPECT_EQ(dreq->dst_comm, CmPeerRouter::kComm);
  wire::CmMessage drep = req;
  drep.dst_comm = dreq->src_comm;
  successor.SendCm(a, wire::CmKind::kDrep, drep);
  server.Expect(RDMA_CM_EVENT_DISCONNECTED);
  EXPECT_EQ(server.Destroy(child), 0);
}

// A polling window the CmSpinTest cases set is 10 ms of runnable time; with none, the
// router is runnable only for the few wake-ups of the exchange, a few hundred microseconds
// alone, and a few milliseconds when make test's load keeps it waiting for a CPU (4.8 ms
// was seen). Under this bound, no window was opened.
constexpr uint64_t kNoWindowNs = 7'000'000;

// An rdma_cm event between pods of this node keeps the router polling for --cm-spin-us
// (here its longest, 10 ms, with --spin-us 0): the program that reads it acts next, here.
// Awake: runnable, as its schedstat counts it (see below).
TEST(CmSpinTest, AnEventBetweenPodsOfThisNodeKeepsTheRouterPolling) {
  for (const uint32_t cm_spin_us : {10'000u, 0u}) {
    TestRouter::Options o;
    o.spin_us = 0;
    o.cm_spin_us = cm_spin_us;
    TestRouter router(o);
    CmPod server(router, Ip("10.1.0.1")), client(router, Ip("10.1.0.2"));
    for (CmPod* p : {&server, &client}) {
      ASSERT_EQ(p->Hello(), 0);
      ASSERT_EQ(p->Open(kCh), 0);
    }
    const uint32_t id = client.CreateId(RDMA_PS_TCP, 0xc1);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    const uint64_t before = router.AwakeNs();
    ASSERT_EQ(client.Resolve(id, server.ip(), 7000), 0);
    client.Expect(RDMA_CM_EVENT_ADDR_RESOLVED);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    if (cm_spin_us != 0)
      EXPECT_GE(router.AwakeNs() - before, 5'000'000u) << "no window after a local event";
    else
      EXPECT_LT(router.AwakeNs() - before, kNoWindowNs) << "a window with --cm-spin-us 0";
  }
}

// A server pod on node-a and a client pod on node-b, their routers polling `spin_us` after
// an answer and `cm_spin_us` after a local rdma_cm event.
struct TwoNodes {
  static TestRouter::Options On(const char* node, const char* host, LoopbackNetwork* net,
                                FakeCluster* cluster, uint32_t spin_us, uint32_t cm_spin_us) {
    TestRouter::Options o{node, Ip(host), net, cluster};
    o.spin_us = spin_us;
    o.cm_spin_us = cm_spin_us;
    return o;
  }
  TwoNodes(uint32_t spin_us, uint32_t cm_spin_us)
      : a(On("node-a", "192.168.0.1", &net, &cluster, spin_us, cm_spin_us)),
        b(On("node-b", "192.168.0.2", &net, &cluster, spin_us, cm_spin_us)) {}
  void Start() {
    for (CmPod* p : {&server, &client}) {
      ASSERT_EQ(p->Hello(), 0);
      ASSERT_EQ(p->Open(kCh), 0);
    }
  }
  // How long the client's router is awake over a CONNECT of `id` (a resolved client id)
  // that node-a rejects (nobody listens), and 30 ms after.
  uint64_t AwakeOverRejectedConnect(uint32_t id) {
    const uint64_t before = b.AwakeNs();
    EXPECT_EQ(client.Connect(id, 0x11, ""), 0);
    EXPECT_EQ(client.Expect(RDMA_CM_EVENT_REJECTED).r.status, kRejInvalidServiceId);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    return b.AwakeNs() - before;
  }
  LoopbackNetwork net;
  FakeCluster cluster;
  TestRouter a, b;
  CmPod server{a, Ip("10.1.0.1")}, client{b, Ip("10.2.0.1")};
};

// Nor does one about a connection to a pod of another node keep it polling: its next step
// is a round trip between the routers away (ADDR_RESOLVED, then REJECTED: nobody listens).
TEST(CmSpinTest, AnEventAboutAConnectionToAnotherNodeOpensNoWindow) {
  TwoNodes n(0, 10'000);
  ASSERT_NO_FATAL_FAILURE(n.Start());
  TestRouter& b = n.b;
  CmPod &server = n.server, &client = n.client;
  const uint32_t id = client.CreateId(RDMA_PS_TCP, 0xc1);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const uint64_t before = b.AwakeNs();
  ASSERT_EQ(client.Resolve(id, server.ip(), 7000), 0);
  client.Expect(RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_EQ(client.ResolveRoute(id), 0);
  client.Expect(RDMA_CM_EVENT_ROUTE_RESOLVED);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_LT(b.AwakeNs() - before, kNoWindowNs) << "a window after resolving another node's pod";
  EXPECT_LT(n.AwakeOverRejectedConnect(id), kNoWindowNs) << "a window after another node's REJ";
}

// A request that leaves its pod waiting for another node opens no polling window
// (EventLoop::NoteRemoteWait), nor does an event about a connection to another node: with
// --spin-us and --cm-spin-us at their longest (10 ms), the client's router stays awake next
// to no time after a cross-node CONNECT (answered by a REJ at once, whose REJECTED event is
// about a connection to node-a: nobody listens), and a whole window after a request the pod
// follows up at once (RESOLVE_ROUTE). Awake: runnable, as its schedstat counts it, so that
// a machine busy with other tests (which leaves the polling thread part of a CPU) changes
// nothing.
TEST(CmSpinTest, ACrossNodeConnectOpensNoPollingWindow) {
  TwoNodes n(10'000, 10'000);
  ASSERT_NO_FATAL_FAILURE(n.Start());
  TestRouter& b = n.b;
  CmPod &server = n.server, &client = n.client;
  const uint32_t id = client.CreateId(RDMA_PS_TCP, 0xc1);
  ASSERT_EQ(client.Resolve(id, server.ip(), 7000), 0);
  client.Expect(RDMA_CM_EVENT_ADDR_RESOLVED);
  const uint64_t before = b.AwakeNs();
  ASSERT_EQ(client.ResolveRoute(id), 0);
  client.Expect(RDMA_CM_EVENT_ROUTE_RESOLVED);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_GE(b.AwakeNs() - before, 5'000'000u) << "no window after a local request";
  EXPECT_LT(n.AwakeOverRejectedConnect(id), kNoWindowNs)
      << "the router polled while the REQ travelled";
}
}  // namespace
}  // namespace ff::router::test
