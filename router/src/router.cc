#include "router.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <spdlog/spdlog.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace ff::router {
namespace {

// epoll tags: kind in the top byte, an id below.
constexpr uint64_t kListenTag = 1ull << 56;
constexpr uint64_t kStopTag = 2ull << 56;
constexpr uint64_t kSessionTag = 3ull << 56;
// Limits that keep one client from exhausting the router.
constexpr size_t kMaxQpsPerSession = 65536;
constexpr size_t kMaxObjectsPerSession = 16384;

// OnConnect result: the answer comes later (remote peer).
constexpr int kDeferred = -1;

template <typename T>
bool Decode(const char* buf, size_t len, T* out) {
  if (len != sizeof(T)) return false;
  std::memcpy(out, buf, sizeof(T));
  return true;
}

// Adds a client object under the client's own id, within the per-client limit.
template <typename Map, typename V>
int AddObject(Map& objects, uint32_t id, V&& value) {
  if (objects.size() >= kMaxObjectsPerSession) return ENOSPC;
  if (objects.count(id)) return EEXIST;
  objects.emplace(id, std::forward<V>(value));
  return 0;
}

template <typename Map>
int RemoveObject(Map& objects, uint32_t id) {
  return objects.erase(id) ? 0 : ENOENT;
}

bool ValidRegion(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

}  // namespace

Router::Router(RouterConfig config, std::unique_ptr<IdentityResolver> identity)
    : config_(std::move(config)), identity_(std::move(identity)) {}

Router::~Router() {
  if (listen_fd_) ::unlink(socket_path().c_str());
}

std::string Router::socket_path() const { return config_.dir + "/" + config_.name + ".sock"; }

bool Router::InstallLibrary(std::string* error) {
  if (config_.library_source.empty()) return true;
  namespace fs = std::filesystem;
  const fs::path target = fs::path(config_.dir) / "libffverbs.so";
  const fs::path tmp = fs::path(config_.dir) / (".libffverbs.so." + std::to_string(::getpid()));
  std::error_code ec;
  fs::copy_file(config_.library_source, tmp, fs::copy_options::overwrite_existing, ec);
  if (!ec) fs::permissions(tmp, fs::perms(0755), ec);
  // rename() replaces the file atomically: pods that already mapped the old library
  // keep their copy, new pods get the new one.
  if (!ec) fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp, ec);
    *error = "cannot install the container library " + config_.library_source + " into " +
             target.string() + ": " + ec.message();
    return false;
  }
  return true;
}

bool Router::Start(std::string* error) {
  struct stat st{};
  if (::stat(config_.dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *error = "--dir " + config_.dir + " is not a directory (create it, or mount the host folder)";
    return false;
  }
  if (::access(config_.dir.c_str(), W_OK) != 0) {
    *error = "--dir " + config_.dir + " is not writable: " + std::strerror(errno);
    return false;
  }
  if (config_.name.empty() || config_.name.find('/') != std::string::npos) {
    *error = "--name must be a plain file name, got '" + config_.name + "'";
    return false;
  }
  const std::string path = socket_path();
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    *error = "socket path " + path + " is longer than a Unix socket allows";
    return false;
  }
  const std::string lock_path = config_.dir + "/" + config_.name + ".lock";
  lock_fd_.reset(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!lock_fd_) {
    *error = "cannot open " + lock_path + ": " + std::strerror(errno);
    return false;
  }
  if (::flock(lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    *error = "another router already serves " + path + " (it holds " + lock_path + ")";
    return false;
  }
  if (!InstallLibrary(error)) return false;

  ::unlink(path.c_str());  // a stale socket of a router that died; we hold the lock
  listen_fd_.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!listen_fd_) {
    *error = std::string("socket: ") + std::strerror(errno);
    return false;
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::bind(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    *error = "cannot bind " + path + ": " + std::strerror(errno);
    listen_fd_.reset();
    return false;
  }
  ::chmod(path.c_str(), 0666);  // pods run as any user
  if (::listen(listen_fd_.get(), 128) != 0) {
    *error = std::string("listen: ") + std::strerror(errno);
    return false;
  }
  epoll_fd_.reset(::epoll_create1(EPOLL_CLOEXEC));
  stop_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!epoll_fd_ || !stop_fd_) {
    *error = std::string("epoll/eventfd: ") + std::strerror(errno);
    return false;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenTag;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, listen_fd_.get(), &ev);
  ev.data.u64 = kStopTag;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, stop_fd_.get(), &ev);
  if (!StartRemote(error)) return false;
  spdlog::info("ffrouter listening on {} (overlay {}, node {})", path, config_.overlay.ToString(),
               config_.node_name);
  return true;
}

