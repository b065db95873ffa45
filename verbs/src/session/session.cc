// Connecting to a router (HELLO), synchronous requests, and the event thread that turns
// router notifications (peer gone, router gone) into flags through the registry.
#include "session/session.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "freeflow/router_socket.h"

namespace ff::verbs {
namespace {

constexpr const char* kDeviceName = "freeflow0";

std::mutex g_session_mu;
Session* g_session = nullptr;  // never freed: the event thread may outlive main
// g_session's ring control block, read without g_session_mu by spinning threads.
std::atomic<const ff::RequestRingControl*> g_ring_control{nullptr};
// Under g_session_mu: what opens the device nodes for a new session (GetSession's
// `on_open`), how many process-wide sessions were opened (the next one's device index), and
// whether a connect has waited for a router being replaced since the last one opened.
void (*g_on_open)(Session*) = nullptr;
int g_sessions_opened = 0;
bool g_waited = false;
// Set in a child forked from a process that had a session (the child has none of its own).
bool g_parent_had_session = false;
// Sessions whose router was lost and which a new one replaced: kept, never freed (their
// contexts may still point at them; an event thread may still be leaving).
std::vector<Session*>& g_lost_sessions = *new std::vector<Session*>;

// Takes one router notification off the event socket, if there is one. false when the
// session ends (closing, or the router is gone: then every QP was failed).
bool TakeEvent(Session* s) {
  // Raised before the receive and lowered once the event is in force, so that EventsPending
  // never sees the socket empty while an event taken off it is still being handled.
  s->taking_event.store(true, std::memory_order_seq_cst);
  struct Taken {
    Session* s;
    ~Taken() { s->taking_event.store(false, std::memory_order_release); }
  } taken{s};
  ff::proto::Event ev{};
  UniqueFd fd;
  int nfds = 0;
  size_t n = 0;
  const int rc = ff::RecvWithFds(s->events.get(), &ev, sizeof(ev), &fd, 1, &nfds, &n, MSG_DONTWAIT);
  if (s->closing.load()) return false;
  if (rc == EAGAIN) return true;
  if (rc == 0 && n == sizeof(ev)) {
    switch (ev.type) {
      case ff::proto::EventType::kPeerGone:
      case ff::proto::EventType::kPeerClosed:
        s->registry.OnPeerGone(ev.qpn, ev.type == ff::proto::EventType::kPeerGone
                                           ? PeerGone::kDied
                                           : PeerGone::kDestroyed);
        return true;
      case ff::proto::EventType::kQpRefused:
        LogError("the router refused queue pair %u (a quota of the pod was reached)", ev.qpn);
        s->registry.OnPeerGone(ev.qpn, PeerGone::kRefused);
        return true;
      case ff::proto::EventType::kPeerNamed:
        s->registry.OnPeerNamed(ev.qpn);
        return true;
      case ff::proto::EventType::kUdPeerLost:
        s->registry.OnUdPeerLost(ev);
        return true;
      case ff::proto::EventType::kProxyDrained:
        s->registry.OnProxyDrained(ev.qpn);
        return true;
      case ff::proto::EventType::kDirectChannel:
      case ff::proto::EventType::kDirectChannelGone:
      case ff::proto::EventType::kDirectConn:
        OnDirectEvent(s, ev, std::move(fd));
        return true;
      case ff::proto::EventType::kUdRing:
        if (nfds == 1) s->registry.OnUdRing(ev, std::move(fd));
        return true;
      case ff::proto::EventType::kShutdown:
        break;
      default:
        return true;  // unknown: ignore it
    }
  }
  // Router stopped or died: nothing can be set up any more and peers can no longer be
  // watched. Fail every QP so that nobody waits forever.
  LogError("lost the connection to the router at %s; failing all queue pairs", s->name.c_str());
  s->fatal.store(true);
  s->registry.OnFatal();
  // rdma_cm channels: their programs read EOF, then DEVICE_REMOVAL.
  if (auto lost = s->on_router_lost.load(std::memory_order_acquire)) lost(s);
  return false;
}

// When the event thread next advances stalled sends (Registry::Tick): soon after a context
// stalls, again soon while a tick advances something, backing off while none does (the
// peer frees nothing, or the program advances its sends itself), and no later than an RNR
// or consent deadline. Off while nothing stalls: an idle process is never woken. A stall
// that turns it on again comes no sooner than `interval` after the last tick, so that a
// busy program whose sends stall and unstall all the time (a bandwidth test whose receiver
// is slower) costs at most one wake-up per kStallTickMaxNs.
struct StallTicker {
  bool on = false;
  uint64_t interval = ff::kStallTickMinNs;
  uint64_t next = 0;
  uint64_t last = 0;  // when the last tick ran

