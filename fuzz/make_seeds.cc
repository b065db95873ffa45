// Writes the seed corpora of fuzz/corpus/ (run: fuzz_make_seeds fuzz/corpus): a few valid
// inputs per target, built from the real protocol structs so that the fuzzer starts past
// the decoders. Inputs read through FuzzedDataProvider take integers from the end and bytes
// from the front; Seed mirrors that. The controlplane_file seeds are plain JSON, written by
// hand in fuzz/corpus/controlplane_file.
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "freeflow/codec.h"
#include "freeflow/protocol.h"
#include "freeflow/protocol/direct_wire.h"

namespace {

using namespace ff;

class Seed {
 public:
  // An integer read with ConsumeIntegralInRange over a range of `range` (max - min).
  Seed& Int(uint64_t value, uint64_t range) {
    int n = 0;
    for (int shift = 0; shift < 64 && (range >> shift) > 0; shift += 8) ++n;
    for (int i = n - 1; i >= 0; --i) back_.push_back(static_cast<uint8_t>(value >> (8 * i)));
    return *this;
  }
  Seed& Bool(bool b) { return Int(b ? 1 : 0, 255); }
  Seed& Bytes(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    front_.insert(front_.end(), c, c + n);
    return *this;
  }
  template <typename T>
  Seed& Struct(const T& v) {
    return Bytes(&v, sizeof(v));
  }
  std::vector<uint8_t> Build(int lead = -1) const {
    std::vector<uint8_t> out;
    if (lead >= 0) out.push_back(static_cast<uint8_t>(lead));
    out.insert(out.end(), front_.begin(), front_.end());
    out.insert(out.end(), back_.rbegin(), back_.rend());
    return out;
  }

