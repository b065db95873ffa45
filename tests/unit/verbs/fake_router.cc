#include "fake_router.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "freeflow/target_ops.h"

namespace fftest {
namespace {

void MustSegment(const char* name, size_t bytes, ff::UniqueFd* fd, ff::Mapping* map) {
  ASSERT_EQ(ff::CreateSegment(name, bytes, fd), 0);
  ASSERT_EQ(ff::MapSegment(fd->get(), bytes, true, map), 0);
}

constexpr uint32_t kRemoteAccess =
    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

// The library sent what the real router refuses: a bug in the library, so a test failure
// as well as the router's answer.
int Refuse(const char* what) {
  ADD_FAILURE() << "the router would refuse this: " << what;
  return EINVAL;
}

// The fd that get(value) finds in the value under `key` of `m`; -1 when there is none.
template <typename Map, typename Get>
int FdAt(const Map& m, uint32_t key, Get get) {
  auto it = m.find(key);
  return it == m.end() ? -1 : get(it->second);
}

void InitQpHeader(void* seg, uint32_t num_rings, uint32_t ring_bytes) {
  auto* h = new (seg) ff::QpSegmentHeader();
  h->magic = ff::kQpSegMagic;
  h->abi = ff::kAbiVersion;
  h->num_rings = num_rings;
  h->ring_bytes = ring_bytes;
}

}  // namespace

// ---- a peer on this node ---------------------------------------------------------------------

SameNodePeer::SameNodePeer(uint32_t qpn_, uint32_t qp_type_, size_t region_bytes)
    : qpn(qpn_), qp_type(qp_type_) {
  const uint32_t ring = qp_type == IBV_QPT_UD ? ff::kUdRingBytes : ff::kRcRingBytes;
  MustSegment("test-peer-qp", ff::QpSegmentBytes(1, ring), &seg_fd, &seg);
  InitQpHeader(seg.get(), 1, ring);
  inbound.Attach(ff::QpRing(seg.get(), 0, ring), ring);
  MustSegment("test-peer-notify", ff::kNotifySegmentBytes, &notify_fd, &notify);
  MustSegment("test-peer-mrs", ff::kMrTableBytes, &table_fd, &table);
  MustSegment("test-peer-region", region_bytes, &region_fd, &region);
}

void SameNodePeer::ShareReadOnly() {
  region_writable = false;
  ASSERT_EQ(ff::SealReadOnly(region_fd.get()), 0);
}

void SameNodePeer::PostCredits(uint64_t n) {
  ff::RecvCredits& c = header()->credits;
  c.posted.store(c.posted.load() + n, std::memory_order_release);
}

uint64_t SameNodePeer::Claimed() const { return header()->credits.claimed.load(); }

uint32_t SameNodePeer::AddMr(uint32_t slot, uint64_t addr, uint64_t offset, uint64_t length,
                             uint32_t access) {
  const uint32_t key = slot << 8 | 1;
  ff::MrEntry& e = table.as<ff::MrEntry>()[slot];
  ff::UpdateMrEntry(e, [&] {
    e.access.store(access);
    e.region.store(region_id);
    e.addr.store(addr);
    e.length.store(length);
    e.region_offset.store(offset);
    e.key.store(key);
  });
  return key;
}

bool SameNodePeer::NextRecord(ff::RecordHeader* h, std::vector<char>* payload) {
  const char* p = nullptr;
  if (inbound.Peek(h, &p) != ff::RingStatus::kOk) return false;
  payload->assign(p, p + h->frag_len);
  inbound.Consume(*h);
  inbound.Release();
  return true;
}

// ---- a proxy segment -------------------------------------------------------------------------

ProxySegment::ProxySegment() {
  MustSegment("test-proxy", ff::QpSegmentBytes(ff::kProxyRings, ff::kProxyRingBytes), &seg_fd,
              &seg);
  InitQpHeader(seg.get(), ff::kProxyRings, ff::kProxyRingBytes);
  requests.Attach(ff::QpRing(seg.get(), ff::kProxyRequestRing, ff::kProxyRingBytes),
                  ff::kProxyRingBytes);
  responses.Attach(ff::QpRing(seg.get(), ff::kProxyResponseRing, ff::kProxyRingBytes),
                   ff::kProxyRingBytes);
  EXPECT_EQ(ff::CreateWakePair(&doorbell, &doorbell_tx, true), 0);
}

std::vector<Request> ProxySegment::TakeRequests() {
  std::vector<Request> out;
  ff::RecordHeader h;
  const char* payload = nullptr;
  while (requests.Peek(&h, &payload) == ff::RingStatus::kOk) {
    ff::RequestView v;
    EXPECT_TRUE(ff::DecodeRequest(h, payload, &v)) << "kind " << int(h.kind);
    Request r{h, v.req, {}};
    if (v.data_len > 0) r.data.assign(v.data, v.data + v.data_len);
    out.push_back(std::move(r));
    requests.Consume(h);
  }
  requests.Release();
  return out;
}

// ---- the router --------------------------------------------------------------------------------

FakeRouter::FakeRouter() {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    ADD_FAILURE() << "socketpair: " << std::strerror(errno);
    return;
  }
  sock_.reset(pair[0]);
  pod_end_.reset(pair[1]);
  MustSegment("test-router-mrs", ff::kMrTableBytes, &table_fd_, &table_);
  thread_ = std::thread([this] { Serve(); });
}

