// TCP mode's router side (libfsocket.so; docs/tcp-mode.md): socket sessions, the listening
// ports of each pod, and one record per accelerated connection between two pods of this
// node — its four-tuple, the stream segment both ends map and each end's side memfd.
//
// Requests (a socket session says kSockHello, then only IsSocketOp requests):
//   SockListen / SockUnlisten (posted): a registration of a port of the session's pod,
//     owned by the session (gone with it too), within the pod's kListeners quota.
//   SockConnect: when the peer address has a registration on the peer port, a new record
//     (client: the asking pod; server: the listener's pod), charged to the asking pod's
//     kStreams and kFds quotas until it goes; else ENOENT (kernel TCP as is).
//   SockClaim: the record in which the asking pod — address and network namespace — is the
//     end at its port, facing the peer it names: its role, the segment and its own side.
//   SockRelease (posted): the client's connect failed; the record goes if no server claimed.
//   SockClosed (posted): a process of the asking pod closed its last descriptor of its end;
//     once both ends said so the record goes at once, without waiting for a sweep (a pod of
//     short connections would otherwise hold its quotas with the closed ones).
//
// Every socket session gets, at kSockHello, the node's pod list (stream_pods.h) read-only:
// the addresses of members and of record ends. A library skips the router for a connection
// whose peer is not on it. It also gets its pod's claims table (stream_claims.h) read-only:
// the records in which the pod is the server and that it has not claimed yet, written
// before the client is answered. A library skips the router for an accepted connection that
// is not in it.
//
// Records outlive sessions (a program execs, a forked child keeps the socket): a record goes
// when its connection is gone from the network namespaces of both ends (a sweep every
// gc_period_ns through the TcpModeProbe, off the loop's thread; TcpModeSweeper), when its
// client releases it, or when the same client tuple connects again. An end seen in its
// namespace and later gone is closed: its namespace handle is let go, and claims naming it
// are refused. The charge of a record whose charged end closed moves to the other end's pod
// (the one keeping it); a pod over quota then loses the record.
//
// Threading: the loop's thread only (answers from the sweeper are posted to the loop).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/event_loop.h"
#include "base/quotas.h"
#include "freeflow/fd.h"
#include "freeflow/ipv4.h"
#include "freeflow/protocol.h"
#include "pods/pod_sessions.h"
#include "tcpmode/claims_table.h"
#include "tcpmode/pod_list.h"
#include "tcpmode/probe.h"
#include "tcpmode/sweeper.h"

namespace ff::router {

class HandoverState;

class TcpModeService {
 public:
  struct Parts {
    EventLoop& loop;
    PodSessions& sessions;
    Quotas& quotas;
    TcpModeProbe& probe;
    std::string node_name;  // told to pods at SockHello
    Ipv4Prefix overlay;     // likewise (its length)
    uint64_t gc_period_ns = kStreamGcPeriodNs;
    uint64_t unseen_grace_ns = kStreamUnseenGraceNs;
  };
  explicit TcpModeService(Parts parts);
  ~TcpModeService();
  TcpModeService(const TcpModeService&) = delete;
  TcpModeService& operator=(const TcpModeService&) = delete;

  // kSockHello and the socket-session requests; every one is answered. false: the request
  // breaks the protocol (the pod is then disconnected).
  bool OnRequest(const Call& call, const char* msg);
  // The session closed: its registrations go; its records stay.
  void OnPodGone(PodId pod);
  // On the router's timer: starts a sweep when records exist and one is due.
  void Tick();

  size_t streams() const { return records_.size(); }
  // SockConnect and SockClaim requests answered so far (a connection's round trips).
  uint64_t asks() const { return asks_; }
  // The pod list sessions get (stream_pods.h): is host-order `ip` on it?
  bool Listed(uint32_t ip) const { return pods_.Listed(ip); }
  size_t listeners() const { return listener_count_; }
  // The hand-over (tcpmode/handover.cc): what keeps TCP mode's state from moving in
  // hand-over `version` ("" when nothing does); all of it into state.doc["tcp_mode"]; and
  // back, after the sessions were taken, in place of this service's empty state (throws
  // HandoverError).
  std::string WhyNotMovable(uint32_t version) const;
  void Export(HandoverState& state) const;
  void Import(HandoverState& state);

