#include "tcpmode/service.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>

#include "freeflow/stream_segment.h"
#include "freeflow/target_ops.h"

namespace ff::router {
namespace {

// Descriptors the router keeps for one record (the segment, the two sides, the two ends of
// the bell pair), charged to the pod that pays for the record.
constexpr uint64_t kRecordFds = 5;

// A zeroed memfd of `bytes` whose size and seals are final: an end cannot shrink it under
// the other (SIGBUS), nor seal it against writes before the other maps it (a claim after
// exec maps it again).
int MakeFinalMemfd(const char* name, uint64_t bytes, UniqueFd* out) {
  if (const int rc = CreateSegment(name, bytes, out)) return rc;
  return ::fcntl(out->get(), F_ADD_SEALS, F_SEAL_SEAL) == 0 ? 0 : errno;
}

// The record's bells: a connected pair of Unix stream sockets, one side to each end, which
// reads its own wake-ups on it and sends the other's. Each side is its own open file, so
// neither end can change the other's flags (the libraries send and receive with
// MSG_DONTWAIT anyway).
int MakeBells(UniqueFd* client, UniqueFd* server) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) return errno;
  client->reset(sv[0]);
  server->reset(sv[1]);
  return 0;
}

}  // namespace

TcpModeService::TcpModeService(Parts parts)
    : parts_(std::move(parts)), sweeper_(parts_.probe, [this](std::vector<StreamLook> looks) {
        parts_.loop.Post([this, looks = std::move(looks)] { Apply(looks); });
      }) {
  if (const int rc = pods_.Create()) {
    spdlog::warn("no pod list for TCP mode ({}): libraries ask about every connection",
                 std::strerror(rc));
  }
}

TcpModeService::~TcpModeService() = default;

bool TcpModeService::OnRequest(const Call& call, const char* msg) {
  if (call.op == proto::Op::kSockHello) return Hello(call);
  auto found = members_.find(call.pod);
  if (found == members_.end()) return false;  // not a socket session
  const Member m = found->second;
  proto::Response r{};
  std::vector<int> fds;
  int status = 0;
  switch (call.op) {
    case proto::Op::kSockListen:
      status = Listen(call, m, proto::As<proto::SockListen>(msg).port);
      break;
    case proto::Op::kSockUnlisten:
      status = Unlisten(call, m, proto::As<proto::SockUnlisten>(msg).port);
      break;
    case proto::Op::kSockConnect:
      ++asks_;
      status = Connect(m, proto::As<proto::SockConnect>(msg), &r, &fds);
      break;
    case proto::Op::kSockClaim:
      ++asks_;
      status = Claim(m, proto::As<proto::SockClaim>(msg), &r, &fds);
      break;
    case proto::Op::kSockRelease:
      status = Release(m, proto::As<proto::SockRelease>(msg));
      break;
    case proto::Op::kSockClosed:
      status = Closed(m, proto::As<proto::SockClosed>(msg));
      break;
    default:
      return false;
  }
  parts_.sessions.Answer(call, status, r, fds.data(), static_cast<int>(fds.size()));
  return true;
}

