// rdma_cm: the router is the kernel behind each pod's /dev/infiniband/rdma_cm (the library
// serves the device node in the process and passes each ucma command here; see
// proto::CmCommand). It keeps the ids, binds ports on the pod's overlay address, resolves
// addresses against the cluster's pods, and runs the IB CM exchange (REQ, REP, RTU, REJ,
// DREQ, DREP, SIDR) with the pod at the other end: directly on this node, through the node
// links otherwise. Events go to the channel socket of the id (the program's descriptor).
//
// What a pod cannot do: name an id of another process or channel (ENOENT / EINVAL), bind or
// connect from an address that is not its own (EADDRNOTAVAIL), or put words in a peer's
// mouth: a message from another node is taken only when its source is a pod of that node,
// and only for the id that exchange created (the id's peer address and comm id must match).
// A program that does not read its events loses its channel after kMaxCmBacklog of them.
//
// Failures a real stack reports, reported the same way: no listener -> REJECTED (reason 8,
// invalid service id), no such pod -> ADDR_ERROR, silent peer -> UNREACHABLE after
// kCmResponseTimeoutNs, peer process or node gone -> DISCONNECTED.
// Threading: the loop's thread only.
#pragma once

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <utility>

#include "base/event_loop.h"
#include "base/quotas.h"
#include "base/reason_counts.h"
#include "cm/cm_table.h"
#include "freeflow/codec.h"
#include "freeflow/ipv4.h"
#include "freeflow/protocol.h"
#include "nodes/directory.h"
#include "nodes/node_transport.h"
#include "pods/pod_sessions.h"

namespace ff::router {

class HandoverState;
class LinkResume;

// Why an rdma_cm message from another router was dropped (metrics: the `reason` label).
enum class CmRefusal : uint8_t {
  kNotItsPod,  // a request from an address that is not a pod of the sending node
  kNotHere,    // an answer to an address that is not a pod of this node
};
inline constexpr size_t kCmRefusals = 2;
using CmRefusals = ReasonCounts<CmRefusal, kCmRefusals>;

class CmService {
 public:
  struct Parts {
    EventLoop& loop;
    PodSessions& sessions;
    Directory& directory;
    NodeTransport* transport;  // nullptr: this node only
    Quotas& quotas;
    Ipv4Prefix overlay;
    // Nodes whose router is being replaced (nodes/link_resume.h); nullptr: none are.
    const LinkResume* resume = nullptr;
  };
  explicit CmService(Parts parts) : p_(parts) {}
  ~CmService();
  // After an event about an id whose peer is a pod of this node, the loop polls this long
  // (--cm-spin-us): its program acts on it within tens of microseconds, and its next
  // requests (or its peer's) come to this router.
  void set_event_spin(uint64_t ns) { event_spin_ns_ = ns; }

  // Pod requests of a welcomed session whose overlay address is `pod_ip`; both answer.
  void OpenChannel(const Call& call, const proto::CmOpenChannel& m, UniqueFd sock);
  void Command(const Call& call, uint32_t pod_ip, proto::CmCommand m);
  // The process is gone: its ids and channels go, and their peers hear of it.
  void OnPodGone(PodId pod);

  // Node links: kCm frames, and links that went down.
  NodeTransport::Handler::Verdict OnMessage(LinkId link, const NodeMessage& m);
  void OnLinkDown(LinkId link);
  // Deadlines (the router's timer).
  void Tick();
  size_t ids() const { return table_.size(); }
  size_t channels() const { return channels_.size(); }
  // rdma_cm messages other routers sent that were dropped, by reason, since start.
  const CmRefusals& refusals() const { return refusals_; }
  // The hand-over (cm_handover.cc): what keeps the ids from moving in hand-over `version`
  // ("" when nothing does); every id and channel into state.doc["cm"]; and back, after the
  // sessions were taken (throws HandoverError).
  std::string WhyNotMovable(uint32_t version) const;
  void Export(HandoverState& state) const;
  // Ids connected to another node go to its parked link in `resume` (link_resume.h).
  void Import(HandoverState& state, LinkResume& resume, uint64_t now);
  // Across a router's replacement: moves the ids whose messages go out on link `from` to
  // `to` (a parked link, or the link that resumes one); how many there are on one.
  size_t Move(LinkId from, LinkId to);
  size_t CountOn(LinkId link) const;
  // This router reaches `node` again after its router was replaced: the messages held for
  // it go (Send), and the ids waiting for an answer from it send theirs again (it may have
  // been lost with the old link). A receiver takes a message twice as once (OnReq; a REP or
  // a DREQ that came already changes nothing).
  void ResendTo(const std::string& node);
  uint32_t AnyPeerOn(LinkId link) const;  // the peer address of one of them (0: none)

