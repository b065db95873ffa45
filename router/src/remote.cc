// Cross-node: router-to-router connections, proxies (a local QP's link to a QP on another
// node) and remote senders (a QP on another node producing into a local QP).
//
// Initiator side: the library writes request records into the proxy's ring 0 and rings
// the doorbell; the router forwards them as kRecord frames, in rounds of at most
// kRoundBytes per proxy so a long transfer on one QP does not starve the others, and
// writes the peer's kResp records into ring 1 for the library to apply.
//
// Target side: each record is executed against the target exactly as the library does on
// one node (core/target_ops.h): credits, ring records, MR checks against the target's
// table, direct access to its registered memory, atomics. Records of one sender are
// applied in order; one that cannot proceed yet (no receive posted: RNR, or a full ring)
// waits, with everything behind it, and is retried on the router's timer.
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "freeflow/target_ops.h"
#include "router.h"

namespace ff::router {
namespace {

constexpr uint32_t kIn = EPOLLIN;
constexpr uint32_t kOut = EPOLLOUT;
constexpr size_t kRoundBytes = 64 * 1024;         // per proxy per drain round
constexpr uint32_t kDirectSendBytes = 4096;       // larger records skip the output buffer
constexpr size_t kOutHighWater = 8u << 20;        // stop draining proxies above this
constexpr size_t kSenderQueueLimit = 16u << 20;   // stop reading a connection above this
constexpr uint64_t kPingIntervalNs = 100'000'000;
constexpr uint64_t kConnectTimeoutNs = 5'000'000'000ull;
uint64_t Now() { return MonotonicNs(); }

uint64_t SenderKey(uint32_t conn, uint32_t chan) { return (static_cast<uint64_t>(conn) << 32) | chan; }

void AddFd(int epfd, int fd, uint64_t tag, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = tag;
  ::epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
}

void ModFd(int epfd, int fd, uint64_t tag, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = tag;
  ::epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &ev);
}

std::vector<char> MakeResp(uint32_t seq, uint32_t status, uint64_t offset, const char* data,
                           uint32_t len, bool last) {
  const uint32_t payload = static_cast<uint32_t>(sizeof(ProxyResponse)) + len;
  std::vector<char> rec(sizeof(RecordHeader) + payload);
  RecordHeader h = ResponseHeader();
  h.total = RecordBytes(payload);
  h.frag_len = payload;
  ProxyResponse op{};
  op.seq = seq;
  op.status = static_cast<uint16_t>(status);
  op.data_offset = offset;
  op.last = last ? 1 : 0;
  std::memcpy(rec.data(), &h, sizeof(h));
  std::memcpy(rec.data() + sizeof(h), &op, sizeof(op));
  if (len > 0) std::memcpy(rec.data() + sizeof(h) + sizeof(op), data, len);
  return rec;
}

}  // namespace

