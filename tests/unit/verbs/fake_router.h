// A stand-in for ffrouter that serves the pod protocol (core/include/freeflow/protocol.h) on
// one end of a socketpair, so that the library's link operations can be tested in one
// process without root: the test hands the other end to ff::verbs::OpenSession.
//
// It does what the real router does for one pod: answers HELLO with an MR table it writes
// (ff::UpdateMrEntry), keeps channels, CQs, SRQs and QPs (numbering QPs from kFirstQpn, as every
// router does, so two fake routers hand out the same numbers), registers memory, and answers
// ConnectQp / ResolveUd the way the test chose for that QP: as a peer process on this node
// (a SameNodePeer the test owns) or as a peer on another node (a ProxySegment, as
// router/src ConnectRemote + FinishConnect build it), or "ask again" (EINPROGRESS) while
// the test withholds the peer's consent. It sends events on the event socket and can close
// the connection as a dying router would. It checks what the real router checks of the
// descriptors it is handed: memfds sealed against shrinking, wake sockets where it wakes
// the pod, no region for a registration without remote access.
//
// Threading: one serving thread answers requests; the test thread calls the methods below.
// All state is under one mutex. Shared memory (proxy rings, peer rings, MR tables) is
// touched by the test thread only, as the one producer or consumer of each ring.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "freeflow/codec.h"
#include "freeflow/fd.h"
#include "freeflow/protocol.h"
#include "freeflow/ring.h"
#include "freeflow/shm_layout.h"
#include "freeflow/traffic_ledger.h"

namespace fftest {

// A peer QP in a process "on this node" that the test plays: its QP segment (one inbound
// ring the library produces into, and its receive credits), its notify segment, its MR table
// and one registered region.
struct SameNodePeer {
  SameNodePeer(uint32_t qpn, uint32_t qp_type, size_t region_bytes);

  // Shares the region for reads only, as a peer whose registrations grant no remote write:
  // sealed read-only (after our own writable mapping), and GetRegion answers writable = 0.
  // The MR table may still claim write access.
  void ShareReadOnly();

  uint32_t qpn;
  uint32_t qp_type;
  uint32_t ctx_id = 77;
  ff::UniqueFd seg_fd;
  ff::Mapping seg;
  ff::UniqueFd notify_fd;
  ff::Mapping notify;
  ff::UniqueFd table_fd;
  ff::Mapping table;
  ff::UniqueFd region_fd;
  ff::Mapping region;
  uint32_t region_id = 5;
  bool region_writable = true;  // what GetRegion answers (and the seal agrees)
  ff::RingConsumer inbound;

  ff::QpSegmentHeader* header() const { return seg.as<ff::QpSegmentHeader>(); }
  // Posts `n` more receive credits.
  void PostCredits(uint64_t n);
  uint64_t Claimed() const;
  // Publishes an MR over [offset, offset+length) of the region at virtual address `addr`;
  // returns its key.
  uint32_t AddMr(uint32_t slot, uint64_t addr, uint64_t offset, uint64_t length, uint32_t access);
  // The next record the library published into our ring; false when there is none.
  bool NextRecord(ff::RecordHeader* h, std::vector<char>* payload);
};

// A request record the library wrote into a proxy ring, copied out and decoded.
struct Request {
  ff::RecordHeader h;
  ff::ProxyRequest req;
  std::vector<char> data;
};

// The router's side of a proxy segment: ring 0 carries the library's requests, ring 1 our
// responses. After writing responses the test calls Respond*, which also rings the pod's
// wake word as the real router does.
struct ProxySegment {
  ProxySegment();

  ff::UniqueFd seg_fd;
  ff::Mapping seg;
  ff::UniqueFd doorbell;     // the receiving end of the doorbell's wake socket
  ff::UniqueFd doorbell_tx;  // its sending end, which the pod is given
  ff::RingConsumer requests;
  ff::RingProducer responses;