// Its ABI was checked by the session layer. A session whose namespace cannot be watched is
// told why and closed (asking again would only cost the router another thread).
bool TcpModeService::Hello(const Call& call) {
  proto::Response r{};
  const PodIdentity* who = parts_.sessions.Identity(call.pod);
  if (who == nullptr) return false;  // gone meanwhile
  std::string error;
  std::shared_ptr<NetnsHandle> ns = HandleFor(call.pod, *who, &error);
  if (ns == nullptr) {
    uint64_t held_back = 0;
    if (refusal_log_.Allow(&held_back)) {
      spdlog::warn("client {} ({}): no TCP mode: {} ({} more since the last line)", call.pod,
                   FormatIpv4(who->ip), error, held_back);
    }
    std::snprintf(r.u.hello.node, sizeof(r.u.hello.node), "TCP mode unavailable: %s",
                  error.c_str());
    parts_.sessions.Answer(call, EACCES, r);
    return false;
  }
  members_[call.pod] = Member{who->ip, who->netns, std::move(ns)};
  pods_.Hold(who->ip);
  ClaimsJoin(who->ip, who->netns);
  parts_.sessions.Welcome(call.pod, UniqueFd(), PodSessions::Kind::kSocket);
  r.u.hello.ip = htonl(who->ip);
  r.u.hello.prefix_len = parts_.overlay.length;
  std::snprintf(r.u.hello.node, sizeof(r.u.hello.node), "%s", parts_.node_name.c_str());
  // [pod list, claims table]: the table only beside a list.
  int tables[2] = {pods_.read_only_fd(), -1};
  if (auto c = claims_.find(who->ip); c != claims_.end())
    tables[1] = c->second->table.read_only_fd();
  const int n = tables[0] < 0 ? 0 : tables[1] < 0 ? 1 : 2;
  parts_.sessions.Answer(call, 0, r, n > 0 ? tables : nullptr, n);
  return true;
}

void TcpModeService::ClaimsJoin(uint32_t ip, uint64_t netns) {
  std::unique_ptr<PodClaims>& c = claims_[ip];
  if (c != nullptr) {
    ++c->members;
    return;
  }
  c = std::make_unique<PodClaims>();
  c->members = 1;
  if (const int rc = c->table.Create()) {
    spdlog::warn("pod {}: no TCP-mode claims table ({}): its libraries ask about every accept",
                 FormatIpv4(ip), std::strerror(rc));
  }
  // Records made before the pod's sessions all ended and came back (an exec, a restart of
  // its server) that its namespace may still claim.
  for (auto& [key, rec] : records_) {
    const End& s = rec.ends[kServer];
    if (key.server_ip == ip && s.netns == netns && !s.closed && !rec.server_claimed)
      Await(key, rec);
  }
}

void TcpModeService::ClaimsLeave(uint32_t ip) {
  auto c = claims_.find(ip);
  if (c == claims_.end() || --c->second->members > 0) return;
  for (auto& [key, rec] : records_) {
    if (key.server_ip == ip) rec.awaiting = false;  // the table goes with its last session
  }
  claims_.erase(c);
}

void TcpModeService::Await(const Key& key, Record& r) {
  auto c = claims_.find(key.server_ip);
  if (r.awaiting || c == claims_.end()) return;
  r.awaiting = true;
  r.placed = c->second->table.Add(StreamClaimKey(key.client_ip, key.client_port, key.server_port));
}

void TcpModeService::Unawait(const Key& key, Record& r) {
  if (!r.awaiting) return;
  r.awaiting = false;
  auto c = claims_.find(key.server_ip);
  if (c == claims_.end()) return;
  c->second->table.Remove(StreamClaimKey(key.client_ip, key.client_port, key.server_port),
                          r.placed);
}

std::shared_ptr<NetnsHandle> TcpModeService::HandleFor(PodId pod, const PodIdentity& who,
                                                       std::string* error) {
  std::erase_if(handles_, [](const auto& h) { return h.second.expired(); });
  // Identity refuses an address that live sessions hold from another namespace, and a handle
  // keeps its namespace (and so its inode number) alive: the same pair is the same pod.
  const auto key = std::make_pair(who.ip, who.netns);
  if (auto it = handles_.find(key); it != handles_.end()) {
    if (std::shared_ptr<NetnsHandle> ns = it->second.lock()) return ns;
  }
  std::shared_ptr<NetnsHandle> ns = parts_.probe.Open(parts_.sessions.SocketOf(pod), who, error);
  if (ns != nullptr) handles_[key] = ns;
  return ns;
}

