// An in-memory network of routers in one process: the node transport that tests use to run
// several routers without namespaces or sockets. Links deliver messages in order, each on
// its receiving router's own loop (so routers may run on different threads), and count the
// bytes a link owes so that back-pressure behaves as on TCP. The test injects faults:
// severed links (a peer router's death as its neighbours see it) and paused delivery.
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "node_transport.h"

namespace ff::router {

class LoopbackTransport;

class LoopbackNetwork {
 public:
  explicit LoopbackNetwork(size_t high_water = kLinkHighWater) : high_water_(high_water) {}
  LoopbackNetwork(const LoopbackNetwork&) = delete;
  LoopbackNetwork& operator=(const LoopbackNetwork&) = delete;

  // Breaks every link between the routers of nodes `a` and `b`: both ends see OnLinkDown.
  void Sever(const std::string& a, const std::string& b);
  // Stops (true) or restarts delivering messages to the router of `node`; while it is
  // paused, what is sent to it waits and its senders' links fill up.
  void Pause(const std::string& node, bool paused);
  // Messages sent so far, in all directions (a test can wait for traffic with it).
  uint64_t messages_sent() const;

 private:
  friend class LoopbackTransport;
  struct Message {
    wire::Type type;
    uint32_t chan;
    uint16_t flags;
    std::vector<char> body;
  };
  struct LinkState {
    LoopbackTransport* owner = nullptr;
    LinkId peer = kNoLink;
    bool dialled = false;
    bool held = false;           // owner's handler held the front message
    bool over_high = false;      // owed reached the high-water mark since the last OnDrained
    size_t owed = 0;             // bytes sent on this link that the peer has not taken yet
    std::string peer_name;
    std::deque<Message> inbox;   // messages for `owner`, in order
  };
  // A callback to run on a transport's loop: a link went down or drained.
  struct Notice {
    LinkId link;
    bool down;
    std::string why;
  };

  void Register(LoopbackTransport* t);
  void Unregister(LoopbackTransport* t);
  void BreakLocked(LinkId link, const std::string& why);  // mu_ held
  void Signal(LoopbackTransport* t);                       // mu_ held

  mutable std::mutex mu_;
  size_t high_water_;
  LinkId next_link_ = 1;
  uint64_t sent_ = 0;
  std::map<LinkId, LinkState> links_;
  std::set<LoopbackTransport*> transports_;
  std::map<LoopbackTransport*, std::vector<Notice>> notices_;
};

class LoopbackTransport final : public NodeTransport {
 public:
  // `self` is this router's endpoint: Dial() finds peers by theirs.
  LoopbackTransport(LoopbackNetwork& net, cp::Endpoint self);
  ~LoopbackTransport() override;  // breaks every link of this router

  bool Start(EventLoop& loop, Handler& handler, std::string* error) override;
  LinkId Dial(const cp::Endpoint& ep) override;
  bool Dialled(LinkId link) const override;
  void Send(LinkId link, wire::Type type, uint32_t chan, uint16_t flags,
            std::initializer_list<Bytes> parts) override;
  bool Congested(LinkId link) const override;
  void Resume(LinkId link) override;
  std::string PeerName(LinkId link) const override;

  const cp::Endpoint& self() const { return self_; }

 private:
  friend class LoopbackNetwork;
  void Pump();  // on the loop: notices first, then messages
  bool DeliverOne(LinkId link);  // false: nothing more to deliver on `link` now

  LoopbackNetwork& net_;
  cp::Endpoint self_;
  EventLoop* loop_ = nullptr;
  Handler* handler_ = nullptr;
  UniqueFd wake_;
  bool paused_ = false;  // guarded by net_.mu_
};

}  // namespace ff::router
