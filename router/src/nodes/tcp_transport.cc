#include "nodes/tcp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/find.h"
#include "freeflow/ipv4.h"
#include "freeflow/target_ops.h"

namespace ff::router {
namespace {

void NoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

sockaddr_in SockAddr(uint32_t ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(ip);
  return a;
}

}  // namespace

TcpTransport::~TcpTransport() {
  gate_.reset();                                   // its thread admits no more links
  if (inbox_ != nullptr) inbox_->owner = nullptr;  // what it posted finds nobody
  // No handler callbacks any more: the router that owns us is going away. Its peers learn
  // that it ended its links (TLS close_notify), not that they broke.
  for (auto& [id, l] : links_) {
    if (l->tls != nullptr && l->secured) l->tls->Goodbye();
    loop_->Unwatch(l->watch);
  }
}

bool TcpTransport::Start(EventLoop& loop, Handler& handler, std::string* error) {
  loop_ = &loop;
  handler_ = &handler;
  inbox_ = std::make_shared<Inbox>();
  inbox_->owner = this;
  gate_ =
      std::make_unique<NodeGate>(NodeGate::Options{options_.host_ip, options_.port, options_.tls});
  // On the gate's thread: queue the link for this loop.
  const auto admitted = [inbox = inbox_, loop = loop_](NodeGate::Admitted a) {
    std::lock_guard<std::mutex> lock(inbox->mu);
    inbox->ready.push_back(std::move(a));
    if (inbox->ready.size() > 1) return;  // already posted
    loop->Post([inbox] {
      std::vector<NodeGate::Admitted> ready;
      {
        std::lock_guard<std::mutex> lock(inbox->mu);
        ready.swap(inbox->ready);
      }
      for (NodeGate::Admitted& r : ready) {
        if (inbox->owner != nullptr) inbox->owner->Adopt(std::move(r));
      }
    });
  };
  if (!gate_->Start(admitted, error)) return false;
  options_.port = gate_->port();
  if (tick_.Start(loop, [this] { OnTick(); }) != 0) {
    *error = std::string("cannot start the node links' timer: ") + std::strerror(errno);
    return false;
  }
  tick_.Arm(kIdleTickNs);
  return true;
}

// A connection the gate admitted: a router that authenticated and said which node it is.
void TcpTransport::Adopt(NodeGate::Admitted a) {
  std::unique_ptr<TlsSession> tls = std::move(a.tls);
  Link* l = Add(std::move(a.fd), false, EPOLLIN | EPOLLRDHUP, std::move(tls));
  if (l == nullptr) return;
  l->secured = true;
  l->peer_node = a.node;
  NoteReady(*l);
  spdlog::info("link {}: router {} connected from {} ({})", l->id, l->peer_node,
               FormatIpv4(a.source_ip),
               l->tls != nullptr ? l->tls->Description() : "plaintext, unauthenticated");
  if (l->tls != nullptr && l->tls->HasPending()) ReadLater(l->id);  // came with the hello
}

TcpTransport::Link* TcpTransport::Find(LinkId id) { return FindIn(links_, id); }

const TcpTransport::Link* TcpTransport::Find(LinkId id) const { return FindIn(links_, id); }

TcpTransport::Link* TcpTransport::Add(UniqueFd fd, bool dialled, uint32_t events,
                                      std::unique_ptr<TlsSession> tls) {
  auto l = std::make_unique<Link>();
  l->id = next_id_++;
  l->fd = std::move(fd);
  l->dialled = dialled;
  l->connected = !dialled;
  l->last_rx_ns = l->last_tx_ns = l->created_ns = MonotonicNs();
  if (tls != nullptr) {
    l->tls = std::move(tls);
  } else if (options_.tls != nullptr) {
    l->tls = TlsSession::Create(*options_.tls, l->fd.get(), dialled);
    if (l->tls == nullptr) return nullptr;
  } else {
    l->secured = true;
  }
  l->events = events;
  const LinkId id = l->id;
  l->watch = loop_->Watch(l->fd.get(), events, [this, id](uint32_t ev) { OnEvents(id, ev); });
  if (l->watch == 0) return nullptr;
  Link* raw = l.get();
  links_.emplace(id, std::move(l));
  return raw;
}

LinkId TcpTransport::Dial(const cp::Endpoint& ep) {
  auto it = dialled_.find({ep.address, ep.port});
  if (it != dialled_.end() && Find(it->second) != nullptr) return it->second;
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return kNoLink;
  NoDelay(fd.get());
  const sockaddr_in a = SockAddr(ep.address, ep.port);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0 &&
      errno != EINPROGRESS) {
    spdlog::warn("cannot reach router {} at {}:{}: {}", ep.node, FormatIpv4(ep.address), ep.port,
                 std::strerror(errno));
    return kNoLink;
  }
  // EPOLLOUT reports the connect's outcome.
  Link* l = Add(std::move(fd), true, EPOLLIN | EPOLLOUT | EPOLLRDHUP);
  if (l == nullptr) return kNoLink;
  l->endpoint = ep;
  l->peer_node = ep.node;
  l->totals = TotalsOf(ep.node);  // what is sent before the link is ready counts too
  dialled_[{ep.address, ep.port}] = l->id;
  wire::Hello hello{wire::kMagic, wire::kVersion, {}};
  std::snprintf(hello.node, sizeof(hello.node), "%s", options_.node_name.c_str());
  const wire::FrameHeader fh{sizeof(hello), wire::Type::kHello, 0, 0, 0};
  Append(*l, &fh, sizeof(fh));
  Append(*l, &hello, sizeof(hello));
  return l->id;
}

