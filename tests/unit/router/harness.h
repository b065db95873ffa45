// Test harness for the router's components in one process, without root or namespaces:
// routers on their own threads joined by the in-memory node transport, an in-memory control
// plane, a fake identity resolver, and "raw pods" that speak the pod protocol themselves over
// a socketpair (what a hostile pod, or the library, would send).
#pragma once

#include <arpa/inet.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "freeflow/codec.h"
#include "freeflow/controlplane.h"
#include "freeflow/fd.h"
#include "freeflow/protocol.h"
#include "freeflow/ring.h"
#include "loopback_transport.h"
#include "router.h"

namespace ff::router::test {

uint32_t Ip(const char* dotted);  // host byte order

// The default per-pod limits with some changed (in flag units: MiB for byte quotas).
PodLimits WithLimits(std::initializer_list<std::pair<Quota, uint32_t>> changed);

// Hands out the overlay address (and network namespace) of each adopted connection, in
// adoption order.
class FakeIdentity final : public IdentityResolver {
 public:
  void Expect(uint32_t ip, uint64_t netns = 0);
  bool Resolve(int sock, PodIdentity* out, std::string* error) override;

 private:
  std::mutex mu_;
  std::deque<std::pair<uint32_t, uint64_t>> next_;
};

// Where pods live, shared by the routers of one test (an in-memory etcd).
class FakeCluster {
 public:
  std::unique_ptr<cp::ControlPlane> PlaneFor(const cp::Endpoint& self);
  void Set(uint32_t ip, const cp::Endpoint& ep);
  void Erase(uint32_t ip);
  std::optional<cp::Endpoint> Lookup(uint32_t ip) const;

 private:
  mutable std::mutex mu_;
  std::map<uint32_t, cp::Endpoint> where_;
};

// One router with its own temporary host folder, serving on its own thread.
class TestRouter {
 public:
  struct Options {
    std::string node = "node-a";
    uint32_t host_ip = 0;                // with a network: this router's endpoint address
    LoopbackNetwork* network = nullptr;  // nullptr: this node only
    FakeCluster* cluster = nullptr;
    uint32_t resolve_timeout_ms = 300;
    PodLimits limits = DefaultPodLimits();
    uint64_t hello_timeout_ns = kHelloTimeoutNs;
  };
  explicit TestRouter(Options options);
  ~TestRouter();
  // Connects a new client socket as a pod with overlay address `ip`, in network namespace
  // `netns` (0: the one all tests share).
  UniqueFd Connect(uint32_t ip, uint64_t netns = 0);
  cp::Endpoint endpoint() const { return {options_.node, options_.host_ip, 7471}; }
  const std::string& dir() const { return dir_; }
  // Router::StatsLine, taken on the router's thread.
  std::string Stats();
  // One figure of Stats() ("qps", "fds", ...).
  uint64_t Stat(const std::string& name);

 private:
  Options options_;
  std::string dir_;
  FakeIdentity* identity_ = nullptr;  // owned by the router
  std::unique_ptr<Router> router_;
  std::thread thread_;
};

// A QP whose segment the test owns, as the library would create it.
struct RawQp {
  int status = -1;  // the router's answer to CreateQp
  uint32_t qpn = 0;
  UniqueFd seg_fd;
  Mapping seg;
  uint32_t num_rings = 0;
  uint32_t ring_bytes = 0;
  QpSegmentHeader* hdr() const { return seg.as<QpSegmentHeader>(); }
  RingHeader* ring(uint32_t i) const { return QpRing(seg.get(), i, ring_bytes); }
};

// What a ConnectQp answer gave: the peer's segments (same node) or a proxy (another node).
struct RawLink {
  int status = 0;
  proto::ConnectReply reply{};
  std::vector<UniqueFd> fds;
  Mapping seg;             // the peer QP's segment, or the proxy segment
  Mapping own_ring;        // a UD destination on this node: the sender's own ring
  RingProducer producer;   // where this QP's requests or messages go
  RingConsumer responses;  // proxies: the router's answers
};

// A pod that speaks the router protocol itself over a socketpair.
class RawPod {
 public:
  RawPod(TestRouter& router, uint32_t ip, uint64_t netns = 0);
  explicit RawPod(UniqueFd sock);  // a client socket connected some other way
  // HELLO with a fresh notify segment, event socket and wake socket. hello() holds the
  // answer (on a refusal, the reason in its `node`).
  int Hello(uint32_t abi = kAbiVersion);
  // Sends `m` (its op from its type unless `op` is given) and waits for the answer.
  template <typename M>
  proto::Response Call(M m, std::vector<int> fds = {}, std::vector<UniqueFd>* got = nullptr,
                       proto::Op op = proto::OpOf<M>) {
    m.h.op = op;
    return CallRaw(&m, sizeof(m), fds, got);
  }
  proto::Response CallRaw(const void* msg, size_t len, const std::vector<int>& fds,
                          std::vector<UniqueFd>* got);
  // The next answer the router sends (status -1 when none came within 3 s).
  proto::Response Receive(std::vector<UniqueFd>* got = nullptr);
  // Sends bytes without waiting for an answer.
  void SendRaw(const void* msg, size_t len, const std::vector<int>& fds = {});
  // True when the router closed this pod's socket within `timeout_ms`.
  bool Disconnected(int timeout_ms = 2000);
  // The next event about a peer going away (kPeerGone, kPeerClosed, kShutdown) the router
  // sent, within `timeout_ms`; set-up events met on the way are kept for NextSetupEvent.
  std::optional<proto::Event> NextEvent(int timeout_ms = 2000);
  // The next set-up event (kPeerNamed, kUdRing with its ring memfd), within `timeout_ms`.
  struct SetupEvent {
    proto::Event event{};
    UniqueFd fd;
  };
  std::optional<SetupEvent> NextSetupEvent(int timeout_ms = 2000);

