// Fuzz target: what a peer router sends on a node link.
//
// The input (after its first byte) is the byte stream a peer writes to a TCP node link. It
// is written to a real TcpTransport (router/src/nodes/tcp_transport.cc) over 127.0.0.1, whose
// gate (node_gate.cc: the hello) and framing (wire::ValidFrame, ping) run on it. Every message the framing delivers
// is then sent, as the peer router "node-b", over the in-memory network to a real router
// "node-a" (tests/unit/router/harness.h: TestRouter), where it reaches the executor
// (requests: kConnect, kRecord, kClose on a link node-b dialled) or the forwarder (answers:
// kConnectReply, kResp, kPeerGone on the link node-a dialled to node-b). Bit 0 of the first
// byte swaps the two, as a peer that ignores the protocol's directions would.
//
// On node-a, for the whole run: a victim pod with an RC and a UD QP, and one MR open to
// remote access (what requests can target), and an initiator pod. Per input, the victim
// consumes whatever the last input delivered and posts 8 receives afresh, and the
// initiator's fresh RC QP connects to a pod of node-b (so node-a dials node-b and waits for
// its answers). Replay: a kConnect whose dest_qpn is below kAliases names the victim's QP of
// that index, dest_ip 1 or 2 the victim's or the initiator's address; a request record with
// rkey 0 names the victim's MR; an answer whose channel is below kAliases names the channel
// node-a opened with that index. At the end node-b's links are cut, the initiator's QP is
// destroyed, and the target waits until node-a's figures (its stats line: QPs, proxies,
// senders, links, descriptors, ...) are back to what they were before the input.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "harness.h"
#include "nodes/tcp_transport.h"
#include "settle.h"

namespace {

using namespace ff;
using namespace ff::router;
using namespace ff::router::test;
using Verdict = NodeTransport::Handler::Verdict;

constexpr uint32_t kAliases = 16;
constexpr uint32_t kVictimIp = 0x0a000001;
constexpr uint32_t kInitiatorIp = 0x0a000002;
constexpr uint32_t kRemoteIp = 0x0a010001;  // a pod of node-b
constexpr uint32_t kSentinelChan = 0xffffffffu;
constexpr uint32_t kAllRemote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
const cp::Endpoint kNodeA{"node-a", 0xc0000201, 7471};
const cp::Endpoint kNodeB{"node-b", 0xc0000202, 7471};

bool IsRequest(wire::Type t) {
  return t == wire::Type::kConnect || t == wire::Type::kRecord || t == wire::Type::kClose;
}

// node-b's end of the in-memory network (one for the run; Reset() between inputs).
struct PeerNode final : NodeTransport::Handler {
  std::unique_ptr<NodeTransport> transport;
  LinkId to_a = kNoLink;        // the link node-b dialled: requests to node-a's executor
  LinkId from_a = kNoLink;      // the link node-a dialled: answers to node-a's forwarder
  std::vector<uint32_t> chans;  // channels node-a opened, in order
  bool sentinel = false;
  bool to_a_down = false;
  std::vector<uint32_t> victim_qpns;
  uint32_t victim_key = 0;
  bool swap = false;

  Verdict OnMessage(LinkId link, const NodeMessage& m) override {
    spdlog::debug("node-b: type {} chan {:#x} flags {} len {} from node-a",
                  static_cast<int>(m.type), m.chan, m.flags, m.len);
    if (m.type == wire::Type::kConnectReply && m.len == sizeof(wire::ConnectReply)) {
      wire::ConnectReply r;
      std::memcpy(&r, m.body, sizeof(r));
      spdlog::debug("node-b: connect reply status {}", r.status);
    }
    if (m.type == wire::Type::kConnect) {
      from_a = link;
      chans.push_back(m.chan);
    }
    if (m.type == wire::Type::kConnectReply && m.chan == kSentinelChan) sentinel = true;
    return Verdict::kConsumed;
  }
  void OnDrained(LinkId) override {}
  // node-a closes a link it finds malformed: nothing more comes back on it.
  void OnLinkDown(LinkId link, const std::string&) override {
    if (link == to_a) to_a_down = true;
  }
  void Reset(bool swap_directions) {
    to_a = from_a = kNoLink;
    to_a_down = false;
    chans.clear();
    sentinel = false;
    swap = swap_directions;
  }