bool TcpTransport::Dialled(LinkId link) const {
  const Link* l = Find(link);
  return l != nullptr && l->dialled;
}

std::vector<LinkView> TcpTransport::Links() const {
  const uint64_t now = MonotonicNs();
  std::vector<LinkView> out;
  out.reserve(links_.size());
  for (const auto& [id, link] : links_) {
    const Link& l = *link;
    LinkView v;
    v.id = id;
    v.peer = l.ready() ? l.peer_node : l.endpoint.node;
    v.dialled = l.dialled;
    v.state = l.ready() ? "ready" : l.connected ? "securing" : "connecting";
    v.queued_bytes = l.owed();
    v.idle_ms = (now - l.last_rx_ns) / 1'000'000;
    v.age_ms = (now - l.created_ns) / 1'000'000;
    out.push_back(std::move(v));
  }
  return out;
}

TcpTransport::PeerTotals* TcpTransport::TotalsOf(const std::string& peer) {
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    if (peers_.size() >= kMaxPeerTotals) return nullptr;  // counted nowhere; the link works
    it = peers_.emplace(peer, PeerTotals{}).first;
  }
  return &it->second;
}

void TcpTransport::NoteReady(Link& l) {
  if (l.totals == nullptr) l.totals = TotalsOf(l.dialled ? l.endpoint.node : l.peer_node);
  if (l.totals == nullptr || l.counted_ready) return;
  l.counted_ready = true;
  ++l.totals->connects;
}

std::vector<std::pair<const char*, uint64_t>> TcpTransport::PortRefusals() const {
  std::vector<std::pair<const char*, uint64_t>> out;
  if (gate_ != nullptr)
    gate_->refusals().ForEach([&](const char* why, uint64_t n) { out.emplace_back(why, n); });
  return out;
}

std::vector<PeerView> TcpTransport::Peers() const {
  std::map<std::string, size_t> up;
  for (const auto& [id, l] : links_)
    if (l->counted_ready) ++up[l->dialled ? l->endpoint.node : l->peer_node];
  std::vector<PeerView> out;
  for (const auto& [peer, t] : peers_)
    out.push_back({peer, up[peer], t.connects, t.losses, t.sent_messages, t.sent_bytes,
                   t.received_messages, t.received_bytes});
  return out;
}

std::string TcpTransport::PeerNode(LinkId link) const {
  const Link* l = Find(link);
  return l == nullptr || !l->ready() ? "" : l->peer_node;
}

bool TcpTransport::Congested(LinkId link) const {
  const Link* l = Find(link);
  return l != nullptr && l->owed() >= kLinkHighWater;
}

