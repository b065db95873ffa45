// Fuzz target: what a pod sends to its router over the pod socket.
//
// A real router (tests/unit/router/harness.h: TestRouter on its own thread, joined to an
// in-memory network and control plane) serves up to three pods that the input plays. The
// input is a sequence of requests; each names its pod and is sent as one datagram with
// descriptors, and the pod waits for the answer, so the session layer, the protocol table
// (proto::DecodeRequest) and every broker handler see hostile input. Descriptors are real:
// memfds of input-chosen sizes (or of the size the request names, with a valid QP segment
// header when it is one), eventfds, sockets and pipes.
//
// Replay: QP numbers and memory keys are assigned by the router. A QPN or key field whose
// value is below kAliases names instead the one this input created with that index, so an
// input means the same thing on every run. At the end every pod disconnects and the target
// waits until the router released them (they leave the control plane), so each input starts
// from a router that holds nothing.
#include <arpa/inet.h>
#include <fcntl.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "harness.h"
#include "settle.h"

namespace {

using namespace ff;
using namespace ff::router;
using namespace ff::router::test;
using proto::Op;

constexpr int kPods = 3;
constexpr uint32_t kAliases = 16;
constexpr int kMaxRequests = 48;
constexpr size_t kMaxSegment = 4u << 20;  // a memfd of an input-chosen size is capped here
const uint32_t kPodIps[kPods] = {0x0a000001, 0x0a000002, 0x0a000003};
constexpr uint32_t kRemoteIp = 0x0a010001;  // a pod of node-b, whose router is unreachable

struct Rig {
  LoopbackNetwork network;
  FakeCluster cluster;
  std::unique_ptr<TestRouter> router;
  Rig() {
    TestRouter::Options o;
    o.node = "node-a";
    o.host_ip = Ip("192.0.2.1");
    o.network = &network;
    o.cluster = &cluster;
    o.resolve_timeout_ms = 1;
    router = std::make_unique<TestRouter>(o);
    cluster.Set(kRemoteIp, cp::Endpoint{"node-b", Ip("192.0.2.2"), 7471});
  }
};

Rig& TheRig() { return fuzz::RigOfTheRun<Rig>(); }

// What one input has made so far.
struct Run {
  std::unique_ptr<RawPod> pods[kPods];
  bool gone[kPods] = {};
  std::vector<uint32_t> qpns;
  std::vector<uint32_t> keys;
  std::vector<uint32_t> cm_ids;  // rdma_cm handles from CREATE_ID answers
  std::vector<UniqueFd> keep;    // descriptors sent, held until the end like a live pod would
};

uint32_t Alias(const std::vector<uint32_t>& made, uint32_t v) {
  return v < kAliases && v < made.size() ? made[v] : v;
}

// Rewrites the fields that name router-assigned numbers (see the file comment).
void ResolveAliases(const Run& run, Op op, char* msg) {
  auto patch = [&](auto m, auto&& fix) {
    fix(m);
    std::memcpy(msg, &m, sizeof(m));
  };
  switch (op) {
    case Op::kDestroyQp:
    case Op::kDisconnectQp:
      return patch(proto::As<proto::DestroyQp>(msg),
                   [&](auto& m) { m.id = Alias(run.qpns, m.id); });
    case Op::kConnectQp:
    case Op::kResolveUd:
      return patch(proto::As<proto::ConnectQp>(msg), [&](auto& m) {
        m.qpn = Alias(run.qpns, m.qpn);
        m.dest_qpn = Alias(run.qpns, m.dest_qpn);
        const uint32_t ip = ntohl(m.dest_ip);
        if (ip > 0 && ip <= kPods + 1) m.dest_ip = htonl(ip <= kPods ? kPodIps[ip - 1] : kRemoteIp);
      });
    case Op::kGetRegion:
      return patch(proto::As<proto::GetRegion>(msg),
                   [&](auto& m) { m.qpn = Alias(run.qpns, m.qpn); });
    case Op::kDeregMr:
    case Op::kMoveMr:
      return patch(proto::As<proto::MoveMr>(msg), [&](auto& m) { m.key = Alias(run.keys, m.key); });
    case Op::kBindMw:
    case Op::kInvalidateMw:
    case Op::kDeallocMw:
      return patch(proto::As<proto::BindMw>(msg), [&](auto& m) {
        m.key = Alias(run.keys, m.key);
        m.new_key = Alias(run.keys, m.new_key);
        m.mr_key = Alias(run.keys, m.mr_key);
        m.qpn = Alias(run.qpns, m.qpn);
      });
    case Op::kCmCommand:
      // Every command names its id at a different offset: any small word may be one. The
      // channel is one of a few, so that opened ones are named.
      return patch(proto::As<proto::CmCommand>(msg), [&](auto& m) {
        m.channel %= 4;
        for (size_t off = 0; off + 4 <= sizeof(m.body); off += 4) {
          uint32_t v;
          std::memcpy(&v, m.body + off, 4);
          v = Alias(run.cm_ids, v);
          std::memcpy(m.body + off, &v, 4);
        }
      });
    case Op::kCmOpenChannel:
      return patch(proto::As<proto::CmOpenChannel>(msg), [&](auto& m) { m.channel %= 4; });
    default:
      return;
  }
}

UniqueFd Memfd(size_t bytes) {
  UniqueFd fd;
  CreateSegment("fuzz", bytes, &fd);
  return fd;
}

// A QP segment for `m`, its header filled in as the library does.
UniqueFd QpSegment(const proto::CreateQp& m) {
  const size_t bytes = QpSegmentBytes(m.num_rings, m.ring_bytes);
  if (m.num_rings > kMaxRingsPerQp || bytes > kMaxSegment) return Memfd(sizeof(QpSegmentHeader));
  UniqueFd fd = Memfd(bytes);
  Mapping map;
  if (fd && MapSegment(fd.get(), sizeof(QpSegmentHeader), true, &map) == 0) {
    auto* h = new (map.get()) QpSegmentHeader();
    h->magic = kQpSegMagic;
    h->abi = kAbiVersion;
    h->num_rings = m.num_rings;
    h->ring_bytes = m.ring_bytes;
  }
  return fd;
}

// The descriptors a well-formed request of `op` carries.
std::vector<UniqueFd> ExpectedFds(Op op, const char* msg) {
  std::vector<UniqueFd> fds;
  switch (op) {
    case Op::kHello: {
      int sv[2];
      fds.push_back(Memfd(kNotifySegmentBytes));
      if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0) {
        fds.emplace_back(sv[1]);
        ::close(sv[0]);  // events go nowhere: the router must cope
      }
      fds.emplace_back(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
      break;
    }
    case Op::kCreateChannel:
      fds.emplace_back(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
      break;
    case Op::kCreateSrq:
      fds.push_back(Memfd(sizeof(SrqSegment)));
      break;
    case Op::kCmOpenChannel: {
      // The program's end stays open until the input ends (Run::keep), as a live one does.
      int sv[2];
      if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0) {
        fds.emplace_back(sv[1]);
        fds.emplace_back(sv[0]);
      }
      break;
    }
    case Op::kCreateQp:
      fds.push_back(QpSegment(proto::As<proto::CreateQp>(msg)));
      break;
    case Op::kRegMr:
    case Op::kMoveMr: {
      const auto m = proto::As<proto::RegMr>(msg);
      if (m.new_region != 0) fds.push_back(Memfd(std::min<uint64_t>(m.region_size, kMaxSegment)));
      break;
    }
    default:
      break;
  }
  return fds;
}

// One descriptor of an input-chosen kind.
UniqueFd AnyFd(FuzzedDataProvider& in) {
  int sv[2];
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      return Memfd(in.ConsumeIntegralInRange<size_t>(0, kMaxSegment));
    case 1:
      return UniqueFd(::eventfd(in.ConsumeIntegral<uint8_t>(), EFD_CLOEXEC));
    case 2:
      if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return UniqueFd();
      ::close(sv[0]);
      return UniqueFd(sv[1]);
    default:
      if (::pipe2(sv, O_CLOEXEC) != 0) return UniqueFd();
      ::close(sv[1]);
      return UniqueFd(sv[0]);
  }
}