FakeRouter::FakeRouter(ff::UniqueFd router_end) : sock_(std::move(router_end)) {
  MustSegment("test-router-mrs", ff::kMrTableBytes, &table_fd_, &table_);
  thread_ = std::thread([this] { Serve(); });
}

FakeRouter::~FakeRouter() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

ff::UniqueFd FakeRouter::TakePodEnd() { return std::move(pod_end_); }

void FakeRouter::RefuseHello(int status, const char* reason) {
  std::lock_guard<std::mutex> g(mu_);
  refuse_status_ = status;
  refuse_reason_ = reason;
}

void FakeRouter::AnswerSameNode(uint32_t qpn, SameNodePeer* peer) {
  std::lock_guard<std::mutex> g(mu_);
  answers_[qpn] = Answer{Answer::kSameNode, peer, nullptr, peer->qpn, peer->qp_type};
}

ProxySegment* FakeRouter::AnswerThroughRouter(uint32_t qpn, uint32_t peer_qpn,
                                              uint32_t peer_qp_type) {
  std::lock_guard<std::mutex> g(mu_);
  proxies_.push_back(std::make_unique<ProxySegment>());
  answers_[qpn] = Answer{Answer::kRouter, nullptr, proxies_.back().get(), peer_qpn, peer_qp_type};
  return proxies_.back().get();
}

bool FakeRouter::TrafficSlot(uint32_t slot, ff::TrafficSlot* out, uint32_t* used) {
  std::lock_guard<std::mutex> g(mu_);
  if (traffic_.get() == nullptr || slot >= ff::kTrafficSlots) return false;
  const ff::TrafficSlot& s = ff::TrafficSlotsOf(traffic_.get())[slot];
  out->peer_ip.store(s.peer_ip.load());
  out->placement.store(s.placement.load());
  for (uint32_t k = 0; k < ff::kTrafficKinds; ++k) {
    out->counts[k].ops.store(s.counts[k].ops.load());
    out->counts[k].bytes.store(s.counts[k].bytes.load());
  }
  if (used != nullptr) *used = traffic_.as<ff::TrafficLedgerHeader>()->used.load();
  return true;
}

void FakeRouter::AnswerDirect(uint32_t qpn, const ff::proto::ConnectReply& reply) {
  std::lock_guard<std::mutex> g(mu_);
  answers_[qpn] = Answer{Answer::kDirect, nullptr, nullptr, reply.peer_qpn, reply.peer_qp_type};
  direct_answers_[qpn] = reply;
}

std::vector<ff::proto::DirectEnded> FakeRouter::direct_ended() {
  std::lock_guard<std::mutex> g(mu_);
  return direct_ended_;
}

void FakeRouter::SendEvent(const ff::proto::Event& e, int fd) {
  std::lock_guard<std::mutex> g(mu_);
  const int fds[1] = {fd};
  EXPECT_EQ(ff::SendWithFds(events_.get(), &e, sizeof(e), fds, fd >= 0 ? 1 : 0), 0);
}

void FakeRouter::AnswerLoopback(uint32_t qpn, uint32_t dest_qpn) {
  std::lock_guard<std::mutex> g(mu_);
  answers_[qpn] = Answer{Answer::kLoopback, nullptr, nullptr, dest_qpn, 0};
}

void FakeRouter::WithholdConsent(uint32_t qpn, bool withhold) {
  std::lock_guard<std::mutex> g(mu_);
  withheld_[qpn] = withhold;
}

