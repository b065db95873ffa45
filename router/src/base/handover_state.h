// What one router hands to the router that replaces it (docs/handover.md): a document of
// records (CBOR, one JSON value) and the descriptors the records name by index, moved over
// the hand-over socket (a SOCK_SEQPACKET Unix socket) as a sequence of messages:
//
//   new -> old   kHello   {versions it speaks: lowest, highest}
//   old -> new   kRefuse  {why, text}                    and the exchange ends
//             or kAccept  {version}, kFds x N (16 descriptors each), kState x M (the CBOR
//                         bytes in pieces), kEnd {descriptors, bytes}
//   new -> old   kServing once it serves every session it took, or kFailed {why, text};
//                then the old router closes what it held (or, failed, serves on).
//
// The records come from the old router, whom the socket's peer checks established
// (identity/router_peer.h); the new router still reads every value as bounded and typed
// (HandoverState::Get and friends throw HandoverError), and every descriptor once.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "freeflow/fd.h"

namespace ff::router {

inline constexpr uint32_t kHandoverMagic = 0x46464856;  // "FFHV"
// The hand-over versions this router speaks: a router of version N+1 speaks N as well.
inline constexpr uint32_t kHandoverVersionLow = 1;
// 2: rdma_cm ids between pods of a node; 3: TCP mode's sessions, listeners and records;
// 4: direct connections and their channels to other nodes (parked, then resumed).
inline constexpr uint32_t kHandoverVersionHigh = 4;

enum class HandoverType : uint32_t {
  kHello = 1,
  kRefuse = 2,
  kAccept = 3,
  kFds = 4,
  kState = 5,
  kEnd = 6,
  kServing = 7,
  kFailed = 8,
};

// A record that breaks the hand-over's rules (a missing or mistyped field, a number out of
// range, a descriptor named twice or of the wrong kind).
class HandoverError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a descriptor in the state must be, checked when it is taken.
enum class FdKind : uint8_t { kAny, kSocket, kMemfd };

class HandoverState {
 public:
  using Json = nlohmann::json;
  Json doc = Json::object();

  // Sending side: names descriptor `fd` (not owned; it must stay open until the state is
  // sent) in the state; the value to store in a record.
  uint32_t PutFd(int fd);
  // The same for a descriptor the state keeps open until it is destroyed.
  uint32_t PutFd(UniqueFd fd);
  // Receiving side: takes the descriptor a record names, once. Throws HandoverError.
  UniqueFd TakeFd(const Json& index, FdKind kind);
  // Descriptors received and not taken by any record (the state is then refused).
  size_t untaken() const;
  size_t fds() const { return out_fds_.size() + in_fds_.size(); }

  // A field of `j`, typed and bounded; throws HandoverError naming `key`.
  static uint64_t U64(const Json& j, const char* key, uint64_t max = UINT64_MAX);
  static uint32_t U32(const Json& j, const char* key, uint32_t max = UINT32_MAX) {
    return static_cast<uint32_t>(U64(j, key, max));
  }
  static bool Bool(const Json& j, const char* key);
  // Element `i` of array `a`, a count of at most `max`; throws HandoverError.
  static uint64_t At(const Json& a, size_t i, uint64_t max = UINT64_MAX);
  static const Json& Array(const Json& j, const char* key, size_t max);
  static const Json& Object(const Json& j, const char* key);
  static std::string Bytes(const Json& j, const char* key, size_t max);
  // A string field of at most `max` bytes.
  static std::string Text(const Json& j, const char* key, size_t max);
  // The longest node name a record holds (a channel's or an rdma_cm id's peer node): room
  // for a Kubernetes node name, at most 253.
  static constexpr size_t kMaxNodeName = 255;

  // Sends the state on `sock` (blocking, after kAccept): 0 or an errno.
  int Send(int sock) const;
  // Receives a state Send() sent (after kAccept): 0, or an errno with *why. At most
  // `max_fds` descriptors and `max_bytes` of document are taken.
  int Receive(int sock, size_t max_fds, size_t max_bytes, std::string* why);

 private:
  std::vector<int> out_fds_;
  std::vector<UniqueFd> owned_;
  std::vector<UniqueFd> in_fds_;
  std::vector<bool> taken_;
};

// The file behind mapping `m` of this process, opened anew (O_RDWR or O_RDONLY) through
// /proc/self/map_files (CAP_SYS_ADMIN): a segment a pod handed over, whose descriptor the
// router closed once it had mapped it, for a successor. Throws HandoverError.
UniqueFd MappedFile(const Mapping& m, int flags);

// One control message of the exchange (kHello, kRefuse, kAccept, kServing, kFailed):
// its type, two numbers and a text of at most kHandoverTextMax bytes.
inline constexpr size_t kHandoverTextMax = 1024;
struct HandoverMessage {
  HandoverType type = HandoverType::kHello;
  uint64_t a = 0;
  uint64_t b = 0;
  std::string text;
};
int SendHandoverMessage(int sock, const HandoverMessage& m);
// Receives the next message, which must be a control message: 0, ENODATA when the peer
// closed, EPROTO for a malformed one, or the errno of the receive.
int ReceiveHandoverMessage(int sock, HandoverMessage* m);

}  // namespace ff::router
