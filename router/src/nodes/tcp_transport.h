// Node links over TCP: one connection per (dialling router, peer router), frames of
// core/codec.h's wire format, flow control by the bytes a link owes its peer, and liveness
// by pings (the dialler pings; both ends close a link that stays silent too long).
//
// With a TLS context (tls.h; the default in ffrouter) every link is TLS 1.3 with both ends'
// certificates verified against the cluster CA, and nothing on a link is acted on before it
// is "ready": the handshake finished, the certificate of a dialled peer names the node the
// control plane gave for its endpoint, and an accepting end heard a hello naming the node
// the dialler's certificate names. Links that do not get there within kDialTimeoutNs are
// closed. Connections from the node network wait in a gate (node_gate.h: bounded per source
// address, on a thread of its own) until they authenticated and said hello; only then do
// they become links of this loop.
#pragma once

#include <sys/uio.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "nodes/node_gate.h"
#include "nodes/node_transport.h"
#include "nodes/tls.h"

namespace ff::router {

class TcpTransport final : public NodeTransport {
 public:
  struct Options {
    std::string node_name;  // told to peers in the hello frame
    uint32_t host_ip = 0;   // address and port to listen on (host byte order)
    uint16_t port = 0;
    uint32_t peer_timeout_ms = 0;           // a dialled link silent this long is closed
    std::shared_ptr<const TlsContext> tls;  // nullptr: plaintext links (--insecure-node-links)
  };
  explicit TcpTransport(Options options) : options_(std::move(options)) {}
  ~TcpTransport() override;

  bool Start(EventLoop& loop, Handler& handler, std::string* error) override;
  LinkId Dial(const cp::Endpoint& ep) override;
  bool Dialled(LinkId link) const override;
  void Send(LinkId link, wire::Type type, uint32_t chan, uint16_t flags,
            std::initializer_list<Bytes> parts) override;
  bool Congested(LinkId link) const override;
  void Resume(LinkId link) override;
  void FlushNow() override;
  size_t LinkCount() const override { return links_.size(); }
  std::vector<LinkView> Links() const override;
  std::vector<PeerView> Peers() const override;
  std::vector<std::pair<const char*, uint64_t>> PortRefusals() const override;
  // The peer's node name once the link is ready: the node we dialled, or the one its hello
  // named (with TLS, both checked against its certificate); "" before.
  std::string PeerNode(LinkId link) const override;
  // The port it listens on (the kernel's choice when Options::port was 0).
  uint16_t port() const { return options_.port; }
  // Where connections wait until they authenticated (after Start).
  const NodeGate& gate() const { return *gate_; }

 private:
  // Totals by peer node (PeerView without the links up), kept past the links; at most
  // kMaxPeerTotals nodes (names come from certificates, or hellos on plaintext links).
  static constexpr size_t kMaxPeerTotals = 4096;
  struct PeerTotals {
    uint64_t connects = 0, losses = 0;
    uint64_t sent_messages = 0, sent_bytes = 0, received_messages = 0, received_bytes = 0;
  };
  struct Link {
    LinkId id = kNoLink;
    PeerTotals* totals = nullptr;  // its peer's, once named (peers_ never erases)
    bool counted_ready = false;    // NoteReady counted it: its end is a loss
    UniqueFd fd;
    EventLoop::WatchId watch = 0;
    bool dialled = false;
    bool connected = false;
    bool secured = false;  // the TLS handshake finished (plaintext: as soon as connected)
    std::unique_ptr<TlsSession> tls;  // nullptr: plaintext
    bool tls_wants_write = false;     // OpenSSL waits for the socket to become writable
    cp::Endpoint endpoint;            // dialled links: whom we dialled
    std::string peer_node;
    std::string close_reason;  // why Parse() refused the link, when it says
    // Bytes read and not parsed yet. Not a vector: growing one zero-fills the new room, which
    // touched half a MiB per link before the first byte came.
    std::unique_ptr<char[]> in;
    size_t in_cap = 0;
    size_t in_used = 0;
    std::vector<char> out;
    size_t out_off = 0;
    uint32_t events = 0;     // epoll interest as registered
    bool held = false;       // the handler held a message: not reading
    bool over_high = false;  // owed reached the high-water mark since the last OnDrained
    bool flush_queued = false;
    uint64_t last_rx_ns = 0;
    uint64_t last_tx_ns = 0;
    uint64_t last_ping_ns = 0;  // dialled links: when we last asked the peer for a pong
    uint64_t created_ns = 0;
    size_t owed() const { return out.size() - out_off; }  // not counting encrypted bytes
    // Accepted links are made ready by the gate (authenticated, hello heard).
    bool ready() const { return secured; }
  };

  Link* Find(LinkId id);
  const Link* Find(LinkId id) const;
  PeerTotals* TotalsOf(const std::string& peer);  // nullptr past kMaxPeerTotals
  void NoteReady(Link& l);                        // the link is ready and its peer named: count it
  // A link on `fd`; its TLS session `tls` when the gate made it, else a new one.
  Link* Add(UniqueFd fd, bool dialled, uint32_t events, std::unique_ptr<TlsSession> tls = nullptr);
  void Adopt(NodeGate::Admitted a);
  void OnEvents(LinkId id, uint32_t events);
  bool ReadAll(Link& l);        // false: the link was closed
  bool FinishConnect(Link& l);  // false: the connect failed and the link was closed
  bool Secure(Link& l);         // advances the TLS handshake; false: the link was closed
  ssize_t Receive(Link& l, char* p, size_t n);
  void FlushTls(Link& l);  // encrypts what the link owes and sends it in batches
  size_t Encrypt(Link& l, const char* p, size_t len);
  bool SendTls(Link& l);      // sends the encrypted bytes; false: the socket is full
  void ReadLater(LinkId id);  // when OpenSSL holds bytes that epoll cannot report
  // Delivers complete frames. false: malformed, the link must be closed.
  bool Parse(Link& l);
  bool OnTransportFrame(Link& l, const wire::FrameHeader& h);  // ping, pong, hello
  void Append(Link& l, const void* p, size_t n);
  // Sends `parts` straight to the socket when nothing is queued ahead; buffers the rest.
  void SendDirect(Link& l, const iovec* iov, int n, size_t total);
  void EncryptDirect(Link& l, const iovec* iov, int n, size_t total);
  void AppendFrom(Link& l, const iovec* iov, int n, size_t skip);
  void ScheduleFlush(Link& l);
  // Writes what the link owes. May report OnDrained when `may_notify`.
  void Flush(Link& l, bool may_notify);
  void SyncEvents(Link& l);
  void Close(LinkId id, const std::string& why);
  void OnTick();

  Options options_;
  EventLoop* loop_ = nullptr;
  Handler* handler_ = nullptr;
  // Links the gate admitted, on their way from its thread to this loop's; `owner` is
  // cleared (on this loop's thread) when the transport goes.
  struct Inbox {
    std::mutex mu;
    std::vector<NodeGate::Admitted> ready;
    TcpTransport* owner = nullptr;
  };
  std::shared_ptr<Inbox> inbox_;
  std::unique_ptr<NodeGate> gate_;
  Timer tick_;
  LinkId next_id_ = 1;
  std::unordered_map<LinkId, std::unique_ptr<Link>> links_;
  std::map<std::pair<uint32_t, uint16_t>, LinkId> dialled_;  // endpoint -> link
  std::vector<LinkId> flush_pending_;  // links to flush at the end of this loop turn
  std::map<std::string, PeerTotals> peers_;
};

}  // namespace ff::router