  // A message the framing delivered, passed on to node-a.
  void Forward(const NodeMessage& m) {
    std::vector<char> body(m.body, m.body + m.len);
    uint32_t chan = m.chan;
    if (IsRequest(m.type) != swap) {
      if (m.type == wire::Type::kConnect && body.size() == sizeof(wire::Connect)) {
        wire::Connect c;
        std::memcpy(&c, body.data(), sizeof(c));
        if (c.dest_qpn < kAliases && c.dest_qpn < victim_qpns.size())
          c.dest_qpn = victim_qpns[c.dest_qpn];
        if (c.dest_ip == 1 || c.dest_ip == 2) c.dest_ip = c.dest_ip == 1 ? kVictimIp : kInitiatorIp;
        std::memcpy(body.data(), &c, sizeof(c));
      }
      constexpr size_t kReqAt = sizeof(RecordHeader);
      if (m.type == wire::Type::kRecord && body.size() >= kReqAt + sizeof(ProxyRequest)) {
        ProxyRequest r;
        std::memcpy(&r, body.data() + kReqAt, sizeof(r));
        if (r.rkey == 0) r.rkey = victim_key;
        std::memcpy(body.data() + kReqAt, &r, sizeof(r));
      }
      if (to_a == kNoLink) to_a = transport->Dial(kNodeA);
      transport->Send(to_a, m.type, chan, m.flags, {{body.data(), body.size()}});
    } else if (from_a != kNoLink) {
      if (chan < kAliases && chan < chans.size()) chan = chans[chan];
      transport->Send(from_a, m.type, chan, m.flags, {{body.data(), body.size()}});
    }
  }
};

// The TCP end the input's bytes arrive on; it hands every message to node-b.
struct Front final : NodeTransport::Handler {
  PeerNode* peer = nullptr;
  bool down = false;
  Verdict OnMessage(LinkId, const NodeMessage& m) override {
    if (peer != nullptr) peer->Forward(m);
    return Verdict::kConsumed;
  }
  void OnDrained(LinkId) override {}
  void OnLinkDown(LinkId, const std::string&) override { down = true; }
};

// The victim: QPs with receives posted and memory open to remote access. It lives for the
// whole run (a HELLO per input cost more than the rest of the input).
struct Victim {
  std::unique_ptr<RawPod> pod;
  std::vector<RawQp> qps;
  Mapping memory;

  void SetUp(TestRouter& router, PeerNode& peer) {
    pod = std::make_unique<RawPod>(router, kVictimIp);
    if (pod->Hello() != 0) __builtin_trap();
    for (uint32_t type : {IBV_QPT_RC, IBV_QPT_UD}) {
      RawQp qp = type == IBV_QPT_UD ? pod->CreateQp(type, kUdRingsPerQp, kUdRingBytes)
                                    : pod->CreateQp(type);
      if (qp.qpn == 0) __builtin_trap();
      qp.hdr()->qp_access.store(kAllRemote);
      qp.hdr()->min_rnr_timer.store(1);
      peer.victim_qpns.push_back(qp.qpn);
      qps.push_back(std::move(qp));
    }
    peer.victim_key = pod->Register(1, 1 << 16, kAllRemote, 0x10000, &memory);
    if (peer.victim_key == 0) __builtin_trap();
  }