void Router::Stop() {
  if (stop_fd_) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(stop_fd_.get(), &one, sizeof(one));
  }
}

void Router::Run() {
  epoll_event events[64];
  for (;;) {
    const bool busy = Busy();
    const int n = ::epoll_wait(epoll_fd_.get(), events, 64, busy ? 0 : -1);
    if (busy && n == 0) {
      // Polling while cross-node traffic flows: no doorbell, no wake-up on the path.
      if (!PollProxies()) ::sched_yield();
      if (!Busy()) PollProxies();  // the window closed: arm the doorbells
      continue;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      spdlog::error("epoll_wait: {}", std::strerror(errno));
      break;
    }
    ResumeParsing();
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      const uint64_t kind = tag & (0xffull << 56);
      const uint32_t id = static_cast<uint32_t>(tag);
      if (kind == kNodeListenTag) {
        AcceptNode();
        continue;
      }
      if (kind == kNodeTag) {
        auto c = conns_.find(id);
        if (c != conns_.end()) HandleNode(*c->second, events[i].events);
        continue;
      }
      if (kind == kDoorbellTag) {
        auto p = proxies_.find(id);
        if (p != proxies_.end()) {
          uint64_t v;
          [[maybe_unused]] ssize_t n = ::read(p->second->doorbell.get(), &v, sizeof(v));
          DrainProxy(*p->second);
        }
        continue;
      }
      if (kind == kTimerTag) {
        uint64_t v;
        [[maybe_unused]] ssize_t n = ::read(timer_fd_.get(), &v, sizeof(v));
        OnTimer();
        continue;
      }
      if (tag == kStopTag) {
        spdlog::info("ffrouter stopping; telling {} clients", sessions_.size());
        for (auto& [id, s] : sessions_) Notify(id, proto::EventType::kShutdown, 0);
        return;
      }
      if (tag == kListenTag) {
        Accept();
        continue;
      }
      Session* s = FindSession(id);
      if (s == nullptr) continue;
      if (events[i].events & EPOLLIN) {
        HandleReadable(*s);
      } else if (events[i].events & (EPOLLHUP | EPOLLERR)) {
        Drop(s->id, "connection closed");
      }
    }
    ResumeParsing();
  }
}

void Router::Accept() {
  for (int burst = 0; burst < 64; ++burst) {
    UniqueFd c(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!c) return;
    auto s = std::make_unique<Session>();
    std::string error;
    if (!identity_->Resolve(c.get(), &s->who, &error)) {
      // Keep the connection until the client's HELLO arrives, so that it reads the reason
      // as its answer instead of a reset connection.
      spdlog::warn("refusing a client: {}", error);
      s->refusal = error;
    }
    s->id = next_session_++;
    if (next_session_ == 0) next_session_ = 1;
    s->sock = std::move(c);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = kSessionTag | s->id;
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, s->sock.get(), &ev);
    if (s->refusal.empty()) {
      spdlog::info("client {} connected: pid {} address {}", s->id, s->who.pid,
                   FormatIpv4(s->who.ip));
    }
    sessions_[s->id] = std::move(s);
  }
}

Router::Session* Router::FindSession(uint32_t id) {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second.get();
}

void Router::HandleReadable(Session& s) {
  // Bounded burst so that one busy client cannot monopolise the loop.
  for (int burst = 0; burst < 32; ++burst) {
    alignas(8) char buf[proto::kMaxMessage];
    UniqueFd fds[proto::kMaxFds];
    int nfds = 0;
    size_t n = 0;
    const int rc = RecvWithFds(s.sock.get(), buf, sizeof(buf), fds, proto::kMaxFds, &nfds, &n,
                               MSG_DONTWAIT);
    if (rc == EAGAIN || rc == EWOULDBLOCK) return;
    if (rc != 0) {
      Drop(s.id, rc == EMSGSIZE ? "oversized message" : "receive error");
      return;
    }
    if (n == 0) {
      Drop(s.id, "client closed the connection");
      return;
    }
    const uint32_t id = s.id;
    if (!Dispatch(s, buf, n, fds, nfds)) {
      Drop(id, "malformed or unexpected message");
      return;
    }
  }
}

