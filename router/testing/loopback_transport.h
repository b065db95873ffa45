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
#include <vector>

#include "nodes/node_transport.h"

namespace ff::router {

class LoopbackNetwork {
 public:
  explicit LoopbackNetwork(size_t high_water = kLinkHighWater) : high_water_(high_water) {}
  LoopbackNetwork(const LoopbackNetwork&) = delete;
  LoopbackNetwork& operator=(const LoopbackNetwork&) = delete;

  // A node transport for the router at `self`; Dial() finds peers by their endpoints. It
  // must not outlive the network; destroying it breaks its links.
  std::unique_ptr<NodeTransport> Attach(cp::Endpoint self);
  // Breaks every link between the routers of nodes `a` and `b`: both ends see OnLinkDown.
  void Sever(const std::string& a, const std::string& b);
  // Stops (true) or restarts delivering messages to the router of `node`; while it is
  // paused, what is sent to it waits and its senders' links fill up.
  void Pause(const std::string& node, bool paused);
  // Messages sent so far, in all directions.
  uint64_t messages_sent() const;

 private:
  // One router's end (defined in the .cc); the structures below are shared by all ends and
  // guarded by mu_.
  class Transport;
  struct Message {
    wire::Type type;
    uint32_t chan;
    uint16_t flags;
    std::vector<char> body;
  };
  struct LinkState {
    Transport* owner = nullptr;
    LinkId peer = kNoLink;
    bool dialled = false;
    bool held = false;          // the owner's handler held the front message
    bool over_high = false;     // owed reached the high-water mark since the last OnDrained
    size_t owed = 0;            // bytes sent on this link that the peer has not taken yet
    std::deque<Message> inbox;  // messages for `owner`, in order
  };
  // Work for a transport's loop: a link went down or drained.
  struct Notice {
    LinkId link;
    bool down;
    std::string why;
  };
  void BreakLocked(LinkId link, const std::string& why);
  void SignalLocked(Transport* t);

  mutable std::mutex mu_;
  size_t high_water_;
  LinkId next_link_ = 1;
  uint64_t sent_ = 0;
  std::map<LinkId, LinkState> links_;
  std::set<Transport*> transports_;
  std::map<Transport*, std::vector<Notice>> notices_;
};

}  // namespace ff::router
