// One-time listeners for direct connections (docs/direct-path.md): the acceptor's router
// opens a listener inside the target pod's network namespace, on that pod's address and a
// port of the configured range, and takes exactly one connection from it: the first whose
// opening frame is a Hello sealed with the connection's secret by the dialling end, naming
// the connection and the two pods. Anything else that connects there is closed and counted;
// the pod never sees it. The accepted socket, its hello consumed, goes to `Done`, and the
// listener closes. A listener nobody completes in time ends with ETIMEDOUT.
//
// Nothing here blocks: the listener and the sockets it accepted are watched by the router's
// event loop, and a socket that has not sent a whole hello by the deadline is closed.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "base/event_loop.h"
#include "base/reason_counts.h"
#include "freeflow/fd.h"
#include "freeflow/frame_seal.h"
#include "freeflow/protocol/direct_wire.h"

namespace ff::router {

// Why a connection to a direct listener was closed (metrics: the `reason` label).
enum class DirectRefusal : uint8_t {
  kAddress,      // from another address than the dialling pod's
  kCrowded,      // the oldest of too many candidates, closed for a newer one
  kClosed,       // closed by its peer before a whole hello
  kUnauthentic,  // a hello that does not open with the connection's secret, or names others
};
inline constexpr size_t kDirectRefusals = 4;
using DirectRefusals = ReasonCounts<DirectRefusal, kDirectRefusals>;

class DirectListeners {
 public:
  struct Options {
    uint16_t port_lo = 0;  // the range listeners bind in; 0..0: any port the kernel picks
    uint16_t port_hi = 0;
    uint64_t timeout_ns = 0;  // how long a listener waits for its connection
    SealMode mode = SealMode::kEncrypt;
  };
  // The connection expected on a listener: who dials, whom, and with what.
  struct Expect {
    uint64_t conn = 0;
    uint32_t dialler_ip = 0;  // host byte order
    uint32_t acceptor_ip = 0;
    uint8_t secret[kDirectSecretBytes] = {};
  };
  // The accepted connection (its hello consumed: the next frame the dialler sends is number
  // 1), or an errno value and an empty descriptor.
  using Done = std::function<void(UniqueFd conn, int error)>;

  DirectListeners(Options options, EventLoop& loop);
  ~DirectListeners();
  DirectListeners(const DirectListeners&) = delete;
  DirectListeners& operator=(const DirectListeners&) = delete;

  // Opens a listener on `expect.acceptor_ip` inside the network namespace `netns` (an open
  // descriptor of it; -1: the router's own, for host-network pods and tests) and sets
  // *port. 0 or an errno value (EADDRINUSE: every port of the range is taken) with *error.
  // `done` runs once, later, on the loop's thread; never from inside Open.
  int Open(int netns, const Expect& expect, Done done, uint16_t* port, std::string* error);
  // Ends listeners past their deadline (ETIMEDOUT). Call from the router's timer.
  void Tick(uint64_t now_ns);
  size_t open() const { return listeners_.size(); }
  // Connections closed because they were not the expected one, since start.
  uint64_t refused() const { return refusals_.total(); }
  const DirectRefusals& refusals() const { return refusals_; }

 private:
  struct Candidate;
  struct Listener;
  void OnAcceptable(uint64_t id);
  void OnReadable(uint64_t id, int cand_fd);
  // The candidate's whole hello arrived: true when it is the expected one.
  bool Authentic(const Listener& l, const char (&frame)[direct::kHelloFrameBytes]);
  void Finish(uint64_t id, UniqueFd conn, int error);
  void Refuse(Listener& l, int cand_fd, DirectRefusal reason, const char* why);

  Options options_;
  EventLoop& loop_;
  uint64_t next_id_ = 1;
  uint32_t next_port_ = 0;  // where the search of the range starts next
  DirectRefusals refusals_{{"address", "crowded", "closed", "unauthentic"}};
  std::map<uint64_t, std::unique_ptr<Listener>> listeners_;
};

}  // namespace ff::router
