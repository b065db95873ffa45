// The direct connections a router knows of (docs/direct-path.md): one TCP connection per
// pair of pod processes on two nodes, shared by every QP pair of the two, whichever of them
// initiated. A connection is known to the router of each end by (the peer pod's address,
// the peer process's token, the local process) and by its id, a 64-bit random number the
// acceptor's router drew and both ends' routers and libraries name it by.
//
// A token names a local process to peer routers: a number of this router's, never a pod's
// word, unique to the process for this router's life (a random salt of this router mixed
// with the PodId, so that a restarted router's tokens are not the old one's). Peer routers
// use it as part of their key, so that every QP pair of the same two processes finds the
// same connection, and a later process of the same pod a new one.
//
// Both processes of a pair may ask at once (the programs move the two QPs of a pair to RTR
// together): each router would make a connection, and the pair would then use one per
// direction, so that no answer ever rides with data. The router of the pod with the lower
// address therefore waits, before it makes a new connection for a peer's ask, until its own
// process's ask to that pod is answered (IsAsking; Executor), and shares the connection
// the other router made.
//
// Entries are forgotten when the local process's session ends, when its library reports
// the connection ended (DirectEnded), and when the acceptor's listener fails. A process
// holds at most kMaxDirectConnsPerProcess (Full): its QP pairs with processes it has no
// connection with are then relayed until one of its connections ends. A Find that finds no
// entry only means a new connection; nothing here ever refuses a connect.
//
// Threading: the loop's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <tuple>
#include <utility>

namespace ff::router {

using PodId = uint32_t;  // one pod connection (a process), as in resources.h

class DirectConnections {
 public:
  // kPending: the acceptor's listener waits for the dialler. kOpen: the acceptor's router
  // handed the accepted socket over, or (the dialler's side, of which its router learns
  // nothing more) the library was told to dial.
  enum class State : uint8_t { kPending, kOpen };
  struct Conn {
    uint64_t id = 0;
    PodId pod = 0;         // the local process
    uint32_t peer_ip = 0;  // the peer pod, host byte order
    uint64_t peer_token = 0;
    uint16_t port = 0;  // the acceptor's listener port (for log lines)
    bool dialler = false;  // the local process dials it (its router asked for it)
    State state = State::kPending;
  };

  // A salt from the system's random source; false (and a fixed salt) when it has none.
  DirectConnections();

  // The token of local process `pod`: never 0, and never the token of another process
  // while this router runs.
  uint64_t Token(PodId pod) const;
  // A fresh connection id: random, never 0, not an id `pod` already holds. 0 when the
  // system's random source fails.
  uint64_t NewId(PodId pod) const;

  // A connection of local process `pod` with the process `peer_token` at `peer_ip`; the
  // newest when there are two (both processes asked at once).
  const Conn* Find(uint32_t peer_ip, uint64_t peer_token, PodId pod) const;
  const Conn* FindById(PodId pod, uint64_t id) const;
  // True when `pod` holds kMaxDirectConnsPerProcess connections: it gets no new one.
  bool Full(PodId pod) const;
  // Records connection `c`. false when `c.pod` holds an entry with that id already.
  bool Add(const Conn& c);
  // Marks it open; false when it is not known (forgotten meanwhile).
  bool SetOpen(PodId pod, uint64_t id);
  // Forgets it, returning what it was.
  std::optional<Conn> Forget(PodId pod, uint64_t id);
  // Forgets every connection of `pod` (its session ended).
  void ForgetPod(PodId pod);

  // Asks in flight: local process `pod` asked a peer router for a direct channel to a QP at
  // `peer_ip` and has no answer yet (Forwarder). Counted per (pod, peer_ip); Answered
  // below none is ignored.
  void Asking(PodId pod, uint32_t peer_ip);
  void Answered(PodId pod, uint32_t peer_ip);
  bool IsAsking(PodId pod, uint32_t peer_ip) const { return asking_.count({pod, peer_ip}) != 0; }

  size_t size() const { return by_id_.size(); }
  size_t count(PodId pod) const;
  size_t asking() const { return asking_.size(); }

  // The hand-over (version 4; docs/handover.md): every connection, pending ones included,
  // and the salt, so that the tokens peer routers know the processes by stay theirs. Asks
  // in flight are not carried (the old router refuses while there are any). Import throws
  // HandoverError on a malformed record or one of a pod that `pod_known` does not know.
  nlohmann::json Export() const;
  void Import(const nlohmann::json& j, const std::function<bool(PodId)>& pod_known);

 private:
  using Id = std::pair<PodId, uint64_t>;  // (pod, conn id)
  // (pod, peer ip, peer token, the order it was added in): the newest of a pair is last.
  using Pair = std::tuple<PodId, uint32_t, uint64_t, uint64_t>;
  struct Entry {
    Conn conn;
    uint64_t order = 0;
  };
  static Pair PairOf(const Entry& e) {
    return {e.conn.pod, e.conn.peer_ip, e.conn.peer_token, e.order};
  }

  uint64_t salt_ = 0;
  uint64_t next_order_ = 0;
  std::map<Id, Entry> by_id_;
  std::map<Pair, uint64_t> by_pair_;  // -> conn id
  std::map<PodId, size_t> counts_;
  std::map<std::pair<PodId, uint32_t>, uint32_t> asking_;  // (pod, peer ip) -> asks
};

}  // namespace ff::router