void TcpModeService::OnPodGone(PodId pod) {
  auto m = members_.find(pod);
  if (m == members_.end()) return;
  const uint32_t ip = m->second.ip;
  for (auto it = listeners_.lower_bound({ip, 0});
       it != listeners_.end() && it->first.first == ip;) {
    std::vector<PodId>& v = it->second;
    listener_count_ -= static_cast<size_t>(std::erase(v, pod));
    it = v.empty() ? listeners_.erase(it) : std::next(it);
  }
  members_.erase(m);  // the ledger, with its kListeners, closes after this
  pods_.Let(ip);
  ClaimsLeave(ip);
}

// ---- listeners ------------------------------------------------------------------------------

int TcpModeService::Listen(const Call& call, const Member& m, uint32_t port) {
  if (port == 0 || port > 65535) return EINVAL;
  if (const int rc = parts_.quotas.Take(call.pod, {{Quota::kListeners, 1}})) return rc;
  listeners_[{m.ip, static_cast<uint16_t>(port)}].push_back(call.pod);
  ++listener_count_;
  return 0;
}

int TcpModeService::Unlisten(const Call& call, const Member& m, uint32_t port) {
  if (port == 0 || port > 65535) return EINVAL;
  auto it = listeners_.find({m.ip, static_cast<uint16_t>(port)});
  if (it == listeners_.end()) return ENOENT;
  std::vector<PodId>& v = it->second;
  auto mine = std::find(v.begin(), v.end(), call.pod);
  if (mine == v.end()) return ENOENT;  // another session's registration is not this one's
  v.erase(mine);
  if (v.empty()) listeners_.erase(it);
  --listener_count_;
  parts_.quotas.Give(call.pod, {{Quota::kListeners, 1}});
  return 0;
}

const TcpModeService::Member* TcpModeService::ListenerOf(uint32_t ip, uint16_t port) const {
  auto it = listeners_.find({ip, port});
  if (it == listeners_.end() || it->second.empty()) return nullptr;
  auto m = members_.find(it->second.front());
  return m == members_.end() ? nullptr : &m->second;
}

// ---- records --------------------------------------------------------------------------------

int TcpModeService::MakeRecord(const Member& client, const Member& server, Record* r) {
  if (const int rc =
          MakeFinalMemfd("ffrouter-stream", StreamSegmentBytes(kStreamRingBytes), &r->segment))
    return rc;
  const Member* who[2] = {&client, &server};
  for (int i : {kClient, kServer}) {
    if (const int rc = MakeFinalMemfd("ffrouter-stream-side", kStreamSideBytes, &r->ends[i].side))
      return rc;
    r->ends[i].ip = who[i]->ip;
    r->ends[i].netns = who[i]->netns;
    r->ends[i].ns = who[i]->ns;
  }
  if (const int rc = MakeBells(&r->ends[kClient].bell, &r->ends[kServer].bell)) return rc;
  r->gen = next_gen_++;
  r->created_ns = MonotonicNs();
  return 0;
}

int TcpModeService::Connect(const Member& m, const proto::SockConnect& q, proto::Response* r,
                            std::vector<int>* fds) {
  if (q.local_port == 0 || q.peer_port == 0) return EINVAL;
  const uint32_t peer = ntohl(q.peer_ip);
  if (peer == m.ip && q.local_port == q.peer_port) return ENOENT;  // a socket facing itself
  const Member* server = ListenerOf(peer, q.peer_port);
  if (server == nullptr) return ENOENT;  // not a pod of this node listening with libfsocket
  const Key key{m.ip, q.local_port, peer, q.peer_port};
  if (auto old = records_.find(key); old != records_.end()) Drop(old, "its client connects again");
  if (const int rc =
          parts_.quotas.TakeForPod(m.ip, {{Quota::kStreams, 1}, {Quota::kFds, kRecordFds}}))
    return rc;
  Record rec;
  if (const int rc = MakeRecord(m, *server, &rec)) {
    parts_.quotas.GiveToPod(m.ip, {{Quota::kStreams, 1}, {Quota::kFds, kRecordFds}});
    spdlog::warn("pod {}: cannot make a stream segment: {}", FormatIpv4(m.ip), std::strerror(rc));
    return rc;
  }
  Record& made = records_.emplace(key, std::move(rec)).first->second;
  for (const End& e : made.ends) pods_.Hold(e.ip);
  Await(key, made);  // before the answer: the client connects only after it
  r->u.sock = proto::SockReply{proto::kStreamClient, kStreamRingBytes};
  *fds = {made.segment.get(), made.ends[kClient].side.get(), made.ends[kClient].bell.get()};
  return 0;
}

