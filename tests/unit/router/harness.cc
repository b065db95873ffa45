#include "harness.h"

#include <arpa/inet.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <stdexcept>

#include "freeflow/target_ops.h"

namespace ff::router::test {
namespace {

// Router logs only when a test asks for them (FF_TEST_LOG=debug|info).
const bool kQuietLogs = [] {
  const char* level = std::getenv("FF_TEST_LOG");
  spdlog::set_level(level != nullptr ? spdlog::level::from_str(level) : spdlog::level::err);
  return true;
}();

class FakeControlPlane final : public cp::ControlPlane {
 public:
  FakeControlPlane(FakeCluster& cluster, cp::Endpoint self) : cluster_(cluster), self_(self) {}
  void Publish(uint32_t ip) override { cluster_.Set(ip, self_); }
  void Withdraw(uint32_t ip) override {
    if (auto ep = cluster_.Lookup(ip); ep && *ep == self_) cluster_.Erase(ip);
  }
  std::optional<cp::Endpoint> Lookup(uint32_t ip) const override { return cluster_.Lookup(ip); }
  std::vector<cp::Endpoint> Nodes() const override { return {}; }
  void OnChange(std::function<void()>) override {}
  bool Start(std::string*) override { return true; }
  bool Healthy() const override { return true; }

 private:
  FakeCluster& cluster_;
  cp::Endpoint self_;
};

}  // namespace

uint32_t Ip(const char* dotted) { return *ParseIpv4(dotted); }

PodLimits WithLimits(std::initializer_list<std::pair<Quota, uint32_t>> changed) {
  PodLimits l = DefaultPodLimits();
  for (const auto& [quota, n] : changed) l[static_cast<size_t>(quota)] = n;
  return l;
}

void FakeIdentity::Expect(uint32_t ip, uint64_t netns) {
  std::lock_guard<std::mutex> g(mu_);
  next_.emplace_back(ip, netns);
}

bool FakeIdentity::Resolve(int, PodIdentity* out, std::string* error) {
  std::lock_guard<std::mutex> g(mu_);
  if (next_.empty() || next_.front().first == 0) {
    if (!next_.empty()) next_.pop_front();
    *error = "the process has no address inside the overlay prefix 10.0.0.0/8";
    return false;
  }
  out->pid = ::getpid();
  out->ip = next_.front().first;
  out->netns = next_.front().second;
  next_.pop_front();
  return true;
}

std::unique_ptr<cp::ControlPlane> FakeCluster::PlaneFor(const cp::Endpoint& self) {
  return std::make_unique<FakeControlPlane>(*this, self);
}

void FakeCluster::Set(uint32_t ip, const cp::Endpoint& ep) {
  std::lock_guard<std::mutex> g(mu_);
  where_[ip] = ep;
}

void FakeCluster::Erase(uint32_t ip) {
  std::lock_guard<std::mutex> g(mu_);
  where_.erase(ip);
}

std::optional<cp::Endpoint> FakeCluster::Lookup(uint32_t ip) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = where_.find(ip);
  if (it == where_.end()) return std::nullopt;
  return it->second;
}

TestRouter::TestRouter(Options options) : options_(std::move(options)) {
  char tmpl[] = "/tmp/ff-router-test-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  RouterConfig config;
  config.dir = dir_;
  config.overlay = *Ipv4Prefix::Parse("10.0.0.0/8");
  config.node_name = options_.node;
  config.host_ip = options_.host_ip;
  config.resolve_timeout_ms = options_.resolve_timeout_ms;
  config.pod_limits = options_.limits;
  config.hello_timeout_ns = options_.hello_timeout_ns;
  RouterDeps deps;
  auto identity = std::make_unique<FakeIdentity>();
  identity_ = identity.get();
  deps.identity = std::move(identity);
  if (options_.network != nullptr) {
    config.control_plane = "test";
    deps.control_plane = options_.cluster->PlaneFor(endpoint());
    deps.transport = options_.network->Attach(endpoint());
  }
  router_ = std::make_unique<Router>(config, std::move(deps));
  std::string error;
  if (!router_->Start(&error)) throw std::runtime_error("router start: " + error);
  thread_ = std::thread([r = router_.get()] { r->Run(); });
}