 private:
  // A socket session: its pod's address and namespace, and a handle on that namespace.
  struct Member {
    uint32_t ip = 0;
    uint64_t netns = 0;
    std::shared_ptr<NetnsHandle> ns;
  };
  struct Key {  // a connection: client address and port, server address and port
    uint32_t client_ip = 0;
    uint16_t client_port = 0;
    uint32_t server_ip = 0;
    uint16_t server_port = 0;
    auto operator<=>(const Key&) const = default;
  };
  static constexpr int kClient = 0, kServer = 1;  // Record::ends, as proto::kStream*
  struct End {
    uint32_t ip = 0;
    uint64_t netns = 0;
    std::shared_ptr<NetnsHandle> ns;  // let go when the end closes
    UniqueFd side;                    // kStreamSideBytes; this end's pod only
    // This end's side of the record's bell pair (stream_segment.h): this end's pod only.
    UniqueFd bell;
    bool seen = false;                // its namespace has shown the connection
    bool closed = false;              // seen, then gone: nobody there can claim it again
    bool closed_said = false;         // the pod said it closed its last descriptor (SockClosed)
    Presence last = Presence::kUnknown;
  };
  struct Record {
    uint64_t gen = 0;  // tells a record from a later one with the same key
    UniqueFd segment;  // StreamSegmentBytes(kStreamRingBytes)
    End ends[2];
    int charged = kClient;  // whose pod's quotas it is charged to
    bool server_claimed = false;
    // In the server pod's claims table (until claimed or dropped); `placed`: in its slots,
    // not spilled.
    bool awaiting = false;
    bool placed = false;
    uint64_t created_ns = 0;
  };
  // A pod's claims table, while the pod has socket sessions.
  struct PodClaims {
    TcpModeClaims table;
    uint32_t members = 0;
  };
  // Which record end a sweep's question was about.
  struct Asked {
    Key key;
    uint64_t gen = 0;
    int end = kClient;
  };

  bool Hello(const Call& call);
  int Listen(const Call& call, const Member& m, uint32_t port);
  int Unlisten(const Call& call, const Member& m, uint32_t port);
  int Connect(const Member& m, const proto::SockConnect& q, proto::Response* r,
              std::vector<int>* fds);
  int Claim(const Member& m, const proto::SockClaim& q, proto::Response* r, std::vector<int>* fds);
  int Release(const Member& m, const proto::SockRelease& q);
  int Closed(const Member& m, const proto::SockClosed& q);
  // The record in which the pod `m` is the end at `local_port` facing `peer_ip`:`peer_port`
  // (the newer one when both orientations match), and which end that is; nullptr if none.
  Record* EndOf(const Member& m, uint32_t peer_ip, uint16_t local_port, uint16_t peer_port,
                int* end, std::map<Key, Record>::iterator* where);
  // The session that holds a registration of `port` at `ip`, or nullptr.
  const Member* ListenerOf(uint32_t ip, uint16_t port) const;
  // The namespace handle of a new socket session (one per namespace, shared).
  std::shared_ptr<NetnsHandle> HandleFor(PodId pod, const PodIdentity& who, std::string* error);
  int MakeRecord(const Member& client, const Member& server, Record* r);
  void Drop(std::map<Key, Record>::iterator it, const char* why);
  // Puts an unclaimed record in its server pod's claims table, or takes it out.
  void Await(const Key& key, Record& r);
  void Unawait(const Key& key, Record& r);
  // A member of address `ip` came (the first makes its pod's claims table, with the
  // unclaimed records of its namespace `netns`) or went (the last takes the table away).
  void ClaimsJoin(uint32_t ip, uint64_t netns);
  void ClaimsLeave(uint32_t ip);
  // The sweep's answers, on the loop's thread.
  void Apply(const std::vector<StreamLook>& looks);
  // After a sweep: drops the record if its connection is gone from both ends, or moves its
  // charge when the charged end closed. Returns false when it dropped it.
  bool Settle(std::map<Key, Record>::iterator it, uint64_t now);
  // Parts of Import: the claims tables (after the members), the records.
  void ImportClaims(HandoverState& state, const nlohmann::json& t);
  void ImportRecords(
      HandoverState& state, const nlohmann::json& t,
      const std::function<std::shared_ptr<NetnsHandle>(const nlohmann::json&)>& handle,
      std::map<uint32_t, uint32_t>* refs);

  Parts parts_;
  TcpModePodList pods_;  // every member's address and every record end's
  std::unordered_map<PodId, Member> members_;
  std::unordered_map<uint32_t, std::unique_ptr<PodClaims>> claims_;  // by pod address
  std::map<std::pair<uint32_t, uint64_t>, std::weak_ptr<NetnsHandle>> handles_;
  // Registrations: (address, port) -> the sessions that registered it, once per request.
  std::map<std::pair<uint32_t, uint16_t>, std::vector<PodId>> listeners_;
  size_t listener_count_ = 0;
  uint64_t asks_ = 0;
  std::map<Key, Record> records_;
  uint64_t next_gen_ = 1;
  std::vector<Asked> asked_;  // the questions of the sweep under way, in order
  bool sweeping_ = false;
  uint64_t next_sweep_ns_ = 0;
  LogLimiter unknown_log_;
  LogLimiter refusal_log_;
  TcpModeSweeper sweeper_;  // last: its thread stops before the tables go
};

}  // namespace ff::router