  ff::QpSegmentHeader* header() const { return seg.as<ff::QpSegmentHeader>(); }
  // Every request published so far, decoded with ff::DecodeRequest (a record it refuses
  // fails the test).
  std::vector<Request> TakeRequests();
};

class FakeRouter {
 public:
  FakeRouter();
  // Serves a connection accepted elsewhere (the pod connected to a socket path).
  explicit FakeRouter(ff::UniqueFd router_end);
  ~FakeRouter();
  FakeRouter(const FakeRouter&) = delete;
  FakeRouter& operator=(const FakeRouter&) = delete;

  // The pod's end of the connection (once).
  ff::UniqueFd TakePodEnd();

  // HELLO is refused with this errno and reason (0: accepted).
  void RefuseHello(int status, const char* reason);
  // ConnectQp / ResolveUd from local QP `qpn` is answered as a peer on this node...
  void AnswerSameNode(uint32_t qpn, SameNodePeer* peer);
  // ...or as a peer on another node; the returned proxy lives as long as the router.
  ProxySegment* AnswerThroughRouter(uint32_t qpn, uint32_t peer_qpn, uint32_t peer_qp_type);
  // ...or, for a loopback test, with the segment of the pod's own QP `dest_qpn`.
  void AnswerLoopback(uint32_t qpn, uint32_t dest_qpn);
  // ...or over a direct connection to the peer process: `reply` as it is (kConnectDirect),
  // with no descriptors.
  void AnswerDirect(uint32_t qpn, const ff::proto::ConnectReply& reply);
  // While withheld, ConnectQp from `qpn` is answered EINPROGRESS (with no descriptors), as
  // the router does until the destination names `qpn`; then as set up above.
  void WithholdConsent(uint32_t qpn, bool withhold);
  // From now on ConnectQp from `qpn` is answered EHOSTUNREACH, as for a peer QP that is gone.
  void ForgetAnswer(uint32_t qpn);
  // How many ConnectQp / ResolveUd requests came from `qpn`.
  int connect_count(uint32_t qpn);
  // The NameQp requests received (answered 0, linking nothing), in order.
  std::vector<ff::proto::NameQp> names();

  // Writes response records to `p` through the codec and wakes the pod.
  void Respond(ProxySegment* p, uint32_t seq, ibv_wc_status status, bool last = true,
               uint64_t data_offset = 0, const void* data = nullptr, uint32_t len = 0);
  // Writes a SEND message into ring 0 of the pod's QP `qpn`, as a peer on this node or the
  // router delivering for one on another node does, and publishes it.
  void DeliverSend(uint32_t qpn, uint32_t src_qpn, const char* data, uint32_t len);
  // Rings the pod's wake word if it armed it (after delivering to the pod).
  void WakePod();

  void SendEvent(ff::proto::EventType type, uint32_t qpn);
  // Sends `e` whole, with descriptor `fd` when it is not -1.
  void SendEvent(const ff::proto::Event& e, int fd = -1);
  // The DirectEnded reports the pod posted, in order.
  std::vector<ff::proto::DirectEnded> direct_ended();
  // Slot `slot` of the traffic ledger the pod handed over (proto::TrafficLedger), as it is
  // now; false when none came.
  bool TrafficSlot(uint32_t slot, ff::TrafficSlot* out, uint32_t* used = nullptr);
  // Closes the connection and the event socket, as a router that died.
  void Close();

  // rdma_cm (verbs/src/rdmacm/cm_device.h): CmOpenChannel keeps the router's end of the channel;
  // CmCommand is answered by `handler` (its return value is the status; default: 0 and no
  // bytes). The handler runs on the serving thread with the router's lock held.
  using CmHandler = std::function<int(const ff::proto::CmCommand&, ff::proto::CmReply*)>;
  void OnCmCommand(CmHandler handler);
  uint32_t last_cm_channel();                       // kNoId: none opened
  int cm_channel_fd(uint32_t channel);              // the router's end (-1: none or dropped)
  void DropCmChannel(uint32_t channel);             // closes the router's end
  std::vector<ff::proto::CmCommand> cm_commands();  // every command, in order

