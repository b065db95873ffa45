// TCP mode (libfsocket.so; docs/tcp-mode.md) on the pod socket: a socket session's HELLO, the
// requests that register listeners and find or claim the stream segment of a connection
// between two pods of one node, and their answer (SockReply). The segment's memory is laid
// out in stream_segment.h, the pod list the router hands over in stream_pods.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "freeflow/protocol/common.h"

namespace ff::proto {

// A TCP connection between two pods of one node whose both ends run libfsocket moves its
// bytes through a stream segment (stream_segment.h) the router makes, instead of the
// kernel's TCP; the kernel connection stays, carries only one-byte bells, and gives the
// socket its addresses, its readiness for poll/epoll and its FIN/RST. The router keeps a
// record per such connection, keyed by its four-tuple, from kSockConnect until the
// connection is gone from both ends' namespaces.
//
// Opens a socket session: answered with HelloReply (verbs_session.h: ip, prefix_len, node)
// and, when the router has one, one descriptor: the node's pod list (stream_pods.h),
// read-only.
using SockHello = HelloOf<Op::kSockHello>;
// The pod listens with libfsocket on TCP `port` of its overlay address (a socket bound to
// it or to INADDR_ANY): connects from pods of this node to it get a stream segment. Kept
// until kSockUnlisten from the same session (posted) or the session's end; a session may
// name a port more than once (each kSockListen needs its kSockUnlisten).
template <Op kOpValue>
struct SockPort {
  RequestHeader<kOpValue> h;
  uint32_t port;  // host byte order, 1..65535
  uint32_t reserved;
};
using SockListen = SockPort<Op::kSockListen>;
using SockUnlisten = SockPort<Op::kSockUnlisten>;
static_assert(sizeof(SockListen) == 16 && sizeof(SockUnlisten) == 16 && alignof(SockListen) == 4);
// One TCP connection as the asking end sees it: its own overlay address (implied: the
// session's), its port, and the other end's address and port.
//   kSockConnect: asked before the kernel connect, from a bound socket. When `peer_ip` is a
//     pod of this node listening with libfsocket on `peer_port`, the router makes the
//     record and its segment and answers 0 (role kStreamClient); else ENOENT (use kernel
//     TCP as is). A record left from an earlier connection with the same four-tuple is
//     replaced.
//   kSockClaim: the end of a connection the asking pod holds (an accepted connection, or a
//     descriptor it inherited across exec): 0 with its role, or ENOENT when no record
//     names this connection with the asking pod at that end.
//   kSockRelease (posted): the client's connect failed; the record goes if no server
//     claimed it.
//   kSockClosed (posted): the last descriptor of the asking pod's end, in the process that
//     sends it, is closed. The record goes once both ends said so (short connections must
//     not hold their pods' quotas until the next sweep); a later claim finds nothing.
// Answer (0): SockReply, fds [stream segment memfd, side memfd of the asker's end, the
// asker's side of the connection's bell pair (a Unix stream socket pair: it reads its own
// wake-ups there and sends the other end's; stream_segment.h)].
template <Op kOpValue>
struct SockTuple {
  RequestHeader<kOpValue> h;
  uint32_t peer_ip;     // network byte order
  uint16_t local_port;  // host byte order
  uint16_t peer_port;   // host byte order
};
using SockConnect = SockTuple<Op::kSockConnect>;
using SockClaim = SockTuple<Op::kSockClaim>;
using SockRelease = SockTuple<Op::kSockRelease>;
using SockClosed = SockTuple<Op::kSockClosed>;
static_assert(sizeof(SockConnect) == 16 && sizeof(SockClaim) == 16 && sizeof(SockRelease) == 16 &&
              sizeof(SockClosed) == 16 && alignof(SockConnect) == 4);
inline constexpr uint32_t kStreamClient = 0, kStreamServer = 1;  // SockReply::role
struct SockReply {
  uint32_t role;        // kStreamClient: produce into ring 0, consume ring 1; else reversed
  uint32_t ring_bytes;  // each ring's size (a power of two); the segment is
                        // StreamSegmentBytes(ring_bytes), the side memfd kStreamSideBytes
};
static_assert(sizeof(SockReply) == 8 && alignof(SockReply) == 4);

}  // namespace ff::proto
