// The seam between the router and the network that joins nodes: messages between routers,
// per link, in order. The TCP implementation (tcp_transport.h) runs between nodes without
// RDMA NICs; an in-memory one (router/testing/loopback_transport.h) runs several routers in one
// process for tests; an RDMA NIC transport would implement the same interface.
//
// A link joins this router to one peer router. The router that dials a link sends
// requests on it (kConnect, kRecord, kClose) and the peer answers on the same link
// (kConnectReply, kResp, kPeerGone): `Dialled()` tells the two ends apart. Transport frames
// (hello, liveness) never reach the handler.
//
// Threading: every call, and every handler callback, happens on the loop's thread.
// Re-entrancy: the transport never calls the handler from inside Send(), Congested(),
// Resume() or Dial(); handler callbacks may call any of those.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "base/event_loop.h"
#include "freeflow/codec.h"
#include "freeflow/controlplane.h"

namespace ff::router {

// When the forwarder or the executor drops a channel: whether the peer router is told over
// the link (kClose / kPeerGone), and whether the end went because its process, QP or node
// died (the peer's QP then fails as on a lost peer) or because it was closed.
enum class TellPeer : bool { kNo, kYes };
enum class DropCause : bool { kClosed, kDied };
inline DropCause CauseOf(bool died) { return died ? DropCause::kDied : DropCause::kClosed; }

using LinkId = uint32_t;  // 0: no link; transports give out ids below 2^31 (link_resume.h)
inline constexpr LinkId kNoLink = 0;

// One message for the handler; `body` is valid only during the callback.
struct NodeMessage {
  wire::Type type;
  uint32_t chan;
  uint16_t flags;
  const char* body;
  uint32_t len;
};

// A piece of a message body to gather.
struct Bytes {
  const void* data;
  size_t len;
};

// One link as an admin sees it (ffctl links).
struct LinkView {
  LinkId id = 0;
  std::string peer;         // the peer's node name, once known
  bool dialled = false;     // this router dialled it (else it accepted it)
  const char* state = "";   // "connecting", "securing" (TLS, hello), "ready"
  size_t queued_bytes = 0;  // owed to the peer, not sent yet
  uint64_t idle_ms = 0;     // since the last bytes from the peer
  uint64_t age_ms = 0;      // since the link was made
};

// What passed between this router and one other node's, over all their links since this
// router started (metrics).
struct PeerView {
  std::string peer;       // the node's name
  size_t links_up = 0;    // links to it that are ready now
  uint64_t connects = 0;  // links that became ready
  uint64_t losses = 0;    // ready links that went down
  uint64_t sent_messages = 0, sent_bytes = 0, received_messages = 0, received_bytes = 0;
};

class NodeTransport {
 public:
  class Handler {
   public:
    enum class Verdict {
      kConsumed,   // done with the message
      kHold,       // cannot take it now: keep it and everything behind it on this link, stop
                   // reading the link, and offer it again after Resume(link)
      kMalformed,  // a protocol violation: the link is closed (OnLinkDown follows)
    };
    virtual ~Handler() = default;
    virtual Verdict OnMessage(LinkId link, const NodeMessage& m) = 0;
    // `link` was congested and owes less than half the high-water mark again.
    virtual void OnDrained(LinkId link) = 0;
    // `link` is gone: closed by the peer, broken, silent too long or malformed. Called once
    // per link; its id is never reused.
    virtual void OnLinkDown(LinkId link, const std::string& why) = 0;
  };

  virtual ~NodeTransport() = default;
  // Starts accepting links from peer routers. false + *error (a sentence a person can act
  // on) when it cannot.
  virtual bool Start(EventLoop& loop, Handler& handler, std::string* error) = 0;
  // The link this router dialled to the router at `ep`, dialling it when there is none.
  // kNoLink when it cannot be reached at all; a dial that fails later reports OnLinkDown.
  virtual LinkId Dial(const cp::Endpoint& ep) = 0;
  virtual bool Dialled(LinkId link) const = 0;
  // The node the router at the other end is, as far as the transport established it (with
  // TLS: the node its verified certificate names); "" while unknown.
  virtual std::string PeerNode(LinkId link) const = 0;
  // Queues one message whose body is the concatenation of `parts`. Never blocks. Sending on
  // a link that is gone does nothing (its OnLinkDown has come or is coming).
  virtual void Send(LinkId link, wire::Type type, uint32_t chan, uint16_t flags,
                    std::initializer_list<Bytes> parts) = 0;
  // True while the link owes its peer at least the high-water mark: stop producing for it
  // until OnDrained.
  virtual bool Congested(LinkId link) const = 0;
  // Offers held messages again (after Verdict::kHold), later in this loop turn.
  virtual void Resume(LinkId link) = 0;
  // Writes what each ready link owes, as far as its socket takes it without waiting: for a
  // router about to stop running its loop (a hand-over, docs/handover.md). The in-memory
  // transport delivers at once and needs none.
  virtual void FlushNow() {}
  // Links open now, in both directions (for the router's statistics).
  virtual size_t LinkCount() const = 0;
  // Each of them, for an admin.
  virtual std::vector<LinkView> Links() const = 0;
  // Each node this router has had a ready link with.
  virtual std::vector<PeerView> Peers() const = 0;
  // Connections to the router port closed before they were a router: (reason, count) for
  // each reason, none for a transport without a port.
  virtual std::vector<std::pair<const char*, uint64_t>> PortRefusals() const { return {}; }
};

}  // namespace ff::router
