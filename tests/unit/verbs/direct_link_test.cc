// A QP whose peer is on another node, over a direct connection between the two processes
// (docs/direct-path.md): two pods in this process, each with its fake router, and the test
// playing what the two real routers do. Pod a's router answers the connect with a new
// connection to a listener the test made on loopback; the test takes the connection as pod
// b's router would (its sealed hello opened and checked) and hands it to pod b with the
// channel events. Then every kind of work request runs between the two QPs with no router
// in the data path, and the receiving library checks each access against its own MR table.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <thread>

#include "freeflow/direct_stream.h"
#include "freeflow/frame_seal.h"
#include "direct/direct.h"
#include "pod.h"

namespace fftest {
namespace {

constexpr uint32_t kLoopback = 0x7f000001;
constexpr uint64_t kConn = 0x1234567890abcdefull;
constexpr uint32_t kChanAB = 7;  // a's QP -> b's QP
constexpr uint32_t kChanBA = 9;  // b's QP -> a's QP
constexpr uint32_t kPodIp = 0x0af40001;  // what the fake routers tell both pods

// Something on the path between two pods' processes: relays the bytes of one direct
// connection both ways, and may change what goes from a to b (`tamper`, called with each
// chunk it read from a, in order; the hello has been consumed before).
class Middle {
 public:
  using Tamper = std::function<std::vector<char>(std::vector<char>)>;
  explicit Middle(Tamper tamper) : tamper_(std::move(tamper)) {}
  ~Middle() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Takes a's side; returns the end to hand to b (a second loopback connection through
  // `listener`, which the test owns).
  ff::UniqueFd Start(ff::UniqueFd a_side, int listener) {
    a_ = std::move(a_side);
    sockaddr_in sa{};
    socklen_t len = sizeof(sa);
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len);
    ff::UniqueFd b_end(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (::connect(b_end.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) return {};
    b_.reset(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
    thread_ = std::thread([this] { Run(); });
    return b_end;
  }

 private:
  void Run() {
    char buf[65536];
    while (!stop_) {
      pollfd p[2] = {{a_.get(), POLLIN, 0}, {b_.get(), POLLIN, 0}};
      if (::poll(p, 2, 20) <= 0) continue;
      if (p[0].revents != 0) {
        const ssize_t n = ::recv(a_.get(), buf, sizeof(buf), 0);
        if (n <= 0) break;
        const std::vector<char> out = tamper_(std::vector<char>(buf, buf + n));
        if (::send(b_.get(), out.data(), out.size(), MSG_NOSIGNAL) < 0) break;
      }
      if (p[1].revents != 0) {
        const ssize_t n = ::recv(b_.get(), buf, sizeof(buf), 0);
        if (n <= 0 || ::send(a_.get(), buf, static_cast<size_t>(n), MSG_NOSIGNAL) < 0) break;
      }
    }
    ::shutdown(a_.get(), SHUT_RDWR);
    ::shutdown(b_.get(), SHUT_RDWR);
  }

  Tamper tamper_;
  ff::UniqueFd a_, b_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

class DirectLink : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ff::NewDirectSecret(secret));
    listener.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(listener);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(kLoopback);
    ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
    ASSERT_EQ(::listen(listener.get(), 4), 0);
    socklen_t len = sizeof(sa);
    ASSERT_EQ(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&sa), &len), 0);
    port = ntohs(sa.sin_port);
  }

  ff::proto::ConnectReply Reply(uint32_t peer_qpn, uint32_t chan, bool fresh) {
    ff::proto::ConnectReply c{};
    c.peer_qpn = peer_qpn;
    c.peer_ip = htonl(kLoopback);
    c.peer_lid = 2;
    c.peer_qp_type = IBV_QPT_RC;
    c.flags = ff::proto::kConnectDirect | (fresh ? ff::proto::kConnectDirectNew : 0);
    c.direct_chan = chan;
    c.direct_port = fresh ? port : 0;
    c.direct_seal = static_cast<uint8_t>(ff::SealMode::kEncrypt);
    c.direct_conn = kConn;
    std::memcpy(c.direct_secret, secret, sizeof(secret));
    return c;
  }