  // What an input left: the victim consumes every record and posts 8 receives afresh, and
  // reads its events, as a live pod would, so that each input finds it the same.
  void Tidy() {
    for (RawQp& qp : qps) {
      for (uint32_t i = 0; i < qp.num_rings; ++i) {
        RingHeader* ring = qp.ring(i);
        ring->head.store(ring->tail.load(std::memory_order_acquire), std::memory_order_release);
      }
      RecvCredits& c = qp.hdr()->credits;
      c.posted.store(c.claimed.load(std::memory_order_acquire) + 8, std::memory_order_release);
    }
    while (pod->NextEvent(0)) {
    }
    while (pod->NextSetupEvent(0)) {
    }
  }
};

// The initiator: a pod of node-a whose RC QP (a fresh one per input) connects to a pod of
// node-b, so that node-a dials node-b and waits for its answers.
struct Initiator {
  std::unique_ptr<RawPod> pod;
  RawQp qp;

  void SetUp(TestRouter& router) {
    pod = std::make_unique<RawPod>(router, kInitiatorIp);
    if (pod->Hello() != 0 || pod->CreateCq(1) != 1) __builtin_trap();  // the QPs' CQ
  }
  // Sends the connect; its answer comes when node-b answers, or at Finish().
  void Connect() {
    qp = pod->CreateQp(IBV_QPT_RC);
    if (qp.qpn == 0) __builtin_trap();
    proto::ConnectQp m{};
    m.qpn = qp.qpn;
    m.dest_ip = htonl(kRemoteIp);
    m.dest_qpn = 0x100;
    pod->SendRaw(&m, sizeof(m));
  }
  // After node-b is gone: the connect's answer (whichever it was) and the QP's release.
  void Finish() {
    // libFuzzer's alarm (each second) may interrupt the wait: look again, a bounded number
    // of times (each look waits up to 3 s).
    int status = -1;
    for (int look = 0; look < 3 && status < 0; ++look) status = pod->Receive().status;
    if (status < 0) __builtin_trap();  // the connect was never answered
    proto::DestroyQp d{};
    d.id = qp.qpn;
    if (pod->Call(d).status != 0) __builtin_trap();
    qp = RawQp();
    while (pod->NextEvent(0)) {
    }
    while (pod->NextSetupEvent(0)) {
    }
  }
};

struct Rig {
  LoopbackNetwork network;
  FakeCluster cluster;
  std::unique_ptr<TestRouter> router;
  EventLoop loop;  // node-b's, run on the fuzzing thread
  std::unique_ptr<TcpTransport> tcp;
  Front front;
  PeerNode peer;
  uint32_t source = 0;  // varies the client address, so that no port pair is reused soon
  Victim victim;
  Initiator initiator;
  std::string baseline;     // node-a's figures with only the two pods set up
  size_t baseline_all = 0;  // descriptors then, pipes included

  Rig() {
    TestRouter::Options o;
    o.node = kNodeA.node;
    o.host_ip = kNodeA.address;
    o.network = &network;
    o.cluster = &cluster;
    o.resolve_timeout_ms = 1;
    router = std::make_unique<TestRouter>(o);
    cluster.Set(kRemoteIp, kNodeB);
    std::string error;
    tcp = std::make_unique<TcpTransport>(TcpTransport::Options{"node-b", 0x7f000001, 0, 60000});
    peer.transport = network.Attach(kNodeB);
    if (loop.Init() != 0 || !tcp->Start(loop, front, &error) ||
        !peer.transport->Start(loop, peer, &error))
      __builtin_trap();
    front.peer = &peer;
    victim.SetUp(*router, peer);
    initiator.SetUp(*router);
    baseline = Figures();
    baseline_all = Descriptors(true);
  }

  // What node-a holds: its stats line without the resident memory, which may move, and
  // with the descriptors counted without pipes (the sanitizers' symbolizer opens two the
  // first time it runs; node-a's and the harness's descriptors share this process).
  std::string Figures() {
    const std::string line = router->Stats();
    return line.substr(0, line.find(" fds=")) + " fds=" + std::to_string(Descriptors(false));
  }
  // Figures() == baseline, read cheaply: the stats line (which counts every descriptor)
  // first; pipes are looked for only when that count moved.
  bool AtBaseline() {
    const std::string line = router->Stats();
    const std::string head = line.substr(0, line.find(" fds="));
    if (baseline.compare(0, head.size() + 5, head + " fds=") != 0) return false;
    const size_t all = Descriptors(true);
    if (all == baseline_all) return true;
    if (Figures() != baseline) return false;
    baseline_all = all;  // the new pipes stay
    return true;
  }
  static size_t Descriptors(bool with_pipes) {
    size_t n = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
      std::error_code link_ec;
      n += with_pipes ||
           std::filesystem::read_symlink(e.path(), link_ec).string().rfind("pipe:", 0) != 0;
    }
    return n;
  }