  // What the pod told us.
  ff::NotifySlot* pod_notify();  // the pod's notify words (wake word included)
  const ff::MrEntry* mr_entry(uint32_t key);
  uint32_t last_qpn();
  int qp_segment_fd(uint32_t qpn);  // the pod's segment of QP `qpn` (a router writes into it)
  int move_mr_count();
  uint32_t last_moved_region();
  // Every region memfd the pod handed over (RegMr or MoveMr), released ones included.
  int regions_received();
  // The memfd the pod handed over for region `id` (-1: none). It stays open after release.
  int region_fd(uint32_t id);
  // The sending end of the wake socket of the channel the pod created last (-1: none).
  int last_channel_fd();

 private:
  struct Answer {
    enum Kind { kSameNode, kRouter, kLoopback, kDirect } kind;
    SameNodePeer* peer = nullptr;
    ProxySegment* proxy = nullptr;
    uint32_t peer_qpn = 0;
    uint32_t peer_qp_type = 0;
  };
  struct QpRecord {
    ff::UniqueFd seg;
    uint32_t num_rings = 0;
    uint32_t ring_bytes = 0;
    uint32_t type = 0;
  };
  struct RegionRecord {
    ff::UniqueFd fd;
    uint64_t size = 0;
    bool released = false;  // kept so that a test can look at a memfd the pod let go
  };

  void Serve();
  void Dispatch(const char* buf, size_t len, ff::UniqueFd* fds, int nfds);
  int OnHello(ff::UniqueFd* fds, ff::proto::Response* r, std::vector<int>* out);
  int OnConnect(const ff::proto::ConnectQp& m, ff::proto::Response* r, std::vector<int>* out);
  int OnCreate(ff::proto::Op op, const char* buf, ff::UniqueFd* fds, ff::proto::Response* r);
  int OnRegMr(const ff::proto::RegMr& m, ff::UniqueFd* fds, int nfds, ff::proto::Response* r);
  int OnDeregMr(const ff::proto::DeregMr& m);
  int OnMoveMr(const ff::proto::MoveMr& m, ff::UniqueFd* fds, int nfds);
  void Release(uint32_t region_id);
  int OnGetRegion(const ff::proto::GetRegion& m, ff::proto::Response* r, std::vector<int>* out);
  int AcceptRegion(bool is_new, uint32_t id, uint64_t size, ff::UniqueFd* fds, int nfds);
  int Handle(ff::proto::Op op, const char* buf, ff::UniqueFd* fds, int nfds, ff::proto::Response* r,
             std::vector<int>* out);

  std::mutex mu_;
  ff::UniqueFd sock_;     // our end
  ff::UniqueFd pod_end_;  // until TakePodEnd
  ff::UniqueFd events_;   // the pod's event socket
  ff::UniqueFd pod_notify_fd_;
  ff::Mapping pod_notify_;
  ff::UniqueFd wake_fd_;
  ff::UniqueFd table_fd_;
  ff::Mapping table_;
  uint32_t next_slot_ = 1;
  uint32_t next_qpn_ = ff::kFirstQpn;
  uint32_t last_qpn_ = 0;
  int refuse_status_ = 0;
  std::string refuse_reason_;
  std::map<uint32_t, QpRecord> qps_;
  std::map<uint32_t, RegionRecord> regions_;
  std::map<uint32_t, Answer> answers_;
  std::map<uint32_t, bool> withheld_;  // QPN -> consent withheld
  std::map<uint32_t, int> connects_;   // QPN -> connect requests
  std::vector<ff::proto::NameQp> names_;
  std::map<uint32_t, ff::proto::ConnectReply> direct_answers_;
  std::vector<ff::proto::DirectEnded> direct_ended_;
  ff::Mapping traffic_;                        // the pod's traffic ledger, read-only
  std::map<uint32_t, ff::UniqueFd> channels_;  // channel id -> its wake socket
  std::map<uint32_t, ff::UniqueFd> cm_channels_;
  uint32_t last_cm_channel_ = ff::proto::kNoId;
  CmHandler cm_handler_;
  std::vector<ff::proto::CmCommand> cm_commands_;
  uint32_t last_channel_ = ff::proto::kNoId;
  std::vector<std::unique_ptr<ProxySegment>> proxies_;
  int move_mr_count_ = 0;
  uint32_t last_moved_region_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace fftest