  ff::proto::Event Channel(uint32_t qpn, uint32_t src_qpn, uint32_t chan) {
    ff::proto::Event e{};
    e.type = ff::proto::EventType::kDirectChannel;
    e.qpn = qpn;
    e.ring = 0;
    e.src_ip = kPodIp;
    e.src_qpn = src_qpn;
    e.chan = chan;
    e.conn = kConn;
    return e;
  }

  // What pod b's router does when pod a dials: accepts, opens the hello, hands it over.
  // With `middle`, b is handed one end of a second loopback connection instead, and
  // `middle` relays between the two, as something on the path between the pods would.
  void AcceptForB(Middle* middle = nullptr) {
    pollfd p{listener.get(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 5000), 1);
    ff::UniqueFd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    ASSERT_TRUE(conn);
    char frame[ff::direct::kHelloFrameBytes];
    ASSERT_EQ(::recv(conn.get(), frame, sizeof(frame), MSG_WAITALL),
              static_cast<ssize_t>(sizeof(frame)));
    ff::direct::Hello hello{};
    ASSERT_TRUE(ff::OpenHello(secret, ff::SealMode::kEncrypt, frame, &hello));
    EXPECT_EQ(hello.magic, ff::direct::kMagic);
    EXPECT_EQ(hello.conn, kConn);
    EXPECT_EQ(hello.src_ip, kPodIp);
    EXPECT_EQ(hello.dest_ip, kLoopback);
    ff::proto::Event e{};
    e.type = ff::proto::EventType::kDirectConn;
    e.src_ip = kPodIp;
    e.conn = kConn;
    e.seal = static_cast<uint32_t>(ff::SealMode::kEncrypt);
    std::memcpy(e.secret, secret, sizeof(secret));
    if (middle == nullptr) return b.router.SendEvent(e, conn.get());
    ff::UniqueFd b_end = middle->Start(std::move(conn), listener.get());
    ASSERT_TRUE(b_end);
    b.router.SendEvent(e, b_end.get());
  }

  // Both QPs connected, each way its own channel on the one connection.
  void Up(const QpOptions& o = {}, Middle* middle = nullptr) {
    qa = a.CreateQp(o);
    qb = b.CreateQp(o);
    ASSERT_NE(qa, nullptr);
    ASSERT_NE(qb, nullptr);
    b.router.SendEvent(Channel(qb->qp_num, qa->qp_num, kChanAB));
    a.router.AnswerDirect(qa->qp_num, Reply(qb->qp_num, kChanAB, true));
    ASSERT_EQ(a.Connect(qa, qb->qp_num, o), 0);
    AcceptForB(middle);
    a.router.SendEvent(Channel(qa->qp_num, qb->qp_num, kChanBA));
    ConnectB(o);
  }
  // b's QP connects to a's on the connection b was handed, as channel kChanBA.
  void ConnectB(const QpOptions& o) {
    b.router.AnswerDirect(qb->qp_num, Reply(qa->qp_num, kChanBA, false));
    // b takes the connection on its event thread; its connect needs it there.
    int rc = ECONNRESET;
    for (int i = 0; i < 500 && rc != 0; ++i) {
      ibv_qp_attr attr{};
      ibv_qp_init_attr init{};
      ibv_query_qp(qb, &attr, 0, &init);
      if (attr.qp_state != IBV_QPS_INIT) break;
      rc = b.Connect(qb, qa->qp_num, o);
      if (rc != 0) ::usleep(10'000);
    }
    ASSERT_EQ(rc, 0);
    // b's end is handed over on its event thread (its channel event may come first).
    for (int i = 0; i < 500 && !Ready(b); ++i) ::usleep(2000);
    ASSERT_TRUE(Ready(b));
  }
  // Waits (at most kWaitLimit) until pod `p` reported a connection ended (DirectEnded).
  static void WaitForEnded(Pod& p) {
    const auto deadline = Clock::now() + kWaitLimit;
    while (p.router.direct_ended().empty() && Clock::now() < deadline) ::usleep(1000);
  }
  static bool Ready(Pod& p) {
    ff::verbs::DirectSet* set = ff::verbs::DirectOf(p.session);
    std::lock_guard<std::mutex> g(set->mu);
    return set->conns.size() == 1 && set->conns.begin()->second->ready.load();
  }

  uint8_t secret[ff::kDirectSecretBytes];
  ff::UniqueFd listener;
  uint16_t port = 0;
  Pod a, b;
  ibv_qp* qa = nullptr;
  ibv_qp* qb = nullptr;
};

TEST_F(DirectLink, SendsGoBothWaysOverOneConnectionWithoutARouter) {
  Up();
  Buffer src(a.pd, 100000), dst(b.pd, 100000, IBV_ACCESS_LOCAL_WRITE);
  for (size_t i = 0; i < src.size(); ++i) src.data()[i] = static_cast<char>(i * 13);
  ASSERT_EQ(PostRecv(qb, dst.Sge(0, 100000), 21), 0);
  ASSERT_EQ(PostSend(qa, IBV_WR_SEND, src.Sge(0, 100000), 11), 0);
  auto rx = PollN(b.cq, 1);
  ASSERT_EQ(rx.size(), 1u);
  EXPECT_EQ(rx[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(rx[0].wr_id, 21u);
  EXPECT_EQ(rx[0].byte_len, 100000u);
  EXPECT_EQ(rx[0].src_qp, qa->qp_num);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), 100000), 0);
  auto tx = PollN(a.cq, 1);
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(tx[0].wr_id, 11u);
  // And back, on the other channel of the same connection.
  Buffer back(b.pd, 64), land(a.pd, 64, IBV_ACCESS_LOCAL_WRITE);
  std::memcpy(back.data(), "pong", 5);
  ASSERT_EQ(PostRecv(qa, land.Sge(0, 64), 22), 0);
  ASSERT_EQ(PostSend(qb, IBV_WR_SEND, back.Sge(0, 5), 12), 0);
  auto rx2 = PollN(a.cq, 1);
  ASSERT_EQ(rx2.size(), 1u);
  EXPECT_EQ(rx2[0].wr_id, 22u);
  EXPECT_EQ(rx2[0].status, IBV_WC_SUCCESS);
  EXPECT_STREQ(land.data(), "pong");
  auto tx2 = PollN(b.cq, 1);
  ASSERT_EQ(tx2.size(), 1u);
  EXPECT_EQ(tx2[0].wr_id, 12u);
  EXPECT_EQ(tx2[0].status, IBV_WC_SUCCESS);
  EXPECT_TRUE(a.router.direct_ended().empty());
}