TestRouter::~TestRouter() {
  router_->Stop();
  thread_.join();
  router_.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string TestRouter::Stats() {
  std::promise<std::string> line;
  router_->Post([&] { line.set_value(router_->StatsLine()); });
  return line.get_future().get();
}

uint64_t TestRouter::Stat(const std::string& name) {
  const std::string line = " " + Stats();
  const size_t at = line.find(" " + name + "=");
  if (at == std::string::npos) throw std::runtime_error("no figure " + name + " in " + line);
  return std::stoull(line.substr(at + name.size() + 2));
}

UniqueFd TestRouter::Connect(uint32_t ip, uint64_t netns) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    throw std::runtime_error("socketpair failed");
  identity_->Expect(ip, netns);
  router_->Adopt(UniqueFd(sv[1]));
  return UniqueFd(sv[0]);
}

RawPod::RawPod(TestRouter& router, uint32_t ip, uint64_t netns)
    : RawPod(router.Connect(ip, netns)) {}

RawPod::RawPod(UniqueFd sock) : sock_(std::move(sock)) {
  timeval tv{3, 0};
  ::setsockopt(sock_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

int RawPod::Hello(uint32_t abi) {
  if (CreateSegment("test-notify", kNotifySegmentBytes, &notify_fd_) != 0) return EIO;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return EIO;
  events_.reset(sv[0]);
  UniqueFd theirs(sv[1]);
  if (CreateWakePair(&wake_fd_, &wake_tx_, true) != 0) return EIO;
  proto::Hello m{};
  m.abi = abi;
  std::vector<UniqueFd> got;
  const proto::Response r = Call(m, {notify_fd_.get(), theirs.get(), wake_tx_.get()}, &got);
  hello_ = r.u.hello;
  hello_.node[sizeof(hello_.node) - 1] = '\0';
  if (r.status == 0 && got.size() == 1) mr_table_ = std::move(got[0]);
  return r.status;
}

void RawPod::SendRaw(const void* msg, size_t len, const std::vector<int>& fds) {
  SendWithFds(sock_.get(), msg, len, fds.data(), static_cast<int>(fds.size()));
}

proto::Response RawPod::CallRaw(const void* msg, size_t len, const std::vector<int>& fds,
                                std::vector<UniqueFd>* got) {
  if (SendWithFds(sock_.get(), msg, len, fds.data(), static_cast<int>(fds.size())) != 0) {
    proto::Response r{};
    r.status = -1;  // no answer
    return r;
  }
  return Receive(got);
}

proto::Response RawPod::Receive(std::vector<UniqueFd>* got) {
  proto::Response r{};
  r.status = -1;  // no answer
  UniqueFd in[proto::kMaxFds];
  int nfds = 0;
  size_t n = 0;
  if (RecvWithFds(sock_.get(), &r, sizeof(r), in, proto::kMaxFds, &nfds, &n) != 0 ||
      n != sizeof(r)) {
    r.status = -1;
    return r;
  }
  for (int i = 0; got != nullptr && i < nfds; ++i) got->push_back(std::move(in[i]));
  return r;
}

bool RawPod::Disconnected(int timeout_ms) {
  pollfd p{sock_.get(), POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return false;
  char buf[512];
  return ::recv(sock_.get(), buf, sizeof(buf), MSG_DONTWAIT) == 0;
}

std::optional<RawPod::SetupEvent> RawPod::ReadEvent(int timeout_ms) {
  pollfd p{events_.get(), POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return std::nullopt;
  SetupEvent e;
  int nfds = 0;
  size_t n = 0;
  if (RecvWithFds(events_.get(), &e.event, sizeof(e.event), &e.fd, 1, &nfds, &n, MSG_DONTWAIT) !=
          0 ||
      n != sizeof(e.event))
    return std::nullopt;
  return e;
}

std::optional<proto::Event> RawPod::NextEvent(int timeout_ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    std::optional<SetupEvent> e = ReadEvent(static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (!e) return std::nullopt;
    const proto::EventType t = e->event.type;
    if (t != proto::EventType::kPeerNamed && t != proto::EventType::kUdRing) return e->event;
    setup_.push_back(std::move(*e));
  }
}

std::optional<RawPod::SetupEvent> RawPod::NextSetupEvent(int timeout_ms) {
  if (setup_.empty()) {
    std::optional<SetupEvent> e = ReadEvent(timeout_ms);
    if (e) setup_.push_back(std::move(*e));
  }
  if (setup_.empty()) return std::nullopt;
  SetupEvent e = std::move(setup_.front());
  setup_.pop_front();
  return e;
}

uint32_t RawPod::CreateCq(uint32_t cq_id, uint32_t slot, uint32_t chan_id) {
  proto::CreateCq m{};
  m.cq_id = cq_id;
  m.notify_slot = slot;
  m.chan_id = chan_id;
  if (Call(m).status != 0) return 0;
  cqs_.push_back(cq_id);
  return cq_id;
}

NotifySlot* RawPod::Slot(uint32_t slot) {
  if (!notify_.get() && MapSegment(notify_fd_.get(), kNotifySegmentBytes, true, &notify_) != 0)
    return nullptr;
  return notify_.as<NotifySlot>() + slot;
}

RawQp RawPod::CreateQp(uint32_t type, uint32_t num_rings, uint32_t ring_bytes, uint32_t cq) {
  if (cq == 0 && cqs_.empty()) CreateCq(1);
  if (cq == 0) cq = cqs_.front();
  RawQp qp;
  qp.num_rings = num_rings;
  qp.ring_bytes = ring_bytes;
  const size_t bytes = QpSegmentBytes(num_rings, ring_bytes);
  if (CreateSegment("test-qp", bytes, &qp.seg_fd) != 0 ||
      MapSegment(qp.seg_fd.get(), bytes, true, &qp.seg) != 0)
    return qp;
  auto* hdr = new (qp.seg.get()) QpSegmentHeader();
  hdr->magic = kQpSegMagic;
  hdr->abi = kAbiVersion;
  hdr->num_rings = num_rings;
  hdr->ring_bytes = ring_bytes;
  proto::CreateQp m{};
  m.qp_type = type;
  m.num_rings = num_rings;
  m.ring_bytes = ring_bytes;
  m.srq_id = proto::kNoId;
  m.recv_cq_id = cq;
  m.send_cq_id = cq;
  const proto::Response r = Call(m, {qp.seg_fd.get()});
  qp.status = r.status;
  if (r.status == 0) qp.qpn = r.u.create_qp.qpn;
  return qp;
}

RawLink RawPod::Connect(const RawQp& qp, uint32_t dest_ip, uint32_t dest_qpn, bool ud) {
  proto::ConnectQp m{};
  m.qpn = qp.qpn;
  m.dest_ip = htonl(dest_ip);
  m.dest_qpn = dest_qpn;
  RawLink link;
  const proto::Response r =
      Call(m, {}, &link.fds, ud ? proto::Op::kResolveUd : proto::Op::kConnectQp);
  link.status = r.status;
  link.reply = r.u.connect;
  if (r.status != 0 || link.fds.empty()) return link;
  const proto::ConnectReply& c = link.reply;
  if (MapSegment(link.fds[0].get(), QpSegmentBytes(c.num_rings, c.ring_bytes), true, &link.seg) !=
      0)
    return link;
  if (c.flags & proto::kConnectRemote) {
    link.producer.Attach(QpRing(link.seg.get(), kProxyRequestRing, c.ring_bytes), c.ring_bytes);
    link.responses.Attach(QpRing(link.seg.get(), kProxyResponseRing, c.ring_bytes), c.ring_bytes);
  } else if (c.flags & proto::kConnectOwnRing) {
    if (MapPeerSegment(link.fds.back().get(), UdRingBytes(c.ring_bytes), true, &link.own_ring) != 0)
      return link;
    link.producer.Attach(link.own_ring.as<RingHeader>(), c.ring_bytes);
  } else {
    link.producer.Attach(QpRing(link.seg.get(), c.ring_index, c.ring_bytes), c.ring_bytes);
  }
  return link;
}

uint32_t RawPod::Register(uint32_t region_id, size_t bytes, uint32_t access, uint64_t addr,
                          Mapping* memory) {
  UniqueFd fd;
  if (CreateSegment("test-region", bytes, &fd) != 0 ||
      MapSegment(fd.get(), bytes, true, memory) != 0)
    return 0;
  // As the library does: reads only -> sealed read-only once our own mapping exists.
  if (!(access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      SealReadOnly(fd.get()) != 0)
    return 0;
  proto::RegMr m{};
  m.addr = addr;
  m.length = bytes;
  m.region_size = bytes;
  m.access = access;
  m.region_id = region_id;
  m.new_region = 1;
  const proto::Response r = Call(m, {fd.get()});
  return r.status == 0 ? r.u.reg_mr.key : 0;
}

uint32_t RawPod::RegisterLocal(uint64_t addr, size_t bytes, uint32_t access) {
  proto::RegMr m{};
  m.addr = addr;
  m.length = bytes;
  m.access = access;
  m.region_id = proto::kNoRegion;
  const proto::Response r = Call(m);
  return r.status == 0 ? r.u.reg_mr.key : 0;
}

bool TryPostRequest(RawLink& link, uint8_t kind, uint8_t flags, const ProxyRequest& req,
                    const void* data, uint32_t len, std::chrono::milliseconds wait) {
  RecordHeader h{};
  h.kind = kind;
  h.flags = flags;
  h.msg_len = req.length;
  const auto fill = [&](char* dst) { std::memcpy(dst, data, len); };
  if (!WaitFor([&] { return AppendRequest(link.producer, h, req, len, fill) == RingStatus::kOk; },
               wait))
    return false;
  link.producer.Publish();
  WakeIfArmed(&link.seg.as<QpSegmentHeader>()->doorbell, link.fds[1].get());
  return true;
}

void PostRequest(RawLink& link, uint8_t kind, uint8_t flags, const ProxyRequest& req,
                 const void* data, uint32_t len) {
  if (!TryPostRequest(link, kind, flags, req, data, len, std::chrono::milliseconds(3000)))
    throw std::runtime_error("the router takes nothing from the proxy request ring");
}

std::optional<ProxyResponse> NextAnswer(RawLink& link, std::vector<char>* data,
                                        std::chrono::milliseconds timeout) {
  RecordHeader h;
  std::vector<char> payload;
  ResponseView v{};
  if (!NextRecord(link.responses, &h, &payload, timeout) || !DecodeResponse(h, payload.data(), &v))
    return std::nullopt;
  if (data != nullptr) data->assign(v.data, v.data + v.data_len);
  return v.resp;
}

std::string PassMessage(RawLink& link, const RawQp& to, const std::string& text) {
  RecordHeader h{};
  h.kind = kRecSend;
  h.flags = kRecFirst | kRecLast;
  const auto len = static_cast<uint32_t>(text.size());
  if (AppendRecord(link.producer, h, text.data(), len) != RingStatus::kOk) return "";
  link.producer.Publish();
  RingConsumer in;
  in.Attach(to.ring(link.reply.ring_index), to.ring_bytes);
  std::vector<char> got;
  if (!NextRecord(in, &h, &got)) return "";
  return std::string(got.begin(), got.end());
}

bool NextRecord(RingConsumer& ring, RecordHeader* h, std::vector<char>* payload,
                std::chrono::milliseconds timeout) {
  const char* p = nullptr;
  if (!WaitFor([&] { return ring.Peek(h, &p) == RingStatus::kOk; }, timeout)) return false;
  payload->assign(p, p + h->frag_len);
  ring.Consume(*h);
  ring.Release();
  return true;
}

}  // namespace ff::router::test