 private:
  std::vector<uint8_t> front_, back_;
};

void Write(const std::string& dir, const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::fclose(f);
}

// ---- pod_messages: (pod, op index, body, "the descriptors it expects") per request ------

template <typename M>
void Request(Seed& s, int pod, M m) {
  const auto index = static_cast<uint32_t>(proto::OpOf<M>) - 1;
  s.Int(pod, 2).Int(index, 255).Struct(m).Bool(true);
}

proto::CreateQp QpRequest(uint32_t type, uint32_t rings, uint32_t ring_bytes, uint32_t srq) {
  proto::CreateQp m{};
  m.qp_type = type;
  m.num_rings = rings;
  m.ring_bytes = ring_bytes;
  m.srq_id = srq;
  m.recv_cq_id = m.send_cq_id = 1;
  return m;
}

proto::CreateCq Cq(uint32_t id, uint32_t slot = proto::kNoId, uint32_t chan = proto::kNoId) {
  proto::CreateCq m{};
  m.cq_id = id;
  m.notify_slot = slot;
  m.chan_id = chan;
  return m;
}

proto::Hello Hello() {
  proto::Hello m{};
  m.abi = kAbiVersion;
  return m;
}

// Alias values (see pod_messages.cc): QPN/key n < 16 is the n-th this input made; a
// dest_ip of 1..3 is that pod, 4 the pod on the unreachable node.
proto::ConnectQp Connect(uint32_t qpn, uint32_t pod_alias, uint32_t dest_qpn) {
  proto::ConnectQp m{};
  m.qpn = qpn;
  m.dest_ip = htonl(pod_alias);
  m.dest_qpn = dest_qpn;
  return m;
}

void PodMessages(const std::string& dir) {
  proto::RegMr reg{};
  reg.addr = 0x10000;
  reg.length = reg.region_size = 1 << 16;
  reg.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  reg.region_id = 1;
  reg.new_region = 1;
  proto::GetRegion get{};
  get.qpn = 1;
  get.region_id = 1;
  Seed rc;  // two pods, RC QPs, one connects to the other and asks for its region
  Request(rc, 0, Hello());
  Request(rc, 0, Cq(1));
  Request(rc, 0, QpRequest(IBV_QPT_RC, 1, kRcRingBytes, proto::kNoId));
  Request(rc, 0, reg);
  Request(rc, 1, Hello());
  Request(rc, 1, Cq(1));
  Request(rc, 1, QpRequest(IBV_QPT_RC, 1, kRcRingBytes, proto::kNoId));
  Request(rc, 1, Connect(1, 1, 0));
  Request(rc, 1, get);
  Write(dir, "rc_connect_region", rc.Build());

  Seed ud;  // UD: a sender resolves a receiver; then both are destroyed
  Request(ud, 0, Hello());
  Request(ud, 0, Cq(1));
  Request(ud, 0, QpRequest(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes, proto::kNoId));
  Request(ud, 1, Hello());
  Request(ud, 1, Cq(1));
  Request(ud, 1, QpRequest(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes, proto::kNoId));
  proto::ConnectQp resolve = Connect(1, 1, 0);
  ud.Int(1, 2)
      .Int(static_cast<uint32_t>(proto::Op::kResolveUd) - 1, 255)
      .Struct(resolve)
      .Bool(true);
  proto::DestroyQp destroy{};
  destroy.id = 0;
  Request(ud, 0, destroy);
  Write(dir, "ud_resolve_destroy", ud.Build());

  Seed objects;  // a channel, a CQ on it, an SRQ, a QP on the SRQ, a remote connect
  proto::CreateChannel chan{};
  chan.id = 3;
  proto::CreateSrq srq{};
  srq.id = 5;
  proto::DeregMr dereg{};
  dereg.key = 0;
  Request(objects, 2, Hello());
  Request(objects, 2, chan);
  Request(objects, 2, Cq(1, 7, 3));
  Request(objects, 2, srq);
  Request(objects, 2, QpRequest(IBV_QPT_RC, 1, kMinRingBytes, 5));
  Request(objects, 2, reg);
  Request(objects, 2, dereg);
  Request(objects, 2, Connect(0, 4, 0x100));
  Write(dir, "objects_remote", objects.Build());
}

// ---- node_frames: the first byte, then frames --------------------------------------------

class Frames {
 public:
  Frames& Add(wire::Type type, uint32_t chan, uint16_t flags, const void* body, uint32_t len) {
    const wire::FrameHeader h{len, type, flags, chan, 0};
    Put(&h, sizeof(h));
    Put(body, len);
    return *this;
  }
  template <typename T>
  Frames& Add(wire::Type type, uint32_t chan, const T& body) {
    return Add(type, chan, 0, &body, sizeof(body));
  }
  Frames& Hello() {
    wire::Hello h{wire::kMagic, wire::kVersion, {}};
    std::snprintf(h.node, sizeof(h.node), "node-b");
    return Add(wire::Type::kHello, 0, h);
  }
  Frames& Request(uint32_t chan, uint8_t kind, uint8_t opcode, uint64_t addr, uint32_t length,
                  uint32_t data_len) {
    RecordHeader h{};
    h.kind = kind;
    h.flags = kRecFirst | kRecLast;
    h.msg_len = length;
    h.src_qpn = 0x100;
    h.src_ip = htonl(0x0a010001);
    h.frag_len = static_cast<uint32_t>(sizeof(ProxyRequest)) + data_len;
    ProxyRequest r{};
    r.remote_addr = addr;
    r.rkey = 0;  // the victim's MR
    r.length = length;
    r.opcode = opcode;
    r.last = 1;
    r.rnr_retry = 7;
    std::vector<char> body(sizeof(h) + h.frag_len, 'd');
    std::memcpy(body.data(), &h, sizeof(h));
    std::memcpy(body.data() + sizeof(h), &r, sizeof(r));
    return Add(wire::Type::kRecord, chan, 0, body.data(), static_cast<uint32_t>(body.size()));
  }
  Frames& Response(uint32_t chan, uint16_t status, uint32_t data_len) {
    const RecordHeader h = ResponseHeader(data_len);
    ProxyResponse r{};
    r.status = status;
    r.last = 1;
    std::vector<char> body(sizeof(h) + h.frag_len, 'r');
    std::memcpy(body.data(), &h, sizeof(h));
    std::memcpy(body.data() + sizeof(h), &r, sizeof(r));
    return Add(wire::Type::kResp, chan, 0, body.data(), static_cast<uint32_t>(body.size()));
  }
  std::vector<uint8_t> Build(uint8_t lead) const {
    std::vector<uint8_t> out{lead};
    out.insert(out.end(), bytes_.begin(), bytes_.end());
    return out;
  }