RawPod* PodFor(Run& run, int i) {
  if (run.gone[i]) return nullptr;
  if (!run.pods[i]) run.pods[i] = std::make_unique<RawPod>(*TheRig().router, kPodIps[i]);
  return run.pods[i].get();
}

// One request of the input, and its answer.
void OneRequest(Run& run, FuzzedDataProvider& in) {
  const int who = in.ConsumeIntegralInRange<int>(0, kPods - 1);
  RawPod* pod = PodFor(run, who);
  if (pod == nullptr) return;
  const uint8_t shape = in.ConsumeIntegral<uint8_t>();
  // Mostly a known op at its size; sometimes any op value and length.
  const bool raw = shape >= 0xf0;
  const proto::OpSpec& spec = proto::kOpSpecs[shape % std::size(proto::kOpSpecs)];
  const size_t len =
      raw ? in.ConsumeIntegralInRange<size_t>(0, proto::kMaxMessage + 64) : spec.size;
  std::vector<char> msg(std::max<size_t>(len, sizeof(proto::Header)), 0);
  const std::vector<uint8_t> body = in.ConsumeBytes<uint8_t>(len);
  if (!body.empty()) std::memcpy(msg.data(), body.data(), body.size());
  const Op op = raw ? proto::As<proto::Header>(msg.data()).op : spec.op;
  if (!raw) std::memcpy(msg.data(), &op, sizeof(op));
  if (len >= spec.size && !raw) ResolveAliases(run, op, msg.data());

  std::vector<UniqueFd> fds;
  if (in.ConsumeBool() && !raw) {
    fds = ExpectedFds(op, msg.data());
  } else {
    for (int n = in.ConsumeIntegralInRange<int>(0, 4); n > 0; --n) fds.push_back(AnyFd(in));
  }
  std::vector<int> raw_fds;
  for (const UniqueFd& fd : fds)
    if (fd) raw_fds.push_back(fd.get());
  if (op == Op::kCmOpenChannel && raw_fds.size() == 2 && !raw) raw_fds.pop_back();  // ours
  std::vector<UniqueFd> got;
  const proto::Response r = pod->CallRaw(msg.data(), len, raw_fds, &got);
  for (UniqueFd& fd : fds) run.keep.push_back(std::move(fd));
  if (r.status < 0) {  // the router dropped this pod (a protocol violation)
    run.gone[who] = true;
    run.pods[who].reset();
    return;
  }
  if (r.status == 0 && op == Op::kCreateQp) run.qpns.push_back(r.u.create_qp.qpn);
  if (r.status == 0 && (op == Op::kRegMr || op == Op::kAllocMw)) run.keys.push_back(r.u.reg_mr.key);
  if (r.status == 0 && op == Op::kCmCommand && r.u.cm.out_len == 4 &&
      proto::As<proto::CmCommand>(msg.data()).cmd == 0 /* CREATE_ID */) {
    uint32_t id;
    std::memcpy(&id, r.u.cm.out, sizeof(id));
    run.cm_ids.push_back(id);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Rig& rig = TheRig();
  FuzzedDataProvider in(data, size);
  {
    Run run;
    for (int i = 0; i < kMaxRequests && in.remaining_bytes() > 0; ++i) OneRequest(run, in);
  }  // every pod disconnects here
  // The router has released a pod once its address left the control plane.
  for (uint32_t ip : kPodIps) {
    if (!fuzz::Settle([&] { return !rig.cluster.Lookup(ip).has_value(); }))
      __builtin_trap();  // a pod the router never released: a hang or a leak
  }
  return 0;
}