bool Router::StartRemote(std::string* error) {
  timer_fd_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (!timer_fd_) {
    *error = std::string("timerfd: ") + std::strerror(errno);
    return false;
  }
  AddFd(epoll_fd_.get(), timer_fd_.get(), kTimerTag, EPOLLIN);
  ArmTimer();
  if (config_.control_plane.empty()) return true;  // single node
  if (config_.host_ip == 0) {
    *error = "--control-plane needs this node's address: pass --host-ip, or set HOST_IP or "
             "HOST_IP_PREFIX";
    return false;
  }
  cp::Endpoint self{config_.node_name, config_.host_ip, config_.port};
  std::string err;
  cp_ = cp::MakeControlPlane(config_.control_plane, self, cp::Options{}, &err);
  if (cp_ == nullptr || !cp_->Start(&err)) {
    *error = "control plane " + config_.control_plane + ": " + err;
    return false;
  }
  node_listen_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  int one = 1;
  ::setsockopt(node_listen_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(config_.port);
  a.sin_addr.s_addr = htonl(config_.host_ip);
  if (::bind(node_listen_.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(node_listen_.get(), 64) != 0) {
    *error = "cannot listen for routers on " + FormatIpv4(config_.host_ip) + ":" +
             std::to_string(config_.port) + ": " + std::strerror(errno);
    return false;
  }
  AddFd(epoll_fd_.get(), node_listen_.get(), kNodeListenTag, EPOLLIN);
  for (auto& [ip, n] : published_) cp_->Publish(ip);
  spdlog::info("routers reach this node at {}:{} (control plane {})", FormatIpv4(config_.host_ip),
               config_.port, config_.control_plane);
  return true;
}

void Router::ResumeParsing() {
  while (!resume_parse_.empty()) {
    const uint32_t id = *resume_parse_.begin();
    resume_parse_.erase(resume_parse_.begin());
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;
    if (!ParseFrames(*it->second)) {
      CloseNode(id, "malformed frame from peer router");
      continue;
    }
    it = conns_.find(id);
    if (it != conns_.end()) FlushNode(*it->second);
  }
}

bool Router::Busy() const { return busy_until_ns_ != 0 && Now() < busy_until_ns_; }

bool Router::PollProxies() {
  bool moved = false;
  for (auto& [chan, p] : proxies_) {
    if (!p->connected || p->dead) continue;
    RecordHeader h;
    const char* payload;
    if (p->requests.Peek(&h, &payload) == RingStatus::kOk) {
      DrainProxy(*p);
      moved = true;
    } else if (!Busy()) {
      DrainProxy(*p);  // arms the doorbell
    }
  }
  return moved;
}

// The session's notify words (CQ events and its wake word), mapped on first use.
NotifySlot* Router::NotifySlots(Session& s) {
  if (!s.notify_map.get() &&
      MapSegment(s.notify_seg.get(), kNotifySegmentBytes, true, &s.notify_map) != 0)
    return nullptr;
  return s.notify_map.as<NotifySlot>();
}

void Router::WakeSession(Session& s) {
  NotifySlot* slots = s.wake_fd ? NotifySlots(s) : nullptr;
  if (slots != nullptr) WakeIfArmed(slots + proto::kWakeSlot, s.wake_fd.get());
}

bool Router::Healthy() const { return cp_ == nullptr || cp_->Healthy(); }

void Router::PublishIp(uint32_t ip) {
  if (published_[ip]++ == 0 && cp_ != nullptr) cp_->Publish(ip);
}

void Router::WithdrawIp(uint32_t ip) {
  auto it = published_.find(ip);
  if (it == published_.end()) return;
  if (--it->second == 0) {
    published_.erase(it);
    if (cp_ != nullptr) cp_->Withdraw(ip);
  }
}

void Router::ArmTimer() {
  // Fast ticks while something waits for a retry; otherwise just pings and deadlines.
  const bool busy = !blocked_senders_.empty() || !pending_resolves_.empty() ||
                    std::any_of(proxies_.begin(), proxies_.end(),
                                [](const auto& p) { return !p.second->resp_backlog.empty(); });
  itimerspec t{};
  t.it_value.tv_nsec = busy ? 200'000 : 50'000'000;
  ::timerfd_settime(timer_fd_.get(), 0, &t, nullptr);
}

void Router::OnTimer() {
  ResumeParsing();
  RetryResolves();
  const uint64_t now = Now();
  for (uint64_t key : std::set<uint64_t>(blocked_senders_)) {
    auto it = senders_.find(key);
    if (it == senders_.end()) {
      blocked_senders_.erase(key);
      continue;
    }
    RunSender(*it->second);
  }
  for (auto& [chan, p] : proxies_) {
    if (!p->resp_backlog.empty()) DeliverResponse(*p, {});
    // Doorbells can be missed only if the library died mid-publish; a slow sweep is cheap.
    if (p->connected && !p->dead) DrainProxy(*p);
  }
  std::vector<uint32_t> expired;
  for (auto& [chan, p] : proxies_) {
    if (!p->connected && !p->dead && p->connect_deadline_ns != 0 && now > p->connect_deadline_ns)
      expired.push_back(chan);
  }
  for (uint32_t chan : expired) {
    auto it = proxies_.find(chan);
    if (it != proxies_.end()) FinishConnect(*it->second, ETIMEDOUT, nullptr);
  }
  std::vector<uint32_t> dead;
  for (auto& [id, c] : conns_) {
    if (!c->connected) {
      if (c->outbound && now - c->last_tx_ns > kConnectTimeoutNs) dead.push_back(id);
      continue;
    }
    if (now - c->last_rx_ns > static_cast<uint64_t>(config_.peer_timeout_ms) * 1000000ull *
                                  (c->outbound ? 1 : 3)) {
      dead.push_back(id);
      continue;
    }
    if (c->outbound && now - c->last_tx_ns > kPingIntervalNs) {
      SendFrame(*c, wire::Type::kPing, 0, nullptr, 0);
      FlushNode(*c);
    }
  }
  for (uint32_t id : dead) {
    auto it = conns_.find(id);
    if (it != conns_.end()) {
      const NodeConn& c = *it->second;
      spdlog::warn("conn {}: nothing from router {} for {} ms (owed {} bytes, {} unparsed, "
                   "paused {}, connected {})", id, c.peer_node, (now - c.last_rx_ns) / 1000000,
                   c.out.size() - c.out_off, c.in_used, c.reading_paused, c.connected);
    }
    CloseNode(id, "peer router silent for too long");
  }
  ArmTimer();
}

// ---- connections ----------------------------------------------------------------------

void Router::AcceptNode() {
  for (int burst = 0; burst < 16; ++burst) {
    UniqueFd fd(::accept4(node_listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) return;
    int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto c = std::make_unique<NodeConn>();
    c->id = next_conn_++;
    c->fd = std::move(fd);
    c->connected = true;
    c->last_rx_ns = c->last_tx_ns = Now();
    c->events = EPOLLIN | EPOLLRDHUP;
    AddFd(epoll_fd_.get(), c->fd.get(), kNodeTag | c->id, c->events);
    conns_[c->id] = std::move(c);
  }
}

Router::NodeConn* Router::Outbound(const cp::Endpoint& ep) {
  auto it = outbound_.find({ep.address, ep.port});
  if (it != outbound_.end()) {
    auto c = conns_.find(it->second);
    if (c != conns_.end()) return c->second.get();
    outbound_.erase(it);
  }
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return nullptr;
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(ep.port);
  a.sin_addr.s_addr = htonl(ep.address);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 && errno != EINPROGRESS) {
    spdlog::warn("cannot reach router {} at {}:{}: {}", ep.node, FormatIpv4(ep.address), ep.port,
                 std::strerror(errno));
    return nullptr;
  }
  auto c = std::make_unique<NodeConn>();
  c->id = next_conn_++;
  c->fd = std::move(fd);
  c->outbound = true;
  c->endpoint = ep;
  c->peer_node = ep.node;
  c->last_rx_ns = c->last_tx_ns = Now();
  c->events = EPOLLIN | EPOLLOUT | EPOLLRDHUP;  // EPOLLOUT reports the connect's outcome
  AddFd(epoll_fd_.get(), c->fd.get(), kNodeTag | c->id, c->events);
  wire::Hello hello{wire::kMagic, wire::kVersion, {}};
  std::snprintf(hello.node, sizeof(hello.node), "%s", config_.node_name.c_str());
  NodeConn* raw = c.get();
  conns_[c->id] = std::move(c);
  outbound_[{ep.address, ep.port}] = raw->id;
  SendFrame(*raw, wire::Type::kHello, 0, &hello, sizeof(hello));
  return raw;
}

void Router::SendFrame(NodeConn& c, wire::Type type, uint32_t chan, const void* a, size_t alen,
                       const void* b, size_t blen, uint16_t flags) {
  wire::FrameHeader h{static_cast<uint32_t>(alen + blen), type, flags, chan, 0};
  if (c.out_off > 0 && c.out_off == c.out.size()) {
    c.out.clear();
    c.out_off = 0;
  }
  const char* hp = reinterpret_cast<const char*>(&h);
  c.out.insert(c.out.end(), hp, hp + sizeof(h));
  if (alen > 0) c.out.insert(c.out.end(), static_cast<const char*>(a), static_cast<const char*>(a) + alen);
  if (blen > 0) c.out.insert(c.out.end(), static_cast<const char*>(b), static_cast<const char*>(b) + blen);
}

// Sends one record frame straight from the proxy ring (no copy into the output buffer)
// when nothing is queued ahead of it; whatever the socket does not take is buffered.
void Router::SendDirect(NodeConn& c, uint32_t chan, const RecordHeader& h, const char* payload) {
  wire::FrameHeader fh{static_cast<uint32_t>(sizeof(h) + h.frag_len), wire::Type::kRecord, 0, chan, 0};
  FlushNode(c);
  size_t sent = 0;
  const size_t total = sizeof(fh) + sizeof(h) + h.frag_len;
  if (c.connected && c.out_off == c.out.size()) {
    iovec iov[3] = {{&fh, sizeof(fh)},
                    {const_cast<RecordHeader*>(&h), sizeof(h)},
                    {const_cast<char*>(payload), h.frag_len}};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = 3;
    for (;;) {
      const ssize_t n = ::sendmsg(c.fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n > 0) {
        sent = static_cast<size_t>(n);
        c.last_tx_ns = Now();
      }
      break;
    }
  }
  if (sent == total) return;
  // Buffer the rest, byte-exact from where the socket stopped.
  const char* parts[3] = {reinterpret_cast<const char*>(&fh), reinterpret_cast<const char*>(&h),
                          payload};
  const size_t lens[3] = {sizeof(fh), sizeof(h), h.frag_len};
  size_t skip = sent;
  for (int i = 0; i < 3; ++i) {
    if (skip >= lens[i]) {
      skip -= lens[i];
      continue;
    }
    c.out.insert(c.out.end(), parts[i] + skip, parts[i] + lens[i]);
    skip = 0;
  }
}

void Router::FlushNode(NodeConn& c) {
  if (!c.connected) return;
  while (c.out_off < c.out.size()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out_off += static_cast<size_t>(n);
      c.last_tx_ns = Now();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    return;  // the error shows up as EPOLLERR/EPOLLHUP
  }
  if (c.out_off == c.out.size()) {
    c.out.clear();
    c.out_off = 0;
  } else if (c.out_off > (4u << 20)) {
    c.out.erase(c.out.begin(), c.out.begin() + static_cast<ptrdiff_t>(c.out_off));
    c.out_off = 0;
  }
  if (c.output_full && c.out.size() - c.out_off < kOutHighWater / 2) {
    // What we owed has drained: read and execute requests again. Frames already read but
    // not executed are parsed from the event loop (not from here, to avoid recursion).
    c.output_full = false;
    c.reading_paused = false;
    SPDLOG_DEBUG("conn {}: output drained; resuming requests ({} bytes unparsed)", c.id, c.in_used);
    resume_parse_.insert(c.id);
  }
  SyncEvents(c);
}

// Registers the epoll interest the connection's state calls for: input unless reading is
// paused, output while bytes wait or the connect is still in progress.
void Router::SyncEvents(NodeConn& c) {
  const uint32_t want = EPOLLRDHUP | (c.reading_paused ? 0u : kIn) |
                        (!c.connected || c.out_off < c.out.size() ? kOut : 0u);
  if (want == c.events) return;
  c.events = want;
  ModFd(epoll_fd_.get(), c.fd.get(), kNodeTag | c.id, want);
}

void Router::HandleNode(NodeConn& c, uint32_t events) {
  const uint32_t id = c.id;
  if (!c.connected && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(c.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      CloseNode(id, std::strerror(err));
      return;
    }
    c.connected = true;
    c.last_rx_ns = Now();
    spdlog::info("connected to router {} at {}:{}", c.endpoint.node,
                 FormatIpv4(c.endpoint.address), c.endpoint.port);
  }
  if (events & EPOLLIN) {
    for (int burst = 0; burst < 64; ++burst) {
      if (c.in.size() - c.in_used < 256 * 1024) c.in.resize(c.in_used + 512 * 1024);
      const ssize_t n = ::recv(c.fd.get(), c.in.data() + c.in_used, c.in.size() - c.in_used,
                               MSG_DONTWAIT);
      if (n == 0) {
        CloseNode(id, "peer router closed the connection");
        return;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        CloseNode(id, std::strerror(errno));
        return;
      }
      c.in_used += static_cast<size_t>(n);
      c.last_rx_ns = Now();
      if (config_.poll_us != 0) busy_until_ns_ = c.last_rx_ns + config_.poll_us * 1000ull;
      if (!ParseFrames(c)) {
        CloseNode(id, "malformed frame from peer router");
        return;
      }
      if (conns_.find(id) == conns_.end() || c.reading_paused) return;
    }
  } else if (events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) {
    CloseNode(id, "connection to peer router broke");
    return;
  }
  if (conns_.find(id) == conns_.end()) return;
  FlushNode(c);
  // Output drained below the high-water mark: resume the proxies that use it.
  if (c.outbound && c.out.size() - c.out_off < kOutHighWater) {
    for (uint32_t chan : std::set<uint32_t>(c.chans)) {
      auto p = proxies_.find(chan);
      if (p != proxies_.end()) DrainProxy(*p->second);
    }
  }
}

bool Router::ParseFrames(NodeConn& c) {
  const uint32_t id = c.id;
  size_t off = 0;
  while (c.in_used - off >= sizeof(wire::FrameHeader)) {
    if (!c.outbound && c.out.size() - c.out_off >= kOutHighWater) {
      // A READ answer is far larger than its request: stop executing requests (and
      // reading) until what we owe this peer has drained.
      c.output_full = true;
      SPDLOG_DEBUG("conn {}: {} bytes owed to the peer; pausing requests", c.id,
                   c.out.size() - c.out_off);
      c.reading_paused = true;
      SyncEvents(c);
      break;
    }
    wire::FrameHeader h;
    std::memcpy(&h, c.in.data() + off, sizeof(h));
    if (!wire::ValidFrame(h)) return false;
    if (c.in_used - off < sizeof(h) + h.len) break;
    if (!OnFrame(c, h, c.in.data() + off + sizeof(h))) return false;
    if (conns_.find(id) == conns_.end()) return true;
    off += sizeof(h) + h.len;
  }
  if (off > 0) {
    std::memmove(c.in.data(), c.in.data() + off, c.in_used - off);
    c.in_used -= off;
  }
  return true;
}

void Router::CloseNode(uint32_t conn_id, const char* why) {
  auto it = conns_.find(conn_id);
  if (it == conns_.end()) return;
  NodeConn& c = *it->second;
  spdlog::warn("connection {} to router {} closed: {}; failing {} channels, {} senders", c.id,
               c.peer_node.empty() ? "?" : c.peer_node, why, c.chans.size(), c.senders.size());
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
  if (c.outbound) outbound_.erase({c.endpoint.address, c.endpoint.port});
  const std::set<uint32_t> chans = c.chans;
  const std::set<uint64_t> senders = c.senders;
  conns_.erase(it);
  for (uint32_t chan : chans) {
    auto p = proxies_.find(chan);
    if (p == proxies_.end()) continue;
    Proxy& px = *p->second;
    if (!px.connected) {
      FinishConnect(px, EHOSTUNREACH, nullptr);
      continue;
    }
    // Outstanding and future work to that node fails: the QP goes to the error state.
    px.dead = true;
    px.conn = 0;
    Notify(px.session, proto::EventType::kPeerGone, px.qpn);
  }
  for (uint64_t key : senders) DropSender(key, false, true);
}

bool Router::OnFrame(NodeConn& c, const wire::FrameHeader& h, const char* body) {
  switch (h.type) {
    case wire::Type::kHello: {
      wire::Hello m;
      if (h.len != sizeof(m) || c.outbound) return false;
      std::memcpy(&m, body, sizeof(m));
      if (m.magic != wire::kMagic || m.version != wire::kVersion) return false;
      m.node[sizeof(m.node) - 1] = '\0';
      c.peer_node = m.node;
      return true;
    }
    case wire::Type::kPing:
      SendFrame(c, wire::Type::kPong, 0, nullptr, 0);
      return true;
    case wire::Type::kPong:
      return true;
    case wire::Type::kConnect: {
      wire::Connect m;
      if (h.len != sizeof(m) || c.outbound) return false;
      std::memcpy(&m, body, sizeof(m));
      OnRemoteConnect(c, h.chan, m);
      return true;
    }
    case wire::Type::kConnectReply: {
      wire::ConnectReply m;
      if (h.len != sizeof(m) || !c.outbound) return false;
      std::memcpy(&m, body, sizeof(m));
      auto p = proxies_.find(h.chan);
      if (p != proxies_.end() && p->second->conn == c.id && !p->second->connected)
        FinishConnect(*p->second, m.status, &m);
      return true;
    }
    case wire::Type::kRecord: {
      RecordHeader rh;
      const char* payload = nullptr;
      RequestView v;
      if (c.outbound || !SplitRecord(body, h.len, &rh, &payload) ||
          !DecodeRequest(rh, payload, &v))
        return false;
      auto it = senders_.find(SenderKey(c.id, h.chan));
      if (it == senders_.end()) {
        // The target went away: every request still gets its one answer, an error, as an
        // RC requester would see retries run out.
        const ProxyRequest& op = v.req;
        if (op.last || rh.kind == kRecReadReq || rh.kind == kRecAtomicReq) {
          const std::vector<char> rec =
              MakeResp(op.seq, IBV_WC_RETRY_EXC_ERR, 0, nullptr, 0, true);
          SendFrame(c, wire::Type::kResp, h.chan, rec.data(), rec.size());
        }
        return true;
      }
      RemoteSender& rs = *it->second;
      if (rs.queue.empty() && ApplyRecord(rs, body, h.len)) {
        // The common case: executed straight from the receive buffer, no copy.
        rs.producer.Publish();
        WakeIfArmed(rs.notify, rs.notify_fd);
        if (Session* owner = FindSession(rs.owner)) WakeSession(*owner);
        return true;
      }
      rs.queue.emplace_back(body, body + h.len);
      rs.queued_bytes += h.len;
      RunSender(rs);
      if (rs.queued_bytes > kSenderQueueLimit && !c.reading_paused) {
        // The target is not keeping up: stop reading this connection until it does.
        c.reading_paused = true;
        SyncEvents(c);
      }
      return true;
    }
    case wire::Type::kResp: {
      RecordHeader rh;
      const char* payload = nullptr;
      ResponseView v;
      if (!c.outbound || !SplitRecord(body, h.len, &rh, &payload) ||
          !DecodeResponse(rh, payload, &v))
        return false;
      auto p = proxies_.find(h.chan);
      if (p == proxies_.end() || p->second->conn != c.id) return true;
      DeliverResponse(*p->second, std::vector<char>(body, body + h.len));
      return true;
    }
    case wire::Type::kClose: {
      if (c.outbound) return false;
      auto it = senders_.find(SenderKey(c.id, h.chan));
      if (it != senders_.end()) DropSender(it->first, false, h.flags != 0);
      return true;
    }
    case wire::Type::kPeerGone: {
      if (!c.outbound) return false;
      auto p = proxies_.find(h.chan);
      if (p != proxies_.end() && p->second->conn == c.id) {
        p->second->dead = true;
        Notify(p->second->session,
               h.flags != 0 ? proto::EventType::kPeerGone : proto::EventType::kPeerClosed,
               p->second->qpn);
      }
      return true;
    }
  }
  return false;
}

// ---- initiator side ---------------------------------------------------------------------

void Router::RetryResolves() {
  if (pending_resolves_.empty()) return;
  const uint64_t now = Now();
  std::vector<PendingResolve> waiting;
  waiting.swap(pending_resolves_);
  for (const PendingResolve& p : waiting) {
    Session* s = FindSession(p.session);
    if (s == nullptr || !s->call_deferred) continue;
    auto q = qps_.find(p.request.qpn);
    const bool known = cp_ != nullptr && cp_->Lookup(ntohl(p.request.dest_ip)).has_value();
    if (q == qps_.end() || (!known && now < p.deadline_ns)) {
      if (q != qps_.end()) pending_resolves_.push_back(p);
      continue;
    }
    s->call_deferred = false;
    const int rc = ConnectRemote(*s, *q->second, p.request, p.ud, false);
    if (rc != 0) {
      proto::Response r{};
      r.h = p.request.h;
      r.status = rc;
      Reply(*s, r);
    }
  }
}

int Router::ConnectRemote(Session& s, Qp& src, const proto::ConnectQp& m, bool ud, bool may_wait) {
  if (cp_ == nullptr) {
    spdlog::info("client {}: {} is not a pod of this node and no control plane is configured",
                 s.id, FormatIpv4(ntohl(m.dest_ip)));
    return EHOSTUNREACH;
  }
  const uint32_t dest_ip = ntohl(m.dest_ip);
  auto ep = cp_->Lookup(dest_ip);
  if (!ep || (ep->address == config_.host_ip && ep->port == config_.port)) {
    if (may_wait && config_.resolve_timeout_ms > 0) {
      // Perhaps a pod that just opened its device: its entry may still be on its way.
      pending_resolves_.push_back(
          {s.id, m, ud, Now() + config_.resolve_timeout_ms * 1000000ull});
      s.call_deferred = true;
      ArmTimer();
      return 0;
    }
    spdlog::info("client {}: no node is known for {}", s.id, FormatIpv4(dest_ip));
    return EHOSTUNREACH;
  }
  if (!ud) {
    for (uint32_t chan : std::set<uint32_t>(src.proxies)) DropProxy(chan, true);
  }
  NodeConn* conn = Outbound(*ep);
  if (conn == nullptr) return EHOSTUNREACH;
  auto p = std::make_unique<Proxy>();
  p->chan = next_chan_++;
  p->session = s.id;
  p->qpn = src.qpn;
  p->qp_type = src.type;
  p->dest_ip = dest_ip;
  p->dest_qpn = m.dest_qpn;
  p->conn = conn->id;
  const size_t bytes = QpSegmentBytes(kProxyRings, kProxyRingBytes);
  if (CreateSegment("ffrouter-proxy", bytes, &p->seg_fd) != 0 ||
      MapSegment(p->seg_fd.get(), bytes, true, &p->seg) != 0)
    return ENOMEM;
  auto* hdr = new (p->seg.get()) QpSegmentHeader();
  hdr->magic = kQpSegMagic;
  hdr->abi = kAbiVersion;
  hdr->num_rings = kProxyRings;
  hdr->ring_bytes = kProxyRingBytes;
  p->requests.Attach(QpRing(p->seg.get(), kProxyRequestRing, kProxyRingBytes), kProxyRingBytes);
  p->responses.Attach(QpRing(p->seg.get(), kProxyResponseRing, kProxyRingBytes), kProxyRingBytes);
  p->doorbell.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!p->doorbell) return ENOMEM;
  p->call_seq = m.h.seq;
  p->connect_deadline_ns = Now() + kConnectTimeoutNs;
  wire::Connect w{s.who.ip, src.qpn, src.type, dest_ip, m.dest_qpn, 0};
  SendFrame(*conn, wire::Type::kConnect, p->chan, &w, sizeof(w));
  FlushNode(*conn);
  conn->chans.insert(p->chan);
  src.proxies.insert(p->chan);
  s.call_deferred = true;
  p->call_op = ud ? proto::Op::kResolveUd : proto::Op::kConnectQp;
  proxies_[p->chan] = std::move(p);
  return 0;
}

void Router::FinishConnect(Proxy& p, int status, const wire::ConnectReply* reply) {
  Session* s = FindSession(p.session);
  const uint32_t chan = p.chan;
  if (s != nullptr && s->call_deferred) {
    proto::Response r{};
    r.h.op = p.call_op;
    r.h.seq = p.call_seq;
    r.status = status;
    std::vector<int> fds;
    if (status == 0) {
      auto& c = r.u.connect;
      c.flags = proto::kConnectRemote;
      c.peer_ctx_id = 0;
      c.peer_qpn = reply->peer_qpn;
      c.peer_ip = htonl(reply->peer_ip);
      c.peer_lid = LidForIp(reply->peer_ip);
      c.ring_index = 0;
      c.num_rings = kProxyRings;
      c.ring_bytes = kProxyRingBytes;
      c.notify_slot = proto::kNoId;
      c.peer_qp_type = reply->qp_type;
      fds = {p.seg_fd.get(), p.doorbell.get()};
    }
    s->call_deferred = false;
    Reply(*s, r, fds.data(), static_cast<int>(fds.size()));
  }
  if (status != 0 || s == nullptr) {
    if (status != 0)
      spdlog::info("connect to QP {:#x} at {} failed: {}", p.dest_qpn, FormatIpv4(p.dest_ip),
                   std::strerror(status));
    DropProxy(chan, status == 0);
    return;
  }
  p.connected = true;
  AddFd(epoll_fd_.get(), p.doorbell.get(), kDoorbellTag | chan, EPOLLIN);
  p.seg.as<QpSegmentHeader>()->doorbell.armed.store(1);
}

void Router::DrainProxy(Proxy& p) {
  if (!p.connected || p.dead) return;
  auto cit = conns_.find(p.conn);
  if (cit == conns_.end()) return;
  NodeConn& c = *cit->second;
  auto* hdr = p.seg.as<QpSegmentHeader>();
  size_t sent = 0;
  bool consumed = false;
  for (int pass = 0; pass < 2; ++pass) {
    while (sent < kRoundBytes && c.out.size() - c.out_off < kOutHighWater) {
      RecordHeader h;
      const char* payload = nullptr;
      const RingStatus rs = p.requests.Peek(&h, &payload);
      if (rs == RingStatus::kEmpty) break;
      if (rs == RingStatus::kCorrupt) {
        spdlog::warn("client {} corrupted the proxy ring of QP {:#x}", p.session, p.qpn);
        p.dead = true;
        Notify(p.session, proto::EventType::kPeerGone, p.qpn);
        return;
      }
      if (h.frag_len >= kDirectSendBytes) {
        SendDirect(c, p.chan, h, payload);
      } else {
        SendFrame(c, wire::Type::kRecord, p.chan, &h, sizeof(h), payload, h.frag_len);
      }
      p.requests.Consume(h);
      consumed = true;
      sent += h.frag_len;
    }
    if (sent >= kRoundBytes || c.out.size() - c.out_off >= kOutHighWater) {
      // More to do: keep the doorbell disarmed and come back on the next round.
      hdr->doorbell.armed.store(0);
      break;
    }
    if (config_.poll_us != 0) busy_until_ns_ = Now() + config_.poll_us * 1000ull;
    if (Busy()) {
      // Polling: the library need not ring (which would cost it a system call).
      hdr->doorbell.armed.store(0, std::memory_order_relaxed);
      break;
    }
    // Empty: arm the doorbell, then look once more (the library checks `armed` after
    // publishing, so one of us sees the other).
    hdr->doorbell.armed.exchange(1, std::memory_order_seq_cst);
    RecordHeader h;
    const char* payload;
    if (p.requests.Peek(&h, &payload) != RingStatus::kOk) break;
    hdr->doorbell.armed.store(0);
  }
  if (consumed) p.requests.Release();
  FlushNode(c);
  if (sent >= kRoundBytes) {
    // Yield to other proxies: a self-wake puts us behind them in the epoll queue.
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(p.doorbell.get(), &one, sizeof(one));
  }
}

void Router::DeliverResponse(Proxy& p, std::vector<char> record) {
  if (!record.empty()) p.resp_backlog.push_back(std::move(record));
  bool wrote = false;
  while (!p.resp_backlog.empty()) {
    const std::vector<char>& rec = p.resp_backlog.front();
    RecordHeader h;
    std::memcpy(&h, rec.data(), sizeof(h));
    const uint32_t payload = static_cast<uint32_t>(rec.size() - sizeof(h));
    h.frag_len = payload;
    h.total = RecordBytes(payload);
    char* dst = nullptr;
    const RingStatus rs = p.responses.Reserve(h.total, &dst);
    if (rs == RingStatus::kFull) break;
    if (rs != RingStatus::kOk) {
      p.resp_backlog.clear();
      break;
    }
    std::memcpy(dst, &h, sizeof(h));
    std::memcpy(dst + sizeof(h), rec.data() + sizeof(h), payload);
    p.responses.Commit(h.total);
    p.resp_backlog.pop_front();
    wrote = true;
  }
  if (!wrote) {
    if (!p.resp_backlog.empty()) ArmTimer();
    return;
  }
  p.responses.Publish();
  // Wake the library if it waits in poll_cq, or sleeps on the QP's send CQ.
  Session* s = FindSession(p.session);
  if (s != nullptr) WakeSession(*s);
  auto q = qps_.find(p.qpn);
  if (s == nullptr || q == qps_.end()) return;
  auto cq = s->cqs.find(q->second->send_cq_id);
  if (cq == s->cqs.end() || cq->second.notify_slot == proto::kNoId) return;
  auto ch = s->channels.find(cq->second.chan_id);
  if (ch == s->channels.end()) return;
  if (NotifySlot* slots = NotifySlots(*s))
    WakeIfArmed(slots + cq->second.notify_slot, ch->second.get());
}

void Router::DropProxy(uint32_t chan, bool tell_peer, bool died) {
  auto it = proxies_.find(chan);
  if (it == proxies_.end()) return;
  Proxy& p = *it->second;
  auto c = conns_.find(p.conn);
  if (c != conns_.end()) {
    c->second->chans.erase(chan);
    if (tell_peer && p.connected) {
      SendFrame(*c->second, wire::Type::kClose, chan, nullptr, 0, nullptr, 0, died ? 1 : 0);
      FlushNode(*c->second);
    }
  }
  auto q = qps_.find(p.qpn);
  if (q != qps_.end()) q->second->proxies.erase(chan);
  if (p.connected) ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, p.doorbell.get(), nullptr);
  proxies_.erase(it);
}