void FakeRouter::ForgetAnswer(uint32_t qpn) {
  std::lock_guard<std::mutex> g(mu_);
  answers_.erase(qpn);
  withheld_[qpn] = false;
}

int FakeRouter::connect_count(uint32_t qpn) {
  std::lock_guard<std::mutex> g(mu_);
  return connects_[qpn];
}

std::vector<ff::proto::NameQp> FakeRouter::names() {
  std::lock_guard<std::mutex> g(mu_);
  return names_;
}

void FakeRouter::Respond(ProxySegment* p, uint32_t seq, ibv_wc_status status, bool last,
                         uint64_t data_offset, const void* data, uint32_t len) {
  ff::ProxyResponse resp{};
  resp.seq = seq;
  resp.status = static_cast<uint16_t>(status);
  resp.last = last ? 1 : 0;
  resp.data_offset = data_offset;
  const ff::RingStatus rs =
      ff::AppendRecord(p->responses, ff::ResponseHeader(),
                       static_cast<uint32_t>(sizeof(resp)) + len, [&](char* dst) {
                         std::memcpy(dst, &resp, sizeof(resp));
                         if (len > 0) std::memcpy(dst + sizeof(resp), data, len);
                       });
  ASSERT_EQ(rs, ff::RingStatus::kOk);
  p->responses.Publish();
  WakePod();
}

void FakeRouter::DeliverSend(uint32_t qpn, uint32_t src_qpn, const char* data, uint32_t len) {
  ff::Mapping seg;
  ASSERT_EQ(ff::MapSegment(qp_segment_fd(qpn), ff::QpSegmentBytes(1, ff::kRcRingBytes), true, &seg),
            0);
  ff::RingProducer ring;  // continues from the published tail
  ring.Attach(ff::QpRing(seg.get(), 0, ff::kRcRingBytes), ff::kRcRingBytes);
  ff::RecordHeader h{};
  h.kind = ff::kRecSend;
  h.flags = ff::kRecFirst | ff::kRecLast;
  h.msg_len = len;
  h.src_qpn = src_qpn;
  ASSERT_EQ(ff::AppendRecord(ring, h, data, len), ff::RingStatus::kOk);
  ring.Publish();
}

void FakeRouter::WakePod() {
  std::lock_guard<std::mutex> g(mu_);
  if (!pod_notify_.get()) return;
  ff::WakeIfArmed(pod_notify_.as<ff::NotifySlot>() + ff::proto::kWakeSlot, wake_fd_.get(), true);
}

void FakeRouter::SendEvent(ff::proto::EventType type, uint32_t qpn) {
  std::lock_guard<std::mutex> g(mu_);
  const ff::proto::Event e{type, qpn};
  EXPECT_EQ(ff::SendWithFds(events_.get(), &e, sizeof(e), nullptr, 0), 0);
}

void FakeRouter::Close() {
  std::lock_guard<std::mutex> g(mu_);
  ::shutdown(sock_.get(), SHUT_RDWR);
  events_.reset();
  cm_channels_.clear();  // a dead router's descriptors close with it
}

void FakeRouter::OnCmCommand(CmHandler handler) {
  std::lock_guard<std::mutex> g(mu_);
  cm_handler_ = std::move(handler);
}

uint32_t FakeRouter::last_cm_channel() {
  std::lock_guard<std::mutex> g(mu_);
  return last_cm_channel_;
}

int FakeRouter::cm_channel_fd(uint32_t channel) {
  std::lock_guard<std::mutex> g(mu_);
  return FdAt(cm_channels_, channel, [](const ff::UniqueFd& fd) { return fd.get(); });
}

void FakeRouter::DropCmChannel(uint32_t channel) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = cm_channels_.find(channel);
  if (it == cm_channels_.end()) return;
  // As the router does: the library holds a copy of this end (protocol.h, CmOpenChannel).
  ::shutdown(it->second.get(), SHUT_RDWR);
  cm_channels_.erase(it);
}

std::vector<ff::proto::CmCommand> FakeRouter::cm_commands() {
  std::lock_guard<std::mutex> g(mu_);
  return cm_commands_;
}

ff::NotifySlot* FakeRouter::pod_notify() {
  std::lock_guard<std::mutex> g(mu_);
  return pod_notify_.as<ff::NotifySlot>();
}

const ff::MrEntry* FakeRouter::mr_entry(uint32_t key) {
  return table_.as<ff::MrEntry>() + ff::MrSlotOfKey(key);
}

uint32_t FakeRouter::last_qpn() {
  std::lock_guard<std::mutex> g(mu_);
  return last_qpn_;
}

