// The per-node freeflow router: the broker that introduces pods to each other.
//
// It owns no data path on one node. It identifies every client by its network namespace,
// assigns QP numbers and memory keys, publishes each context's MR table, and hands the
// shared-memory segments of a QP (and the memfds behind remote-accessible memory) to the
// peers that connect to it. When a client goes away everything it held is released and
// its peers are told. Single-threaded: one epoll loop, non-blocking SOCK_SEQPACKET
// sockets, so one slow or hostile client cannot stall another.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <deque>

#include "freeflow/codec.h"
#include "freeflow/controlplane.h"
#include "freeflow/fd.h"
#include "freeflow/ipv4.h"
#include "freeflow/protocol.h"
#include "freeflow/shm_layout.h"
#include "freeflow/ring.h"
#include "freeflow/target_ops.h"
#include "identity.h"

namespace ff::router {

// epoll tags of the cross-node descriptors (see router.cc for the others).
inline constexpr uint64_t kNodeListenTag = 4ull << 56;
inline constexpr uint64_t kNodeTag = 5ull << 56;
inline constexpr uint64_t kDoorbellTag = 6ull << 56;
inline constexpr uint64_t kTimerTag = 7ull << 56;

struct RouterConfig {
  std::string dir = "/freeflow";
  std::string name = "ffrouter";
  Ipv4Prefix overlay;
  std::string library_source;  // copied to <dir>/libffverbs.so at start; empty: skip
  std::string node_name;
  // Cross-node: this node's underlay address and router-to-router port; empty control
  // plane spec = single-node mode (no listener, no remote peers).
  uint32_t host_ip = 0;  // host byte order
  uint16_t port = 7471;
  std::string control_plane;
  uint32_t peer_timeout_ms = 2000;  // a silent peer router is declared dead after this
  // While cross-node traffic flows the router polls proxy rings and sockets instead of
  // sleeping, for this long after the last activity (0: always sleep on doorbells).
  uint32_t poll_us = 0;
  // How long a connect waits for the control plane to learn an unknown address.
  uint32_t resolve_timeout_ms = 3000;
};

class Router {
 public:
  Router(RouterConfig config, std::unique_ptr<IdentityResolver> identity);
  ~Router();

  // Takes the lock, installs the library and listens. Returns false with *error set to a
  // message a person can act on (bad dir, second router, ...).
  bool Start(std::string* error);
  // Serves until Stop() is called (from a signal handler or another thread).
  void Run();
  void Stop();

  std::string socket_path() const;
  bool Healthy() const;
  size_t session_count() const { return sessions_.size(); }

 private:
  struct Region {
    UniqueFd fd;
    uint64_t size = 0;
  };
  struct Cq {
    uint32_t notify_slot = proto::kNoId;
    uint32_t chan_id = proto::kNoId;
  };
  struct Session {
    uint32_t id = 0;
    UniqueFd sock;
    UniqueFd events;
    PodIdentity who;
    bool hello = false;
    std::string refusal;  // set when the client is not a pod of the overlay
    UniqueFd notify_seg;
    UniqueFd wake_fd;  // rung after cross-node deliveries when the wake word is armed
    UniqueFd mr_table_fd;     // read-write, router only
    UniqueFd mr_table_ro_fd;  // what the owner and peers get
    Mapping mr_table;
    std::vector<uint8_t> slot_tags;
    std::vector<uint32_t> free_slots;
    std::map<uint32_t, UniqueFd> channels;
    std::map<uint32_t, Cq> cqs;
    std::map<uint32_t, UniqueFd> srqs;
    std::map<uint32_t, Region> regions;
    std::set<uint32_t> qps;
    // Mapped on demand when a remote initiator reaches this session's memory.
    Mapping notify_map;
    std::map<uint32_t, Mapping> region_maps;
    // A ConnectQp answered once the peer router replies.
    bool call_deferred = false;
  };
  struct Qp {
    uint32_t qpn = 0;
    uint32_t type = 0;
    uint32_t owner = 0;  // session id
    UniqueFd seg;
    uint32_t num_rings = 0;
    uint32_t ring_bytes = 0;
    uint32_t srq_id = proto::kNoId;
    uint32_t recv_cq_id = proto::kNoId;
    std::vector<uint32_t> ring_producer;  // producer of each ring: a qpn, kRemoteProducer|id, 0
    std::set<uint32_t> produces_into;     // QPs whose rings this QP produces into
    uint32_t send_cq_id = proto::kNoId;
    std::set<uint32_t> proxies;           // channels to remote peers opened for this QP
  };
  static constexpr uint32_t kRemoteProducer = 0x80000000u;