 private:
  void Put(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    bytes_.insert(bytes_.end(), c, c + n);
  }
  std::vector<uint8_t> bytes_;
};

void NodeFrames(const std::string& dir) {
  // dest_ip 1: the victim; dest_qpn 0/1: its RC/UD QP (see node_frames.cc).
  const wire::Connect rc{0x0a010001, 0x100, IBV_QPT_RC, 1, 0, 0};
  const wire::Connect ud{0x0a010001, 0x101, IBV_QPT_UD, 1, 1, 0};
  Frames requests;
  requests.Hello()
      .Add(wire::Type::kConnect, 7, rc)
      .Request(7, kRecSend, IBV_WR_SEND, 0, 100, 100)
      .Request(7, kRecWrite, IBV_WR_RDMA_WRITE, 0x10000, 256, 256)
      .Request(7, kRecReadReq, IBV_WR_RDMA_READ, 0x10040, 512, 0)
      .Request(7, kRecAtomicReq, IBV_WR_ATOMIC_FETCH_AND_ADD, 0x10080, 8, 0)
      .Request(7, kRecWriteImm, IBV_WR_RDMA_WRITE_WITH_IMM, 0x10000, 0, 0)
      .Add(wire::Type::kPing, 0, 0, nullptr, 0)
      .Add(wire::Type::kClose, 7, 0, nullptr, 0);
  Write(dir, "rc_requests", requests.Build(0));
  Frames datagrams;
  datagrams.Hello().Add(wire::Type::kConnect, 9, ud).Request(9, kRecSend, IBV_WR_SEND, 0, 64, 64);
  Write(dir, "ud_send", datagrams.Build(0));
  const wire::ConnectReply accept{0, 0x100, 0x0a010001, IBV_QPT_RC};
  Frames answers;  // to node-a's forwarder, on the channel it opened first
  answers.Hello()
      .Add(wire::Type::kConnectReply, 0, accept)
      .Response(0, IBV_WC_SUCCESS, 0)
      .Response(0, IBV_WC_SUCCESS, 64)
      .Add(wire::Type::kPeerGone, 0, 1, nullptr, 0);
  Write(dir, "answers", answers.Build(0));
}

// ---- ring_records --------------------------------------------------------------------------

std::vector<char> SendRecord(uint32_t len, uint8_t flags, uint32_t qkey = 0) {
  RecordHeader h{};
  h.kind = kRecSend;
  h.flags = flags;
  h.msg_len = len;
  h.src_qpn = 0x500;
  h.frag_len = len;
  h.qkey = qkey;
  h.total = RecordBytes(len);
  std::vector<char> rec(h.total, 's');
  std::memcpy(rec.data(), &h, sizeof(h));
  return rec;
}

void RingRecords(const std::string& dir) {
  RecordHeader h{};
  h.kind = kRecWrite;
  h.frag_len = sizeof(ProxyRequest) + 16;
  ProxyRequest r{};
  r.opcode = IBV_WR_RDMA_WRITE;
  r.length = 16;
  r.last = 1;
  Seed codec;
  codec.Struct(h).Struct(r).Bytes("0123456789abcdef", 16);
  Write(dir, "codec_write", codec.Build(0));
  const RecordHeader rh = ResponseHeader(8);
  ProxyResponse resp{};
  resp.last = 1;
  Seed response;
  response.Struct(rh).Struct(resp).Bytes("datadata", 8);
  Write(dir, "codec_response", response.Build(0));

  // Ring ends: head 0, tail after two records; then four appends into an empty ring.
  std::vector<char> ring = SendRecord(40, kRecFirst | kRecLast);
  const std::vector<char> second = SendRecord(100, kRecFirst);
  ring.insert(ring.end(), second.begin(), second.end());
  Seed ends;
  ends.Int(0, 1).Int(0, ~0ull).Bool(true).Int(ring.size(), 0xffffffff).Int(0, 0xffff).Bool(true);
  ends.Int(0, 0xffff).Bytes("\x10\x40\x80\xff\x01\x02\x03\x04", 8).Bytes(ring.data(), ring.size());
  Write(dir, "ring_ends", ends.Build(1));

  // The library: a UD QP (type 2), ring 3, two receives, a GRH-sized message with its Q_Key.
  const std::vector<char> dgram = SendRecord(64, kRecFirst | kRecLast, 0x1111);
  Seed lib;
  lib.Int(2, 2).Int(3, kUdRingsPerQp - 1).Int(2, 16).Int(4096, 8192).Int(4096, 8192);
  lib.Int(0, 255).Bool(false).Int(dgram.size(), kUdRingBytes).Bytes(dgram.data(), dgram.size());
  Write(dir, "library_ud", lib.Build(2));
  const std::vector<char> msg = SendRecord(300, kRecFirst | kRecLast);
  Seed rc;  // an RC QP (type 0), one receive
  rc.Int(0, 2).Int(0, 0).Int(1, 16).Int(1024, 8192);
  rc.Int(0, 255).Bool(false).Int(msg.size(), kRcRingBytes).Bytes(msg.data(), msg.size());
  Write(dir, "library_rc", rc.Build(2));
}

}  // namespace

// ---- direct_frames: a script of sealed frames, injected bytes and takes -----------------

void DirectFrames(const std::string& dir) {
  Seed s;
  const char body[10] = "genuine!!";
  // A sealed record, then an injected one that looks like a frame, then a take.
  s.Int(0, 2).Int(2, 6).Int(1, 0xffffffffu).Int(sizeof(body), direct::kMaxBody + 64);
  s.Bytes(body, sizeof(body));
  const direct::Head forged{4, direct::Type::kRecord, 0, 1, 0};
  std::vector<uint8_t> junk(sizeof(forged) + 4 + kSealTagBytes, 0x5a);
  std::memcpy(junk.data(), &forged, sizeof(forged));
  s.Int(1, 2).Int(junk.size() - 1, 511).Bytes(junk.data(), junk.size());
  s.Int(2, 2).Int(8, 8);
  Write(dir, "sealed_then_injected", s.Build());
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const std::string root = argv[1];
  PodMessages(root + "/pod_messages");
  NodeFrames(root + "/node_frames");
  RingRecords(root + "/ring_records");
  DirectFrames(root + "/direct_frames");
  return 0;
}