// ---- target side ------------------------------------------------------------------------

Mapping* Router::SessionRegion(Session& owner, uint32_t region_id) {
  auto m = owner.region_maps.find(region_id);
  if (m != owner.region_maps.end()) return &m->second;
  auto r = owner.regions.find(region_id);
  if (r == owner.regions.end()) return nullptr;
  Mapping map;
  if (MapSegment(r->second.fd.get(), r->second.size, true, &map) != 0) return nullptr;
  return &owner.region_maps.emplace(region_id, std::move(map)).first->second;
}

void Router::OnRemoteConnect(NodeConn& c, uint32_t chan, const wire::Connect& m) {
  wire::ConnectReply reply{0, 0, 0, 0};
  auto fail = [&](int status) {
    reply.status = status;
    SendFrame(c, wire::Type::kConnectReply, chan, &reply, sizeof(reply));
    FlushNode(c);
  };
  Qp* dest = FindDest(htonl(m.dest_ip), 0, m.dest_qpn);
  if (dest == nullptr) return fail(EHOSTUNREACH);
  if (dest->type != m.qp_type) return fail(EINVAL);
  Session* owner = FindSession(dest->owner);
  if (owner == nullptr) return fail(EHOSTUNREACH);
  const uint64_t key = SenderKey(c.id, chan);
  if (senders_.count(key)) DropSender(key, false);
  uint32_t ring = proto::kNoId;
  for (uint32_t i = 0; i < dest->num_rings; ++i) {
    if (dest->ring_producer[i] == 0) {
      ring = i;
      break;
    }
  }
  if (ring == proto::kNoId) return fail(dest->type == IBV_QPT_UD ? ENOSPC : EBUSY);
  auto rs = std::make_unique<RemoteSender>();
  rs->key = key;
  rs->id = next_sender_++ & ~kRemoteProducer;
  rs->conn = c.id;
  rs->chan = chan;
  rs->src_ip = m.src_ip;
  rs->src_qpn = m.src_qpn;
  rs->target_qpn = dest->qpn;
  rs->owner = owner->id;
  rs->qp_type = dest->type;
  rs->ring = ring;
  const size_t bytes = QpSegmentBytes(dest->num_rings, dest->ring_bytes);
  if (MapSegment(dest->seg.get(), bytes, true, &rs->seg) != 0) return fail(ENOMEM);
  rs->hdr = rs->seg.as<QpSegmentHeader>();
  rs->credits = &rs->hdr->credits;
  if (dest->srq_id != proto::kNoId) {
    auto srq = owner->srqs.find(dest->srq_id);
    if (srq == owner->srqs.end() ||
        MapSegment(srq->second.get(), sizeof(SrqSegment), true, &rs->srq_seg) != 0)
      return fail(EHOSTUNREACH);
    rs->credits = &rs->srq_seg.as<SrqSegment>()->credits;
  }
  rs->producer.Attach(QpRing(rs->seg.get(), ring, dest->ring_bytes), dest->ring_bytes);
  auto cq = owner->cqs.find(dest->recv_cq_id);
  if (cq != owner->cqs.end() && cq->second.notify_slot != proto::kNoId) {
    auto ch = owner->channels.find(cq->second.chan_id);
    NotifySlot* slots = ch != owner->channels.end() ? NotifySlots(*owner) : nullptr;
    if (slots != nullptr) {
      rs->notify = slots + cq->second.notify_slot;
      rs->notify_fd = ch->second.get();
    }
  }
  dest->ring_producer[ring] = kRemoteProducer | rs->id;
  reply.peer_qpn = dest->qpn;
  reply.peer_ip = owner->who.ip;
  reply.qp_type = dest->type;
  c.senders.insert(key);
  senders_[key] = std::move(rs);
  SendFrame(c, wire::Type::kConnectReply, chan, &reply, sizeof(reply));
  FlushNode(c);
}