  // A TCP connection to another router.
  struct NodeConn {
    uint32_t id = 0;
    UniqueFd fd;
    bool outbound = false;
    bool connected = false;
    cp::Endpoint endpoint;  // outbound: whom we dialled
    std::string peer_node;
    std::vector<char> in;
    size_t in_used = 0;
    std::vector<char> out;
    size_t out_off = 0;
    uint32_t events = 0;  // epoll interest as registered; SyncEvents() keeps it current
    bool reading_paused = false;
    bool output_full = false;  // inbound: stopped executing requests until output drains
    uint64_t last_rx_ns = 0;
    uint64_t last_tx_ns = 0;
    std::set<uint32_t> chans;      // outbound: proxies using this connection
    std::set<uint64_t> senders;    // inbound: remote senders arriving on it
  };
  // Initiator side: a local QP's link to a QP on another node.
  struct Proxy {
    uint32_t chan = 0;
    uint32_t session = 0;
    uint32_t qpn = 0;  // local QP
    uint32_t qp_type = 0;
    uint32_t dest_ip = 0;
    uint32_t dest_qpn = 0;
    uint32_t conn = 0;
    UniqueFd seg_fd;
    Mapping seg;
    UniqueFd doorbell;
    RingConsumer requests;
    RingProducer responses;
    std::deque<std::vector<char>> resp_backlog;  // responses waiting for ring space
    bool connected = false;
    bool dead = false;
    uint32_t call_seq = 0;  // the deferred ConnectQp to answer
    proto::Op call_op = proto::Op::kConnectQp;
    uint64_t connect_deadline_ns = 0;
  };
  // Target side: a QP on another node producing into a local QP's ring.
  struct RemoteSender {
    uint64_t key = 0;  // conn << 32 | chan
    uint32_t id = 0;
    uint32_t conn = 0;
    uint32_t chan = 0;
    uint32_t src_ip = 0;
    uint32_t src_qpn = 0;
    uint32_t target_qpn = 0;
    uint32_t owner = 0;  // session of the target QP
    uint32_t qp_type = 0;
    uint32_t ring = 0;
    Mapping seg;
    Mapping srq_seg;
    QpSegmentHeader* hdr = nullptr;
    RecvCredits* credits = nullptr;
    uint64_t posted_cache = 0;
    RingProducer producer;
    NotifySlot* notify = nullptr;
    int notify_fd = -1;  // owned by the target's session
    std::deque<std::vector<char>> queue;  // records not applied yet, in order
    size_t queued_bytes = 0;
    bool have_credit = false;
    bool dropping = false;  // UC/UD message without a receive: drop its fragments
    bool errored = false;   // after an error nothing more is executed (RC semantics)
    RnrState rnr;
  };

  // Cross-node (remote.cc).
  bool StartRemote(std::string* error);
  void AcceptNode();
  NodeConn* Outbound(const cp::Endpoint& ep);
  void HandleNode(NodeConn& c, uint32_t events);
  bool ParseFrames(NodeConn& c);
  bool OnFrame(NodeConn& c, const wire::FrameHeader& h, const char* body);
  void SendFrame(NodeConn& c, wire::Type type, uint32_t chan, const void* a, size_t alen,
                 const void* b = nullptr, size_t blen = 0, uint16_t flags = 0);
  void FlushNode(NodeConn& c);
  void SyncEvents(NodeConn& c);
  void SendDirect(NodeConn& c, uint32_t chan, const RecordHeader& h, const char* payload);
  void CloseNode(uint32_t conn_id, const char* why);
  int ConnectRemote(Session& s, Qp& src, const proto::ConnectQp& m, bool ud, bool may_wait = true);
  void RetryResolves();
  void FinishConnect(Proxy& p, int status, const wire::ConnectReply* reply);
  void DrainProxy(Proxy& p);
  void DeliverResponse(Proxy& p, std::vector<char> record);
  void DropProxy(uint32_t chan, bool tell_peer, bool died = false);
  void OnRemoteConnect(NodeConn& c, uint32_t chan, const wire::Connect& m);
  bool ApplyRecord(RemoteSender& rs, const char* rec, size_t len);
  void RunSender(RemoteSender& rs);
  void Respond(RemoteSender& rs, uint32_t seq, uint32_t status, uint64_t offset,
               const char* data, uint32_t len, bool last);
  void DropSender(uint64_t key, bool tell_peer, bool died = false);
  Mapping* SessionRegion(Session& owner, uint32_t region_id);
  void OnTimer();
  void ResumeParsing();
  bool PollProxies();  // drains every proxy; true when anything moved
  bool Busy() const;
  void ArmTimer();
  void PublishIp(uint32_t ip);
  void WakeSession(Session& s);
  NotifySlot* NotifySlots(Session& s);
  void WithdrawIp(uint32_t ip);

