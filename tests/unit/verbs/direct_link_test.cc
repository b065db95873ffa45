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
#include <memory>
#include <thread>
#include <vector>

#include "direct/direct.h"
#include "freeflow/direct_stream.h"
#include "freeflow/frame_seal.h"
#include "freeflow/tunables.h"
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

// Atomic `op` from `qp` on the first word of `target`, which holds `before`: it completes on
// `cq`, returns `before` into `local` and leaves `after` in the word.
void ExpectAtomic(ibv_qp* qp, ibv_cq* cq, ibv_wr_opcode op, const Buffer& local,
                  const Buffer& target, uint64_t before, uint64_t compare_add, uint64_t swap,
                  uint64_t after) {
  std::memcpy(target.data(), &before, 8);
  ASSERT_EQ(PostAtomic(qp, op, local.Sge(0, 8), 3, reinterpret_cast<uint64_t>(target.data()),
                       target.mr()->rkey, compare_add, swap),
            0);
  auto wcs = PollN(cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  uint64_t word = 0;
  std::memcpy(&word, local.data(), 8);
  EXPECT_EQ(word, before);
  std::memcpy(&word, target.data(), 8);
  EXPECT_EQ(word, after);
}

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

  // What b's router says when channel `chan` to its QP `qpn` closes.
  static ff::proto::Event ChannelGone(uint32_t qpn, uint32_t chan) {
    ff::proto::Event e{};
    e.type = ff::proto::EventType::kDirectChannelGone;
    e.qpn = qpn;
    e.chan = chan;
    e.conn = kConn;
    return e;
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
  // qa in pod a and qb in pod b, not connected yet.
  void CreateBoth(const QpOptions& o = {}) {
    qa = a.CreateQp(o);
    qb = b.CreateQp(o);
    ASSERT_NE(qa, nullptr);
    ASSERT_NE(qb, nullptr);
  }

  void Up(const QpOptions& o = {}, Middle* middle = nullptr) {
    ASSERT_NO_FATAL_FAILURE(CreateBoth(o));
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

  // In a's place, a hostile process: it holds the connection's secret (its router handed it
  // over, as to any dialler) and sends whatever frames it likes, sealed. b has QP qb, which
  // takes channel kChanAB (as b's router announced it), and a channel kChanBA of its own to
  // the hostile process's QP kHostileQpn on the same connection.
  static constexpr uint32_t kHostileQpn = 0x777;
  void UpHostile() {
    qb = b.CreateQp();
    ASSERT_NE(qb, nullptr);
    b.router.SendEvent(Channel(qb->qp_num, kHostileQpn, kChanAB));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(kLoopback);
    ff::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
    const ff::direct::Hello hello{ff::direct::kMagic, ff::direct::kVersion, kConn, kPodIp,
                                  kLoopback};
    char frame[ff::direct::kHelloFrameBytes];
    ASSERT_TRUE(ff::SealHello(secret, ff::SealMode::kEncrypt, hello, frame));
    ASSERT_EQ(::send(fd.get(), frame, sizeof(frame), MSG_NOSIGNAL),
              static_cast<ssize_t>(sizeof(frame)));
    AcceptForB();
    hostile = std::make_unique<ff::DirectStream>(std::move(fd));
    ff::DirectStream::Setup setup;
    setup.secret = &secret;
    setup.role = ff::DirectRole::kDialler;
    setup.first_tx = 1;  // the hello was frame 0
    ASSERT_TRUE(hostile->Init(setup));
    hostile->set_send_limit(8u << 20);
    for (int i = 0; i < 500 && !Ready(b); ++i) ::usleep(2000);
    ASSERT_TRUE(Ready(b));
    b.router.AnswerDirect(qb->qp_num, Reply(kHostileQpn, kChanBA, false));
    ASSERT_EQ(b.Connect(qb, kHostileQpn, {}), 0);
  }
  // Seals one frame into the hostile stream and writes it whole (bounded by kWaitLimit).
  bool HostileSends(ff::direct::Type type, uint32_t chan, const void* body, size_t len) {
    const iovec v{const_cast<void*>(body), len};
    if (hostile->PutFrame(type, chan, 0, &v, 1) != ff::DirectStream::Put::kOk) return false;
    const auto deadline = Clock::now() + kWaitLimit;
    while (hostile->unsent() > 0 && Clock::now() < deadline) {
      if (!hostile->Flush()) return false;
      if (hostile->unsent() > 0) ::usleep(1000);
    }
    return hostile->unsent() == 0;
  }
  // A whole SEND message of `len` bytes of `fill` from the hostile QP, as a record.
  std::vector<char> SendRecord(size_t len, char fill) {
    std::vector<char> rec(sizeof(ff::RecordHeader) + sizeof(ff::ProxyRequest) + len, fill);
    ff::RecordHeader h{};
    h.kind = ff::kRecSend;
    h.flags = ff::kRecFirst | ff::kRecLast;
    h.msg_len = static_cast<uint32_t>(len);
    h.src_qpn = kHostileQpn;
    h.src_ip = htonl(kPodIp);
    h.frag_len = static_cast<uint32_t>(sizeof(ff::ProxyRequest) + len);
    h.total = ff::RecordBytes(h.frag_len);
    ff::ProxyRequest op{};
    op.length = static_cast<uint32_t>(len);
    op.opcode = IBV_WR_SEND;
    op.last = 1;
    op.rnr_retry = 7;  // retry forever: the target keeps the record until a receive comes
    std::memcpy(rec.data(), &h, sizeof(h));
    std::memcpy(rec.data() + sizeof(h), &op, sizeof(op));
    return rec;
  }

  std::unique_ptr<ff::DirectStream> hostile;
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
  ExpectAtomic(qa, a.cq, IBV_WR_ATOMIC_FETCH_AND_ADD, readback, target, 5, 10, 0, 15);
  // An ATOMIC_WRITE of the second: the word stored, nothing returned.
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(qa);
  const uint64_t value = 0xfeedfacecafebeefull;
  ibv_wr_start(qpx);
  qpx->wr_id = 4;
  qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_atomic_write(qpx, target.mr()->rkey, raddr + 8, &value);
  ASSERT_EQ(ibv_wr_complete(qpx), 0);
  auto aw = PollN(a.cq, 1);
  ASSERT_EQ(aw.size(), 1u);
  EXPECT_EQ(aw[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(aw[0].opcode, IBV_WC_ATOMIC_WRITE);
  EXPECT_EQ(std::memcmp(target.data() + 8, &value, 8), 0);
}

TEST_F(DirectLink, ADiallerThatNeverPollsServesWhatItsPeerSends) {
  // b's QP connected first, on a connection a's router offered a: a hears of b's channel
  // before it has dialled. Its event thread takes that event and sleeps again, with no
  // connection to watch yet; a then dials from the program's thread. a never polls, so only
  // its event thread can execute what b sends (perftest's passive side of ib_atomic_bw).
  ASSERT_NO_FATAL_FAILURE(CreateBoth());
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
  ExpectAtomic(qb, b.cq, IBV_WR_ATOMIC_CMP_AND_SWP, local, target, 5, 5, 9, 9);
}

TEST_F(DirectLink, AConnectAnsweredBeforeTheEventsOfItsConnectionWaitsForThem) {
  // b's router told b of the connection a dialled (kDirectChannel, kDirectConn) before it
  // answered b's connect with it, but b's event thread has not taken those events yet: the
  // answer comes first. b's connect succeeds all the same and its QP works once they came.
  ASSERT_NO_FATAL_FAILURE(CreateBoth());
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

// A peer that holds the secret but breaks the channel rules: each time only that
// connection ends (EPROTO, as for a frame that does not open), b's memory takes nothing, and
// b's QP on it fails as one whose peer died.

TEST_F(DirectLink, RecordsOnAChannelNobodyOpenedEndTheConnection) {
  UpHostile();
  Buffer dst(b.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
  std::memset(dst.data(), 'z', 4096);
  ASSERT_EQ(PostRecv(qb, dst.Sge(0, 4096), 21), 0);
  const std::vector<char> rec = SendRecord(64, 'h');
  // Channel 99 was never announced to b: b waits kDirectChannelWaitNs for the event that
  // would open it (it may be on its way), then ends the connection.
  ASSERT_TRUE(HostileSends(ff::direct::Type::kRecord, 99, rec.data(), rec.size()));
  const auto deadline = Clock::now() + kWaitLimit;
  while (b.router.direct_ended().empty() && Clock::now() < deadline) ::usleep(1000);
  ASSERT_EQ(b.router.direct_ended().size(), 1u);
  EXPECT_EQ(b.router.direct_ended()[0].error, static_cast<uint32_t>(EPROTO));
  auto rx = PollN(b.cq, 1);
  ASSERT_EQ(rx.size(), 1u);
  EXPECT_NE(rx[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(dst.data()[0], 'z');
}

// The router announced a channel for a QP of b that went before b took the event in (its
// process destroyed the QP meanwhile): the channel is one of a QP that no longer exists. Its
// records are refused as such, and the connection, with every other channel on it, stays.
TEST_F(DirectLink, RecordsForAChannelOfAQpThatWentAreRefusedAndTheConnectionStays) {
  UpHostile();
  constexpr uint32_t kChanOfGoneQp = 77;
  b.router.SendEvent(Channel(0x4242, kHostileQpn, kChanOfGoneQp));  // b has no QP 0x4242
  Buffer dst(b.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(PostRecv(qb, dst.Sge(0, 4096), 21), 0);
  const std::vector<char> lost = SendRecord(64, 'x');
  ASSERT_TRUE(HostileSends(ff::direct::Type::kRecord, kChanOfGoneQp, lost.data(), lost.size()));
  const std::vector<char> rec = SendRecord(64, 'h');
  ASSERT_TRUE(HostileSends(ff::direct::Type::kRecord, kChanAB, rec.data(), rec.size()));
  // Within far less than kDirectChannelWaitNs: nothing waits for channel 77.
  const auto rx = PollN(b.cq, 1);
  ASSERT_EQ(rx.size(), 1u);
  EXPECT_EQ(rx[0].wr_id, 21u);
  EXPECT_EQ(rx[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(rx[0].byte_len, 64u);
  EXPECT_EQ(dst.data()[0], 'h');
  EXPECT_TRUE(b.router.direct_ended().empty());
}

// b's event thread is held up (here: it waits for b's context lock, which this test holds)
// longer than kDirectChannelWaitNs while records of a channel it has not taken in yet arrive
// and are served: they wait for the announcement, which is still being taken in, and the
// connection stays. Only a channel still unknown kDirectChannelWaitNs after b took in every
// event ends it (RecordsOnAChannelNobodyOpenedEndTheConnection).
TEST_F(DirectLink, RecordsWaitForAnAnnouncementTheEventThreadIsStillTakingIn) {
  UpHostile();
  constexpr uint32_t kLateChan = 78;
  Buffer dst(b.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(PostRecv(qb, dst.Sge(0, 4096), 31), 0);
  std::shared_ptr<ff::verbs::DirectConn> conn;
  {
    ff::verbs::DirectSet* set = ff::verbs::DirectOf(b.session);
    std::lock_guard<std::mutex> g(set->mu);
    ASSERT_EQ(set->conns.size(), 1u);
    conn = set->conns.begin()->second;
  }
  ff::verbs::Context* ctx = ff::verbs::ToCtx(b.ctx);
  ctx->lock.lock();
  b.router.SendEvent(Channel(qb->qp_num, kHostileQpn, kLateChan));
  const std::vector<char> rec = SendRecord(64, 'L');
  bool sent = HostileSends(ff::direct::Type::kRecord, kLateChan, rec.data(), rec.size());
  // Served as the program's poll or the event thread would serve it, for longer than the
  // wait, while the announcement is held up.
  const auto until = Clock::now() + std::chrono::nanoseconds(ff::kDirectChannelWaitNs) +
                     std::chrono::milliseconds(500);
  while (sent && Clock::now() < until && !conn->ended.load()) {
    uint64_t due = 0;
    ff::verbs::ServeConn(conn.get(), nullptr, &due);
    ::usleep(10'000);
  }
  const bool ended_while_held = conn->ended.load();
  ctx->lock.unlock();
  ASSERT_TRUE(sent);
  EXPECT_FALSE(ended_while_held);
  const auto rx = PollN(b.cq, 1);
  ASSERT_EQ(rx.size(), 1u);
  EXPECT_EQ(rx[0].wr_id, 31u);
  EXPECT_EQ(rx[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(dst.data()[0], 'L');
  EXPECT_TRUE(b.router.direct_ended().empty());
}

TEST_F(DirectLink, ACreditForBytesNeverSentEndsTheConnection) {
  UpHostile();
  // b sent nothing on its channel kChanBA: a credit for 1 MiB of it is a lie that would let
  // b's sends run past the window the hostile peer must buffer.
  const ff::direct::Credit lie{1u << 20};
  ASSERT_TRUE(HostileSends(ff::direct::Type::kCredit, kChanBA, &lie, sizeof(lie)));
  WaitForEnded(b);
  ASSERT_EQ(b.router.direct_ended().size(), 1u);
  EXPECT_EQ(b.router.direct_ended()[0].error, static_cast<uint32_t>(EPROTO));
  // b's QP on it fails as a requester whose peer died: its next send completes in error.
  Buffer src(b.pd, 64, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(PostSend(qb, IBV_WR_SEND, src.Sge(0, 8), 5), 0);
  auto wcs = PollN(b.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_NE(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(StateOf(qb), IBV_QPS_ERR);
}

TEST_F(DirectLink, RecordsBeyondTheChannelsWindowEndTheConnection) {
  UpHostile();
  // No receive posted: the first SEND waits for one (RNR, retried forever), and every record
  // behind it queues at b. A peer keeps within kChannelWindow uncredited bytes; this one
  // sends three windows' worth.
  const std::vector<char> rec = SendRecord(ff::kMaxFragment, 'h');
  const size_t records = 3 * ff::kChannelWindow / rec.size() + 1;
  for (size_t i = 0; i < records && b.router.direct_ended().empty(); ++i) {
    if (!HostileSends(ff::direct::Type::kRecord, kChanAB, rec.data(), rec.size())) break;
  }
  WaitForEnded(b);
  ASSERT_EQ(b.router.direct_ended().size(), 1u);
  EXPECT_EQ(b.router.direct_ended()[0].error, static_cast<uint32_t>(EPROTO));
  // What it queued is gone with the connection: a receive posted now takes none of it.
  Buffer dst(b.pd, ff::kMaxFragment, IBV_ACCESS_LOCAL_WRITE);
  std::memset(dst.data(), 'z', dst.size());
  PostRecv(qb, dst.Sge(0, ff::kMaxFragment), 31);
  auto rx = PollN(b.cq, 1);
  if (!rx.empty()) {
    EXPECT_NE(rx[0].status, IBV_WC_SUCCESS);
  }
  EXPECT_EQ(dst.data()[0], 'z');
  EXPECT_EQ(StateOf(qb), IBV_QPS_ERR);
}

TEST_F(DirectLink, APeerThatNeverReadsTimesTheSenderOutAndNothingElseWaits) {
  UpHostile();
  // The hostile process takes the connection and reads nothing. b sends 4 MiB: what the
  // window and the socket take goes out, the rest waits, none is answered.
  constexpr size_t kMsg = 128 * 1024;
  constexpr int kMsgs = 32;
  Buffer src(b.pd, kMsg, IBV_ACCESS_LOCAL_WRITE);
  const auto start = Clock::now();
  int posted = 0;
  for (; posted < kMsgs; ++posted)
    if (PostSend(qb, IBV_WR_SEND, src.Sge(0, kMsg), 100 + posted) != 0) break;
  ASSERT_GT(posted, 1);
  // As an HCA whose peer stops acknowledging: the first fails with retries exceeded once the
  // peer has been silent for kDirectPeerSilentNs (plus the QP's retry budget), the rest are
  // flushed; b's poll returned all along (PollN polls, it never blocked).
  auto wcs = PollN(b.cq, static_cast<size_t>(posted));
  ASSERT_EQ(wcs.size(), static_cast<size_t>(posted));
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR);
  for (const ibv_wc& wc : wcs) EXPECT_NE(wc.status, IBV_WC_SUCCESS);
  EXPECT_GE(Clock::now() - start, std::chrono::nanoseconds(ff::kDirectPeerSilentNs));
  WaitForEnded(b);
  ASSERT_EQ(b.router.direct_ended().size(), 1u);
  EXPECT_EQ(b.router.direct_ended()[0].error, static_cast<uint32_t>(ETIMEDOUT));
  EXPECT_EQ(StateOf(qb), IBV_QPS_ERR);
}

TEST_F(DirectLink, RecordsForAChannelThatWentFailThatRequestAndTheConnectionStays) {
  Up();
  // b's router says a's channel to qb went (qb's side dropped it; a has not heard yet).
  b.router.SendEvent(ChannelGone(qb->qp_num, kChanAB));
  Buffer src(a.pd, 64), dst(b.pd, 64, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(PostRecv(qb, dst.Sge(0, 64), 21), 0);
  std::vector<ibv_wc> tx;
  // The event reaches b's event thread a little later: a send that still finds the channel
  // succeeds; once it went, a's send fails as to a QP that no longer exists.
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(PostSend(qa, IBV_WR_SEND, src.Sge(0, 8), 11), 0);
    tx = PollN(a.cq, 1);
    ASSERT_EQ(tx.size(), 1u);
    if (tx[0].status != IBV_WC_SUCCESS) break;
    PollN(b.cq, 1);
    ASSERT_EQ(PostRecv(qb, dst.Sge(0, 64), 21), 0);
    ::usleep(2000);
  }
  EXPECT_EQ(tx[0].status, IBV_WC_RETRY_EXC_ERR);
  // Only that request (its QP is in error, as an RC requester is after one): the connection
  // stays, and a second QP pair of the same two processes runs on it.
  EXPECT_TRUE(b.router.direct_ended().empty());
  EXPECT_TRUE(a.router.direct_ended().empty());
  ibv_qp* qa2 = a.CreateQp();
  ibv_qp* qb2 = b.CreateQp();
  ASSERT_NE(qa2, nullptr);
  ASSERT_NE(qb2, nullptr);
  b.router.SendEvent(Channel(qb2->qp_num, qa2->qp_num, 11));
  a.router.AnswerDirect(qa2->qp_num, Reply(qb2->qp_num, 11, false));
  ASSERT_EQ(a.Connect(qa2, qb2->qp_num, {}), 0);
  a.router.SendEvent(Channel(qa2->qp_num, qb2->qp_num, 13));
  b.router.AnswerDirect(qb2->qp_num, Reply(qa2->qp_num, 13, false));
  ASSERT_EQ(b.Connect(qb2, qa2->qp_num, {}), 0);
  ASSERT_EQ(PostRecv(qb2, dst.Sge(0, 64), 23), 0);
  std::memcpy(src.data(), "ping", 5);
  ASSERT_EQ(PostSend(qa2, IBV_WR_SEND, src.Sge(0, 5), 13), 0);
  auto rx = PollN(b.cq, 1);
  // The channel event and the record race as they do between real routers; b waits for it.
  while (!rx.empty() && rx[0].wr_id == 21) rx = PollN(b.cq, 1);
  ASSERT_EQ(rx.size(), 1u);
  EXPECT_EQ(rx[0].wr_id, 23u);
  EXPECT_EQ(rx[0].status, IBV_WC_SUCCESS);
  EXPECT_STREQ(dst.data(), "ping");
  auto tx2 = PollN(a.cq, 1);
  ASSERT_EQ(tx2.size(), 1u);
  EXPECT_EQ(tx2[0].status, IBV_WC_SUCCESS);
  EXPECT_TRUE(b.router.direct_ended().empty());
}

// UD over the connection: the router gives the channel a ring of the sender's own (kUdRing,
// then kDirectChannel with the same memfd), the receiving library puts each datagram there
// as the router would, and the QP's Q_Key and the sender's identity are checked and stamped
// as for a relayed datagram. A channel the router closes still delivers for kUdCloseDrainNs,
// then goes whether or not more comes, and a datagram for it is lost, unanswered: the UD
// sender's completions stay successful and the connection stays.
TEST_F(DirectLink, DatagramsGoOverTheConnectionIntoARingOfTheSendersOwn) {
  QpOptions ud;
  ud.type = IBV_QPT_UD;
  ASSERT_NO_FATAL_FAILURE(CreateBoth(ud));
  ASSERT_EQ(a.Connect(qa, 0, ud), 0);
  ASSERT_EQ(b.Connect(qb, 0, ud), 0);
  ff::UniqueFd ring;
  ASSERT_EQ(ff::CreateSegment("test-udring", ff::UdRingBytes(ff::kUdRingBytes), &ring), 0);
  ff::proto::Event e{};
  e.type = ff::proto::EventType::kUdRing;
  e.qpn = qb->qp_num;
  e.src_ip = kPodIp;
  e.src_qpn = qa->qp_num;
  b.router.SendEvent(e, ring.get());
  b.router.SendEvent(Channel(qb->qp_num, qa->qp_num, kChanAB), ring.get());
  ff::proto::ConnectReply reply = Reply(qb->qp_num, kChanAB, true);
  reply.peer_qp_type = IBV_QPT_UD;
  a.router.AnswerDirect(qa->qp_num, reply);

  Buffer src(a.pd, 64), dst(b.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
  constexpr uint32_t kGrh = 40;
  ASSERT_EQ(PostRecv(qb, dst.Sge(0, 4096), 21), 0);
  std::memcpy(src.data(), "ping", 5);
  ibv_ah* ah = a.NewAh();
  // A datagram with another Q_Key first: it crosses like any, and b's QP drops it.
  ASSERT_EQ(PostUdSend(qa, ah, src.Sge(0, 5), 10, qb->qp_num, 0x2222), 0);
  ASSERT_NO_FATAL_FAILURE(AcceptForB());
  ASSERT_EQ(PostUdSend(qa, ah, src.Sge(0, 5), 11, qb->qp_num, 0x1111), 0);
  auto tx = PollN(a.cq, 2);
  ASSERT_EQ(tx.size(), 2u);
  EXPECT_EQ(tx[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(tx[1].status, IBV_WC_SUCCESS);
  auto rx = PollN(b.cq, 1);
  ASSERT_EQ(rx.size(), 1u);
  EXPECT_EQ(rx[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(rx[0].wr_id, 21u);
  EXPECT_EQ(rx[0].byte_len, kGrh + 5);
  EXPECT_EQ(rx[0].src_qp, qa->qp_num);
  EXPECT_NE(rx[0].wc_flags & IBV_WC_GRH, 0);
  EXPECT_STREQ(dst.data() + kGrh, "ping");
  EXPECT_EQ(a.router.connect_count(qa->qp_num), 1) << "one ask for the destination";
  EXPECT_TRUE(PollFew(b.cq, 20).empty()) << "the datagram of the other Q_Key was dropped";
  {
    // No router between: the one connection, ready at both ends.
    ff::verbs::DirectSet* set = ff::verbs::DirectOf(a.session);
    std::lock_guard<std::mutex> g(set->mu);
    ASSERT_EQ(set->conns.size(), 1u);
    EXPECT_TRUE(set->conns.begin()->second->ready.load());
  }

  // b's router closes the channel (a's QP went, or another sender took the ring): what a had
  // sent before is still delivered for kUdCloseDrainNs, as the relay delivers it; after that
  // a datagram that still comes is lost on the way, as on a fabric.
  b.router.SendEvent(ChannelGone(qb->qp_num, kChanAB));
  ::usleep(20'000);  // b's event thread has taken the event
  ASSERT_EQ(PostRecv(qb, dst.Sge(0, 4096), 22), 0);
  ASSERT_EQ(PostUdSend(qa, ah, src.Sge(0, 5), 100, qb->qp_num, 0x1111), 0);
  ASSERT_EQ(PollN(a.cq, 1).size(), 1u);
  rx = PollN(b.cq, 1);
  ASSERT_EQ(rx.size(), 1u) << "sent while the channel closes: delivered";
  EXPECT_EQ(rx[0].wr_id, 22u);
  ::usleep(ff::kUdCloseDrainNs / 1000 + 100'000);
  {
    // Gone by then, though nothing more came on the connection: the channel no longer holds
    // the sender's ring and b's segment mapped.
    ff::verbs::DirectSet* set = ff::verbs::DirectOf(b.session);
    std::lock_guard<std::mutex> g(set->mu);
    ASSERT_EQ(set->conns.size(), 1u);
    ff::verbs::DirectConn& conn = *set->conns.begin()->second;
    std::lock_guard<std::mutex> c(conn.chan_mu);
    EXPECT_EQ(conn.in.count(kChanAB), 0u);
    EXPECT_EQ(conn.closing_due_ns.load(), UINT64_MAX) << "no closing channel left to wait for";
  }
  ASSERT_EQ(PostRecv(qb, dst.Sge(0, 4096), 23), 0);
  ASSERT_EQ(PostUdSend(qa, ah, src.Sge(0, 5), 101, qb->qp_num, 0x1111), 0);
  tx = PollN(a.cq, 1);
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].status, IBV_WC_SUCCESS) << "a datagram never fails its sender";
  EXPECT_TRUE(PollFew(b.cq, 200).empty()) << "lost once the channel went";
  EXPECT_EQ(StateOf(qa), IBV_QPS_RTS);
  EXPECT_EQ(StateOf(qb), IBV_QPS_RTS);
  EXPECT_TRUE(a.router.direct_ended().empty());
  EXPECT_TRUE(b.router.direct_ended().empty());
}

}  // namespace
}  // namespace fftest