void Router::Respond(RemoteSender& rs, uint32_t seq, uint32_t status, uint64_t offset,
                     const char* data, uint32_t len, bool last) {
  auto c = conns_.find(rs.conn);
  if (c == conns_.end()) return;
  const std::vector<char> rec = MakeResp(seq, status, offset, data, len, last);
  SendFrame(*c->second, wire::Type::kResp, rs.chan, rec.data(), rec.size());
}

void Router::RunSender(RemoteSender& rs) {
  const uint64_t key = rs.key;
  bool published = false;
  while (!rs.queue.empty()) {
    const std::vector<char>& rec = rs.queue.front();
    if (!ApplyRecord(rs, rec.data(), rec.size())) break;
    rs.queued_bytes -= rec.size();
    rs.queue.pop_front();
    published = true;
  }
  if (published) {
    rs.producer.Publish();
    WakeIfArmed(rs.notify, rs.notify_fd);
    if (Session* owner = FindSession(rs.owner)) WakeSession(*owner);
  }
  if (rs.queue.empty()) {
    blocked_senders_.erase(key);
  } else if (blocked_senders_.insert(key).second) {
    ArmTimer();
  }
  auto c = conns_.find(rs.conn);
  if (c != conns_.end()) {
    FlushNode(*c->second);
    NodeConn& conn = *c->second;
    if (conn.reading_paused && rs.queued_bytes < kSenderQueueLimit / 2) {
      conn.reading_paused = false;
      SyncEvents(conn);
    }
  }
}

