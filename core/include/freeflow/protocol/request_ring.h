// The request ring of a verbs session: the two messages that set it up and ring it. The
// ring's memory (RequestRingControl, then a RingHeader and kRequestRingBytes of records of
// kind kRecRequest and kRecOnSocket) is laid out in shm_layout.h; docs/protocol.md tells the
// whole contract.
#pragma once

#include <cstdint>

#include "freeflow/protocol/common.h"

namespace ff::proto {

// The request ring of a verbs session (shm_layout.h), handed over once after HELLO. fds:
// [ring memfd, sealed against shrinking, RequestRingSegmentBytes(bytes) long]; `bytes` is
// kRequestRingBytes. From the answer on, the library writes each request as one
// kRecRequest record instead of sending it: its payload is the time it was published
// (MonotonicNs, 8 bytes; the router serves the rings of all pods oldest first), then the
// request's bytes, header included. A request with descriptors still travels on the socket,
// right after a kRecOnSocket record (the publish time alone) that holds its place: the
// router serves the ring in order and takes such a request from the socket when it reaches
// its record. While the router sleeps it sets
// RequestRingControl::sleeping; a library that finds it set after publishing takes it back
// to 0 and sends a Doorbell. A router that refuses the ring (or predates it) leaves the
// library on the socket. Requests are answered on the socket as before. Only a Doorbell,
// or a request whose kRecOnSocket record is published, may come on the socket after it.
struct RequestRing {
  RequestHeader<Op::kRequestRing> h;
  uint32_t bytes;
  uint32_t reserved;
};
static_assert(sizeof(RequestRing) == 16 && alignof(RequestRing) == 4);
// Posted: the ring has records (RequestRing). Nothing else.
struct Doorbell {
  RequestHeader<Op::kDoorbell> h;
  uint32_t reserved[2];
};
static_assert(sizeof(Doorbell) == 16 && alignof(Doorbell) == 4);

}  // namespace ff::proto
