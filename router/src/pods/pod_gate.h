// The pod socket's gate: where new connections wait until the router knows who is on the
// other end. Identifying a client costs a thread that enters its network namespace and
// reads every address there, and a pod decides how many addresses its namespace holds and
// how often it connects; so that work runs here, on a thread of its own at a lower
// priority, never on the thread that serves identified pods (docs/security.md, "Pod
// identity"). A connection leaves the gate identified (or refused, with the reason) and
// handed to that thread's loop, or closed.
//
// Fairness: connections wait per network namespace (named by the peer's credentials when it
// connected; a process that lies there only moves itself to another line) and the gate
// identifies one connection of each namespace in turn, so a namespace that connects again
// and again delays another's next client by at most one identification of its own.
//
// Bounds: at most kMaxUnidentifiedClients wait at once; a newcomer beyond that is taken and
// the oldest connection of the namespace that holds the most closes for it, so a flood from
// one namespace closes its own connections. A connection that waited kRouterCallTimeoutS
// (what the library waits for HELLO's answer) is closed unidentified (its client gave up);
// one whose client hung up without a word (a health probe) is dropped without a line in the
// log. At most kMaxIdentifiedInFlight identified connections wait for the loop to take them;
// the gate waits while that many do.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "base/acceptor.h"
#include "base/event_loop.h"
#include "base/quotas.h"
#include "freeflow/fd.h"
#include "freeflow/tunables.h"
#include "identity/identity.h"

namespace ff::router {

// True when the client of connected socket `sock` hung up without sending anything: a health
// probe that only checks that the socket accepts (the device plugin's, every 500 ms; a
// kubelet exec probe). It wants no answer and no line in the log.
bool HungUpSilently(int sock);

class PodGate {
 public:
  // A connection that left the gate: its socket and who is behind it, or why that could
  // not be known (`error` not empty).
  struct Identified {
    UniqueFd sock;
    PodIdentity who;
    std::string error;
  };
  // Called on the thread of the loop given to Start().
  using OnIdentified = std::function<void(Identified)>;

  struct Options {
    // The line a new connection waits in (default: the inode of the network namespace its
    // peer was in when it connected; 0 when that cannot be told). Tests choose their own.
    std::function<uint64_t(int sock)> line_of;
    // A connection that waited this long is closed: as long as the library waits for the
    // answer to its HELLO, after which its client has given up.
    uint64_t stale_ns = kRouterCallTimeoutS * 1'000'000'000ull;
  };
  // `identity` is used on the gate's thread only, one client at a time.
  PodGate(IdentityResolver& identity, Options options);
  explicit PodGate(IdentityResolver& identity) : PodGate(identity, Options()) {}
  // Stops the thread and closes what waits; on the thread of `deliver_to`, which then
  // receives nothing more.
  ~PodGate();
  PodGate(const PodGate&) = delete;
  PodGate& operator=(const PodGate&) = delete;

  // Takes connections from `listening` (a listening Unix socket) and delivers each on
  // `deliver_to`'s thread. false + *error when the gate's loop cannot start.
  bool Start(int listening, EventLoop& deliver_to, OnIdentified on_identified, std::string* error);

  // Thread-safe: connections waiting to be identified now, those closed for newer ones,
  // and whether accepting is paused (the process is out of descriptors).
  size_t waiting() const { return waiting_.load(); }
  uint64_t evicted() const { return evicted_.load(); }
  bool accept_paused() const { return accept_paused_.load(); }

 private:
  struct Waiting {
    UniqueFd sock;
    uint64_t since_ns = 0;
  };
  // Identified connections on their way to the loop; `open` is cleared (and `deliver`
  // dropped) when the gate goes.
  struct Outbox {
    std::mutex mu;
    std::deque<Identified> ready;
    OnIdentified deliver;
    bool open = true;
  };

  void Run();
  void OnAccepted(UniqueFd sock);
  void MakeRoom();
  // Identifies the oldest connection of the namespace whose turn it is.
  void IdentifyNext();
  void Deliver(Identified id);
  bool OutboxFull();

  IdentityResolver& identity_;
  Options options_;
  std::shared_ptr<Outbox> outbox_ = std::make_shared<Outbox>();
  EventLoop* deliver_to_ = nullptr;
  EventLoop loop_;
  Acceptor acceptor_;
  Timer tick_;
  std::thread thread_;
  std::unordered_map<uint64_t, std::deque<Waiting>> by_netns_;  // netns inode -> oldest first
  std::deque<uint64_t> turns_;  // namespaces with connections waiting, next first
  size_t total_ = 0;
  LogLimiter evict_log_, stale_log_;
  std::atomic<size_t> waiting_{0};
  std::atomic<uint64_t> evicted_{0};
  std::atomic<bool> accept_paused_{false};
};

// Identifies the client of `sock` with `identity`: the connection with who is behind it or
// why that could not be known; nothing for a probe that hung up without a word before or
// while it was identified (logged at debug level only).
std::optional<PodGate::Identified> IdentifyClient(IdentityResolver& identity, UniqueFd sock);

}  // namespace ff::router