void TcpTransport::OnEvents(LinkId id, uint32_t events) {
  Link* l = Find(id);
  if (l == nullptr) return;
  if (!l->connected && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) && !FinishConnect(*l)) return;
  if (!l->connected) return;
  if (!l->secured && (!Secure(*l) || !l->secured)) return;  // closed, or the handshake goes on
  if (events & EPOLLIN) {
    if (!ReadAll(*l)) return;
  } else if (events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) {
    Close(id, "connection to peer router broke");
    return;
  }
  Flush(*l, true);
}

bool TcpTransport::FinishConnect(Link& l) {
  int err = 0;
  socklen_t len = sizeof(err);
  ::getsockopt(l.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    Close(l.id, std::strerror(err));
    return false;
  }
  l.connected = true;
  l.last_rx_ns = MonotonicNs();
  if (l.tls == nullptr) NoteReady(l);  // plaintext: ready once connected
  spdlog::info("connected to router {} at {}:{}", l.endpoint.node, FormatIpv4(l.endpoint.address),
               l.endpoint.port);
  return true;
}

bool TcpTransport::Secure(Link& l) {
  std::string error;
  const TlsStatus status = l.tls->Handshake(&error);
  switch (status) {
    case TlsStatus::kWantRead:
    case TlsStatus::kWantWrite:
      l.tls_wants_write = status == TlsStatus::kWantWrite;
      SyncEvents(l);
      return true;
    case TlsStatus::kFailed:
      Close(l.id, error);
      return false;
    case TlsStatus::kDone:
      break;
  }
  l.tls_wants_write = false;
  // Only a dialled link gets here: an accepted one arrives from the gate secured.
  if (!l.tls->PeerIs(l.endpoint.node)) {
    Close(l.id, "the router at " + FormatIpv4(l.endpoint.address) + ":" +
                    std::to_string(l.endpoint.port) + " presented the certificate of " +
                    l.tls->PeerSubject() + ", not of node " + l.endpoint.node);
    return false;
  }
  l.secured = true;
  NoteReady(l);
  spdlog::info("link {}: TLS with router {} ({})", l.id, l.endpoint.node, l.tls->Description());
  SyncEvents(l);
  if (l.tls->HasPending()) ReadLater(l.id);  // came with the handshake's last flight
  return true;
}

ssize_t TcpTransport::Receive(Link& l, char* p, size_t n) {
  if (l.tls == nullptr) return ::recv(l.fd.get(), p, n, MSG_DONTWAIT);
  return l.tls->Read(p, n, &l.tls_wants_write);
}

void TcpTransport::ReadLater(LinkId id) {
  loop_->Defer([this, id] {
    Link* l = Find(id);
    if (l != nullptr && !l->held && ReadAll(*l)) Flush(*l, true);
  });
}

bool TcpTransport::ReadAll(Link& l) {
  const LinkId id = l.id;
  int burst = 0;
  for (; burst < kLinkReadBurst && !l.held; ++burst) {
    if (l.in_cap - l.in_used < kLinkReadChunk / 2) {
      const size_t cap = l.in_used + kLinkReadChunk;
      std::unique_ptr<char[]> bigger(new char[cap]);  // left uninitialised: recv() fills it
      if (l.in_used > 0) std::memcpy(bigger.get(), l.in.get(), l.in_used);
      l.in = std::move(bigger);
      l.in_cap = cap;
    }
    const ssize_t n = Receive(l, l.in.get() + l.in_used, l.in_cap - l.in_used);
    if (n == 0) {
      Close(id, "peer router closed the connection");
      return false;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;  // epoll reports more
      Close(id, std::strerror(errno));
      return false;
    }
    l.in_used += static_cast<size_t>(n);
    l.last_rx_ns = MonotonicNs();
    if (!Parse(l)) {
      Close(id, l.close_reason.empty() ? "malformed frame from peer router" : l.close_reason);
      return false;
    }
  }
  // Out of turns with bytes left: a plaintext socket stays readable for epoll, but what
  // OpenSSL already read is invisible to it.
  if (burst == kLinkReadBurst && l.tls != nullptr && l.tls->HasPending()) ReadLater(id);
  return true;
}

