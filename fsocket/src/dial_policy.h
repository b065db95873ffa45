// Which connects are worth a stream segment (docs/tcp-mode.md, "Short connections"). An
// accelerated connection costs two round trips to the router, a segment made, mapped and
// unmapped: far more than the kernel's handshake between two pods of one node. A connection
// that carries a request and its answer and closes (HTTP without keep-alive, a connection
// per transaction) cannot win that back. The library watches, per destination address and
// port, how its accelerated connections end; after a run of short ones it gives the next
// connects there to the kernel, with no round trip at all, and now and then accelerates one
// again to see whether the pattern changed (freeflow/tunables.h, kShortStream*). While that
// look is open, the connects that follow go to the kernel too: a program with several
// connections under way (ab -c 4, a pool) would otherwise accelerate one look each.
//
// Per process, in memory: a forked child starts with its parent's view.
#pragma once

#include <cstdint>

#include "sock.h"

namespace ff::fsocket {

// What a connect to a destination should be.
enum class Dial {
  kAccelerate,  // a stream, judged when it ends
  kLook,        // a stream, the one look after the kernel's turn (others wait for its end)
  kKernel,      // kernel TCP: the destination's connections have been short
};
// A connect to `ip_net`:`port_net` (network order) is about to be accelerated: what it
// should be. A kLook that does not become a stream must be given back (LookNotMade).
Dial DialKind(uint32_t ip_net, uint16_t port_net);
// The look DialKind granted for that destination was not made (the stream was not set up).
void LookNotMade(uint32_t ip_net, uint16_t port_net);
// Marks stream `s` as a connection this process dialed; `look` as DialKind said.
void NoteDialed(Sock& s, bool look);
// The last descriptor of stream `s` in this process is being closed: when this process
// dialed it, the calls that moved bytes on it and the bytes they moved judge its destination.
void NoteDialedEnd(const Sock& s);

// fork support: the table's lock across fork().
void DialPolicyPrepareFork();
void DialPolicyAfterFork();

}  // namespace ff::fsocket