  void Start(uint64_t now) {
    const uint64_t first = std::max(now + ff::kStallTickMinNs, last + interval);
    next = on ? std::min(next, first) : first;
    on = true;
  }
  void Run(Registry& r) {
    const Registry::TickOutcome o = r.Tick();
    on = o.stalled;
    interval = o.advanced ? ff::kStallTickMinNs : std::min(interval * 2, ff::kStallTickMaxNs);
    last = ff::MonotonicNs();
    next = std::max(std::min(last + interval, o.due), last + ff::kStallTickFloorNs);
  }
  // ppoll's timeout: nullptr (wait for an event) while off.
  const timespec* Timeout(timespec* ts) const {
    if (!on) return nullptr;
    const uint64_t now = ff::MonotonicNs();
    const uint64_t wait = next > now ? next - now : 0;
    ts->tv_sec = static_cast<time_t>(wait / 1000000000u);
    ts->tv_nsec = static_cast<long>(wait % 1000000000u);
    return ts;
  }
};

// Copies request `req` into `buf` numbered `seq` (*sent: its header so). 0, or EINVAL for a
// size no request has.
int Number(const void* req, size_t len, uint32_t seq, char (&buf)[ff::proto::kMaxMessage],
           ff::proto::Header* sent) {
  if (len > sizeof(buf) || len < sizeof(ff::proto::Header)) return EINVAL;
  std::memcpy(buf, req, len);
  std::memcpy(sent, buf, sizeof(*sent));
  sent->seq = seq;
  std::memcpy(buf, sent, sizeof(*sent));
  return 0;
}

// Sends request `req` numbered `seq` on the socket (*sent: its header as sent). 0, EINVAL for
// a size no request has, ENOTCONN when the router is gone, or the send's error.
int SendRequest(int sock, const void* req, size_t len, uint32_t seq, const int* fds, int nfds,
                ff::proto::Header* sent) {
  char buf[ff::proto::kMaxMessage];
  if (const int rc = Number(req, len, seq, buf, sent)) return rc;
  const int rc = ff::SendWithFds(sock, buf, len, fds, nfds);
  return rc == EPIPE ? ENOTCONN : rc;
}

// After publishing: a Doorbell when the router marked the ring asleep, one per sleep (the
// exchange). The router stores the mark before its last look at the ring, and we load it
// after publishing: one of us sees the other (both sequentially consistent). call_mu held.
int RingIfAsleep(Session* s) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (s->ring.control->sleeping.load(std::memory_order_seq_cst) == 0 ||
      s->ring.control->sleeping.exchange(0) == 0)
    return 0;
  ff::proto::Doorbell d{};
  ff::proto::Header h;
  return SendRequest(s->sock.get(), &d, sizeof(d), ff::proto::kPostedSeq, nullptr, 0, &h);
}

// Writes one record of `kind` into the session's request ring: the time it is published
// (MonotonicNs: the router serves the rings of all pods oldest first), then `len` bytes of
// `req`. Waits (ringing) while the router has not made room. call_mu held.
int PublishRecord(Session* s, uint8_t kind, const char* req, uint32_t len) {
  const uint32_t payload = static_cast<uint32_t>(sizeof(uint64_t)) + len;
  const uint32_t total = ff::RecordBytes(payload);
  char* at = nullptr;
  const uint64_t give_up = ff::MonotonicNs() + ff::kRouterCallTimeoutS * 1'000'000'000ull;
  for (;;) {
    const ff::RingStatus st = s->ring.producer.Reserve(total, &at);
    if (st == ff::RingStatus::kOk) break;
    if (st != ff::RingStatus::kFull) return EPROTO;  // the router broke the ring's indices
    if (s->fatal.load()) return ENOTCONN;
    if (ff::MonotonicNs() > give_up) return ETIMEDOUT;
    // Full: the router is behind. It does not sleep on a ring with requests in it (unless it
    // marked it before they came): ring if it did, and give it the CPU.
    if (const int rc = RingIfAsleep(s)) return rc;
    ::usleep(50);
  }
  ff::RecordHeader rh{};
  rh.total = total;
  rh.kind = kind;
  rh.frag_len = payload;
  const uint64_t now = ff::MonotonicNs();
  std::memcpy(at, &rh, sizeof(rh));
  std::memcpy(at + sizeof(rh), &now, sizeof(now));
  if (len != 0) std::memcpy(at + sizeof(rh) + sizeof(now), req, len);
  s->ring.producer.Commit(total);
  s->ring.producer.Publish();
  return 0;
}

// Sends request `req` numbered `seq` to the router: into the request ring when the router took
// one (a request with descriptors on the socket, its place held in the ring), else on the
// socket. *sent: its header as sent. call_mu held.
int Deliver(Session* s, const void* req, size_t len, uint32_t seq, const int* fds, int nfds,
            ff::proto::Header* sent) {
  if (s->ring.control == nullptr) return SendRequest(s->sock.get(), req, len, seq, fds, nfds, sent);
  char buf[ff::proto::kMaxMessage];
  if (const int rc = Number(req, len, seq, buf, sent)) return rc;
  if (nfds > 0) {
    // Its place first: the router, reaching the record, finds the request on the socket.
    if (const int rc = PublishRecord(s, ff::kRecOnSocket, nullptr, 0)) return rc;
    const int rc = ff::SendWithFds(s->sock.get(), buf, len, fds, nfds);
    if (rc != 0) {
      // Its place is held in the ring, where the router now waits for it: nothing after it
      // would be served. The session ends (the router drops it) rather than hang.
      LogError("cannot send a request to %s: %s; the session ends", s->name.c_str(),
               std::strerror(rc));
      s->fatal.store(true);
      ::shutdown(s->sock.get(), SHUT_RDWR);
    }
    return rc == EPIPE ? ENOTCONN : rc;
  }
  if (const int rc = PublishRecord(s, ff::kRecRequest, buf, static_cast<uint32_t>(len))) return rc;
  return RingIfAsleep(s);
}

// When the event thread serves the session's direct connections: while the program polls
// them (within kDirectAttendNs) it leaves them to it and looks again when that window
// closes; otherwise when one is readable, or at the time ServeDirectEvents asked for.
//
// It watches the epoll set even while the set is empty: a dial adds its connection from the
// program's thread (LinkDirect) and tells nobody, and a program that never polls (the
// passive side of one-sided operations) leaves what arrives there to this thread alone. An
// empty set is never readable, so watching it costs nothing.
//
// While the program keeps polling, each look finds it still there: the thread then sleeps
// twice as long past the program's last poll, up to kDirectAttendMaxNs, and from the
// program's first lapse on again kDirectAttendNs. A thread that woke every kDirectAttendNs
// took a busy program's core 5,000 times a second; ib_send_bw's 64-byte message rate lost
// a fifth to it. What a program leaves behind when it stops polling without sleeping in
// the library (an answer it held back, a one-sided operation) then waits at most that long.
struct DirectWatch {
  uint64_t due = UINT64_MAX;
  uint64_t lapse = ff::kDirectAttendNs;  // how long past the program's last poll to sleep