  void Accept();
  void HandleReadable(Session& s);
  // Returns false when the session must be dropped (protocol violation or I/O error).
  bool Dispatch(Session& s, const char* buf, size_t len, UniqueFd* fds, int nfds);
  bool Reply(Session& s, const proto::Response& r, const int* fds = nullptr, int nfds = 0);
  void Drop(uint32_t session_id, const char* why);
  void ReleaseQp(Qp& qp, bool process_died);
  void Notify(uint32_t session_id, proto::EventType type, uint32_t qpn);
  Session* FindSession(uint32_t id);
  Qp* FindDest(uint32_t dest_ip, uint16_t dest_lid, uint32_t dest_qpn);
  bool FillConnectReply(Session& s, Qp& dest, uint32_t ring, proto::Response* r,
                        std::vector<int>* fds);
  bool InstallLibrary(std::string* error);

  int OnHello(Session& s, const proto::Hello& m, UniqueFd* fds, int nfds, proto::Response* r,
              std::vector<int>* out_fds);
  int OnCreateQp(Session& s, const proto::CreateQp& m, UniqueFd* fds, int nfds, proto::Response* r);
  int OnConnect(Session& s, const proto::ConnectQp& m, bool ud, proto::Response* r,
                std::vector<int>* out_fds);
  int AcceptRegion(Session& s, bool is_new, uint32_t region_id, uint64_t region_size,
                   UniqueFd* fds, int nfds);
  int OnRegMr(Session& s, const proto::RegMr& m, UniqueFd* fds, int nfds, proto::Response* r);
  int OnDeregMr(Session& s, const proto::DeregMr& m);
  int OnMoveMr(Session& s, const proto::MoveMr& m, UniqueFd* fds, int nfds);
  int OnGetRegion(Session& s, const proto::GetRegion& m, proto::Response* r,
                  std::vector<int>* out_fds);

  RouterConfig config_;
  std::unique_ptr<IdentityResolver> identity_;
  UniqueFd lock_fd_;
  UniqueFd listen_fd_;
  UniqueFd epoll_fd_;
  UniqueFd stop_fd_;  // eventfd written by Stop()
  uint32_t next_session_ = 1;
  uint32_t next_qpn_ = 0x100;
  std::unordered_map<uint32_t, std::unique_ptr<Session>> sessions_;
  std::unordered_map<uint32_t, std::unique_ptr<Qp>> qps_;

  std::unique_ptr<cp::ControlPlane> cp_;
  UniqueFd node_listen_;
  UniqueFd timer_fd_;
  uint32_t next_conn_ = 1;
  uint32_t next_chan_ = 1;
  uint32_t next_sender_ = 1;
  std::unordered_map<uint32_t, std::unique_ptr<NodeConn>> conns_;
  std::map<std::pair<uint32_t, uint16_t>, uint32_t> outbound_;  // endpoint -> conn
  std::unordered_map<uint32_t, std::unique_ptr<Proxy>> proxies_;
  std::unordered_map<uint64_t, std::unique_ptr<RemoteSender>> senders_;
  std::set<uint64_t> blocked_senders_;
  // Connects to an address the control plane does not know yet (a pod that just started
  // on another node): retried until the deadline, then answered with EHOSTUNREACH.
  struct PendingResolve {
    uint32_t session;
    proto::ConnectQp request;
    bool ud;
    uint64_t deadline_ns;
  };
  std::vector<PendingResolve> pending_resolves_;
  std::map<uint32_t, int> published_;  // overlay ip -> sessions with that ip
  uint64_t busy_until_ns_ = 0;
  std::set<uint32_t> resume_parse_;  // connections with unexecuted frames to parse again
};

}  // namespace ff::router
