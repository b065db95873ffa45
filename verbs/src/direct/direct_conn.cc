// Direct connections of a session: dialled for a connect the router answered with a new
// connection, taken over when the router accepted one for us, the channels on each, and
// their end (docs/direct-path.md, "Inside the library").
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "direct/direct.h"
#include "freeflow/ipv4.h"

namespace ff::verbs {
namespace {

// Sockets are made and connected by system call, never through libc's socket() and
// connect(): libfsocket.so (TCP mode), preloaded beside us, takes those over for pod
// addresses, and this connection is ours, not the program's.
int RawSocket() {
  return static_cast<int>(
      ::syscall(SYS_socket, AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
}

void NoDelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Connects to `ip`:`port` (host order) within kDirectDialTimeoutNs. 0 or an errno value.
int Dial(uint32_t ip, uint16_t port, UniqueFd* out) {
  UniqueFd fd(RawSocket());
  if (!fd) return errno;
  NoDelay(fd.get());
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(ip);
  if (::syscall(SYS_connect, fd.get(), &sa, sizeof(sa)) != 0) {
    if (errno != EINPROGRESS) return errno;
    pollfd p{fd.get(), POLLOUT, 0};
    const int ms = static_cast<int>(ff::kDirectDialTimeoutNs / 1'000'000);
    int r;
    do {
      r = ::poll(&p, 1, ms);
    } while (r < 0 && errno == EINTR);
    if (r == 0) return ETIMEDOUT;
    int err = 0;
    socklen_t len = sizeof(err);
    if (r < 0 || ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
    if (err != 0) return err;
  }
  *out = std::move(fd);
  return 0;
}

// Sends the dialler's hello whole (a fresh socket takes its few bytes at once).
int SendHello(int fd, const char (&frame)[ff::direct::kHelloFrameBytes]) {
  size_t sent = 0;
  const uint64_t until = ff::MonotonicNs() + ff::kDirectDialTimeoutNs;
  while (sent < sizeof(frame)) {
    const ssize_t w = ::send(fd, frame + sent, sizeof(frame) - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w > 0) {
      sent += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno != EAGAIN && errno != EINTR) return errno;
    if (ff::MonotonicNs() > until) return ETIMEDOUT;
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, 10);
  }
  return 0;
}

bool KnownSeal(uint32_t seal) {
  return seal == static_cast<uint32_t>(ff::SealMode::kEncrypt) ||
         seal == static_cast<uint32_t>(ff::SealMode::kAuthenticate);
}

// Makes `c` ready with stream `fd` and watches it. c->recv_mu and send_mu need not be held:
// nobody uses the stream before `ready`.
int Start(DirectConn* c, UniqueFd fd, const uint8_t (&secret)[ff::kDirectSecretBytes],
          ff::SealMode mode, ff::DirectRole role) {
  const int raw = fd.get();
  auto stream = std::make_unique<ff::DirectStream>(std::move(fd));
  ff::DirectStream::Setup setup;
  setup.secret = &secret;
  setup.role = role;
  setup.mode = mode;
  // The dialler's hello was frame 0 of its direction, opened by the acceptor's router.
  setup.first_tx = role == ff::DirectRole::kDialler ? 1 : 0;
  setup.first_rx = role == ff::DirectRole::kDialler ? 0 : 1;
  if (!stream->Init(setup)) return ENOMEM;
  c->stream = std::move(stream);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = c->id;
  if (::epoll_ctl(c->session->direct_ep.get(), EPOLL_CTL_ADD, raw, &ev) != 0) return errno;
  c->ready.store(true, std::memory_order_release);
  c->session->direct_conns.fetch_add(1, std::memory_order_acq_rel);
  return 0;
}

std::shared_ptr<DirectConn> Find(DirectSet* set, uint64_t id) {
  std::lock_guard<std::mutex> g(set->mu);
  auto it = set->conns.find(id);
  return it == set->conns.end() ? nullptr : it->second;
}

// The connection `id` to `peer_ip`, made (not ready) if the set has none.
std::shared_ptr<DirectConn> FindOrAdd(Session* s, uint64_t id, uint32_t peer_ip) {
  DirectSet* set = DirectOf(s);
  std::lock_guard<std::mutex> g(set->mu);
  auto& slot = set->conns[id];
  if (!slot) {
    slot = std::make_shared<DirectConn>();
    slot->id = id;
    slot->peer_ip = peer_ip;
    slot->session = s;
    slot->created_ns = ff::MonotonicNs();
  }
  return slot;
}

// Channel `chan` (to a UD QP when `datagram`) of `c` is gone: what comes for it is refused.
// chan_mu held.
void RememberGone(DirectConn* c, uint32_t chan, bool datagram) {
  if (c->gone.emplace(chan, datagram).second) c->gone_order.push_back(chan);
  if (c->gone_order.size() > ff::kDirectGoneChannels) {
    c->gone.erase(c->gone_order.front());
    c->gone_order.pop_front();
  }
}

}  // namespace

void ForgetChannel(DirectConn* c,
                   std::unordered_map<uint32_t, std::shared_ptr<InChannel>>::iterator it) {
  const uint32_t chan = it->first;
  it->second->gone.store(true, std::memory_order_release);
  const bool datagram = it->second->datagram;
  c->in.erase(it);
  RememberGone(c, chan, datagram);
}

void ForgetClosedChannels(DirectConn* c, uint64_t now) {
  if (!ClosingDue(c, now)) return;  // none closing, or none drained yet
  std::lock_guard<std::mutex> g(c->chan_mu);
  uint64_t next = UINT64_MAX;
  for (auto it = c->in.begin(); it != c->in.end();) {
    const uint64_t since = it->second->closing_since_ns;
    if (since == 0 || now - since < ff::kUdCloseDrainNs) {
      if (since != 0) next = std::min(next, since + ff::kUdCloseDrainNs);
      ++it;
      continue;
    }
    auto after = std::next(it);
    ForgetChannel(c, it);
    it = after;
  }
  c->closing_due_ns.store(next, std::memory_order_relaxed);
}

namespace {

// kDirectChannel: our QP e.qpn takes the records of channel e.chan, into its ring e.ring
// (UD: into the ring of its own `ud_ring` that came with the event).
void InstallChannel(Session* s, const ff::proto::Event& e, UniqueFd ud_ring) {
  auto ch = std::make_shared<InChannel>();
  ch->chan = e.chan;
  ch->qpn = e.qpn;
  bool ok = false;
  s->registry.WithQp(e.qpn, [&](Qp* qp) {
    const Inbound& in = qp->inbound;
    if (e.ring >= in.num_rings || qp->kind->datagram != static_cast<bool>(ud_ring)) return;
    const size_t bytes = ff::QpSegmentBytes(in.num_rings, in.ring_bytes);
    if (ff::MapSegment(in.seg_fd.get(), bytes, true, &ch->seg) != 0) return;
    if (ud_ring &&
        ff::MapPeerSegment(ud_ring.get(), ff::UdRingBytes(in.ring_bytes), true, &ch->ud_ring) != 0)
      return;
    ch->datagram = qp->kind->datagram;
    auto* hdr = ch->seg.as<ff::QpSegmentHeader>();
    // On an SRQ too: the receive path claims each message on the SRQ when it takes it.
    ff::RecvCredits* credits = &hdr->credits;
    Cq* rcq = qp->rcq;
    if (rcq != nullptr && rcq->channel != nullptr && rcq->notify_slot != ff::proto::kNoId) {
      ch->cq_slot = s->slot(rcq->notify_slot);
      ch->cq_fd.reset(::fcntl(rcq->channel->tx.get(), F_DUPFD_CLOEXEC, 0));
    }
    ff::TargetChannel::Setup setup;
    setup.kind = qp->kind;
    setup.hdr = hdr;
    setup.credits = credits;
    setup.ring = ud_ring ? ch->ud_ring.as<ff::RingHeader>()
                         : ff::QpRing(ch->seg.get(), e.ring, in.ring_bytes);
    setup.ring_bytes = in.ring_bytes;
    setup.target_qpn = e.qpn;
    setup.src_ip = e.src_ip;
    setup.src_qpn = e.src_qpn;
    ch->target.Init(setup);
    ok = true;
  });
  auto c = FindOrAdd(s, e.conn, e.src_ip);
  std::lock_guard<std::mutex> g(c->chan_mu);
  if (!ok) {
    // The QP went (or the router's event does not fit it): the channel is one of a QP that
    // no longer exists, whose records are refused as such, never waited for as a channel
    // still to come (that would end the connection, and every channel on it).
    LogDebug("direct channel %u for QP 0x%x: no such QP here any more", e.chan, e.qpn);
    auto old = c->in.find(e.chan);
    if (old != c->in.end()) {
      ForgetChannel(c.get(), old);
    } else {
      RememberGone(c.get(), e.chan, static_cast<bool>(ud_ring));
    }
    return;
  }
  c->gone.erase(e.chan);
  // A UD channel of that number still closing (the number came round again) is replaced.
  c->in[e.chan] = std::move(ch);
}

// The router says channel e.chan of e.conn is closed (kDirectChannelGone). A UD channel
// closes after kUdCloseDrainNs (ForgetClosedChannels): its sender's datagrams sent before it
// went may still be on the way, or wait here for room in the ring, and are delivered, as the
// relay delivers them (Executor::CloseSender). Then it goes, with what it mapped, even when
// nothing more comes on the connection: the connection is due then (ClosingDue).
void RemoveChannel(Session* s, const ff::proto::Event& e) {
  auto c = Find(DirectOf(s), e.conn);
  if (!c) return;
  std::lock_guard<std::mutex> g(c->chan_mu);
  auto it = c->in.find(e.chan);
  if (it == c->in.end()) return;
  if (it->second->datagram) {
    if (it->second->closing_since_ns == 0) {
      it->second->closing_since_ns = ff::MonotonicNs();
      const uint64_t due = it->second->closing_since_ns + ff::kUdCloseDrainNs;
      LowerDue(c->closing_due_ns, due);
      LowerDue(s->direct_due_ns, due);
    }
    return;
  }
  ForgetChannel(c.get(), it);
}

// kDirectConn: the connection the router accepted for us.
void TakeConnection(Session* s, const ff::proto::Event& e, UniqueFd fd) {
  if (!fd || !KnownSeal(e.seal)) {
    LogError("the router handed over direct connection %llx without a socket or a known seal",
             static_cast<unsigned long long>(e.conn));
    return;
  }
  NoDelay(fd.get());
  auto c = FindOrAdd(s, e.conn, e.src_ip);
  if (c->ready.load()) return;  // a second hand-over of one connection: keep the first
  if (const int rc = Start(c.get(), std::move(fd), e.secret, static_cast<ff::SealMode>(e.seal),
                           ff::DirectRole::kAcceptor)) {
    LogError("cannot take direct connection from %s: %s", ff::FormatIpv4(e.src_ip).c_str(),
             std::strerror(rc));
    EndConn(c.get(), rc);
  }
}

}  // namespace

DirectOut::~DirectOut() {
  if (!conn) return;
  std::lock_guard<std::mutex> g(conn->chan_mu);
  auto it = conn->out.find(out->chan);
  if (it != conn->out.end() && it->second == out) conn->out.erase(it);
}

DirectSet* DirectOf(Session* s) {
  std::lock_guard<std::mutex> g(s->direct_mu);
  if (!s->direct) {
    s->direct = std::make_shared<DirectSet>();
    s->has_direct.store(true, std::memory_order_release);
  }
  return s->direct.get();
}

void CloseDirectInChild(Session* s) {
  std::shared_ptr<DirectSet> set = s->direct;  // no other thread runs in the child
  if (!set) return;
  for (auto& [id, c] : set->conns)
    if (c->ready.load() && c->stream->fd() >= 0) ::close(c->stream->fd());
}

int LinkDirect(Qp* qp, const ff::proto::ConnectReply& c, PeerLink* link) {
  Session* s = qp->ctx->session;
  const uint32_t peer_ip = ntohl(c.peer_ip);
  const bool fresh = (c.flags & ff::proto::kConnectDirectNew) != 0;
  if (!KnownSeal(c.direct_seal) || (fresh && c.direct_port == 0)) return EPROTO;
  DirectSet* set = DirectOf(s);
  std::shared_ptr<DirectConn> conn = Find(set, c.direct_conn);
  if (fresh) {
    // The peer's channels on this connection may have been announced first (a QP of the
    // peer process connecting to one of ours at the same time): the connection is then
    // known here, not yet dialled. One that is up already the router cannot offer anew.
    if (conn && (conn->ready.load() || conn->ended.load())) return EPROTO;
    conn = FindOrAdd(s, c.direct_conn, peer_ip);
    UniqueFd fd;
    int rc = Dial(peer_ip, c.direct_port, &fd);
    if (rc == 0) {
      ff::direct::Hello hello{ff::direct::kMagic, ff::direct::kVersion, c.direct_conn, s->ip,
                              peer_ip};
      char frame[ff::direct::kHelloFrameBytes];
      const auto mode = static_cast<ff::SealMode>(c.direct_seal);
      rc = ff::SealHello(c.direct_secret, mode, hello, frame) ? SendHello(fd.get(), frame) : ENOMEM;
      if (rc == 0)
        rc = Start(conn.get(), std::move(fd), c.direct_secret, mode, ff::DirectRole::kDialler);
    }
    if (rc != 0) {
      LogError("QP 0x%x: cannot reach QP 0x%x at %s directly (port %u): %s",
               qp->qpx.qp_base.qp_num, c.peer_qpn, ff::FormatIpv4(peer_ip).c_str(),
               c.direct_port, std::strerror(rc));
      EndConn(conn.get(), rc);
      link->dead = true;
    }
  } else if (!conn) {
    // A shared connection we have not heard of: ours to accept (a dialler knows its own).
    // Our router told us of it (kDirectChannel, kDirectConn) before it answered, but on the
    // event socket, which the event thread may not have read yet. It waits here as it would
    // had those events come first, until the router hands the socket over; one that never
    // comes (it ended here and left the set already) fails the QP's sends in PutRecord, as a
    // peer's that does not answer.
    conn = FindOrAdd(s, c.direct_conn, peer_ip);
  } else if (conn->ended.load()) {
    // The router reuses a connection that has just ended here: the QP fails as one whose
    // peer does not answer, and the router forgets the connection (DirectEnded).
    link->dead = true;
  }
  auto out = std::make_shared<OutChannel>();
  out->chan = c.direct_chan;
  out->qp = qp;
  out->qpn = qp->qpx.qp_base.qp_num;
  {
    std::lock_guard<std::mutex> g(conn->chan_mu);
    conn->out[out->chan] = out;
  }
  auto handle = std::make_shared<DirectOut>();
  handle->conn = std::move(conn);
  handle->out = std::move(out);
  link->direct = std::move(handle);
  return 0;
}

void OnDirectEvent(Session* s, const ff::proto::Event& e, UniqueFd fd) {
  switch (e.type) {
    case ff::proto::EventType::kDirectChannel:
      return InstallChannel(s, e, std::move(fd));
    case ff::proto::EventType::kDirectChannelGone:
      return RemoveChannel(s, e);
    case ff::proto::EventType::kDirectConn:
      return TakeConnection(s, e, std::move(fd));
    default:
      return;
  }
}

std::shared_ptr<Mapping> DirectRegion(Session* s, uint32_t id, uint32_t need) {
  DirectSet* set = DirectOf(s);
  const bool writes = (need & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) != 0;
  std::lock_guard<std::mutex> g(set->region_mu);
  auto it = set->regions.find(id);
  if (it == set->regions.end()) return nullptr;
  DirectSet::RegionEntry& r = it->second;
  if (writes && !r.writable) return nullptr;
  if (!r.map) {
    auto map = std::make_shared<Mapping>();
    if (ff::MapPeerSegment(r.fd, r.size, r.writable, map.get()) != 0) return nullptr;
    r.map = std::move(map);
  }
  return r.map;
}

void NoteDirectRegion(Session* s, uint32_t id, int fd, size_t size, bool writable) {
  DirectSet* set = DirectOf(s);
  std::lock_guard<std::mutex> g(set->region_mu);
  set->regions[id] = DirectSet::RegionEntry{fd, size, writable, nullptr};
}

void ForgetDirectRegion(Session* s, uint32_t id) {
  DirectSet* set = DirectOf(s);
  std::shared_ptr<Mapping> last;  // unmapped outside the lock, once no access holds it
  std::lock_guard<std::mutex> g(set->region_mu);
  auto it = set->regions.find(id);
  if (it == set->regions.end()) return;
  last = std::move(it->second.map);
  set->regions.erase(it);
}

void EndConn(DirectConn* c, int error, const char* why) {
  if (c->ended.exchange(true)) return;
  Session* s = c->session;
  DirectSet* set = DirectOf(s);
  std::shared_ptr<DirectConn> self;
  {
    std::lock_guard<std::mutex> g(set->mu);
    auto it = set->conns.find(c->id);
    if (it != set->conns.end() && it->second.get() == c) {
      self = std::move(it->second);
      set->conns.erase(it);
    }
    if (self) set->ended.push_back({self, error, why});
  }
  if (c->ready.load(std::memory_order_acquire)) {
    // The peer sees it end now, though our links may hold the object a while longer.
    ::shutdown(c->stream->fd(), SHUT_RDWR);
    ::epoll_ctl(s->direct_ep.get(), EPOLL_CTL_DEL, c->stream->fd(), nullptr);
    s->direct_conns.fetch_sub(1, std::memory_order_acq_rel);
  }
  // The event thread fails the channels' QPs and tells the router (FinishEnded).
  ff::SendWake(s->tick_tx.get());
}

void WakeSelf(Session* s) {
  if (!s->self_wake_tx) return;
  ff::WakeIfArmed(s->slot(ff::proto::kWakeSlot), s->self_wake_tx.get(), true);
}

void FinishEndedDirect(Session* s) {
  std::vector<DirectSet::Ended> ended;
  {
    std::shared_ptr<DirectSet> set;
    {
      std::lock_guard<std::mutex> g(s->direct_mu);
      set = s->direct;
    }
    if (!set) return;
    std::lock_guard<std::mutex> g(set->mu);
    ended.swap(set->ended);
  }
  for (auto& [c, error, broken] : ended) {
    std::vector<uint32_t> qpns;
    {
      std::lock_guard<std::mutex> g(c->chan_mu);
      for (auto& [chan, out] : c->out) qpns.push_back(out->qpn);
      for (auto& [chan, in] : c->in) qpns.push_back(in->qpn);
    }
    // Closed by the peer (its process ended, or dropped the connection): as a peer that
    // destroyed its QPs, later sends fail and receives stay; the routers say more if the
    // process died. Ended for a broken rule (a frame that did not open, a record beyond the
    // peer's rights): as a peer that died, at once.
    const bool closed = error == ECONNRESET;
    const char* why = broken != nullptr       ? broken
                      : c->ready.load()       ? c->stream->why_dead()
                                              : std::strerror(error);
    if (*why == '\0') why = std::strerror(error);
    if (!closed) {
      LogError("the direct connection to %s ended (%s): failing its %zu queue pairs",
               ff::FormatIpv4(c->peer_ip).c_str(), why, qpns.size());
    } else if (!qpns.empty()) {
      LogDebug("the direct connection to %s ended (%s)", ff::FormatIpv4(c->peer_ip).c_str(), why);
    }
    for (uint32_t qpn : qpns)
      s->registry.OnPeerGone(qpn, closed ? PeerGone::kDestroyed : PeerGone::kDied);
    ff::proto::DirectEnded m{};
    m.conn = c->id;
    m.error = static_cast<uint32_t>(error);
    s->Post(&m, sizeof(m));
  }
}

// The connections of `s` now (none when it has never had one).
std::vector<std::shared_ptr<DirectConn>> ConnsOf(Session* s) {
  std::vector<std::shared_ptr<DirectConn>> conns;
  if (s->direct_conns.load(std::memory_order_relaxed) == 0) return conns;
  DirectSet* set = DirectOf(s);
  std::lock_guard<std::mutex> g(set->mu);
  for (auto& [id, c] : set->conns) conns.push_back(c);
  return conns;
}

namespace {

// Writes what every connection of `s` holds, waiting (at most kDirectExitFlushNs in all) for
// sockets that cannot take it all now.
void FlushDirectBeforeExit(Session* s) {
  const std::vector<std::shared_ptr<DirectConn>> conns = ConnsOf(s);
  const uint64_t until = ff::MonotonicNs() + ff::kDirectExitFlushNs;
  for (const auto& c : conns) {
    if (!c->ready.load(std::memory_order_acquire)) continue;
    for (;;) {
      size_t left;
      {
        std::lock_guard<std::mutex> g(c->send_mu);
        c->stream->Flush();
        c->answers_since_ns = 0;
        left = c->stream->dead() ? 0 : c->stream->unsent();
      }
      const uint64_t now = ff::MonotonicNs();
      if (left == 0 || now >= until) break;
      pollfd p{c->stream->fd(), POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>((until - now) / 1'000'000) + 1);
    }
  }
}

// A program that exits right after its last receive has acknowledged it, or right after its
// last datagrams completed (a UD send completes once its frame is in the connection's buffer,
// as one on an HCA once it left): what the connections hold is written before the process
// goes (exit() and the end of main run this).
[[gnu::destructor]] void FlushAtExit() {
  if (Session* s = ProcessSession()) FlushDirectBeforeExit(s);
}

}  // namespace

}  // namespace ff::verbs
