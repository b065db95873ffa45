// The target side of direct channels (docs/direct-path.md, executor.h): which connection of
// the two processes a channel rides on, the listener of a new one inside the owner's network
// namespace, and what the owner hears of both.
#include <spdlog/spdlog.h>

#include <cstring>

#include "freeflow/clock.h"
#include "freeflow/ipv4.h"
#include "freeflow/tunables.h"
#include "identity/netns_probe.h"
#include "nodes/executor.h"

namespace ff::router {

bool Executor::WantsDirect(const wire::Connect& m) const {
  return parts_.direct.on && (m.flags & wire::kConnectAskDirect) != 0;
}

bool Executor::WaitsForCrossedAsk(const wire::Connect& m, const Pod& owner, uint64_t* until) const {
  if (!WantsDirect(m) || owner.who.ip > m.src_ip) return false;
  const DirectConnections& conns = *parts_.direct.conns;
  if (!conns.IsAsking(owner.id, m.src_ip) || conns.Find(m.src_ip, m.token, owner.id) != nullptr)
    return false;
  const uint64_t now = MonotonicNs();
  if (*until == 0) *until = now + kDirectCrossedWaitNs;
  return now < *until;
}

bool Executor::DirectConn(const wire::Connect& m, Pod& owner, wire::ConnectReply* reply) {
  DirectConnections& conns = *parts_.direct.conns;
  auto direct = [&](uint32_t flags, uint64_t conn) {
    reply->flags = flags;
    reply->conn = conn;
    reply->seal = static_cast<uint8_t>(parts_.direct.seal);
    reply->token = conns.Token(owner.id);
    return true;
  };
  if (const DirectConnections::Conn* c = conns.Find(m.src_ip, m.token, owner.id))
    return direct(wire::kReplyDirect, c->id);
  if (conns.Full(owner.id)) {
    spdlog::debug("client {} holds {} direct connections: QP {:#x} of {} is relayed", owner.id,
                  conns.count(owner.id), m.src_qpn, FormatIpv4(m.src_ip));
    return false;
  }
  DirectListeners::Expect expect;
  expect.conn = conns.NewId(owner.id);
  expect.dialler_ip = m.src_ip;
  expect.acceptor_ip = owner.who.ip;
  std::string error;
  int netns = -1;
  if (expect.conn == 0 || !NewDirectSecret(expect.secret)) {
    error = "the system's random source failed";
  } else if (OwnerNetns(owner, &netns, &error) == 0) {
    if (parts_.quotas.Take(owner.id, {{Quota::kFds, 1}}) != 0) return false;  // logged
    std::array<uint8_t, kDirectSecretBytes> secret;
    std::memcpy(secret.data(), expect.secret, secret.size());
    auto done = [this, pod = owner.id, conn = expect.conn, from = m.src_ip, secret](UniqueFd sock,
                                                                                    int err) {
      DirectAccepted(pod, conn, from, secret, std::move(sock), err);
    };
    if (parts_.direct.listeners->Open(netns, expect, std::move(done), &reply->port, &error) == 0) {
      DirectConnections::Conn c;
      c.id = expect.conn;
      c.pod = owner.id;
      c.peer_ip = m.src_ip;
      c.peer_token = m.token;
      c.port = reply->port;
      conns.Add(c);  // NewId is an id the pod does not hold
      std::memcpy(reply->secret, expect.secret, sizeof(reply->secret));
      return direct(wire::kReplyDirect | wire::kReplyNewConn, expect.conn);
    }
    reply->port = 0;
    parts_.quotas.Give(owner.id, {{Quota::kFds, 1}});
  }
  spdlog::info("client {}: no direct connection for QP {:#x} of {}, which is relayed: {}", owner.id,
               m.src_qpn, FormatIpv4(m.src_ip), error);
  return false;
}

int Executor::OwnerNetns(Pod& owner, int* fd, std::string* error) {
  *fd = -1;
  if (owner.who.netns == 0) return 0;  // identified without a namespace (tests): the router's
  if (!owner.netns) {
    const int sock = parts_.sessions.SocketOf(owner.id);
    if (sock < 0) {
      *error = "its session is gone";
      return ENOENT;
    }
    if (const int rc = parts_.quotas.Take(owner.id, {{Quota::kFds, 1}})) {
      *error = "its descriptor quota is spent";
      return rc;
    }
    if (!OpenPeerNamespace(sock, owner.who.netns, &owner.netns, error)) {
      parts_.quotas.Give(owner.id, {{Quota::kFds, 1}});
      return EIO;
    }
  }
  *fd = owner.netns.get();
  return 0;
}

void Executor::DirectAccepted(PodId pod, uint64_t conn, uint32_t dialler_ip,
                              const std::array<uint8_t, kDirectSecretBytes>& secret, UniqueFd sock,
                              int error) {
  parts_.quotas.Give(pod, {{Quota::kFds, 1}});  // the listener's
  DirectConnections& conns = *parts_.direct.conns;
  if (error != 0) {
    spdlog::info("client {}: direct connection {:#x} from {} was not made: {}", pod, conn,
                 FormatIpv4(dialler_ip), std::strerror(error));
    conns.Forget(pod, conn);
    return;
  }
  if (!conns.SetOpen(pod, conn)) return;  // forgotten meanwhile: the socket closes here
  proto::Event e{};
  e.type = proto::EventType::kDirectConn;
  e.src_ip = dialler_ip;
  e.conn = conn;
  e.seal = static_cast<uint32_t>(parts_.direct.seal);
  std::memcpy(e.secret, secret.data(), sizeof(e.secret));
  parts_.sessions.NotifyWithFd(pod, e, sock.get());
}

void Executor::TellChannel(const Sender& s, uint32_t ring, PodId owner, bool gone, int ud_ring) {
  proto::Event e{};
  e.type = gone ? proto::EventType::kDirectChannelGone : proto::EventType::kDirectChannel;
  e.qpn = s.target_qpn;
  e.chan = s.chan;
  e.conn = s.conn;
  if (!gone) {
    e.ring = ring;
    e.src_ip = s.src_ip;
    e.src_qpn = s.src_qpn;
  }
  parts_.sessions.NotifyWithFd(owner, e, ud_ring);
}

}  // namespace ff::router