  // A CQ; with a completion channel when `chan_id` names one (its event word: `slot`).
  // Returns `cq_id`, or 0 when the router refused it.
  uint32_t CreateCq(uint32_t cq_id, uint32_t slot = proto::kNoId, uint32_t chan_id = proto::kNoId);
  // A QP of `type` on CQ `cq` (0: CQ 1, created on first use).
  RawQp CreateQp(uint32_t type, uint32_t num_rings = 1, uint32_t ring_bytes = kRcRingBytes,
                 uint32_t cq = 0);
  // This pod's notify word `slot` (CQ events, the wake word), as the router sees it.
  NotifySlot* Slot(uint32_t slot);
  RawLink Connect(const RawQp& qp, uint32_t dest_ip, uint32_t dest_qpn, bool ud = false);
  // RC/UC `qp` names its peer (moves to RTR) before that peer connects to it: the connect
  // status, EINPROGRESS as long as the peer has not named `qp` in turn.
  int Name(const RawQp& qp, uint32_t peer_ip, uint32_t peer_qpn) {
    return Connect(qp, peer_ip, peer_qpn).status;
  }
  // Registers `bytes` of a fresh region memfd with `access` (which must grant some remote
  // access), sealed read-only as the library does when it grants reads only; returns the key
  // (0 on failure).
  uint32_t Register(uint32_t region_id, size_t bytes, uint32_t access, uint64_t addr,
                    Mapping* memory);
  // Registers memory without remote access (no region); returns the key (0 on failure).
  uint32_t RegisterLocal(uint64_t addr, size_t bytes, uint32_t access);
  // The receiving end of this pod's wake socket, and its sending end (the router holds it
  // too; the pod keeps a copy, as a hostile one would).
  int wake_fd() const { return wake_fd_.get(); }
  int wake_tx() const { return wake_tx_.get(); }

  const proto::HelloReply& hello() const { return hello_; }
  int mr_table_fd() const { return mr_table_.get(); }

 private:
  UniqueFd sock_;
  UniqueFd events_;
  UniqueFd notify_fd_;
  UniqueFd wake_fd_;
  UniqueFd wake_tx_;
  UniqueFd mr_table_;
  Mapping notify_;
  proto::HelloReply hello_{};
  std::vector<uint32_t> cqs_;
  std::deque<SetupEvent> setup_;

  std::optional<SetupEvent> ReadEvent(int timeout_ms);
};

// Writes one request into a proxy link's request ring and rings the doorbell when the
// router armed it, as the library does. false when the ring had no room within `wait`.
bool TryPostRequest(RawLink& link, uint8_t kind, uint8_t flags, const ProxyRequest& req,
                    const void* data, uint32_t len, std::chrono::milliseconds wait);
// The same, waiting up to 3 s for room (and throwing when there is none).
void PostRequest(RawLink& link, uint8_t kind, uint8_t flags, const ProxyRequest& req,
                 const void* data = nullptr, uint32_t len = 0);
// The router's next answer on a proxy link, its data in *data; nullopt when none came.
std::optional<ProxyResponse> NextAnswer(
    RawLink& link, std::vector<char>* data = nullptr,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(3000));

// Polls `pred` until it holds or `timeout` passes.
template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds timeout = std::chrono::milliseconds(3000)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Writes a one-record SEND of `text` through a same-node link and returns what QP `to` (the
// link's peer) finds in the ring it was given ("" when nothing came).
std::string PassMessage(RawLink& link, const RawQp& to, const std::string& text);

// The next record of `ring`, waiting for it; false when none came.
bool NextRecord(RingConsumer& ring, RecordHeader* h, std::vector<char>* payload,
                std::chrono::milliseconds timeout = std::chrono::milliseconds(3000));

}  // namespace ff::router::test