// Executes one record from a remote initiator. false: it cannot proceed yet (retry later).
bool Router::ApplyRecord(RemoteSender& rs, const char* rec, size_t len) {
  RecordHeader h;
  const char* payload = nullptr;
  RequestView v;
  if (!SplitRecord(rec, len, &h, &payload) || !DecodeRequest(h, payload, &v)) return true;
  const ProxyRequest& op = v.req;
  const char* data = v.data;
  const uint32_t dlen = v.data_len;
  if (rs.errored) return true;
  const bool reliable = rs.qp_type == IBV_QPT_RC;
  const bool acked = rs.qp_type != IBV_QPT_UD;
  Session* owner = FindSession(rs.owner);
  if (owner == nullptr) return true;

  // Consumes a receive credit; false when the record must wait (RNR) or was failed.
  auto claim = [&](bool* drop) -> bool {
    *drop = false;
    if (rs.have_credit) return true;
    if (ClaimCredit(rs.credits, &rs.posted_cache)) {
      rs.have_credit = true;
      rs.rnr = RnrState{};
      return true;
    }
    if (!reliable) {
      *drop = true;  // UC/UD: no receive, the message is dropped
      return true;
    }
    if (rs.rnr.deadline_ns == 0) {
      SPDLOG_DEBUG("QP {:#x}: no receive posted for remote QP {:#x}; RNR retry in {} us",
                   rs.target_qpn, rs.src_qpn, RnrTimerNs(rs.hdr->min_rnr_timer.load()) / 1000);
    }
    if (RnrRetryExhausted(&rs.rnr, rs.hdr->min_rnr_timer.load(), op.rnr_retry,
                          Now())) {
      Respond(rs, op.seq, IBV_WC_RNR_RETRY_EXC_ERR, 0, nullptr, 0, true);
      rs.errored = true;
      *drop = true;
      return true;
    }
    return false;
  };

  switch (h.kind) {
    case kRecSend: {
      if (h.flags & kRecFirst) {
        rs.dropping = false;
        bool drop = false;
        if (!claim(&drop)) return false;
        if (drop) rs.dropping = true;
        if (rs.errored) return true;
      }
      if (!rs.dropping) {
        const uint32_t total = RecordBytes(dlen);
        char* dst = nullptr;
        const RingStatus st = rs.producer.Reserve(total, &dst);
        if (st == RingStatus::kFull) return false;
        if (st != RingStatus::kOk) return true;
        RecordHeader out = h;
        out.total = total;
        out.frag_len = dlen;
        out.src_qpn = rs.src_qpn;
        out.src_ip = htonl(rs.src_ip);
        std::memcpy(dst, &out, sizeof(out));
        std::memcpy(dst + sizeof(out), data, dlen);
        rs.producer.Commit(total);
        if (dlen >= kMaxFragment) rs.producer.Publish();
      }
      if (h.flags & kRecLast) {
        rs.have_credit = false;
        rs.dropping = false;
        if (acked) Respond(rs, op.seq, IBV_WC_SUCCESS, 0, nullptr, 0, true);
      }
      return true;
    }
    case kRecWrite: {
      MrView v;
      ibv_wc_status st = CheckRemoteAccess(rs.hdr, owner->mr_table.as<MrEntry>(), op.rkey,
                                           op.remote_addr, dlen, IBV_ACCESS_REMOTE_WRITE, &v);
      if (st == IBV_WC_SUCCESS && dlen > 0) {
        Mapping* m = SessionRegion(*owner, v.region);
        const int64_t off = m ? RegionOffset(v, op.remote_addr, dlen, m->size()) : -1;
        if (off < 0) {
          st = IBV_WC_REM_ACCESS_ERR;
        } else {
          std::memcpy(m->as<char>() + off, data, dlen);
        }
      }
      if (st != IBV_WC_SUCCESS) {
        Respond(rs, op.seq, st, 0, nullptr, 0, true);
        rs.errored = true;
      } else if (op.last) {
        Respond(rs, op.seq, IBV_WC_SUCCESS, 0, nullptr, 0, true);
      }
      return true;
    }
    case kRecWriteImm: {
      bool drop = false;
      if (!claim(&drop)) return false;
      if (rs.errored) return true;
      if (!drop) {
        const uint32_t total = RecordBytes(0);
        char* dst = nullptr;
        const RingStatus st = rs.producer.Reserve(total, &dst);
        if (st == RingStatus::kFull) return false;
        if (st != RingStatus::kOk) return true;
        RecordHeader out{};
        out.total = total;
        out.kind = kRecWriteImm;
        out.flags = kRecFirst | kRecLast | kRecImm;
        out.msg_len = op.length;
        out.imm = h.imm;
        out.src_qpn = rs.src_qpn;
        out.src_ip = htonl(rs.src_ip);
        std::memcpy(dst, &out, sizeof(out));
        rs.producer.Commit(total);
      }
      rs.have_credit = false;
      Respond(rs, op.seq, IBV_WC_SUCCESS, 0, nullptr, 0, true);
      return true;
    }
    case kRecReadReq: {
      MrView v;
      ibv_wc_status st = CheckRemoteAccess(rs.hdr, owner->mr_table.as<MrEntry>(), op.rkey,
                                           op.remote_addr, op.length, IBV_ACCESS_REMOTE_READ, &v);
      const char* src = nullptr;
      if (st == IBV_WC_SUCCESS && op.length > 0) {
        Mapping* m = SessionRegion(*owner, v.region);
        const int64_t off = m ? RegionOffset(v, op.remote_addr, op.length, m->size()) : -1;
        if (off < 0) st = IBV_WC_REM_ACCESS_ERR;
        else src = m->as<char>() + off;
      }
      if (st != IBV_WC_SUCCESS) {
        Respond(rs, op.seq, st, 0, nullptr, 0, true);
        rs.errored = true;
        return true;
      }
      uint64_t sent = 0;
      do {
        const uint32_t frag = static_cast<uint32_t>(std::min<uint64_t>(op.length - sent, kMaxFragment));
        Respond(rs, op.seq, IBV_WC_SUCCESS, sent, src + sent, frag, sent + frag == op.length);
        sent += frag;
      } while (sent < op.length);
      return true;
    }
    case kRecAtomicReq: {
      if ((op.remote_addr & 7) != 0) {
        Respond(rs, op.seq, IBV_WC_REM_INV_REQ_ERR, 0, nullptr, 0, true);
        rs.errored = true;
        return true;
      }
      MrView v;
      ibv_wc_status st = CheckRemoteAccess(rs.hdr, owner->mr_table.as<MrEntry>(), op.rkey,
                                           op.remote_addr, 8, IBV_ACCESS_REMOTE_ATOMIC, &v);
      Mapping* m = st == IBV_WC_SUCCESS ? SessionRegion(*owner, v.region) : nullptr;
      const int64_t off = m ? RegionOffset(v, op.remote_addr, 8, m->size()) : -1;
      if (st != IBV_WC_SUCCESS || off < 0) {
        Respond(rs, op.seq, IBV_WC_REM_ACCESS_ERR, 0, nullptr, 0, true);
        rs.errored = true;
        return true;
      }
      const uint64_t old = AtomicOp(reinterpret_cast<uint64_t*>(m->as<char>() + off), op.opcode,
                                    op.compare_add, op.swap);
      Respond(rs, op.seq, IBV_WC_SUCCESS, 0, reinterpret_cast<const char*>(&old), 8, true);
      return true;
    }
    default:
      return true;
  }
}

void Router::DropSender(uint64_t key, bool tell_peer, bool died) {
  auto it = senders_.find(key);
  if (it == senders_.end()) return;
  RemoteSender& rs = *it->second;
  auto c = conns_.find(rs.conn);
  if (c != conns_.end()) {
    c->second->senders.erase(key);
    if (tell_peer) {
      SendFrame(*c->second, wire::Type::kPeerGone, rs.chan, nullptr, 0, nullptr, 0, died ? 1 : 0);
      FlushNode(*c->second);
    }
  }
  auto q = qps_.find(rs.target_qpn);
  if (q != qps_.end()) {
    for (auto& p : q->second->ring_producer)
      if (p == (kRemoteProducer | rs.id)) p = 0;
    // The remote peer is gone: a connected RC/UC target learns it as from a local peer.
    if (!tell_peer && rs.qp_type != IBV_QPT_UD)
      Notify(q->second->owner, died ? proto::EventType::kPeerGone : proto::EventType::kPeerClosed,
             rs.target_qpn);
  }
  blocked_senders_.erase(key);
  senders_.erase(it);
}

}  // namespace ff::router
