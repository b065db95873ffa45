// Issue 37, attack 4: rdma_cm events a pod does not read wait in the router, and a channel
// cost only the descriptor of its socket: one pod with 996 channels and 4096 resolves on each,
// never reading, grew the router from 13.5 MB to 2.39 GB.
//
// The attacker opens kChannels channels and, on each, resolves one id kPerChannel times
// toward an address outside the pod network (an ADDR_ERROR event each, and the id can be
// resolved again) without ever reading an event: far more than its queued-mib quota (32 MiB
// by default, about 56 000 events) holds. The router must close channels once the pod's quota is
// full (the attacker sees them hang up), and the suite checks the router's memory while the
// attacker holds the rest.
#include <poll.h>
#include <rdma/rdma_user_cm.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <cstring>

#include "adversary.h"
#include "freeflow/ipv4.h"

namespace ff::adversary {
namespace {

constexpr uint32_t kChannels = 256;  // kMaxCmChannelsPerSession
constexpr int kPerChannel = 1024;    // 262 144 events of 592 bytes: 148 MiB

using test::CmCommandOf;

// A new id on channel `ch`: its handle, 0 when refused.
uint32_t CreateId(RawPod& pod, uint32_t ch, uint64_t uid) {
  rdma_ucm_create_id c{};
  c.uid = uid;
  c.ps = RDMA_PS_TCP;
  const proto::Response created =
      pod.Call(CmCommandOf(RDMA_USER_CM_CMD_CREATE_ID, c, sizeof(rdma_ucm_create_id_resp), ch));
  if (created.status != 0) return 0;
  rdma_ucm_create_id_resp resp;
  std::memcpy(&resp, created.u.cm.out, sizeof(resp));
  return resp.id;
}

// Resolves `id` toward `ip`: the answer's status. An address outside the pod network ends
// in an ADDR_ERROR event and leaves the id as it was: it can be resolved again, an event
// each time.
int Resolve(RawPod& pod, uint32_t ch, uint32_t id, uint32_t ip) {
  rdma_ucm_resolve_ip r{};
  r.id = id;
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(7000);
  sin.sin_addr.s_addr = htonl(ip);
  std::memcpy(&r.dst_addr, &sin, sizeof(sin));
  return pod.Call(CmCommandOf(RDMA_USER_CM_CMD_RESOLVE_IP, r, 0, ch)).status;
}

constexpr uint32_t kOutside = 0xc0000201;  // 192.0.2.1: no pod's, outside every pod network

}  // namespace

CmFloodResult FloodCmEvents(RawPod& pod) {
  CmFloodResult f;
  for (uint32_t ch = 1; ch <= kChannels; ++ch) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) break;
    f.channels.emplace_back(sv[0]);
    UniqueFd theirs(sv[1]);
    proto::CmOpenChannel m{};
    m.channel = ch;
    if (pod.Call(m, {theirs.get()}).status != 0) {
      f.channels.pop_back();
      break;
    }
  }
  if (f.channels.size() != kChannels) return f;
  for (uint32_t ch = 1; ch <= kChannels; ++ch) {
    const uint32_t id = CreateId(pod, ch, ch);
    for (int i = 0; id != 0 && i < kPerChannel; ++i) {
      const int st = Resolve(pod, ch, id, kOutside);
      if (st != 0) {
        f.refusals.push_back(st);
        break;  // its channel was closed
      }
      ++f.resolved;
    }
  }
  for (const UniqueFd& fd : f.channels) {
    pollfd p{fd.get(), POLLRDHUP, 0};
    if (::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP)) != 0) ++f.closed;
  }
  return f;
}

std::string DescribeCmFlood(const CmFloodResult& f) {
  return std::to_string(f.resolved) + " resolved; the router closed " + std::to_string(f.closed) +
         " channels once the pod's queued-mib was full" +
         (f.refusals.empty() ? "" : " (then " + Tally(f.refusals) + ")");
}

bool CmFloodHeld(const CmFloodResult& f) {
  return f.channels.size() == kChannels && f.closed > 0 &&
         f.resolved < static_cast<int>(kChannels) * kPerChannel;
}

const std::string kCmFloodTried = std::to_string(kChannels) + " rdma_cm channels, " +
                                  std::to_string(kPerChannel) + " resolves of one id toward " +
                                  FormatIpv4(kOutside) +
                                  " on each (an ADDR_ERROR event each), never reading an event";

int CmFlood(const Args& a) {
  Report r("37.4", "cm-flood");
  const Rendezvous rv(a.meet);
  auto start = OpenAgainstVictim(a, r);
  if (!start) return Conclude(r, rv);
  RawPod& pod = start->pod;
  CmFloodResult f = FloodCmEvents(pod);
  if (f.channels.size() != kChannels) {
    r.Check(false, "setting up", "opened " + std::to_string(f.channels.size()) + " channels only");
    return Conclude(r, rv);
  }
  r.Check(CmFloodHeld(f), kCmFloodTried, DescribeCmFlood(f));
  // The pod goes on: a channel of its own, an id, a resolve.
  int sv[2];
  int after = -1;
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0) {
    UniqueFd mine(sv[0]), theirs(sv[1]);
    // A channel it closed gave its descriptor back: one more fits.
    proto::CmOpenChannel m{};
    m.channel = kChannels + 1;
    after = pod.Call(m, {theirs.get()}).status;
    const uint32_t id = after == 0 ? CreateId(pod, kChannels + 1, 1) : 0;
    if (after == 0) after = id == 0 ? -1 : Resolve(pod, kChannels + 1, id, start->victim.ip);
    f.channels.push_back(std::move(mine));
  }
  r.Check(after == 0, "a new channel and resolve afterwards", "served: " + ErrName(after));
  return Conclude(r, rv);
}

}  // namespace ff::adversary