bool Router::Reply(Session& s, const proto::Response& r, const int* fds, int nfds) {
  return SendWithFds(s.sock.get(), &r, sizeof(r), fds, nfds, MSG_DONTWAIT) == 0;
}

void Router::Notify(uint32_t session_id, proto::EventType type, uint32_t qpn) {
  Session* s = FindSession(session_id);
  if (s == nullptr || !s->events) return;
  proto::Event e{type, qpn};
  const int rc = SendWithFds(s->events.get(), &e, sizeof(e), nullptr, 0, MSG_DONTWAIT);
  if (rc == EAGAIN) {
    spdlog::warn("client {} does not read its events; dropping its event socket", session_id);
  }
  if (rc != 0) s->events.reset();
}

bool Router::Dispatch(Session& s, const char* buf, size_t len, UniqueFd* fds, int nfds) {
  if (len < sizeof(proto::Header)) return false;
  proto::Header h;
  std::memcpy(&h, buf, sizeof(h));
  proto::Response r{};
  r.h = h;
  std::vector<int> out_fds;
  int status = 0;
  auto no_fds = [&] { return nfds == 0; };
  if (!s.hello && h.op != proto::Op::kHello) return false;
  if (!s.refusal.empty()) {
    r.status = EACCES;
    std::snprintf(r.u.hello.node, sizeof(r.u.hello.node), "%s", s.refusal.c_str());
    Reply(s, r);
    return false;
  }

  switch (h.op) {
    case proto::Op::kHello: {
      proto::Hello m;
      if (s.hello || !Decode(buf, len, &m) || nfds != 3) return false;
      status = OnHello(s, m, fds, nfds, &r, &out_fds);
      break;
    }
    case proto::Op::kCreateChannel: {
      proto::CreateChannel m;
      if (!Decode(buf, len, &m) || nfds != 1) return false;
      status = AddObject(s.channels, m.chan_id, std::move(fds[0]));
      break;
    }
    case proto::Op::kDestroyChannel: {
      proto::DestroyChannel m;
      if (!Decode(buf, len, &m) || !no_fds()) return false;
      status = RemoveObject(s.channels, m.chan_id);
      break;
    }
    case proto::Op::kCreateCq: {
      proto::CreateCq m;
      if (!Decode(buf, len, &m) || !no_fds()) return false;
      if (m.notify_slot != proto::kNoId &&
          (m.notify_slot >= proto::kWakeSlot || !s.channels.count(m.chan_id))) {
        status = EINVAL;
      } else {
        status = AddObject(s.cqs, m.cq_id, Cq{m.notify_slot, m.chan_id});
      }
      break;
    }
    case proto::Op::kDestroyCq: {
      proto::DestroyCq m;
      if (!Decode(buf, len, &m) || !no_fds()) return false;
      status = RemoveObject(s.cqs, m.cq_id);
      break;
    }
    case proto::Op::kCreateSrq: {
      proto::CreateSrq m;
      if (!Decode(buf, len, &m) || nfds != 1) return false;
      status = !SegmentAtLeast(fds[0].get(), sizeof(SrqSegment))
                   ? EINVAL
                   : AddObject(s.srqs, m.srq_id, std::move(fds[0]));
      break;
    }
    case proto::Op::kDestroySrq: {
      proto::DestroySrq m;
      if (!Decode(buf, len, &m) || !no_fds()) return false;
      status = RemoveObject(s.srqs, m.srq_id);
      break;
    }
    case proto::Op::kCreateQp: {
      proto::CreateQp m;
      if (!Decode(buf, len, &m) || nfds != 1) return false;
      status = OnCreateQp(s, m, fds, nfds, &r);
      break;
    }
    case proto::Op::kDestroyQp: {
      proto::DestroyQp m;
      if (!Decode(buf, len, &m) || !no_fds()) return false;
      auto it = qps_.find(m.qpn);
      if (it == qps_.end() || it->second->owner != s.id) {
        status = ENOENT;
      } else {
        ReleaseQp(*it->second, false);
        s.qps.erase(m.qpn);
        qps_.erase(it);
      }
      break;
    }
    case proto::Op::kConnectQp:
    case proto::Op::kResolveUd: {
      proto::ConnectQp m;
      if (!Decode(buf, len, &m) || !no_fds()) return false;
      status = OnConnect(s, m, h.op == proto::Op::kResolveUd, &r, &out_fds);
      if (status == kDeferred) return true;  // answered when the peer router replies
      break;
    }
    case proto::Op::kDisconnectQp: {
      proto::DisconnectQp m;
      if (!Decode(buf, len, &m) || !no_fds()) return false;
      auto it = qps_.find(m.qpn);
      if (it == qps_.end() || it->second->owner != s.id) {
        status = ENOENT;
      } else {
        Qp& qp = *it->second;
        for (uint32_t chan : std::set<uint32_t>(qp.proxies)) DropProxy(chan, true);
        for (uint32_t dest : qp.produces_into) {
          auto d = qps_.find(dest);
          if (d == qps_.end()) continue;
          for (auto& p : d->second->ring_producer)
            if (p == qp.qpn) p = 0;
        }
        qp.produces_into.clear();
      }
      break;
    }
    case proto::Op::kRegMr: {
      proto::RegMr m;
      if (!Decode(buf, len, &m) || nfds > 1) return false;
      status = OnRegMr(s, m, fds, nfds, &r);
      break;
    }
    case proto::Op::kDeregMr: {
      proto::DeregMr m;
      if (!Decode(buf, len, &m) || !no_fds()) return false;
      status = OnDeregMr(s, m);
      break;
    }
    case proto::Op::kMoveMr: {
      proto::MoveMr m;
      if (!Decode(buf, len, &m) || nfds > 1) return false;
      status = OnMoveMr(s, m, fds, nfds);
      break;
    }
    case proto::Op::kGetRegion: {
      proto::GetRegion m;
      if (!Decode(buf, len, &m) || !no_fds()) return false;
      status = OnGetRegion(s, m, &r, &out_fds);
      break;
    }
    default:
      return false;
  }
  r.status = status;
  return Reply(s, r, out_fds.data(), static_cast<int>(out_fds.size()));
}