  // Whether to wait for the connections' readability now; *wake: when to look at them
  // again at the latest.
  bool Watch(Session* s, uint64_t now, uint64_t* wake) const {
    *wake = due;
    const uint64_t polled = s->direct_polled_ns.load(std::memory_order_relaxed);
    if (polled != 0 && now < polled + ff::kDirectAttendNs) {
      *wake = polled + lapse;
      return false;
    }
    return true;
  }
  // After a wake-up: `timed_out` when nothing but the clock woke the thread.
  void Looked(bool attending, bool timed_out) {
    if (!attending) {
      lapse = ff::kDirectAttendNs;
    } else if (timed_out) {
      lapse = std::min(2 * lapse, ff::kDirectAttendMaxNs);
    }
  }
};

void EventLoop(Session* s) {
  StallTicker ticker;
  DirectWatch direct;
  for (;;) {
    uint64_t now = ff::MonotonicNs();
    uint64_t direct_wake = UINT64_MAX;
    const bool watch = direct.Watch(s, now, &direct_wake);
    pollfd p[3] = {{s->events.get(), POLLIN, 0},
                   {s->tick_rx.get(), POLLIN, 0},
                   {s->direct_ep.get(), static_cast<short>(watch ? POLLIN : 0), 0}};
    timespec ts{};
    const timespec* timeout = ticker.Timeout(&ts);
    if (direct_wake != UINT64_MAX) {
      const uint64_t wait = direct_wake > now ? direct_wake - now : 0;
      const uint64_t ticker_wait = timeout != nullptr
                                       ? static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u +
                                             static_cast<uint64_t>(ts.tv_nsec)
                                       : UINT64_MAX;
      if (wait < ticker_wait) {
        ts.tv_sec = static_cast<time_t>(wait / 1'000'000'000u);
        ts.tv_nsec = static_cast<long>(wait % 1'000'000'000u);
        timeout = &ts;
      }
    }
    const int r = ::ppoll(p, 3, timeout, nullptr);
    if (s->closing.load()) return;
    if (r > 0 && p[1].revents != 0) {
      ff::DrainWakes(s->tick_rx.get());
      ticker.Start(ff::MonotonicNs());
    }
    if (r > 0 && p[0].revents != 0 && !TakeEvent(s)) return;
    if (ticker.on && ff::MonotonicNs() >= ticker.next) ticker.Run(s->registry);
    // Connections that ended are finished at once (tick_rx rang for them); the others when
    // the program leaves them to us.
    now = ff::MonotonicNs();
    if (s->has_direct.load(std::memory_order_acquire)) {
      // A timeout may be the end of the program's attention or a connection's due time.
      const bool watch_now = direct.Watch(s, now, &direct_wake);
      direct.Looked(!watch_now, r == 0);
      if (watch_now && (r == 0 || p[2].revents != 0 || p[1].revents != 0 || now >= direct.due)) {
        direct.due = ServeDirectEvents(s);
      } else if (r > 0 && p[1].revents != 0) {
        FinishEndedDirect(s);
      }
    }
  }
}

void InitDevice(Session* s) {
  s->device.session = s;
  ibv_device& d = s->device.dev;
  d.node_type = IBV_NODE_CA;
  d.transport_type = IBV_TRANSPORT_IB;
  std::snprintf(d.name, sizeof(d.name), "%s", kDeviceName);
  std::snprintf(d.dev_name, sizeof(d.dev_name), "uverbs0");
  // Where sysfs shows them: the library serves both (views/sysfs_view.h).
  std::snprintf(d.dev_path, sizeof(d.dev_path), "/sys/class/infiniband_verbs/%s", d.dev_name);
  std::snprintf(d.ibdev_path, sizeof(d.ibdev_path), "/sys/class/infiniband/%s", d.name);
}

// Shared memory and descriptors this process hands the router at HELLO. `theirs` receives
// the router's end of the event socket, `notify_fd` the notify segment's memfd.
int PrepareHello(Session* s, UniqueFd* theirs, UniqueFd* notify_fd) {
  int rc = ff::CreateSegment("ffverbs-notify", ff::kNotifySegmentBytes, notify_fd);
  if (rc == 0) rc = ff::MapSegment(notify_fd->get(), ff::kNotifySegmentBytes, true, &s->notify);
  int pair[2];
  if (rc == 0 && ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) rc = errno;
  if (rc != 0) {
    LogError("cannot set up shared memory for the router: %s", std::strerror(rc));
    return rc;
  }
  s->events.reset(pair[0]);
  theirs->reset(pair[1]);
  rc = ff::CreateWakePair(&s->wake_fd, &s->wake_tx, true);
  if (rc == 0) rc = ff::CreateWakePair(&s->tick_rx, &s->tick_tx, true);
  if (rc == 0) {
    s->self_wake_tx.reset(::fcntl(s->wake_tx.get(), F_DUPFD_CLOEXEC, 0));
    s->direct_ep.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!s->self_wake_tx || !s->direct_ep) rc = errno;
  }
  if (rc != 0) LogError("cannot create a wake socket: %s", std::strerror(rc));
  return rc;
}

int Hello(Session* s) {
  UniqueFd theirs, notify_fd;
  int rc = PrepareHello(s, &theirs, &notify_fd);
  if (rc != 0) return rc;
  ff::proto::Hello hello{};
  hello.abi = ff::kAbiVersion;
  const int fds[3] = {notify_fd.get(), theirs.get(), s->wake_tx.get()};
  ff::proto::Response resp{};
  UniqueFd table;
  int got = 0;
  rc = s->Call(&hello, sizeof(hello), fds, 3, &resp, &table, 1, &got);
  theirs.reset();
  s->wake_tx.reset();  // the router's now
  resp.u.hello.node[sizeof(resp.u.hello.node) - 1] = '\0';
  if (rc != 0) {
    LogError("the router at %s refused this process: %s%s%s", s->name.c_str(), std::strerror(rc),
             resp.u.hello.node[0] ? ": " : "", resp.u.hello.node);
    return rc;
  }
  const uint32_t len = resp.u.hello.prefix_len;
  if (got != 1 || len > 32 ||
      ff::MapRouterTable(table.get(), ff::kMrTableBytes, &s->mr_table) != 0) {
    LogError("the router at %s sent a malformed HELLO answer", s->name.c_str());
    return EPROTO;
  }
  s->ctx_id = resp.u.hello.ctx_id;
  s->ip = ntohl(resp.u.hello.ip);
  s->lid = resp.u.hello.lid;
  s->overlay = ff::Ipv4Prefix::Containing(s->ip, len);
  s->node = resp.u.hello.node;
  return 0;
}

// Connects to the router's socket at `path`: 0 or the connect's errno, said nowhere.
int TryConnect(const std::string& path, UniqueFd* out) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return ENAMETOOLONG;
  UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock) return errno;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return errno;
  *out = std::move(sock);
  return 0;
}