int FakeRouter::qp_segment_fd(uint32_t qpn) {
  std::lock_guard<std::mutex> g(mu_);
  return FdAt(qps_, qpn, [](const QpRecord& q) { return q.seg.get(); });
}

int FakeRouter::move_mr_count() {
  std::lock_guard<std::mutex> g(mu_);
  return move_mr_count_;
}

uint32_t FakeRouter::last_moved_region() {
  std::lock_guard<std::mutex> g(mu_);
  return last_moved_region_;
}

int FakeRouter::regions_received() {
  std::lock_guard<std::mutex> g(mu_);
  return static_cast<int>(regions_.size());
}

int FakeRouter::region_fd(uint32_t id) {
  std::lock_guard<std::mutex> g(mu_);
  return FdAt(regions_, id, [](const RegionRecord& r) { return r.fd.get(); });
}

int FakeRouter::last_channel_fd() {
  std::lock_guard<std::mutex> g(mu_);
  return FdAt(channels_, last_channel_, [](const ff::UniqueFd& fd) { return fd.get(); });
}

void FakeRouter::Serve() {
  while (!stop_.load()) {
    pollfd p{sock_.get(), POLLIN, 0};
    const int n = ::poll(&p, 1, 20);
    if (n <= 0) continue;
    alignas(8) char buf[ff::proto::kMaxMessage];
    ff::UniqueFd fds[ff::proto::kMaxFds];
    int nfds = 0;
    size_t len = 0;
    if (ff::RecvWithFds(sock_.get(), buf, sizeof(buf), fds, ff::proto::kMaxFds, &nfds, &len) != 0 ||
        len == 0)
      return;  // the pod closed its end, or we did (Close)
    Dispatch(buf, len, fds, nfds);
  }
}

void FakeRouter::Dispatch(const char* buf, size_t len, ff::UniqueFd* fds, int nfds) {
  ff::proto::Op op;
  if (!ff::proto::DecodeRequest(buf, len, nfds, &op)) {
    ADD_FAILURE() << "the library sent a malformed request (" << len << " bytes, " << nfds
                  << " fds)";
    return;
  }
  ff::proto::Response r{};
  std::memcpy(&r.h, buf, sizeof(r.h));
  std::vector<int> out;
  std::lock_guard<std::mutex> g(mu_);
  r.status = Handle(op, buf, fds, nfds, &r, &out);
  if (r.h.seq == ff::proto::kPostedSeq) return;  // posted: the library waits for no answer
  EXPECT_EQ(ff::SendWithFds(sock_.get(), &r, sizeof(r), out.data(), static_cast<int>(out.size())),
            0);
}

int FakeRouter::Handle(ff::proto::Op op, const char* buf, ff::UniqueFd* fds, int nfds,
                       ff::proto::Response* r, std::vector<int>* out) {
  using namespace ff::proto;
  switch (op) {
    case Op::kHello:
      return OnHello(fds, r, out);
    case Op::kCreateChannel:
    case Op::kCreateSrq:
    case Op::kCreateQp:
      return OnCreate(op, buf, fds, r);
    case Op::kDestroyQp: {  // forget the segment, as the router does (long runs create many)
      const uint32_t qpn = As<DestroyQp>(buf).id;
      qps_.erase(qpn);
      answers_.erase(qpn);
      return 0;
    }
    case Op::kConnectQp:
    case Op::kResolveUd:
      return OnConnect(As<ConnectQp>(buf), r, out);
    case Op::kNameQp:
      names_.push_back(As<NameQp>(buf));
      return 0;
    case Op::kDirectEnded:
      direct_ended_.push_back(As<DirectEnded>(buf));
      return 0;
    case Op::kTrafficLedger:
      return ff::MapPeerSegment(fds[0].get(), ff::kTrafficLedgerBytes, false, &traffic_);
    case Op::kRequestRing:
      return EOPNOTSUPP;  // this fake reads its socket only: the library stays on it
    case Op::kRegMr:
      return OnRegMr(As<RegMr>(buf), fds, nfds, r);
    case Op::kDeregMr:
      return OnDeregMr(As<DeregMr>(buf));
    case Op::kMoveMr:
      return OnMoveMr(As<MoveMr>(buf), fds, nfds);
    case Op::kGetRegion:
      return OnGetRegion(As<GetRegion>(buf), r, out);
    case Op::kCmOpenChannel:
      last_cm_channel_ = As<CmOpenChannel>(buf).channel;
      cm_channels_[last_cm_channel_] = std::move(fds[0]);
      return 0;
    case Op::kCmCommand:
      cm_commands_.push_back(As<CmCommand>(buf));
      return cm_handler_ ? cm_handler_(cm_commands_.back(), &r->u.cm) : 0;
    default:
      return 0;  // CQs, destroy and disconnect: nothing to keep here
  }
}