TEST_F(DirectLink, OneSidedOperationsProgressWithoutTheTargetCallingIn) {
  Up();
  const int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                     IBV_ACCESS_REMOTE_ATOMIC;
  Buffer target(b.pd, 1 << 20, remote);
  Buffer local(a.pd, 1 << 20, IBV_ACCESS_LOCAL_WRITE);
  for (size_t i = 0; i < local.size(); ++i) local.data()[i] = static_cast<char>(i * 7 + 1);
  const auto raddr = reinterpret_cast<uint64_t>(target.data());
  // b never polls: its event thread executes what arrives.
  ASSERT_EQ(PostSend(qa, IBV_WR_RDMA_WRITE, local.Sge(0, 1 << 20), 1, raddr, target.mr()->rkey), 0);
  auto w = PollN(a.cq, 1);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(local.data(), target.data(), 1 << 20), 0);
  // READ it back elsewhere.
  Buffer readback(a.pd, 1 << 20, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(PostSend(qa, IBV_WR_RDMA_READ, readback.Sge(0, 1 << 20), 2, raddr, target.mr()->rkey),
            0);
  auto r = PollN(a.cq, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(readback.data(), target.data(), 1 << 20), 0);
  // An atomic on the first word.
  uint64_t word = 5;
  std::memcpy(target.data(), &word, 8);
  ASSERT_EQ(PostAtomic(qa, IBV_WR_ATOMIC_FETCH_AND_ADD, readback.Sge(0, 8), 3, raddr,
                       target.mr()->rkey, 10, 0),
            0);
  auto f = PollN(a.cq, 1);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].status, IBV_WC_SUCCESS);
  uint64_t old = 0;
  std::memcpy(&old, readback.data(), 8);
  EXPECT_EQ(old, 5u);
  std::memcpy(&word, target.data(), 8);
  EXPECT_EQ(word, 15u);
}

