// Events on their way to one pod while its event socket is full. Most events a pod gets are
// caused by other parties (a sender taking a ring of its UD QP, a peer closing), as often as
// they like: a pod that reads its events, only more slowly than a third pod makes them, must
// not lose its event socket (and with it its session's QPs). So an event that says what
// another queued event says, newer, replaces it (a UD QP's ring has one sender: the latest
// kUdRing of a ring stands for all before it; a QP's kPeerGone, kPeerNamed, ... once is as
// good as twice), and what waits is bounded by the pod's own objects, not by how often
// others act. Events that replace nothing (a direct connection each) wait up to
// kMaxQueuedEvents; beyond that (or its quotas: PodSessions charges what waits) the pod is
// not reading, and loses its event socket.
// Threading: the router loop's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <tuple>

#include "freeflow/fd.h"
#include "freeflow/protocol.h"

namespace ff::router {

class HandoverState;

class EventBacklog {
 public:
  // Queues `e` with a duplicate of `fd` (-1: none), replacing the queued event it makes
  // stale (the new one goes last). false when it would exceed kMaxQueuedEvents, or `fd`
  // cannot be duplicated: nothing was queued.
  bool Push(const proto::Event& e, int fd);
  // Sends what `sock` takes, oldest first. 0: all sent; EAGAIN: the socket is full; else
  // the error that breaks it.
  int Flush(int sock);
  bool empty() const { return queue_.empty(); }
  size_t size() const { return queue_.size(); }
  size_t fds() const { return fds_; }  // descriptors the queued events hold
  uint64_t replaced() const { return replaced_; }
  // Hand-over (pods/handover.cc): the events in order, each [bytes, descriptor or null];
  // and back, through Push.
  nlohmann::json Export(HandoverState& state) const;
  void Import(HandoverState& state, const nlohmann::json& j);

 private:
  // What an event is about: two events with the same key say the same thing, the newer
  // truer. kind 0: an event that replaces nothing.
  using Key = std::tuple<uint32_t, uint32_t, uint32_t, uint32_t, uint32_t>;
  static bool KeyOf(const proto::Event& e, Key* key);
  struct Queued {
    proto::Event event;
    UniqueFd fd;
    bool keyed = false;
    Key key;
  };
  std::list<Queued> queue_;
  std::map<Key, std::list<Queued>::iterator> by_key_;
  size_t fds_ = 0;
  uint64_t replaced_ = 0;
};

}  // namespace ff::router