  // Runs node-b's loop until `done` (which only node-b's handlers change) holds or `ms`
  // pass. It sleeps in epoll between events: spinning would take the CPU node-a needs.
  template <typename Pred>
  bool Pump(Pred done, int ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (!done()) {
      if (std::chrono::steady_clock::now() > end) return false;
      loop.RunOnce(1);
    }
    return true;
  }
};

Rig& TheRig() { return fuzz::RigOfTheRun<Rig>(); }

// A blocking connect; libFuzzer's timeout alarm may interrupt it, and it then goes on alone.
bool Connected(int fd, const sockaddr_in& to) {
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) == 0) return true;
  if (errno != EINTR) return false;
  pollfd p{fd, POLLOUT, 0};
  int err = 0;
  socklen_t len = sizeof(err);
  while (::poll(&p, 1, 5000) < 0 && errno == EINTR) {
  }
  return ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0 &&
         (p.revents & POLLOUT) != 0;
}

// Writes the stream to a fresh connection to the TCP end and runs it until the link is down
// (or, for a stream that never said a well-formed hello, until the port's gate closed it).
void Stream(Rig& rig, const uint8_t* data, size_t size) {
  const uint64_t refused = rig.tcp->gate().refused();
  const auto over = [&] { return rig.front.down || rig.tcp->gate().refused() != refused; };
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ++rig.source;
  sockaddr_in self{};
  self.sin_family = AF_INET;
  self.sin_addr.s_addr = htonl(0x7f000000u | (1 + rig.source % 0xfffffe));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(rig.tcp->port());
  a.sin_addr.s_addr = htonl(0x7f000001);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&self), sizeof(self)) != 0 ||
      !Connected(fd.get(), a))
    __builtin_trap();  // the harness itself failed
  rig.front.down = false;
  size_t off = 0;
  while (off < size && !over()) {
    const ssize_t n = ::send(fd.get(), data + off, size - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) off += static_cast<size_t>(n);
    if (n < 0 && errno != EAGAIN && errno != EINTR) break;
    rig.loop.RunOnce(0);
  }
  ::shutdown(fd.get(), SHUT_WR);
  if (!rig.Pump(over, 5000)) __builtin_trap();  // the link hangs
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Rig& rig = TheRig();
  PeerNode& peer = rig.peer;
  peer.Reset((data[0] & 1) != 0);
  rig.victim.Tidy();
  rig.initiator.Connect();
  rig.Pump([&] { return !peer.chans.empty(); }, 2000);
  Stream(rig, data + 1, size - 1);
  // Everything forwarded is in node-a's inbox; a connect that fails marks its end.
  const wire::Connect last{0, 0, 0, 0, 0, 0};
  if (peer.to_a == kNoLink) peer.to_a = peer.transport->Dial(kNodeA);
  peer.transport->Send(peer.to_a, wire::Type::kConnect, kSentinelChan, 0, {{&last, sizeof(last)}});
  rig.Pump([&] { return peer.sentinel || peer.to_a_down; }, 200);
  rig.network.Sever(kNodeA.node, kNodeB.node);
  rig.loop.RunOnce(0);
  rig.initiator.Finish();
  rig.victim.Tidy();
  // node-a is back to what it held before the input: nothing leaked, nothing left waiting.
  if (!fuzz::Settle([&] { return rig.AtBaseline(); })) {
    std::fprintf(stderr, "node-a before: %s\nnode-a after:  %s\n", rig.baseline.c_str(),
                 rig.Figures().c_str());
    __builtin_trap();  // a hang or a leak
  }
  return 0;
}
