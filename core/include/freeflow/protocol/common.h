// What every message on the pod socket (a library's SOCK_SEQPACKET connection to its router)
// starts with, the ops that name the requests, and the limits of one datagram. The messages
// themselves are in the header of their protocol (freeflow/protocol.h lists them; the
// contracts are in docs/protocol.md).
#pragma once

#include <cstddef>
#include <cstdint>

#include "freeflow/abi_constants.h"

namespace ff::proto {

// ABI: an op's number is its value here; new ops go last (before kMaxOp), and no op is ever
// renumbered: a library and a router of different versions must still tell a HELLO
// (kHello, kSockHello) apart from anything else, to refuse each other cleanly.
enum class Op : uint32_t {
  kHello = 1,
  kCreateChannel,
  kDestroyChannel,
  kCreateCq,
  kDestroyCq,
  kCreateSrq,
  kDestroySrq,
  kCreateQp,
  kDestroyQp,
  kConnectQp,
  kDisconnectQp,
  kResolveUd,
  kRegMr,
  kDeregMr,
  kGetRegion,
  kMoveMr,
  kAllocMw,
  kBindMw,
  kInvalidateMw,
  kDeallocMw,
  kCmOpenChannel,
  kCmCommand,
  // TCP mode (libfsocket.so): a socket session says kSockHello instead of kHello and may
  // then send only the kSock* requests below; a verbs session may send none of them.
  kSockHello,
  kSockListen,
  kSockUnlisten,
  kSockConnect,
  kSockClaim,
  kSockRelease,
  kSockClosed,
  kNameQp,
  kRequestRing,
  kDoorbell,
  kDirectEnded,
  kTrafficLedger,
  kMaxOp,
};
static_assert(static_cast<uint32_t>(Op::kHello) == 1 && static_cast<uint32_t>(Op::kSockHello) == 23,
              "a HELLO of either kind keeps its number in every version");
static_assert(static_cast<uint32_t>(Op::kMaxOp) == 35, "a new op needs a kAbiVersion bump");

struct Header {
  Op op;
  uint32_t seq;  // echoed in the response
};
static_assert(sizeof(Header) == 8 && alignof(Header) == 4);

// The header of a request of one kind: a value-initialised request names its op, and
// OpOf<M> tells it at compile time. Same layout as Header.
template <Op kOpValue>
struct RequestHeader {
  static constexpr Op kOp = kOpValue;
  Op op = kOpValue;
  uint32_t seq = 0;
};
static_assert(sizeof(RequestHeader<Op::kHello>) == sizeof(Header) &&
              alignof(RequestHeader<Op::kHello>) == alignof(Header));
template <typename M>
inline constexpr Op OpOf = decltype(M::h)::kOp;

// The first request of a session: a verbs session's Hello (verbs_session.h) or a socket
// session's SockHello (tcp_mode.h), both naming the ABI the library was built for.
template <Op kOpValue>
struct HelloOf {
  RequestHeader<kOpValue> h;
  uint32_t abi;
  uint32_t reserved;
};
static_assert(sizeof(HelloOf<Op::kHello>) == 16 && alignof(HelloOf<Op::kHello>) == 4 &&
              offsetof(HelloOf<Op::kHello>, abi) == 8);

inline constexpr uint32_t kNoId = 0xffffffffu;
// A request with this seq is posted: the router answers none (IsPostable, pod_socket.h). The
// library numbers its other requests from 1 and skips it.
inline constexpr uint32_t kPostedSeq = 0xffffffffu;

// The largest datagram either side sends on the pod socket, and the most descriptors that
// come with one.
inline constexpr int kMaxFds = 8;
inline constexpr int kMaxMessage = 512;

}  // namespace ff::proto
