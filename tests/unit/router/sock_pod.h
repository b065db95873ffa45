// A raw pod that speaks TCP mode's socket-session protocol (docs/tcp-mode.md) itself, as a
// hostile pod would, for the socket service's tests.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>

#include <cstdint>
#include <vector>

#include "freeflow/fd.h"
#include "freeflow/protocol.h"
#include "freeflow/stream_segment.h"
#include "harness.h"

namespace ff::router::test {

// What a SockConnect or SockClaim answered.
struct SockAnswer {
  int status = -1;
  proto::SockReply reply{};
  std::vector<UniqueFd> fds;  // [segment, side, bell] on success
};

// The inode of the object behind `fd`: two descriptors of one memfd share it.
inline ino_t InodeOf(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? st.st_ino : 0;
}

inline bool SameMemfd(const UniqueFd& a, const UniqueFd& b) {
  return InodeOf(a.get()) != 0 && InodeOf(a.get()) == InodeOf(b.get());
}

inline uint64_t SizeOf(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

class SockPod : public RawPod {
 public:
  SockPod(TestRouter& router, uint32_t ip, uint64_t netns = 0) : RawPod(router, ip, netns) {}

  // SockHello; hello() holds the answer.
  int SockHello(uint32_t abi = kAbiVersion) {
    proto::SockHello m{};
    m.abi = abi;
    std::vector<UniqueFd> fds;
    const proto::Response r = Call(m, {}, &fds);
    pod_list_ = fds.empty() ? UniqueFd() : std::move(fds[0]);
    claims_ = fds.size() < 2 ? UniqueFd() : std::move(fds[1]);
    reply_ = r.u.hello;
    reply_.node[sizeof(reply_.node) - 1] = '\0';
    return r.status;
  }
  const proto::HelloReply& sock_hello() const { return reply_; }
  // The node's pod list that came with the SockHello answer (stream_pods.h).
  const UniqueFd& pod_list() const { return pod_list_; }
  // The pod's claims table that came with it (stream_claims.h).
  const UniqueFd& claims() const { return claims_; }

  int Listen(uint32_t port) {
    proto::SockListen m{};
    m.port = port;
    return Call(m).status;
  }
  // Posted, as the library sends it; Sync() waits until the router has handled it.
  void Unlisten(uint32_t port) {
    proto::SockUnlisten m{};
    m.h.seq = proto::kPostedSeq;
    m.port = port;
    SendRaw(&m, sizeof(m));
  }
  SockAnswer Connect(uint32_t peer_ip, uint16_t local_port, uint16_t peer_port) {
    return Tuple<proto::SockConnect>(peer_ip, local_port, peer_port);
  }
  SockAnswer Claim(uint32_t peer_ip, uint16_t local_port, uint16_t peer_port) {
    return Tuple<proto::SockClaim>(peer_ip, local_port, peer_port);
  }
  void Release(uint32_t peer_ip, uint16_t local_port, uint16_t peer_port) {
    PostTuple<proto::SockRelease>(peer_ip, local_port, peer_port);
  }
  // Posted, as the library sends it when it closes its last descriptor of a stream.
  void Closed(uint32_t peer_ip, uint16_t local_port, uint16_t peer_port) {
    PostTuple<proto::SockClosed>(peer_ip, local_port, peer_port);
  }
  // A request answered in order after everything sent before (a listen on port 0: EINVAL).
  bool Sync() { return Listen(0) == EINVAL; }

 private:
  template <typename M>
  SockAnswer Tuple(uint32_t peer_ip, uint16_t local_port, uint16_t peer_port) {
    M m{};
    m.peer_ip = htonl(peer_ip);
    m.local_port = local_port;
    m.peer_port = peer_port;
    SockAnswer a;
    const proto::Response r = Call(m, {}, &a.fds);
    a.status = r.status;
    a.reply = r.u.sock;
    return a;
  }

  template <typename M>
  void PostTuple(uint32_t peer_ip, uint16_t local_port, uint16_t peer_port) {
    M m{};
    m.h.seq = proto::kPostedSeq;
    m.peer_ip = htonl(peer_ip);
    m.local_port = local_port;
    m.peer_port = peer_port;
    SendRaw(&m, sizeof(m));
  }

  proto::HelloReply reply_{};
  UniqueFd pod_list_;
  UniqueFd claims_;
};

}  // namespace ff::router::test