int FakeRouter::OnCreate(ff::proto::Op op, const char* buf, ff::UniqueFd* fds,
                         ff::proto::Response* r) {
  using namespace ff::proto;
  if (op == Op::kCreateChannel) {
    if (!ff::IsWakeSocket(fds[0].get())) return Refuse("a channel fd that is not a wake socket");
    last_channel_ = As<CreateChannel>(buf).id;
    channels_[last_channel_] = std::move(fds[0]);
    return 0;
  }
  if (op == Op::kCreateSrq) {
    if (!ff::SealedAtLeast(fds[0].get(), sizeof(ff::SrqSegment)))
      return Refuse("an SRQ segment not sealed against shrinking");
    return 0;
  }
  const auto m = As<CreateQp>(buf);
  if (!ff::SealedAtLeast(fds[0].get(), ff::QpSegmentBytes(m.num_rings, m.ring_bytes)))
    return Refuse("a QP segment not sealed against shrinking, or too small");
  last_qpn_ = next_qpn_++;
  qps_[last_qpn_] = QpRecord{std::move(fds[0]), m.num_rings, m.ring_bytes, m.qp_type};
  r->u.create_qp.qpn = last_qpn_;
  return 0;
}

int FakeRouter::OnHello(ff::UniqueFd* fds, ff::proto::Response* r, std::vector<int>* out) {
  if (refuse_status_ != 0) {
    std::snprintf(r->u.hello.node, sizeof(r->u.hello.node), "%s", refuse_reason_.c_str());
    return refuse_status_;
  }
  if (!ff::SealedAtLeast(fds[0].get(), ff::kNotifySegmentBytes))
    return Refuse("a notify segment not sealed against shrinking");
  if (!ff::IsWakeSocket(fds[2].get())) return Refuse("a wake fd that is not a wake socket");
  pod_notify_fd_ = std::move(fds[0]);
  events_ = std::move(fds[1]);
  wake_fd_ = std::move(fds[2]);
  EXPECT_EQ(ff::MapSegment(pod_notify_fd_.get(), ff::kNotifySegmentBytes, true, &pod_notify_), 0);
  r->u.hello.ctx_id = 1;
  r->u.hello.ip = htonl(0x0af40001);  // 10.244.0.1
  r->u.hello.prefix_len = 16;         // in 10.244.0.0/16, as a router's VNET_PREFIX says
  r->u.hello.lid = 1;
  std::snprintf(r->u.hello.node, sizeof(r->u.hello.node), "fake-node");
  out->push_back(table_fd_.get());
  return 0;
}

int FakeRouter::OnConnect(const ff::proto::ConnectQp& m, ff::proto::Response* r,
                          std::vector<int>* out) {
  ++connects_[m.qpn];
  if (m.h.op == ff::proto::Op::kConnectQp && withheld_[m.qpn]) return EINPROGRESS;
  auto it = answers_.find(m.qpn);
  if (it == answers_.end()) return EHOSTUNREACH;
  const Answer& a = it->second;
  auto& c = r->u.connect;
  if (a.kind == Answer::kDirect) {
    c = direct_answers_.at(m.qpn);
    return 0;
  }
  c.peer_qpn = a.peer_qpn;
  c.peer_ip = htonl(0x0af40002);
  c.peer_qp_type = a.peer_qp_type;
  c.notify_slot = ff::proto::kNoId;
  c.ring_index = 0;
  if (a.kind == Answer::kRouter) {
    c.flags = ff::proto::kConnectRemote;
    c.num_rings = ff::kProxyRings;
    c.ring_bytes = ff::kProxyRingBytes;
    *out = {a.proxy->seg_fd.get(), a.proxy->doorbell_tx.get()};
    return 0;
  }
  if (a.kind == Answer::kLoopback) {
    const QpRecord& dest = qps_.at(a.peer_qpn);
    c.peer_ctx_id = 1;
    c.peer_qp_type = dest.type;
    c.num_rings = dest.num_rings;
    c.ring_bytes = dest.ring_bytes;
    *out = {dest.seg.get(), pod_notify_fd_.get(), table_fd_.get()};
    return 0;
  }
  c.peer_ctx_id = a.peer->ctx_id;
  c.num_rings = 1;
  c.ring_bytes = a.peer->header()->ring_bytes;
  *out = {a.peer->seg_fd.get(), a.peer->notify_fd.get(), a.peer->table_fd.get()};
  return 0;
}