TEST_F(DirectLink, ADiallerThatNeverPollsServesWhatItsPeerSends) {
  // b's QP connected first, on a connection a's router offered a: a hears of b's channel
  // before it has dialled. Its event thread takes that event and sleeps again, with no
  // connection to watch yet; a then dials from the program's thread. a never polls, so only
  // its event thread can execute what b sends (perftest's passive side of ib_atomic_bw).
  qa = a.CreateQp();
  qb = b.CreateQp();
  ASSERT_NE(qa, nullptr);
  ASSERT_NE(qb, nullptr);
  a.router.SendEvent(Channel(qa->qp_num, qb->qp_num, kChanBA));
  auto installed = [&] {
    ff::verbs::DirectSet* set = ff::verbs::DirectOf(a.session);
    std::lock_guard<std::mutex> g(set->mu);
    auto it = set->conns.find(kConn);
    if (it == set->conns.end()) return false;
    std::lock_guard<std::mutex> c(it->second->chan_mu);
    return it->second->in.count(kChanBA) == 1;
  };
  for (int i = 0; i < 500 && !installed(); ++i) ::usleep(2000);
  ASSERT_TRUE(installed());
  ::usleep(20'000);  // a's event thread is back in its wait
  b.router.SendEvent(Channel(qb->qp_num, qa->qp_num, kChanAB));
  a.router.AnswerDirect(qa->qp_num, Reply(qb->qp_num, kChanAB, true));
  ASSERT_EQ(a.Connect(qa, qb->qp_num), 0);
  AcceptForB();
  ConnectB({});
  Buffer target(a.pd, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  Buffer local(b.pd, 64, IBV_ACCESS_LOCAL_WRITE);
  uint64_t word = 5;
  std::memcpy(target.data(), &word, 8);
  ASSERT_EQ(PostAtomic(qb, IBV_WR_ATOMIC_CMP_AND_SWP, local.Sge(0, 8), 1,
                       reinterpret_cast<uint64_t>(target.data()), target.mr()->rkey, 5, 9),
            0);
  auto wcs = PollN(b.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  uint64_t old = 0;
  std::memcpy(&old, local.data(), 8);
  EXPECT_EQ(old, 5u);
  std::memcpy(&word, target.data(), 8);
  EXPECT_EQ(word, 9u);
}

TEST_F(DirectLink, AConnectAnsweredBeforeTheEventsOfItsConnectionWaitsForThem) {
  // b's router told b of the connection a dialled (kDirectChannel, kDirectConn) before it
  // answered b's connect with it, but b's event thread has not taken those events yet: the
  // answer comes first. b's connect succeeds all the same and its QP works once they came.
  qa = a.CreateQp();
  qb = b.CreateQp();
  ASSERT_NE(qa, nullptr);
  ASSERT_NE(qb, nullptr);
  a.router.AnswerDirect(qa->qp_num, Reply(qb->qp_num, kChanAB, true));
  ASSERT_EQ(a.Connect(qa, qb->qp_num), 0);
  b.router.AnswerDirect(qb->qp_num, Reply(qa->qp_num, kChanBA, false));
  ASSERT_EQ(b.Connect(qb, qa->qp_num), 0);
  b.router.SendEvent(Channel(qb->qp_num, qa->qp_num, kChanAB));
  AcceptForB();
  a.router.SendEvent(Channel(qa->qp_num, qb->qp_num, kChanBA));
  Buffer back(b.pd, 64), land(a.pd, 64, IBV_ACCESS_LOCAL_WRITE);
  std::memcpy(back.data(), "pong", 5);
  ASSERT_EQ(PostRecv(qa, land.Sge(0, 64), 22), 0);
  ASSERT_EQ(PostSend(qb, IBV_WR_SEND, back.Sge(0, 5), 12), 0);
  auto rx = PollN(a.cq, 1);
  ASSERT_EQ(rx.size(), 1u);
  EXPECT_EQ(rx[0].status, IBV_WC_SUCCESS);
  EXPECT_STREQ(land.data(), "pong");
  auto tx = PollN(b.cq, 1);
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].status, IBV_WC_SUCCESS);
}

TEST_F(DirectLink, AnAccessBeyondItsRightsFailsThatQpOnly) {
  Up();
  Buffer target(b.pd, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  Buffer local(a.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
  const auto raddr = reinterpret_cast<uint64_t>(target.data());
  std::memset(target.data(), 'x', 4096);
  std::memset(local.data(), 'y', 4096);
  // Write to a region shared for reads only: refused by b's own check, b's memory as it was.
  ASSERT_EQ(PostSend(qa, IBV_WR_RDMA_WRITE, local.Sge(0, 4096), 1, raddr, target.mr()->rkey), 0);
  auto w = PollN(a.cq, 1);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(target.data()[0], 'x');
  EXPECT_EQ(target.data()[4095], 'x');
  EXPECT_EQ(StateOf(qa), IBV_QPS_ERR);
}

TEST_F(DirectLink, ADeadConnectionFailsItsQpsAndIsReported) {
  Up();
  // The connection breaks (a peer process that died, a reset): cut here from b's side.
  {
    ff::verbs::DirectSet* set = ff::verbs::DirectOf(b.session);
    std::lock_guard<std::mutex> g(set->mu);
    ASSERT_EQ(set->conns.size(), 1u);
    ::shutdown(set->conns.begin()->second->stream->fd(), SHUT_RDWR);
  }
  // a's event thread sees it end: the QP fails as one whose peer died, and the router hears.
  WaitForEnded(a);
  const auto ended = a.router.direct_ended();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].conn, kConn);
  Buffer local(a.pd, 64, IBV_ACCESS_LOCAL_WRITE);
  PostSend(qa, IBV_WR_SEND, local.Sge(0, 8), 5);
  auto wcs = PollN(a.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_NE(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(StateOf(qa), IBV_QPS_ERR);
}

TEST_F(DirectLink, AnAlteredFrameEndsTheConnectionAndLandsNothing) {
  std::atomic<int> chunks{0};
  Middle middle([&](std::vector<char> bytes) {
    // The first frame after the hello: flip one bit of its body.
    if (chunks++ == 0 && bytes.size() > 40) bytes[40] ^= 1;
    return bytes;
  });
  Up({}, &middle);
  Buffer src(a.pd, 4096), dst(b.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
  std::memset(src.data(), 'a', 4096);
  std::memset(dst.data(), 'z', 4096);
  ASSERT_EQ(PostRecv(qb, dst.Sge(0, 4096), 21), 0);
  ASSERT_EQ(PostSend(qa, IBV_WR_SEND, src.Sge(0, 4096), 11), 0);
  // b refuses the frame and ends the connection: its QP fails as one whose peer died.
  auto rx = PollN(b.cq, 1);
  ASSERT_EQ(rx.size(), 1u);
  EXPECT_EQ(rx[0].wr_id, 21u);
  EXPECT_NE(rx[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(dst.data()[0], 'z');
  EXPECT_EQ(dst.data()[4095], 'z');
  WaitForEnded(b);
  ASSERT_EQ(b.router.direct_ended().size(), 1u);
  EXPECT_EQ(b.router.direct_ended()[0].error, static_cast<uint32_t>(EPROTO));
  // a's send does not succeed either.
  auto tx = PollN(a.cq, 1);
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_NE(tx[0].status, IBV_WC_SUCCESS);
}

TEST_F(DirectLink, AReplayedFrameEndsTheConnection) {
  std::vector<char> first;
  std::atomic<int> chunks{0};
  Middle middle([&](std::vector<char> bytes) {
    // The first chunk again, right behind itself: its frames a second time.
    if (chunks++ == 0) {
      first = bytes;
      bytes.insert(bytes.end(), first.begin(), first.end());
    }
    return bytes;
  });
  Up({}, &middle);
  Buffer src(a.pd, 64), dst(b.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
  std::memset(src.data(), 'a', 64);
  ASSERT_EQ(PostRecv(qb, dst.Sge(0, 64), 21), 0);
  ASSERT_EQ(PostRecv(qb, dst.Sge(64, 64), 22), 0);
  ASSERT_EQ(PostSend(qa, IBV_WR_SEND, src.Sge(0, 64), 11), 0);
  // The message arrives once; its replay ends the connection.
  auto rx = PollN(b.cq, 2);
  ASSERT_EQ(rx.size(), 2u);
  EXPECT_EQ(rx[0].wr_id, 21u);
  EXPECT_EQ(rx[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(rx[1].wr_id, 22u);
  EXPECT_NE(rx[1].status, IBV_WC_SUCCESS);  // flushed: the QP failed, no second copy
  WaitForEnded(b);
  ASSERT_EQ(b.router.direct_ended().size(), 1u);
  EXPECT_EQ(b.router.direct_ended()[0].error, static_cast<uint32_t>(EPROTO));
}

}  // namespace
}  // namespace fftest