void SayUnreachable(const std::string& path, int rc) {
  if (rc == ENAMETOOLONG) {
    LogError("router socket path %s is too long", path.c_str());
    return;
  }
  LogError(
      "no virtual RDMA device: cannot reach the router at %s: %s (is ffrouter running "
      "and the host folder mounted? FFR_NAME / FREEFLOW_DIR choose the router)",
      path.c_str(), std::strerror(rc));
}

int ConnectUnix(const std::string& path, UniqueFd* out) {
  const int rc = TryConnect(path, out);
  if (rc != 0) SayUnreachable(path, rc);
  return rc;
}

// Hands the router a request ring (proto::RequestRing). Without one (a router that refuses
// it, or no memory for it) requests go on the socket, as they always could.
void OfferRequestRing(Session* s) {
  RequestRingEnd r;
  const size_t bytes = ff::RequestRingSegmentBytes(ff::kRequestRingBytes);
  UniqueFd fd;
  int rc = ff::CreateSegment("ffverbs-requests", bytes, &fd);
  if (rc == 0) rc = ff::MapSegment(fd.get(), bytes, true, &r.map);
  if (rc == 0) {
    ff::proto::RequestRing m{};
    m.bytes = ff::kRequestRingBytes;
    const int raw = fd.get();
    ff::proto::Response resp{};
    rc = s->Call(&m, sizeof(m), &raw, 1, &resp);
  }
  if (rc != 0) {
    LogDebug("requests to %s go on its socket (no request ring: %s)", s->name.c_str(),
             std::strerror(rc));
    return;
  }
  r.producer.Attach(ff::RequestRingOf(r.map.get()), ff::kRequestRingBytes);
  r.control = r.map.as<ff::RequestRingControl>();
  s->ring = std::move(r);
}