bool TcpTransport::Parse(Link& l) {
  size_t off = 0;
  while (!l.held && l.in_used - off >= sizeof(wire::FrameHeader)) {
    wire::FrameHeader h;
    std::memcpy(&h, l.in.get() + off, sizeof(h));
    if (!wire::ValidFrame(h)) return false;
    if (l.in_used - off < sizeof(h) + h.len) break;
    const char* body = l.in.get() + off + sizeof(h);
    if (wire::IsTransportFrame(h.type)) {
      if (!OnTransportFrame(l, h)) return false;
    } else {
      if (l.totals != nullptr) {
        ++l.totals->received_messages;
        l.totals->received_bytes += h.len;
      }
      const NodeMessage m{h.type, h.chan, h.flags, body, h.len};
      const Handler::Verdict v = handler_->OnMessage(l.id, m);
      if (v == Handler::Verdict::kMalformed) return false;
      if (v == Handler::Verdict::kHold) {
        l.held = true;
        SyncEvents(l);
        break;
      }
    }
    off += sizeof(h) + h.len;
  }
  if (off > 0) {
    std::memmove(l.in.get(), l.in.get() + off, l.in_used - off);
    l.in_used -= off;
  }
  return true;
}

bool TcpTransport::OnTransportFrame(Link& l, const wire::FrameHeader& h) {
  switch (h.type) {
    case wire::Type::kHello:
      // The gate took an accepted link's hello; a dialled link hears none: malformed.
      return false;
    case wire::Type::kPing: {
      const wire::FrameHeader pong{0, wire::Type::kPong, 0, 0, 0};
      Append(l, &pong, sizeof(pong));
      ScheduleFlush(l);
      return true;
    }
    default:
      return true;  // kPong: its arrival refreshed last_rx_ns
  }
}

void TcpTransport::Append(Link& l, const void* p, size_t n) {
  if (l.out_off > 0 && l.out_off == l.out.size()) {
    l.out.clear();
    l.out_off = 0;
  }
  const char* c = static_cast<const char*>(p);
  l.out.insert(l.out.end(), c, c + n);
  if (l.owed() >= kLinkHighWater) l.over_high = true;
}

void TcpTransport::Send(LinkId link, wire::Type type, uint32_t chan, uint16_t flags,
                        std::initializer_list<Bytes> parts) {
  Link* l = Find(link);
  if (l == nullptr) return;
  size_t total = 0;
  for (const Bytes& b : parts) total += b.len;
  if (l->totals != nullptr) {
    ++l->totals->sent_messages;
    l->totals->sent_bytes += total;
  }
  const wire::FrameHeader fh{static_cast<uint32_t>(total), type, flags, chan, 0};
  if (total >= kDirectSendBytes && l->connected && l->secured && parts.size() < 8) {
    iovec iov[8];
    int n = 0;
    iov[n++] = {const_cast<wire::FrameHeader*>(&fh), sizeof(fh)};
    for (const Bytes& b : parts) iov[n++] = {const_cast<void*>(b.data), b.len};
    SendDirect(*l, iov, n, sizeof(fh) + total);
    return;
  }
  Append(*l, &fh, sizeof(fh));
  for (const Bytes& b : parts) Append(*l, b.data, b.len);
  ScheduleFlush(*l);
}

