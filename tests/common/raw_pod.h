// A "raw pod": a client that speaks the router's pod protocol itself (core protocol.h) over a
// connected SOCK_SEQPACKET socket, and the shared memory the router hands it, without the
// library — what a hostile pod does. The one copy of it: the router unit tests and the
// fuzz targets drive in-process routers with it (over socketpairs, tests/unit/router/harness.h
// makes one for a TestRouter); the adversary suite drives real ffrouter processes with it
// (over their Unix sockets, tests/adversary).
#pragma once

#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "freeflow/codec.h"
#include "freeflow/fd.h"
#include "freeflow/protocol.h"
#include "freeflow/ring.h"

namespace ff::test {

// A QP whose segment the test owns, as the library would create it.
struct RawQp {
  int status = -1;               // the router's answer to CreateQp (0 when posted)
  uint32_t qpn = 0;              // 0 when the router refused the QP
  std::vector<uint32_t> grants;  // the QP numbers the answer granted (proto::CreateQpReply)
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

// Connects to the router socket at `path`; an invalid fd when nobody listens there.
UniqueFd ConnectToRouter(const std::string& path);

// A memfd of `bytes` that can still shrink (no seals): what a hostile pod hands over.
UniqueFd UnsealedSegment(size_t bytes);

// A pod that speaks the router protocol itself over `sock`.
class RawPod {
 public:
  // `sock`: a connected SOCK_SEQPACKET socket to the router. Answers are awaited 3 s at most.
  explicit RawPod(UniqueFd sock);
  // HELLO with a fresh notify segment, event socket and wake socket. hello() holds the
  // answer (on a refusal, the reason in its `node`).
  int Hello(uint32_t abi = kAbiVersion);
  // HELLO with the notify segment and wake descriptor the caller chose (a hostile pod may
  // hand over anything); this pod keeps them.
  int HelloWith(UniqueFd notify, UniqueFd wake_tx, uint32_t abi = kAbiVersion);
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
  // Returns once the router has carried out everything this pod sent before (posted
  // requests are never answered; a request that changes nothing is, in its turn). Another
  // pod's socket is served in its own order: a test that races two pods calls this first.
  // False when no answer came in its turn.
  bool Flush();
  // True when the router closed this pod's socket within `timeout_ms`.
  bool Disconnected(int timeout_ms = 2000);
  // The next event about a peer or QP going away (kPeerGone, kPeerClosed, kUdPeerLost, kQpRefused,
  // kDirectChannelGone, kShutdown) the router sent, within `timeout_ms`; set-up events met on
  // the way are kept for NextSetupEvent.
  std::optional<proto::Event> NextEvent(int timeout_ms = 2000);
  // The next set-up event (kPeerNamed, kUdRing with its ring memfd, kDirectChannel,
  // kDirectConn with its socket), within `timeout_ms`.
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
  // The same with the segment memfd the caller chose (at least QpSegmentBytes, mappable);
  // its header is written here. qpn stays 0 when the router refused it.
  RawQp CreateQpWith(UniqueFd seg_fd, uint32_t type, uint32_t num_rings, uint32_t ring_bytes,
                     uint32_t cq = 0);
  // A QP of `type` under number `granted` (one an earlier answer granted, or any a hostile
  // pod tries), posted or answered. Posted, the result is what the library assumes: status
  // 0 and qpn `granted`.
  RawQp CreateGrantedQp(uint32_t granted, bool posted, uint32_t type = IBV_QPT_RC);
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
  // Registers `bytes` of region memfd `fd` (which the pod chose, sealed or not) as new
  // region `region_id`: the answer's status; the key in *key.
  int RegisterWith(UniqueFd fd, uint32_t region_id, size_t bytes, uint32_t access, uint64_t addr,
                   uint32_t* key);
  // Registers memory without remote access (no region); returns the key (0 on failure).
  uint32_t RegisterLocal(uint64_t addr, size_t bytes, uint32_t access);
  // The receiving end of this pod's wake socket, and its sending end (the router holds it
  // too; the pod keeps a copy, as a hostile one would).
  int wake_fd() const { return wake_fd_.get(); }
  int wake_tx() const { return wake_tx_.get(); }
  int notify_fd() const { return notify_fd_.get(); }

  const proto::HelloReply& hello() const { return hello_; }
  int mr_table_fd() const { return mr_table_.get(); }

 private:
  RawQp NewQp(UniqueFd seg_fd, uint32_t type, uint32_t num_rings, uint32_t ring_bytes, uint32_t cq,
              uint32_t granted, bool posted);

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

// The next record of `ring`, waiting for it; false when none came.
bool NextRecord(RingConsumer& ring, RecordHeader* h, std::vector<char>* payload,
                std::chrono::milliseconds timeout = std::chrono::milliseconds(3000));

// The next ring a UD QP `qp` of `pod` was given (kUdRing; kPeerNamed events met on the way
// are skipped), mapped into *ring and attached to *in; *event is the announcement. False
// when none came within 2 s or it cannot be mapped.
bool NextUdRing(RawPod& pod, const RawQp& qp, Mapping* ring, RingConsumer* in, proto::Event* event);
// The payload of the next record of `in` ("" when none came within `timeout`), consumed.
std::string NextPayload(RingConsumer& in,
                        std::chrono::milliseconds timeout = std::chrono::milliseconds(3000));

// Writes a one-record SEND of `text` through a same-node link and publishes it: false when
// the ring has no room.
bool WriteMessage(RawLink& link, const std::string& text);
// The same, and returns what QP `to` (the link's peer) finds in the ring it was given (""
// when nothing came).
std::string PassMessage(RawLink& link, const RawQp& to, const std::string& text);

// ---- a proxy link (a peer on another node), as the library drives it -----------------
// Writes one request into the proxy's request ring, publishes it and rings the doorbell
// when the router armed it. Waits up to `wait` for room: kOk, or why the ring took nothing.
RingStatus PostRequest(RawLink& link, uint8_t kind, uint8_t flags, const ProxyRequest& req,
                       const void* data = nullptr, uint32_t len = 0,
                       std::chrono::milliseconds wait = std::chrono::milliseconds(3000));
// The same: true when the request went in within `wait`.
bool TryPostRequest(RawLink& link, uint8_t kind, uint8_t flags, const ProxyRequest& req,
                    const void* data, uint32_t len, std::chrono::milliseconds wait);
// One whole SEND of `text`, as work request `seq` (room awaited as by PostRequest).
RingStatus PostSend(RawLink& link, uint32_t seq, const std::string& text, uint8_t rnr_retry = 7,
                    std::chrono::milliseconds wait = std::chrono::milliseconds(3000));
// The router's next answer on the proxy (its data in *data); nothing when none came in time
// or it was malformed.
std::optional<ProxyResponse> NextAnswer(
    RawLink& link, std::vector<char>* data = nullptr,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(3000));

// An rdma_cm command `cmd` (RDMA_USER_CM_CMD_*) with `body` on channel `ch`, as the library
// sends it; `out_len`: the bytes of answer the program's buffer holds.
template <typename T>
proto::CmCommand CmCommandOf(uint32_t cmd, const T& body, uint32_t out_len, uint32_t ch) {
  proto::CmCommand m{};
  m.channel = ch;
  m.cmd = cmd;
  m.in_len = sizeof(T);
  m.out_len = out_len;
  static_assert(sizeof(T) <= sizeof(m.body));
  std::memcpy(m.body, &body, sizeof(T));
  return m;
}

}  // namespace ff::test