// Hands the router the session's traffic ledger (proto::TrafficLedger), posted: a router
// that refuses it only logs it, and the session works the same, uncounted.
void OfferTrafficLedger(Session* s) {
  UniqueFd fd;
  std::shared_ptr<TrafficLedger> ledger = TrafficLedger::Create(&fd);
  if (ledger == nullptr) return;
  ff::proto::TrafficLedger m{};
  m.bytes = ff::kTrafficLedgerBytes;
  const int raw = fd.get();
  if (s->Post(&m, sizeof(m), &raw, 1) == 0) s->traffic = std::move(ledger);
}

// Grows this process's descriptor table now, once, to what the session may need later
// (kReservedDescriptors, within the soft limit): by duplicating `fd` to the highest number
// and closing the copy. The kernel never shrinks a table, and one that must grow while the
// program's threads run waits for an RCU grace period first (expand_fdtable); in a 20-rank
// UD alltoall on two vCPUs a rank that grew its table mid-run sat in recvmsg for seconds,
// and its peers' UD endpoints timed out. Best effort: a lower limit just means a smaller
// table.
void ReserveDescriptorTable(int fd) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t want = std::min<rlim_t>(limit.rlim_cur, ff::kReservedDescriptors);
  if (want < 2) return;
  const int top = ::fcntl(fd, F_DUPFD_CLOEXEC, static_cast<int>(want - 1));
  if (top >= 0) ::close(top);
}