int FakeRouter::AcceptRegion(bool is_new, uint32_t id, uint64_t size, ff::UniqueFd* fds, int nfds) {
  if (!is_new) return nfds == 0 && regions_.count(id) ? 0 : EINVAL;
  if (nfds != 1 || regions_.count(id) || !ff::SealedAtLeast(fds[0].get(), size)) return EINVAL;
  regions_[id] = RegionRecord{std::move(fds[0]), size};
  return 0;
}

void FakeRouter::Release(uint32_t region_id) {
  auto it = regions_.find(region_id);
  if (it != regions_.end()) it->second.released = true;
}

int FakeRouter::OnRegMr(const ff::proto::RegMr& m, ff::UniqueFd* fds, int nfds,
                        ff::proto::Response* r) {
  if (m.region_id == ff::proto::kNoRegion) {
    if ((m.access & kRemoteAccess) || nfds != 0 || m.new_region || m.region_offset || m.region_size)
      return Refuse("a registration without a region that grants remote access or has one");
  } else {
    if (!(m.access & kRemoteAccess)) return Refuse("a region for local-only memory");
    if (const int rc = AcceptRegion(m.new_region != 0, m.region_id, m.region_size, fds, nfds))
      return rc;
  }
  const uint32_t slot = next_slot_++;
  const uint32_t key = slot << 8 | 1;
  ff::MrEntry& e = table_.as<ff::MrEntry>()[slot];
  ff::UpdateMrEntry(e, [&] {
    e.access.store(m.access);
    e.region.store(m.region_id);
    e.addr.store(m.addr);
    e.length.store(m.length);
    e.region_offset.store(m.region_offset);
    e.pd.store(m.pd);
    e.key.store(key);
  });
  r->u.reg_mr.key = key;
  return 0;
}

int FakeRouter::OnDeregMr(const ff::proto::DeregMr& m) {
  ff::MrEntry& e = table_.as<ff::MrEntry>()[ff::MrSlotOfKey(m.key)];
  if (e.key.load() != m.key) return EINVAL;
  const uint32_t region = e.region.load();
  ff::UpdateMrEntry(e, [&] { e.key.store(0); });
  if (m.release && region != ff::proto::kNoRegion) Release(region);
  return 0;
}

int FakeRouter::OnMoveMr(const ff::proto::MoveMr& m, ff::UniqueFd* fds, int nfds) {
  ff::MrEntry& e = table_.as<ff::MrEntry>()[ff::MrSlotOfKey(m.key)];
  if (e.key.load() != m.key) return EINVAL;
  const uint32_t from = e.region.load();
  if (from == ff::proto::kNoRegion || m.region_id == ff::proto::kNoRegion)
    return Refuse("a move of a registration without a region, or into none");
  if (const int rc = AcceptRegion(m.new_region != 0, m.region_id, m.region_size, fds, nfds))
    return rc;
  ff::UpdateMrEntry(e, [&] {
    e.region.store(m.region_id);
    e.region_offset.store(m.region_offset);
  });
  if (m.release && from != m.region_id) Release(from);
  ++move_mr_count_;
  last_moved_region_ = m.region_id;
  return 0;
}

int FakeRouter::OnGetRegion(const ff::proto::GetRegion& m, ff::proto::Response* r,
                            std::vector<int>* out) {
  auto it = answers_.find(m.qpn);
  if (it != answers_.end() && it->second.kind == Answer::kSameNode &&
      it->second.peer->region_id == m.region_id) {
    r->u.region.size = it->second.peer->region.size();
    r->u.region.writable = it->second.peer->region_writable ? 1 : 0;
    out->push_back(it->second.peer->region_fd.get());
    return 0;
  }
  auto own = regions_.find(m.region_id);  // loopback: the pod's own memory
  if (it == answers_.end() || it->second.kind != Answer::kLoopback || own == regions_.end() ||
      own->second.released)
    return ENOENT;
  r->u.region.size = own->second.size;
  r->u.region.writable = ff::SealedReadOnly(own->second.fd.get()) ? 0 : 1;
  out->push_back(own->second.fd.get());
  return 0;
}

}  // namespace fftest
