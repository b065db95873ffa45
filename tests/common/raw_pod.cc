#include "raw_pod.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "freeflow/target_ops.h"

namespace ff::test {

UniqueFd ConnectToRouter(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return UniqueFd();
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock || ::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return UniqueFd();
  return sock;
}

UniqueFd UnsealedSegment(size_t bytes) {
  UniqueFd fd(::memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd && ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) fd.reset();
  return fd;
}

RawPod::RawPod(UniqueFd sock) : sock_(std::move(sock)) {
  timeval tv{3, 0};
  ::setsockopt(sock_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

int RawPod::Hello(uint32_t abi) {
  UniqueFd notify, tx;
  if (CreateSegment("test-notify", kNotifySegmentBytes, &notify) != 0) return EIO;
  if (CreateWakePair(&wake_fd_, &tx, true) != 0) return EIO;
  return HelloWith(std::move(notify), std::move(tx), abi);
}

int RawPod::HelloWith(UniqueFd notify, UniqueFd wake_tx, uint32_t abi) {
  notify_fd_ = std::move(notify);
  wake_tx_ = std::move(wake_tx);
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return EIO;
  events_.reset(sv[0]);
  UniqueFd theirs(sv[1]);
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

bool RawPod::Flush() {
  proto::DestroyCq nothing{};
  nothing.h.seq = 0x5eed;
  nothing.id = proto::kNoId;  // no such CQ: refused, and nothing changes
  const proto::Response r = Call(nothing);
  return r.h.seq == nothing.h.seq && r.status == ENOENT;
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
  // ECONNRESET: the router closed it with requests of ours unread (a pod dropped for its
  // request ring leaves its doorbell behind).
  const ssize_t n = ::recv(sock_.get(), buf, sizeof(buf), MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno == ECONNRESET);
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
    if (t != proto::EventType::kPeerNamed && t != proto::EventType::kUdRing &&
        t != proto::EventType::kDirectChannel && t != proto::EventType::kDirectConn)
      return e->event;
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
  UniqueFd seg;
  if (CreateSegment("test-qp", QpSegmentBytes(num_rings, ring_bytes), &seg) != 0) {
    RawQp qp;
    qp.num_rings = num_rings;
    qp.ring_bytes = ring_bytes;
    return qp;
  }
  return CreateQpWith(std::move(seg), type, num_rings, ring_bytes, cq);
}

RawQp RawPod::CreateQpWith(UniqueFd seg_fd, uint32_t type, uint32_t num_rings, uint32_t ring_bytes,
                           uint32_t cq) {
  return NewQp(std::move(seg_fd), type, num_rings, ring_bytes, cq, 0, false);
}

RawQp RawPod::CreateGrantedQp(uint32_t granted, bool posted, uint32_t type) {
  UniqueFd seg;
  if (CreateSegment("test-qp", QpSegmentBytes(1, kRcRingBytes), &seg) != 0) return RawQp{};
  return NewQp(std::move(seg), type, 1, kRcRingBytes, 0, granted, posted);
}

RawQp RawPod::NewQp(UniqueFd seg_fd, uint32_t type, uint32_t num_rings, uint32_t ring_bytes,
                    uint32_t cq, uint32_t granted, bool posted) {
  if (cq == 0 && cqs_.empty()) CreateCq(1);
  if (cq == 0) cq = cqs_.front();
  RawQp qp;
  qp.num_rings = num_rings;
  qp.ring_bytes = ring_bytes;
  qp.seg_fd = std::move(seg_fd);
  if (MapSegment(qp.seg_fd.get(), QpSegmentBytes(num_rings, ring_bytes), true, &qp.seg) != 0)
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
  m.qpn = granted;
  if (posted) {
    m.h.op = proto::Op::kCreateQp;
    m.h.seq = proto::kPostedSeq;
    SendRaw(&m, sizeof(m), {qp.seg_fd.get()});
    qp.status = 0;
    qp.qpn = granted;
    return qp;
  }
  const proto::Response r = Call(m, {qp.seg_fd.get()});
  qp.status = r.status;
  if (r.status == 0) qp.qpn = r.u.create_qp.qpn;
  const proto::CreateQpReply& c = r.u.create_qp;
  qp.grants.assign(c.grant, c.grant + std::min(c.grant_count, proto::kQpnGrant));
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
  uint32_t key = 0;
  return RegisterWith(std::move(fd), region_id, bytes, access, addr, &key) == 0 ? key : 0;
}

int RawPod::RegisterWith(UniqueFd fd, uint32_t region_id, size_t bytes, uint32_t access,
                         uint64_t addr, uint32_t* key) {
  proto::RegMr m{};
  m.addr = addr;
  m.length = bytes;
  m.region_size = bytes;
  m.access = access;
  m.region_id = region_id;
  m.new_region = 1;
  const proto::Response r = Call(m, {fd.get()});
  *key = r.status == 0 ? r.u.reg_mr.key : 0;
  return r.status;
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

bool NextRecord(RingConsumer& ring, RecordHeader* h, std::vector<char>* payload,
                std::chrono::milliseconds timeout) {
  const char* p = nullptr;
  if (!WaitFor([&] { return ring.Peek(h, &p) == RingStatus::kOk; }, timeout)) return false;
  payload->assign(p, p + h->frag_len);
  ring.Consume(*h);
  ring.Release();
  return true;
}

bool NextUdRing(RawPod& pod, const RawQp& qp, Mapping* ring, RingConsumer* in,
                proto::Event* event) {
  auto e = pod.NextSetupEvent();
  while (e && e->event.type == proto::EventType::kPeerNamed) e = pod.NextSetupEvent();
  if (!e || e->event.type != proto::EventType::kUdRing) return false;
  *event = e->event;
  if (MapPeerSegment(e->fd.get(), UdRingBytes(qp.ring_bytes), true, ring) != 0) return false;
  in->Attach(ring->as<RingHeader>(), qp.ring_bytes);
  return true;
}

std::string NextPayload(RingConsumer& in, std::chrono::milliseconds timeout) {
  RecordHeader h;
  std::vector<char> got;
  if (!NextRecord(in, &h, &got, timeout)) return "";
  return std::string(got.begin(), got.end());
}

bool WriteMessage(RawLink& link, const std::string& text) {
  RecordHeader h{};
  h.kind = kRecSend;
  h.flags = kRecFirst | kRecLast;
  const auto len = static_cast<uint32_t>(text.size());
  if (AppendRecord(link.producer, h, text.data(), len) != RingStatus::kOk) return false;
  link.producer.Publish();
  return true;
}

std::string PassMessage(RawLink& link, const RawQp& to, const std::string& text) {
  if (!WriteMessage(link, text)) return "";
  RingConsumer in;
  in.Attach(to.ring(link.reply.ring_index), to.ring_bytes);
  return NextPayload(in);
}

RingStatus PostRequest(RawLink& link, uint8_t kind, uint8_t flags, const ProxyRequest& req,
                       const void* data, uint32_t len, std::chrono::milliseconds wait) {
  RecordHeader h{};
  h.kind = kind;
  h.flags = flags;
  h.msg_len = req.length;
  const auto fill = [&](char* dst) {
    if (len > 0) std::memcpy(dst, data, len);
  };
  RingStatus st = RingStatus::kOk;
  if (!WaitFor(
          [&] { return (st = AppendRequest(link.producer, h, req, len, fill)) == RingStatus::kOk; },
          wait))
    return st;
  link.producer.Publish();
  WakeIfArmed(&link.seg.as<QpSegmentHeader>()->doorbell, link.fds[1].get(), true);
  return st;
}

bool TryPostRequest(RawLink& link, uint8_t kind, uint8_t flags, const ProxyRequest& req,
                    const void* data, uint32_t len, std::chrono::milliseconds wait) {
  return PostRequest(link, kind, flags, req, data, len, wait) == RingStatus::kOk;
}

RingStatus PostSend(RawLink& link, uint32_t seq, const std::string& text, uint8_t rnr_retry,
                    std::chrono::milliseconds wait) {
  ProxyRequest r{};
  r.opcode = IBV_WR_SEND;
  r.seq = seq;
  r.length = static_cast<uint32_t>(text.size());
  r.last = 1;
  r.rnr_retry = rnr_retry;
  return PostRequest(link, kRecSend, kRecFirst | kRecLast, r, text.data(), r.length, wait);
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

}  // namespace ff::test