TcpModeService::Record* TcpModeService::EndOf(const Member& m, uint32_t peer_ip,
                                              uint16_t local_port, uint16_t peer_port, int* end,
                                              std::map<Key, Record>::iterator* where) {
  // The asking pod as the server (an accepted connection) or as the client (its connect, or
  // a socket it inherited across exec). The ports tell the two apart when both ends are this
  // pod; a stale record of the other orientation loses to the newer one.
  const std::pair<Key, int> ways[] = {{Key{peer_ip, peer_port, m.ip, local_port}, kServer},
                                      {Key{m.ip, local_port, peer_ip, peer_port}, kClient}};
  Record* found = nullptr;
  for (const auto& [key, which] : ways) {
    auto it = records_.find(key);
    if (it == records_.end()) continue;
    const End& e = it->second.ends[which];
    if (e.closed || e.ip != m.ip || e.netns != m.netns) continue;
    if (found == nullptr || it->second.gen > found->gen) {
      found = &it->second;
      *end = which;
      *where = it;
    }
  }
  return found;
}

int TcpModeService::Claim(const Member& m, const proto::SockClaim& q, proto::Response* r,
                          std::vector<int>* fds) {
  if (q.local_port == 0 || q.peer_port == 0) return EINVAL;
  int role = kClient;
  std::map<Key, Record>::iterator it;
  Record* found = EndOf(m, ntohl(q.peer_ip), q.local_port, q.peer_port, &role, &it);
  if (found == nullptr) return ENOENT;
  if (role == kServer) {
    found->server_claimed = true;
    Unawait(it->first, *found);
  }
  r->u.sock = proto::SockReply{role == kServer ? proto::kStreamServer : proto::kStreamClient,
                               kStreamRingBytes};
  *fds = {found->segment.get(), found->ends[role].side.get(), found->ends[role].bell.get()};
  return 0;
}

int TcpModeService::Release(const Member& m, const proto::SockRelease& q) {
  auto it = records_.find(Key{m.ip, q.local_port, ntohl(q.peer_ip), q.peer_port});
  if (it == records_.end() || it->second.ends[kClient].netns != m.netns) return ENOENT;
  if (it->second.server_claimed) return EBUSY;  // the connection is up: the sweep decides
  Drop(it, "its client released it");
  return 0;
}

int TcpModeService::Closed(const Member& m, const proto::SockClosed& q) {
  if (q.local_port == 0 || q.peer_port == 0) return EINVAL;
  int end = kClient;
  std::map<Key, Record>::iterator it;
  Record* r = EndOf(m, ntohl(q.peer_ip), q.local_port, q.peer_port, &end, &it);
  if (r == nullptr) return ENOENT;
  End& e = r->ends[end];
  e.closed_said = true;
  e.seen = true;  // it had the connection: no grace for a connection never seen by a sweep
  const End& other = r->ends[end == kClient ? kServer : kClient];
  if (other.closed_said || other.closed) Drop(it, "both ends closed it");
  return 0;
}

void TcpModeService::Drop(std::map<Key, Record>::iterator it, const char* why) {
  const Key& k = it->first;
  Record& r = it->second;
  Unawait(k, r);
  parts_.quotas.GiveToPod(r.ends[r.charged].ip, {{Quota::kStreams, 1}, {Quota::kFds, kRecordFds}});
  spdlog::debug("stream {}:{} -> {}:{} dropped: {}", FormatIpv4(k.client_ip), k.client_port,
                FormatIpv4(k.server_ip), k.server_port, why);
  for (const End& e : r.ends) pods_.Let(e.ip);
  records_.erase(it);
}