void TcpTransport::SendDirect(Link& l, const iovec* iov, int n, size_t total) {
  if (l.tls != nullptr) return EncryptDirect(l, iov, n, total);
  Flush(l, false);  // what is queued goes first
  size_t sent = 0;
  if (l.owed() == 0) {
    msghdr msg{};
    msg.msg_iov = const_cast<iovec*>(iov);
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t r;
    do {
      r = ::sendmsg(l.fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (r < 0 && errno == EINTR);
    if (r > 0) {
      sent = static_cast<size_t>(r);
      l.last_tx_ns = MonotonicNs();
    }
  }
  if (sent == total) return;
  AppendFrom(l, iov, n, sent);
  SyncEvents(l);
}

// Buffers `iov` from byte `skip` on (what the socket or the TLS session did not take).
void TcpTransport::AppendFrom(Link& l, const iovec* iov, int n, size_t skip) {
  for (int i = 0; i < n; ++i) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    Append(l, static_cast<const char*>(iov[i].iov_base) + skip, iov[i].iov_len - skip);
    skip = 0;
  }
}

// TLS: a large frame is encrypted straight from its parts into the session's send buffer
// (no copy into the link's).
void TcpTransport::EncryptDirect(Link& l, const iovec* iov, int n, size_t total) {
  size_t taken = 0;
  if (l.owed() == 0) {
    // The small leading parts (headers) share one record.
    char head[256];
    size_t head_len = 0;
    int i = 0;
    for (; i < n - 1 && head_len + iov[i].iov_len <= sizeof(head); ++i) {
      std::memcpy(head + head_len, iov[i].iov_base, iov[i].iov_len);
      head_len += iov[i].iov_len;
    }
    bool all = true;
    if (head_len > 0) {
      taken = Encrypt(l, head, head_len);
      all = taken == head_len;
    }
    for (; all && i < n; ++i) {
      const size_t got = Encrypt(l, static_cast<const char*>(iov[i].iov_base), iov[i].iov_len);
      taken += got;
      all = got == iov[i].iov_len;
    }
  }
  if (taken < total) AppendFrom(l, iov, n, taken);
  // Sent at once, as a plaintext link does: waiting for the end of the loop turn to batch
  // more halves the throughput (the peer idles meanwhile).
  Flush(l, false);
}

// Small frames are written once per loop turn, so that many of them share one system call.
void TcpTransport::ScheduleFlush(Link& l) {
  if (l.flush_queued) return;
  l.flush_queued = true;
  flush_pending_.push_back(l.id);
  if (flush_pending_.size() > 1) return;
  loop_->Defer([this] {
    std::vector<LinkId> ids;
    ids.swap(flush_pending_);
    for (LinkId id : ids) {
      if (Link* l = Find(id)) {
        l->flush_queued = false;
        Flush(*l, true);
      }
    }
  });
}

void TcpTransport::Flush(Link& l, bool may_notify) {
  if (!l.connected || !l.secured) return;
  if (l.tls != nullptr) {
    FlushTls(l);
  } else {
    while (l.out_off < l.out.size()) {
      const ssize_t n = ::send(l.fd.get(), l.out.data() + l.out_off, l.out.size() - l.out_off,
                               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        l.out_off += static_cast<size_t>(n);
        l.last_tx_ns = MonotonicNs();
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      break;  // EAGAIN: EPOLLOUT resumes; an error shows up as EPOLLERR/EPOLLHUP
    }
  }
  if (l.out_off == l.out.size()) {
    l.out.clear();
    l.out_off = 0;
  } else if (l.out_off > kLinkCompactBytes) {
    l.out.erase(l.out.begin(), l.out.begin() + static_cast<ptrdiff_t>(l.out_off));
    l.out_off = 0;
  }
  if (may_notify && l.over_high && l.owed() < kLinkHighWater / 2) {
    l.over_high = false;
    handler_->OnDrained(l.id);
  }
  SyncEvents(l);
}

// Encrypts what the link owes into the session's send buffer and sends it, a buffer at a
// time, until the socket is full.
void TcpTransport::FlushTls(Link& l) {
  l.out_off += Encrypt(l, l.out.data() + l.out_off, l.out.size() - l.out_off);
  if (l.tls->HasUnsent()) SendTls(l);
}

// Encrypts up to `len` bytes, sending the send buffer whenever it is full. The bytes taken:
// fewer when the socket is full, or the session waits for its peer or failed (reading
// reports that).
size_t TcpTransport::Encrypt(Link& l, const char* p, size_t len) {
  size_t off = 0;
  while (off < len) {
    const ssize_t w = l.tls->Write(p + off, len - off);
    if (w > 0) {
      off += static_cast<size_t>(w);
    } else if (!l.tls->HasUnsent() || !SendTls(l)) {
      break;
    }
  }
  return off;
}

bool TcpTransport::SendTls(Link& l) {
  const bool all = l.tls->SendPending();
  l.last_tx_ns = MonotonicNs();
  return all;
}

// Registers the epoll interest the link's state calls for: input unless a message is held,
// output while bytes wait or the connect is still in progress.
void TcpTransport::SyncEvents(Link& l) {
  const bool unsent = l.tls != nullptr && l.tls->HasUnsent();
  const bool out = !l.connected || l.tls_wants_write || unsent || (l.secured && l.owed() > 0);
  const uint32_t want = EPOLLRDHUP | (l.held ? 0u : static_cast<uint32_t>(EPOLLIN)) |
                        (out ? static_cast<uint32_t>(EPOLLOUT) : 0u);
  if (want == l.events) return;
  l.events = want;
  loop_->Modify(l.watch, want);
}

void TcpTransport::FlushNow() {
  for (auto& [id, l] : links_) Flush(*l, false);
}

void TcpTransport::Resume(LinkId link) {
  Link* l = Find(link);
  if (l == nullptr || !l->held) return;
  l->held = false;
  SyncEvents(*l);
  // Parse what was held from the loop, not from inside the handler that resumed us.
  loop_->Defer([this, link] {
    Link* l = Find(link);
    if (l == nullptr || l->held) return;
    if (!Parse(*l)) {
      Close(link, l->close_reason.empty() ? "malformed frame from peer router" : l->close_reason);
      return;
    }
    if (l->tls != nullptr && !l->held && l->tls->HasPending() && !ReadAll(*l)) return;
    Flush(*l, true);
  });
}

void TcpTransport::Close(LinkId id, const std::string& why) {
  auto it = links_.find(id);
  if (it == links_.end()) return;
  Link& l = *it->second;
  spdlog::warn("link {} to router {} closed: {}", id, l.peer_node.empty() ? "?" : l.peer_node, why);
  loop_->Unwatch(l.watch);
  if (l.dialled) dialled_.erase({l.endpoint.address, l.endpoint.port});
  if (l.counted_ready) ++l.totals->losses;
  links_.erase(it);
  handler_->OnLinkDown(id, why);
}

void TcpTransport::OnTick() {
  const uint64_t now = MonotonicNs();
  const uint64_t timeout = static_cast<uint64_t>(options_.peer_timeout_ms) * 1'000'000ull;
  std::vector<std::pair<LinkId, std::string>> dead;
  std::vector<LinkId> ping;
  for (auto& [id, l] : links_) {
    if (!l->connected) {
      if (now - l->last_tx_ns > kDialTimeoutNs) dead.emplace_back(id, "connect timed out");
      continue;
    }
    if (!l->ready() && now - l->created_ns > kDialTimeoutNs) {
      dead.emplace_back(id, "TLS handshake not finished in time");
      continue;
    }
    // A link we stopped reading (its answers pile up) is alive while its peer takes them.
    const uint64_t heard = l->held ? std::max(l->last_rx_ns, l->last_tx_ns) : l->last_rx_ns;
    if (now - heard > timeout * (l->dialled ? 1 : kInboundSilenceFactor)) {
      spdlog::warn(
          "link {}: nothing from router {} for {} ms (owed {} bytes, {} unparsed, held {})", id,
          l->peer_node, (now - l->last_rx_ns) / 1'000'000, l->owed(), l->in_used, l->held);
      dead.emplace_back(id, "peer router silent for too long");
      continue;
    }
    // Pinged when we have not *heard* from the peer lately, whatever we send: a link that
    // carries one-way traffic only (UD) would otherwise never hear back and be closed.
    if (l->dialled && l->ready() && now - l->last_rx_ns > kPingIntervalNs &&
        now - l->last_ping_ns > kPingIntervalNs) {
      l->last_ping_ns = now;
      ping.push_back(id);
    }
  }
  const wire::FrameHeader frame{0, wire::Type::kPing, 0, 0, 0};
  for (LinkId id : ping) {
    Link* l = Find(id);
    Append(*l, &frame, sizeof(frame));
    ScheduleFlush(*l);
  }
  for (auto& [id, why] : dead) Close(id, why);
  tick_.Arm(kIdleTickNs);
}

}  // namespace ff::router
