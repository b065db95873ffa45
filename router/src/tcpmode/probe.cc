#include "tcpmode/probe.h"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "freeflow/fd.h"
#include "freeflow/tunables.h"
#include "identity/netns_probe.h"
#include "identity/peer_process.h"

namespace ff::router {
namespace {

class SockDiagNamespace final : public NetnsHandle {
 public:
  explicit SockDiagNamespace(UniqueFd diag, uint32_t seq = 0) : diag_(std::move(diag)), seq_(seq) {}
  int fd() const override { return diag_.get(); }
  uint32_t NextSeq() { return ++seq_; }

 private:
  UniqueFd diag_;  // NETLINK_SOCK_DIAG, made inside the pod's namespace
  uint32_t seq_ = 0;
};

// What one inet_diag answer says about the connection asked for: an exact lookup may answer
// with the listener of the local port when the connection itself is gone.
// A dual-stack (AF_INET6) socket holds the peer as ::ffff:a.b.c.d, and the IPv4 lookup finds
// it all the same.
bool PeerIs(const inet_diag_msg& m, uint32_t ip) {
  if (m.idiag_family == AF_INET) return m.id.idiag_dst[0] == htonl(ip);
  return m.idiag_family == AF_INET6 && m.id.idiag_dst[0] == 0 && m.id.idiag_dst[1] == 0 &&
         m.id.idiag_dst[2] == htonl(0xffff) && m.id.idiag_dst[3] == htonl(ip);
}

Presence Judge(const inet_diag_msg& m, const TcpTuple& t) {
  if (m.id.idiag_dport != htons(t.remote_port) || !PeerIs(m, t.remote_ip))
    return Presence::kGone;  // not this connection (a listener)
  switch (m.idiag_state) {
    case TCP_TIME_WAIT:
    case TCP_CLOSE:
    case TCP_LISTEN:
      return Presence::kGone;
    default:
      return Presence::kAlive;
  }
}

// The answer to question `seq` among the messages of one receive, if it is there.
bool ReadAnswer(const char* buf, ssize_t n, uint32_t seq, const TcpTuple& t, Presence* out) {
  int len = static_cast<int>(n);
  for (auto* h = reinterpret_cast<const nlmsghdr*>(buf); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
    if (h->nlmsg_seq != seq) continue;
    if (h->nlmsg_type == NLMSG_ERROR && h->nlmsg_len >= NLMSG_LENGTH(sizeof(nlmsgerr))) {
      const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
      *out = e->error == -ENOENT ? Presence::kGone : Presence::kUnknown;
      return true;
    }
    if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY &&
        h->nlmsg_len >= NLMSG_LENGTH(sizeof(inet_diag_msg))) {
      inet_diag_msg m;
      std::memcpy(&m, NLMSG_DATA(h), sizeof(m));
      *out = Judge(m, t);
      return true;
    }
  }
  return false;
}

// One TCP socket by its tuple (no dump of the namespace): answered with that socket, with
// the listener of the local port, or with ENOENT.
struct ExactLookup {
  nlmsghdr h;
  inet_diag_req_v2 r;
};
ExactLookup AskFor(const TcpTuple& t, uint32_t seq) {
  ExactLookup q{};
  q.r.sdiag_family = AF_INET;
  q.r.sdiag_protocol = IPPROTO_TCP;
  q.r.idiag_states = ~0u;
  q.r.id.idiag_sport = htons(t.local_port);
  q.r.id.idiag_dport = htons(t.remote_port);
  q.r.id.idiag_src[0] = htonl(t.local_ip);
  q.r.id.idiag_dst[0] = htonl(t.remote_ip);
  q.r.id.idiag_cookie[0] = q.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  q.h = nlmsghdr{sizeof(q), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, seq, 0};
  return q;
}

class SockDiagProbe final : public TcpModeProbe {
 public:
  std::shared_ptr<NetnsHandle> Open(int sock, const PodIdentity& who, std::string* error) override {
    PeerProcess peer;
    if (!FindPeerProcess(sock, true, &peer, error)) return nullptr;
    UniqueFd diag;
    const bool ok = RunInNamespace(
        peer.namespace_handle(),
        [&](dev_t, ino_t ino, std::string* err) {
          if (who.netns != 0 && ino != who.netns) {
            *err = "its network namespace is not the one it was identified in";
            return;
          }
          diag = OpenNetlink(NETLINK_SOCK_DIAG, "sock_diag in the client's namespace", err);
        },
        error);
    if (!ok) return nullptr;
    return std::make_shared<SockDiagNamespace>(std::move(diag));
  }

  std::shared_ptr<NetnsHandle> Adopt(UniqueFd fd) override {
    int domain = 0, protocol = 0;
    socklen_t len = sizeof(int);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 || domain != AF_NETLINK ||
        ::getsockopt(fd.get(), SOL_SOCKET, SO_PROTOCOL, &protocol, &len) != 0 ||
        protocol != NETLINK_SOCK_DIAG)
      return nullptr;
    // Answers to the other router's questions may wait in it: drop them, and number ours
    // from another range (an answer is taken only for its own sequence number).
    alignas(nlmsghdr) char buf[8192];
    for (int i = 0; i<kMaxStaleDiagAnswers&& ::recv(fd.get(), buf, sizeof(buf), MSG_DONTWAIT)> 0;
         ++i) {
    }
    return std::make_shared<SockDiagNamespace>(std::move(fd), 0x80000000u);
  }

  Presence Look(NetnsHandle& handle, const TcpTuple& t) override {
    auto& ns = static_cast<SockDiagNamespace&>(handle);
    const ExactLookup q = AskFor(t, ns.NextSeq());
    if (::send(ns.fd(), &q, sizeof(q), 0) != static_cast<ssize_t>(sizeof(q)))
      return Presence::kUnknown;
    alignas(nlmsghdr) char buf[8192];
    for (int reads = 0; reads < kMaxStaleDiagAnswers; ++reads) {
      const ssize_t n = ::recv(ns.fd(), buf, sizeof(buf), 0);  // SO_RCVTIMEO bounds it
      if (n <= 0) return Presence::kUnknown;
      Presence p = Presence::kUnknown;
      if (ReadAnswer(buf, n, q.h.nlmsg_seq, t, &p)) return p;
    }
    return Presence::kUnknown;
  }
};

}  // namespace

std::unique_ptr<TcpModeProbe> MakeSockDiagProbe() { return std::make_unique<SockDiagProbe>(); }

}  // namespace ff::router