// ---- garbage collection ---------------------------------------------------------------------

void TcpModeService::Tick() {
  const uint64_t now = MonotonicNs();
  if (sweeping_ || records_.empty() || now < next_sweep_ns_) return;
  next_sweep_ns_ = now + parts_.gc_period_ns;
  std::vector<StreamLook> looks;
  asked_.clear();
  for (const auto& [key, rec] : records_) {
    for (int end : {kClient, kServer}) {
      const End& e = rec.ends[end];
      if (e.closed || e.ns == nullptr) continue;
      const TcpTuple client{key.client_ip, key.client_port, key.server_ip, key.server_port};
      const TcpTuple server{key.server_ip, key.server_port, key.client_ip, key.client_port};
      looks.push_back({e.ns, end == kClient ? client : server});
      asked_.push_back({key, rec.gen, end});
    }
  }
  sweeping_ = sweeper_.Start(std::move(looks));
  if (!sweeping_) spdlog::warn("cannot start the TCP-mode sweeper thread; retrying later");
}

void TcpModeService::Apply(const std::vector<StreamLook>& looks) {
  sweeping_ = false;
  size_t unknown = 0;
  for (size_t i = 0; i < looks.size() && i < asked_.size(); ++i) {
    auto it = records_.find(asked_[i].key);
    if (it == records_.end() || it->second.gen != asked_[i].gen) continue;  // replaced
    End& e = it->second.ends[asked_[i].end];
    e.last = looks[i].answer;
    if (e.last == Presence::kUnknown) ++unknown;
    if (e.last == Presence::kAlive) e.seen = true;
    if (e.last == Presence::kGone && e.seen) {
      e.closed = true;  // gone for good: a connection never comes back to a namespace
      e.ns.reset();
    }
  }
  asked_.clear();
  uint64_t held_back = 0;
  if (unknown > 0 && unknown_log_.Allow(&held_back)) {
    spdlog::warn(
        "sock_diag did not say whether {} TCP-mode connections exist; their records stay "
        "({} more such sweeps since the last line)",
        unknown, held_back);
  }
  const uint64_t now = MonotonicNs();
  for (auto it = records_.begin(); it != records_.end();) {
    auto next = std::next(it);
    Settle(it, now);
    it = next;
  }
  std::erase_if(handles_, [](const auto& h) { return h.second.expired(); });
}

bool TcpModeService::Settle(std::map<Key, Record>::iterator it, uint64_t now) {
  Record& r = it->second;
  const End& client = r.ends[kClient];
  const End& server = r.ends[kServer];
  if (client.last == Presence::kGone && server.last == Presence::kGone) {
    // Before the client's kernel connect neither end has it yet: a grace, then it goes.
    if (!client.seen && !server.seen && now - r.created_ns < parts_.unseen_grace_ns) return true;
    Drop(it, "its connection is gone from both ends");
    return false;
  }
  const End& charged = r.ends[r.charged];
  const int other = r.charged == kClient ? kServer : kClient;
  const End& keeper = r.ends[other];
  if (!charged.closed || keeper.closed || keeper.ip == charged.ip) return true;
  // The pod that still holds the connection keeps the record: it pays for it from now on.
  const uint32_t from = charged.ip;
  if (parts_.quotas.TakeForPod(keeper.ip, {{Quota::kStreams, 1}, {Quota::kFds, kRecordFds}})) {
    Drop(it, "the pod that keeps it is over its quota");
    return false;
  }
  parts_.quotas.GiveToPod(from, {{Quota::kStreams, 1}, {Quota::kFds, kRecordFds}});
  r.charged = other;
  return true;
}

}  // namespace ff::router