 private:
  struct Channel {
    // Shut down, not only closed, however it goes: the library holds a copy of this end
    // (protocol.h, CmOpenChannel), and the program must still read EOF.
    ~Channel() {
      if (sock) ::shutdown(sock.get(), SHUT_RDWR);
    }
    UniqueFd sock;
    EventLoop::WatchId watch = 0;
    std::deque<proto::CmEvent> backlog;  // events the socket could not take yet
  };
  using ChannelKey = std::pair<PodId, uint32_t>;
  // Watches a channel's socket: the program's hang-up, and room for its backlog.
  void WatchChannel(const ChannelKey& key, Channel& ch);
  // One command being served.
  struct Ctx {
    const Call& call;
    uint32_t pod_ip;
    const proto::CmCommand& m;
    proto::CmReply* reply;
    uint32_t handle = 0;  // the id the command named or created: its state goes back

    template <typename T>
    T Body() const {
      T t;
      std::memcpy(&t, m.body, sizeof(T));
      return t;
    }
    // Answers `r` (at most out_len bytes of it); ENOSPC when the program's buffer is too
    // small for `need` bytes.
    template <typename T>
    int Out(const T& r, size_t need = sizeof(T)) {
      static_assert(sizeof(T) <= proto::kCmMaxReply);
      if (m.out_len < need) return ENOSPC;
      reply->out_len = static_cast<uint32_t>(std::min<size_t>(m.out_len, sizeof(T)));
      std::memcpy(reply->out, &r, reply->out_len);
      return 0;
    }
  };

  // Commands (cm_service_commands.cc). Each returns 0 or a positive errno.
  int Dispatch(Ctx& c);
  int CreateId(Ctx& c);
  int DestroyIdCmd(Ctx& c);
  int BindIp(Ctx& c);
  int ResolveIp(Ctx& c);
  int ResolveRoute(Ctx& c);
  int QueryRouteCmd(Ctx& c);
  int Connect(Ctx& c);
  int Listen(Ctx& c);
  int Accept(Ctx& c);
  int Reject(Ctx& c);
  int Disconnect(Ctx& c);
  int InitQpAttrCmd(Ctx& c);
  int Notify(Ctx& c);
  int SetOption(Ctx& c);
  int MigrateId(Ctx& c);
  // The id a command names: the caller's, on the caller's channel.
  CmId* Named(Ctx& c, uint32_t handle, int* status);
  // A command that names an id: its body and the id, or nullptr and the errno to answer.
  template <typename T>
  struct NamedCmd {
    T cmd;
    CmId* id;
    int status;
  };
  template <typename T>
  NamedCmd<T> TakeNamed(Ctx& c) {
    NamedCmd<T> n{c.Body<T>(), nullptr, 0};
    n.id = Named(c, n.cmd.id, &n.status);
    return n;
  }
  int BindTo(CmId& id, uint32_t pod_ip, const struct CmSockaddr& sa);

  // The CM exchange (cm_service_exchange.cc).
  wire::CmMessage MessageFrom(const CmId& id) const;
  // Sends to the pod at m.dst_ip. EHOSTUNREACH when no router holds it.
  int Send(CmId* id, wire::CmKind kind, const wire::CmMessage& m);
  void AwaitAnswer(CmId* id, CmState next);
  void Reply(wire::CmKind kind, const wire::CmMessage& to, uint8_t reason);
  // A message from the router of node `from` ("": this one), whose source is checked.
  void Receive(wire::CmKind kind, const wire::CmMessage& m, const std::string& from);
  void OnReq(wire::CmKind kind, const wire::CmMessage& m, const std::string& from);
  void OnRep(CmId& id, const wire::CmMessage& m);
  void OnSidrRep(CmId& id, const wire::CmMessage& m);
  void OnRej(CmId& id, const wire::CmMessage& m);
  void OnDreq(CmId* id, const wire::CmMessage& m);
  CmId* Peer(const wire::CmMessage& m, const std::string& from);
  void Establish(CmId& id);
  // Ends the id's exchange and tells its program `event` (if it has seen the id): now, or
  // after the current loop turn's callbacks and what they queued (`after_turn`).
  void Fail(CmId& id, uint32_t event, int32_t status, bool after_turn = false);
  // Leaves the exchange as a destroyed id does, then forgets the id.
  void DestroyId(uint32_t handle);

  // Events (cm_service_exchange.cc).
  void Emit(const CmId& id, const proto::CmEvent& e);
  void Flush(const ChannelKey& key);
  void CloseChannel(const ChannelKey& key, const char* why);

  Parts p_;
  uint64_t event_spin_ns_ = 0;  // set_event_spin
  CmTable table_;
  std::map<ChannelKey, Channel> channels_;
  // The last message each id sent to another node (ResendTo), by handle; `held`: it waits
  // for the node's replaced router (Send), not sent yet.
  struct Sent {
    wire::CmKind kind;
    wire::CmMessage m;
    bool held;
  };
  std::map<uint32_t, Sent> sent_;
  LogLimiter log_;
  CmRefusals refusals_{{"not_its_pod", "not_here"}};
  uint32_t state_version_ = 0;  // proto::CmIdState::version of the last snapshot
};

}  // namespace ff::router
