// The node port's gate: where connections from the node network wait until they are a
// router. Anyone on the node network can open them, so what the router does for them
// before they authenticate runs here, on a thread of its own at a lower priority, never on
// the thread that serves pods and ready links: accepting, bounding, the TLS handshake and
// the hello. A connection leaves the gate either admitted (its TLS handshake verified a
// cluster certificate and its first frame, a hello, named the node that certificate names;
// without TLS, a well-formed hello) and handed to the transport's loop, or closed.
//
// Bounds: at most kMaxPendingNodeLinks connections wait at once, kMaxPendingNodeLinksPerSource
// of them from one address, each for kDialTimeoutNs. A connection beyond either bound is
// taken, and a waiting one of the address that holds the most closes for it: the one whose
// peer got least far (sent nothing, sent bytes not read yet, began its handshake), then the
// oldest; never one whose handshake verified a certificate. Idle connections from any number
// of addresses thus cannot keep a router out; from the dialling router's own address they
// would have to begin that many TLS handshakes while its one runs. Every line a connection
// here can make the router log is rate-limited.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "base/acceptor.h"
#include "base/event_loop.h"
#include "base/quotas.h"
#include "base/reason_counts.h"
#include "freeflow/codec.h"
#include "freeflow/fd.h"
#include "nodes/tls.h"

namespace ff::router {

// Why a connection left the gate without being admitted (metrics: the `reason` label).
enum class GateRefusal : uint8_t {
  kCrowded,    // closed for a newer connection before it authenticated
  kTls,        // the TLS handshake failed (no cluster certificate, or a bad one)
  kVersion,    // a hello of another wire version
  kIdentity,   // a hello naming a node its certificate does not name
  kClosed,     // closed by its peer, or a socket error, before its hello
  kMalformed,  // a malformed frame, or another message before the hello
  kTimeout,    // no handshake or hello within kDialTimeoutNs
};
inline constexpr size_t kGateRefusals = 7;
using GateRefusals = ReasonCounts<GateRefusal, kGateRefusals>;

class NodeGate {
 public:
  struct Options {
    uint32_t host_ip = 0;  // address and port to listen on (host byte order; port 0: any)
    uint16_t port = 0;
    std::shared_ptr<const TlsContext> tls;  // nullptr: plaintext (--insecure-node-links)
  };
  // A connection that passed: its socket, its TLS session (nullptr: plaintext; it may hold
  // bytes read after the hello), the node its hello named, the address it came from.
  struct Admitted {
    UniqueFd fd;
    std::unique_ptr<TlsSession> tls;
    std::string node;
    uint32_t source_ip = 0;
  };
  // Called on the gate's thread.
  using OnAdmitted = std::function<void(Admitted)>;

  explicit NodeGate(Options options) : options_(std::move(options)) {}
  ~NodeGate();  // stops the thread; closes what waits
  NodeGate(const NodeGate&) = delete;
  NodeGate& operator=(const NodeGate&) = delete;

  // Listens (on the caller's thread, so that the error comes back), then starts the thread.
  bool Start(OnAdmitted on_admitted, std::string* error);
  uint16_t port() const { return options_.port; }

  // Thread-safe: connections waiting now, and those closed before they passed (with the
  // reason of the last one).
  size_t waiting() const { return waiting_.load(); }
  uint64_t refused() const { return refusals_.total(); }
  const GateRefusals& refusals() const { return refusals_; }
  std::string last_refusal() const;

 private:
  struct Pending {
    uint64_t id = 0;
    UniqueFd fd;
    std::unique_ptr<TlsSession> tls;
    EventLoop::WatchId watch = 0;
    uint32_t source_ip = 0;
    uint64_t created_ns = 0;
    bool secured = false;  // the TLS handshake finished (plaintext: at once)
    bool wants_write = false;
    uint32_t events = 0;
    char hello[sizeof(wire::FrameHeader) + sizeof(wire::Hello)];
    size_t got = 0;  // bytes of `hello` read
  };

  void Run();
  void OnAccepted(UniqueFd fd);
  void MakeRoom(uint32_t source);
  int Progress(const Pending& p) const;  // how far its peer got: 0, 1 or 2
  void Advance(uint64_t id);
  bool ReadHello(Pending& p);  // false: refused or waiting for bytes; true: all of it read
  void Admit(Pending& p, const std::string& node);
  void Refuse(uint64_t id, GateRefusal reason, const std::string& why);
  void Sync(Pending& p);
  void OnTick();

  Options options_;
  OnAdmitted on_admitted_;
  UniqueFd listen_;
  EventLoop loop_;
  Acceptor acceptor_;
  Timer tick_;
  std::thread thread_;
  std::unordered_map<uint64_t, std::unique_ptr<Pending>> pending_;
  uint64_t next_id_ = 1;
  uint64_t evicted_ = 0;
  LogLimiter evict_log_, refuse_log_;
  std::atomic<size_t> waiting_{0};
  GateRefusals refusals_{
      {"crowded", "tls", "version", "identity", "closed", "malformed", "timeout"}};
  mutable std::mutex last_mu_;
  std::string last_refusal_;
};

}  // namespace ff::router
