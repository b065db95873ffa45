// TCP mode's view of the kernel: a handle on a pod's network namespace, and whether one TCP
// connection exists there (sock_diag). The socket service keeps a record per accelerated
// connection until the connection is gone from the namespaces of both its ends; this is how
// it asks. A seam: unit tests say which connections exist without root or namespaces.
//
// The handle of the real probe is a NETLINK_SOCK_DIAG socket that a short-lived thread made
// inside the pod's namespace (as identity.cc reads a namespace): a socket stays bound to the
// namespace it was made in, so later questions need no thread and no setns(). It keeps the
// namespace alive while the router holds it (as any socket in it would), so the socket
// service holds it only while a session of the pod or an open end of a record needs it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "freeflow/fd.h"
#include "identity/identity.h"

namespace ff::router {

// One end's view of a TCP connection, host byte order.
struct TcpTuple {
  uint32_t local_ip = 0;
  uint16_t local_port = 0;
  uint32_t remote_ip = 0;
  uint16_t remote_port = 0;
};

enum class Presence : uint8_t {
  kAlive,    // a socket holds the tuple in a state other than TIME_WAIT, CLOSE or LISTEN
  kGone,     // no socket holds it, or it is in TIME_WAIT or CLOSE: no process can claim it
  kUnknown,  // the kernel did not say (no answer in time, sock_diag missing)
};

// A pod's network namespace as the router holds it (opaque; see the file comment).
class NetnsHandle {
 public:
  virtual ~NetnsHandle() = default;
  // The descriptor that holds the namespace, for a hand-over (docs/handover.md); -1 when the
  // handle has none and cannot move.
  virtual int fd() const { return -1; }
};

class TcpModeProbe {
 public:
  virtual ~TcpModeProbe() = default;
  // The loop's thread: a handle on the network namespace of the process behind connected
  // pod socket `sock`, which must be the namespace identity found (`who.netns`, when known).
  // nullptr + *error (a sentence a person can act on).
  virtual std::shared_ptr<NetnsHandle> Open(int sock, const PodIdentity& who,
                                            std::string* error) = 0;
  // One thread at a time (the sweeper's): whether connection `t` exists in the namespace of
  // `ns`. Never blocks longer than kNetlinkTimeoutMs.
  virtual Presence Look(NetnsHandle& ns, const TcpTuple& t) = 0;
  // The loop's thread, in a hand-over: a handle on what another router's handle held (its
  // fd()); nullptr when `fd` is not what this probe's handles hold.
  virtual std::shared_ptr<NetnsHandle> Adopt(UniqueFd /*fd*/) { return nullptr; }
};

// The real probe: sock_diag (inet_diag, TCP, IPv4) inside each pod's namespace.
std::unique_ptr<TcpModeProbe> MakeSockDiagProbe();

}  // namespace ff::router