int Router::OnHello(Session& s, const proto::Hello& m, UniqueFd* fds, int, proto::Response* r,
                    std::vector<int>* out_fds) {
  if (m.abi != kAbiVersion) {
    std::snprintf(r->u.hello.node, sizeof(r->u.hello.node),
                  "library ABI %u does not match router ABI %u", m.abi, kAbiVersion);
    return EPROTO;
  }
  if (!SegmentAtLeast(fds[0].get(), kNotifySegmentBytes)) return EINVAL;
  int type = 0;
  socklen_t tl = sizeof(type);
  if (::getsockopt(fds[1].get(), SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_SEQPACKET)
    return EINVAL;
  ::fcntl(fds[1].get(), F_SETFL, O_NONBLOCK);
  int rc = CreateSegment("ffrouter-mrtable", kMrTableBytes, &s.mr_table_fd);
  if (rc == 0) rc = MapSegment(s.mr_table_fd.get(), kMrTableBytes, true, &s.mr_table);
  if (rc != 0) return rc;
  const std::string self = "/proc/self/fd/" + std::to_string(s.mr_table_fd.get());
  s.mr_table_ro_fd.reset(::open(self.c_str(), O_RDONLY | O_CLOEXEC));
  if (!s.mr_table_ro_fd) return errno;
  s.notify_seg = std::move(fds[0]);
  s.events = std::move(fds[1]);
  s.wake_fd = std::move(fds[2]);
  s.slot_tags.assign(kMrTableSlots, 0);
  s.free_slots.reserve(kMrTableSlots);
  for (uint32_t i = kMrTableSlots - 1; i >= 1; --i) s.free_slots.push_back(i);
  s.hello = true;
  PublishIp(s.who.ip);
  r->u.hello.ctx_id = s.id;
  r->u.hello.ip = htonl(s.who.ip);
  r->u.hello.lid = LidForIp(s.who.ip);
  r->u.hello.prefix_len = config_.overlay.length;
  std::snprintf(r->u.hello.node, sizeof(r->u.hello.node), "%s", config_.node_name.c_str());
  out_fds->push_back(s.mr_table_ro_fd.get());
  return 0;
}

int Router::OnCreateQp(Session& s, const proto::CreateQp& m, UniqueFd* fds, int,
                       proto::Response* r) {
  if (s.qps.size() >= kMaxQpsPerSession) return ENOSPC;
  if (m.qp_type != IBV_QPT_RC && m.qp_type != IBV_QPT_UC && m.qp_type != IBV_QPT_UD)
    return EINVAL;
  if (m.num_rings == 0 || m.num_rings > 64 || m.ring_bytes < 4096 || m.ring_bytes > (64u << 20) ||
      (m.ring_bytes & (m.ring_bytes - 1)) != 0)
    return EINVAL;
  if (!SegmentAtLeast(fds[0].get(), QpSegmentBytes(m.num_rings, m.ring_bytes)))
    return EINVAL;
  if (m.srq_id != proto::kNoId && !s.srqs.count(m.srq_id)) return EINVAL;
  if (!s.cqs.count(m.recv_cq_id)) return EINVAL;
  uint32_t qpn = 0;
  for (int tries = 0; tries < (1 << 24); ++tries) {
    qpn = next_qpn_;
    next_qpn_ = (next_qpn_ + 1) & 0xffffff;
    if (next_qpn_ < 0x100) next_qpn_ = 0x100;
    if (!qps_.count(qpn)) break;
  }
  auto qp = std::make_unique<Qp>();
  qp->qpn = qpn;
  qp->type = m.qp_type;
  qp->owner = s.id;
  qp->seg = std::move(fds[0]);
  qp->num_rings = m.num_rings;
  qp->ring_bytes = m.ring_bytes;
  qp->srq_id = m.srq_id;
  qp->recv_cq_id = m.recv_cq_id;
  qp->send_cq_id = m.send_cq_id;
  qp->ring_producer.assign(m.num_rings, 0);
  qps_[qpn] = std::move(qp);
  s.qps.insert(qpn);
  r->u.create_qp.qpn = qpn;
  return 0;
}

Router::Qp* Router::FindDest(uint32_t dest_ip, uint16_t dest_lid, uint32_t dest_qpn) {
  auto it = qps_.find(dest_qpn);
  if (it == qps_.end()) return nullptr;
  Session* owner = FindSession(it->second->owner);
  if (owner == nullptr) return nullptr;
  if (dest_ip != 0 ? owner->who.ip != ntohl(dest_ip) : LidForIp(owner->who.ip) != dest_lid)
    return nullptr;
  return it->second.get();
}

bool Router::FillConnectReply(Session&, Qp& dest, uint32_t ring, proto::Response* r,
                              std::vector<int>* fds) {
  Session* owner = FindSession(dest.owner);
  if (owner == nullptr) return false;
  auto& c = r->u.connect;
  c.peer_ctx_id = owner->id;
  c.peer_qpn = dest.qpn;
  c.peer_ip = htonl(owner->who.ip);
  c.peer_lid = LidForIp(owner->who.ip);
  c.ring_index = ring;
  c.num_rings = dest.num_rings;
  c.ring_bytes = dest.ring_bytes;
  c.peer_qp_type = dest.type;
  c.notify_slot = proto::kNoId;
  c.has_srq = 0;
  fds->push_back(dest.seg.get());
  fds->push_back(owner->notify_seg.get());
  fds->push_back(owner->mr_table_ro_fd.get());
  auto cq = owner->cqs.find(dest.recv_cq_id);
  if (cq != owner->cqs.end() && cq->second.notify_slot != proto::kNoId) {
    auto ch = owner->channels.find(cq->second.chan_id);
    if (ch != owner->channels.end()) {
      c.notify_slot = cq->second.notify_slot;
      fds->push_back(ch->second.get());
    }
  }
  if (dest.srq_id != proto::kNoId) {
    auto srq = owner->srqs.find(dest.srq_id);
    if (srq == owner->srqs.end()) return false;
    c.has_srq = 1;
    fds->push_back(srq->second.get());
  }
  return true;
}

int Router::OnConnect(Session& s, const proto::ConnectQp& m, bool ud, proto::Response* r,
                      std::vector<int>* out_fds) {
  auto self = qps_.find(m.qpn);
  if (self == qps_.end() || self->second->owner != s.id) return ENOENT;
  Qp& src = *self->second;
  if ((src.type == IBV_QPT_UD) != ud) return EINVAL;
  Qp* dest = FindDest(m.dest_ip, m.dest_lid, m.dest_qpn);
  if (dest == nullptr && m.dest_ip != 0 && !published_.count(ntohl(m.dest_ip))) {
    // Not a pod of this node: reach it through its node's router.
    const int rc = ConnectRemote(s, src, m, ud);
    return rc == 0 ? kDeferred : rc;
  }
  if (dest == nullptr) {
    spdlog::info("client {}: no QP {:#x} at {}", s.id, m.dest_qpn,
                 m.dest_ip ? FormatIpv4(ntohl(m.dest_ip)) : "lid " + std::to_string(m.dest_lid));
    return EHOSTUNREACH;
  }
  if (dest->type != src.type) return EINVAL;
  uint32_t ring = proto::kNoId;
  for (uint32_t i = 0; i < dest->num_rings; ++i) {
    if (dest->ring_producer[i] == src.qpn) {
      ring = i;
      break;
    }
  }
  if (ring == proto::kNoId) {
    for (uint32_t i = 0; i < dest->num_rings; ++i) {
      if (dest->ring_producer[i] == 0) {
        ring = i;
        break;
      }
    }
  }
  if (ring == proto::kNoId) return ud ? ENOSPC : EBUSY;
  if (!ud) {
    // An RC/UC QP sends to one peer: forget an earlier connection of this QP.
    for (uint32_t old : src.produces_into) {
      auto d = qps_.find(old);
      if (d == qps_.end() || d->second.get() == dest) continue;
      for (auto& p : d->second->ring_producer)
        if (p == src.qpn) p = 0;
    }
    src.produces_into.clear();
  }
  if (!FillConnectReply(s, *dest, ring, r, out_fds)) return EHOSTUNREACH;
  dest->ring_producer[ring] = src.qpn;
  src.produces_into.insert(dest->qpn);
  return 0;
}

// A registration naming a region the router has not seen brings its memfd, which must be at
// least as large as the library claims.
int Router::AcceptRegion(Session& s, bool is_new, uint32_t region_id, uint64_t region_size,
                         UniqueFd* fds, int nfds) {
  if (!is_new) return nfds == 0 ? 0 : EINVAL;
  if (nfds != 1 || s.regions.count(region_id) || s.regions.size() >= kMaxObjectsPerSession)
    return EINVAL;
  if (!SegmentAtLeast(fds[0].get(), region_size)) return EINVAL;
  s.regions[region_id] = Region{std::move(fds[0]), region_size};
  return 0;
}

namespace {

// Changes an MR table entry under its sequence lock: odd while `change` runs, so that a
// reader (ReadMrEntry) never sees a half-written entry.
template <typename F>
void UpdateEntry(MrEntry& e, F change) {
  const uint32_t seq = e.seq.load(std::memory_order_relaxed);
  e.seq.store(seq + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  change();
  e.seq.store(seq + 2, std::memory_order_release);
}

}  // namespace

int Router::OnRegMr(Session& s, const proto::RegMr& m, UniqueFd* fds, int nfds,
                    proto::Response* r) {
  if (m.length == 0 || m.length > kMaxMsgSize * 64) return EINVAL;
  if (const int rc = AcceptRegion(s, m.new_region != 0, m.region_id, m.region_size, fds, nfds))
    return rc;
  auto region = s.regions.find(m.region_id);
  if (region == s.regions.end()) return ENOENT;
  if (!ValidRegion(m.region_offset, m.length, region->second.size)) return EINVAL;
  if (s.free_slots.empty()) return ENOMEM;
  const uint32_t slot = s.free_slots.back();
  s.free_slots.pop_back();
  uint8_t tag = ++s.slot_tags[slot];
  if (tag == 0) tag = s.slot_tags[slot] = 1;
  const uint32_t key = (slot << 8) | tag;
  MrEntry& e = s.mr_table.as<MrEntry>()[slot];
  UpdateEntry(e, [&] {
    e.access.store(m.access, std::memory_order_relaxed);
    e.region.store(m.region_id, std::memory_order_relaxed);
    e.addr.store(m.addr, std::memory_order_relaxed);
    e.length.store(m.length, std::memory_order_relaxed);
    e.region_offset.store(m.region_offset, std::memory_order_relaxed);
    e.key.store(key, std::memory_order_relaxed);
  });
  r->u.reg_mr.key = key;
  return 0;
}

int Router::OnDeregMr(Session& s, const proto::DeregMr& m) {
  const uint32_t slot = MrSlotOfKey(m.key);
  if (slot == 0 || slot >= kMrTableSlots) return EINVAL;
  MrEntry& e = s.mr_table.as<MrEntry>()[slot];
  if (e.key.load(std::memory_order_relaxed) != m.key) return EINVAL;
  const uint32_t region = e.region.load(std::memory_order_relaxed);
  // Invalidate before answering: from the moment the owner's dereg returns, every peer
  // lookup of this key fails.
  UpdateEntry(e, [&] { e.key.store(0, std::memory_order_relaxed); });
  s.free_slots.push_back(slot);
  if (m.release_region) s.regions.erase(region);
  return 0;
}

int Router::OnMoveMr(Session& s, const proto::MoveMr& m, UniqueFd* fds, int nfds) {
  const uint32_t slot = MrSlotOfKey(m.key);
  if (slot == 0 || slot >= kMrTableSlots) return EINVAL;
  MrEntry& e = s.mr_table.as<MrEntry>()[slot];
  if (e.key.load(std::memory_order_relaxed) != m.key) return EINVAL;
  if (const int rc = AcceptRegion(s, m.new_region != 0, m.region_id, m.region_size, fds, nfds))
    return rc;
  auto region = s.regions.find(m.region_id);
  if (region == s.regions.end()) return ENOENT;
  const uint64_t length = e.length.load(std::memory_order_relaxed);
  if (!ValidRegion(m.region_offset, length, region->second.size)) return EINVAL;
  const uint32_t old_region = e.region.load(std::memory_order_relaxed);
  UpdateEntry(e, [&] {
    e.region.store(m.region_id, std::memory_order_relaxed);
    e.region_offset.store(m.region_offset, std::memory_order_relaxed);
  });
  if (m.release_old && old_region != m.region_id) s.regions.erase(old_region);
  return 0;
}

int Router::OnGetRegion(Session& s, const proto::GetRegion& m, proto::Response* r,
                        std::vector<int>* out_fds) {
  auto self = qps_.find(m.qpn);
  if (self == qps_.end() || self->second->owner != s.id) return ENOENT;
  // Only memory of a process this QP is connected to.
  for (uint32_t dest : self->second->produces_into) {
    auto d = qps_.find(dest);
    if (d == qps_.end()) continue;
    Session* owner = FindSession(d->second->owner);
    if (owner == nullptr) continue;
    auto region = owner->regions.find(m.region_id);
    if (region == owner->regions.end()) continue;
    r->u.region.size = region->second.size;
    out_fds->push_back(region->second.fd.get());
    return 0;
  }
  return ENOENT;
}

void Router::ReleaseQp(Qp& qp, bool process_died) {
  const proto::EventType gone =
      process_died ? proto::EventType::kPeerGone : proto::EventType::kPeerClosed;
  for (uint32_t chan : std::set<uint32_t>(qp.proxies)) DropProxy(chan, true, process_died);
  // Peers producing into this QP: their sends can no longer be delivered.
  for (uint32_t producer : qp.ring_producer) {
    if (producer == 0) continue;
    if (producer & kRemoteProducer) {
      for (auto& [key, rs] : senders_) {
        if (rs->id == (producer & ~kRemoteProducer)) {
          DropSender(key, true, process_died);
          break;
        }
      }
      continue;
    }
    auto p = qps_.find(producer);
    if (p == qps_.end()) continue;
    p->second->produces_into.erase(qp.qpn);
    if (p->second->type != IBV_QPT_UD) Notify(p->second->owner, gone, producer);
  }
  // QPs this one produced into: free the ring, and tell a connected RC/UC peer.
  for (uint32_t dest : qp.produces_into) {
    auto d = qps_.find(dest);
    if (d == qps_.end()) continue;
    for (auto& p : d->second->ring_producer)
      if (p == qp.qpn) p = 0;
    if (d->second->type != IBV_QPT_UD) Notify(d->second->owner, gone, dest);
  }
  qp.produces_into.clear();
}

void Router::Drop(uint32_t session_id, const char* why) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  Session& s = *it->second;
  spdlog::info("client {} (pid {}, {}) gone: {}; releasing {} QPs, {} regions", s.id, s.who.pid,
               FormatIpv4(s.who.ip), why, s.qps.size(), s.regions.size());
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, s.sock.get(), nullptr);
  for (uint32_t qpn : s.qps) {
    auto q = qps_.find(qpn);
    if (q == qps_.end()) continue;
    ReleaseQp(*q->second, true);
    qps_.erase(q);
  }
  if (s.hello) WithdrawIp(s.who.ip);
  sessions_.erase(it);
}

}  // namespace ff::router