int Open(UniqueFd sock, const std::string& name, Session** out) {
  // A router that stops answering must turn into an error, not a hang.
  timeval tv{ff::kRouterCallTimeoutS, 0};
  if (::setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) return errno;
  auto s = std::make_unique<Session>();
  s->name = name;
  s->sock = std::move(sock);
  if (const int rc = Hello(s.get())) return rc;
  InitDevice(s.get());
  OfferRequestRing(s.get());
  OfferTrafficLedger(s.get());
  ReserveDescriptorTable(s->sock.get());
  Session* raw = s.get();
  raw->event_thread = std::thread(EventLoop, raw);
  LogDebug("connected to %s as context %u", name.c_str(), raw->ctx_id);
  *out = s.release();
  return 0;
}

template <typename F>
Session* NoThrowOpen(int* error, F&& open) {
  Session* s = nullptr;
  int rc;
  try {
    rc = open(&s);
  } catch (const std::bad_alloc&) {
    rc = ENOMEM;
  } catch (...) {  // std::thread could not start
    rc = EAGAIN;
  }
  if (error != nullptr) *error = rc;
  return rc == 0 ? s : nullptr;
}

uint64_t RouterWaitNs() {
  static const uint64_t ns = [] {
    const char* v = std::getenv("FFV_ROUTER_WAIT_MS");
    const long ms = v != nullptr && *v != '\0' ? std::atol(v) : ff::kDefaultRouterWaitMs;
    return ms > 0 ? static_cast<uint64_t>(std::min(ms, 600'000L)) * 1'000'000u : 0u;
  }();
  return ns;
}

// Whether a connect that failed with `rc` finds a router being replaced: its socket is there
// with nobody behind it, or this process lost its router (`lost`) and no new one has bound
// yet. A path that never had a router is no device, said at once.
bool BeingReplaced(int rc, bool lost) { return rc == ECONNREFUSED || (lost && rc == ENOENT); }

// Connects the process-wide session's socket, waiting (bounded) for a router being replaced,
// once per outage: a program that asks for the device again and again while there is none
// waits the first time only.
int ConnectProcessRouter(const std::string& path, bool lost, UniqueFd* out) {
  int rc = TryConnect(path, out);
  if (rc != 0 && !g_waited && BeingReplaced(rc, lost) && RouterWaitNs() > 0) {
    g_waited = true;
    LogDebug("waiting up to %llu ms for the router at %s (%s)",
             static_cast<unsigned long long>(RouterWaitNs() / 1'000'000u), path.c_str(),
             std::strerror(rc));
    const uint64_t until = ff::MonotonicNs() + RouterWaitNs();
    while (rc != 0 && BeingReplaced(rc, lost) && ff::MonotonicNs() < until) {
      const timespec pause{0, ff::kRouterRetryMs * 1'000'000L};
      ::nanosleep(&pause, nullptr);
      rc = TryConnect(path, out);
    }
  }
  if (rc != 0) SayUnreachable(path, rc);
  return rc;
}

// g_session if its router is alive; else a new session in its place (g_session_mu held).
Session* LiveLocked() {
  Session* current = g_session;
  if (current != nullptr && !current->fatal.load()) return current;
  const bool lost = current != nullptr;
  const std::string path = ff::RouterSocketPathFromEnv();
  Session* s = NoThrowOpen(nullptr, [&](Session** out) {
    UniqueFd sock;
    const int rc = ConnectProcessRouter(path, lost, &sock);
    return rc != 0 ? rc : Open(std::move(sock), path, out);
  });
  if (s == nullptr) return nullptr;
  g_waited = false;
  s->device.index = g_sessions_opened++;
  // The lost session stays allocated: its contexts, and the program's pointer to its
  // device, still lead to it.
  if (lost) {
    // Its spare QP segments are nobody's (no QP is made on a lost session): unmapped now.
    std::deque<Session::SpareSegment> spares;
    {
      std::lock_guard<std::mutex> sg(current->spare_mu);
      spares.swap(current->spare_segments);
    }
    try {
      g_lost_sessions.push_back(current);
    } catch (const std::bad_alloc&) {  // it stays allocated all the same, only unlisted
    }
  }
  g_session = s;
  g_ring_control.store(s->ring.control, std::memory_order_release);
  if (g_on_open != nullptr) g_on_open(s);
  if (lost)
    LogError(
        "the router at %s is back: device %s (index %d) can be opened again; objects "
        "of the lost one keep failing until they are destroyed",
        path.c_str(), s->device.dev.name, s->device.index);
  return s;
}

}  // namespace

uint64_t AnswerSpinNs() {
  static const uint64_t ns = [] {
    const char* v = std::getenv("FFV_SPIN_US");
    const long us = v != nullptr && *v != '\0' ? std::atol(v) : ff::kDefaultAnswerSpinUs;
    return us > 0 ? static_cast<uint64_t>(std::min(us, 1'000'000L)) * 1000u : 0u;
  }();
  return ns;
}

Session* GetSession(void (*on_open)(Session*)) {
  std::lock_guard<std::mutex> g(g_session_mu);
  if (on_open != nullptr) g_on_open = on_open;
  return LiveLocked();
}

Session* LiveProcessSession(bool* had) {
  std::lock_guard<std::mutex> g(g_session_mu);
  *had = g_session != nullptr || g_parent_had_session;
  return *had ? LiveLocked() : nullptr;
}

const ff::RequestRingControl* ProcessRingControl() {
  return g_ring_control.load(std::memory_order_acquire);
}

Session* ProcessSession() {
  std::lock_guard<std::mutex> g(g_session_mu);
  return g_session;
}

void LockProcessSession() { g_session_mu.lock(); }
void UnlockProcessSession() { g_session_mu.unlock(); }

void ForgetProcessSessionInChild() {
  Session* s = g_session;
  g_session = nullptr;
  if (s == nullptr) return;
  // What the parent set up (librdmacm's device list) the child inherits, so its first call
  // may be one that only a process with a session is served for (opening rdma_cm).
  g_parent_had_session = true;
  // The parent's connection stays the parent's: the child's copies of its descriptors would
  // keep the router from seeing the parent go, and requests on them would be the parent's.
  // The Session itself is left as it is (its event thread did not survive the fork).
  for (UniqueFd* fd : {&s->sock, &s->events, &s->wake_fd, &s->wake_tx, &s->tick_rx, &s->tick_tx,
                       &s->direct_ep, &s->self_wake_tx})
    if (*fd) ::close(fd->release());
  // Nor its direct connections: the peers must see them end when the parent does.
  CloseDirectInChild(s);
  // Nor are requests written to its ring: the router would take them for the parent's.
  g_ring_control.store(nullptr, std::memory_order_relaxed);
  s->ring.control = nullptr;
  s->ring.map.reset();
}

Session* OpenSession(const std::string& socket_path, int* error) {
  return NoThrowOpen(error, [&](Session** out) {
    UniqueFd sock;
    const int rc = ConnectUnix(socket_path, &sock);
    return rc != 0 ? rc : Open(std::move(sock), socket_path, out);
  });
}

Session* OpenSession(ff::UniqueFd connected_socket, const std::string& name_for_logs, int* error) {
  return NoThrowOpen(
      error, [&](Session** out) { return Open(std::move(connected_socket), name_for_logs, out); });
}

void CloseSession(Session* s) {
  if (s == nullptr) return;
  s->closing.store(true);
  // Ends the event thread's recv (it sees `closing` and leaves without failing anything).
  ::shutdown(s->events.get(), SHUT_RDWR);
  ::shutdown(s->sock.get(), SHUT_RDWR);
  if (s->event_thread.joinable()) s->event_thread.join();
  delete s;
}

bool EventsPending(Session* s) {
  // The socket first: an event received before this finds it empty was marked as being
  // taken before it was received.
  pollfd p{s->events.get(), POLLIN, 0};
  if (::poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0) return true;
  return s->taking_event.load(std::memory_order_seq_cst);
}

int Session::Call(const void* req, size_t len, const int* fds, int nfds, ff::proto::Response* resp,
                  UniqueFd* fds_out, int max_fds_out, int* nfds_out) {
  // A program that turns from its QPs to the router first sends the acknowledgements (and
  // posts) its polls held back for its next post: an HCA acknowledges a message as it arrives,
  // whatever the program does next. Held, they waited for the event thread, up to
  // kDirectAttendMaxNs while the program had polled just before: perftest's server, its last
  // exchange message unacknowledged, listened for the test's connection only after the
  // client, which had taken that message, had its connect rejected (integration.rdmacm.cross).
  if (direct_conns.load(std::memory_order_relaxed) != 0) FlushDirectAnswers(this);
  std::lock_guard<std::mutex> g(call_mu);
  if (nfds_out != nullptr) *nfds_out = 0;
  if (fatal.load()) return ENOTCONN;
  if (++seq == ff::proto::kPostedSeq) ++seq;
  ff::proto::Header h;
  int rc = Deliver(this, req, len, seq, fds, nfds, &h);
  if (rc != 0) return rc;
  UniqueFd scratch[ff::proto::kMaxFds];
  int got = 0;
  size_t n = 0;
  const auto receive = [&](int flags) {
    return ff::RecvWithFds(sock.get(), resp, sizeof(*resp), scratch, ff::proto::kMaxFds, &got, &n,
                           flags);
  };
  rc = SpinForAnswer(ring.control, [&] { return receive(MSG_DONTWAIT); });
  if (rc == EAGAIN) rc = receive(0);
  if (rc != 0) return rc == EAGAIN ? ETIMEDOUT : rc;
  if (n == 0) return ENOTCONN;
  if (n != sizeof(*resp) || resp->h.seq != h.seq || resp->h.op != h.op) return EPROTO;
  for (int i = 0; i < got && i < max_fds_out; ++i) {
    fds_out[i] = std::move(scratch[i]);
    if (nfds_out != nullptr) ++*nfds_out;
  }
  return resp->status;
}

int Session::Post(const void* req, size_t len, const int* fds, int nfds, uint64_t* served_at) {
  std::lock_guard<std::mutex> g(call_mu);
  if (served_at != nullptr) *served_at = 0;
  if (fatal.load()) return ENOTCONN;
  ff::proto::Header h;
  const int rc = Deliver(this, req, len, ff::proto::kPostedSeq, fds, nfds, &h);
  if (rc == 0 && served_at != nullptr && ring.control != nullptr)
    *served_at = ring.producer.position();
  return rc;
}

bool Session::Served(uint64_t served_at) {
  std::lock_guard<std::mutex> g(call_mu);
  return served_at != 0 && ring.control != nullptr && !fatal.load() &&
         ring.producer.ReleasedUpTo(served_at);
}

int Session::SimpleCall(const void* req, size_t len) {
  ff::proto::Response r{};
  return Call(req, len, nullptr, 0, &r);
}

}  // namespace ff::verbs
