// Two well-behaved raw pods the attacks need:
// - the helper of a cross-node attack, on the other node: it gives the attacker one RC QP per
//   QP of the attacker's and a region its QPs may read and write, connects each QP once the
//   attacker named them, sends one SEND on each and reports the completion statuses; it keeps
//   its connections until the attack is over, and writes a byte into each region the
//   attacker lists (quota-all);
// - the probe the script runs in another pod of the attacked node while an attack holds: a
//   fresh HELLO, answered within 1 s.
#include <chrono>
#include <cstdio>
#include <sstream>

#include "adversary.h"

namespace ff::adversary {
namespace {

constexpr uint64_t kPeerAddr = 0x10000000;
constexpr auto kProbeLimit = std::chrono::milliseconds(1000);

// One SEND on a connected link: its completion status, -1 without an answer.
int SendOne(RawLink& link) {
  if (test::PostSend(link, 1, "from the other node") != RingStatus::kOk) return -1;
  const auto answer = test::NextAnswer(link);
  return answer ? answer->status : -1;
}

// One byte written into each region `list` names ("<rkey> <addr>" each), over the links of
// `links` that connected, in turn: the completion statuses, in order (-1: no answer).
std::string WriteEach(const std::string& list, std::vector<RawLink>& links) {
  std::vector<RawLink*> up;  // the connects that were refused have no rings
  for (RawLink& l : links)
    if (l.status == 0) up.push_back(&l);
  std::istringstream in(list);
  std::string statuses;
  uint32_t rkey = 0, seq = 100;
  uint64_t addr = 0;
  for (size_t i = 0; in >> rkey >> addr && !up.empty(); ++i) {
    RawLink& link = *up[i % up.size()];
    ProxyRequest w{};
    w.remote_addr = addr;
    w.rkey = rkey;
    w.seq = ++seq;
    w.length = 1;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.last = 1;
    w.rnr_retry = 7;
    const auto answer =
        test::PostRequest(link, kRecWrite, kRecFirst | kRecLast, w, "w", 1) == RingStatus::kOk
            ? test::NextAnswer(link)
            : std::nullopt;
    statuses += " " + std::to_string(answer ? answer->status : -1);
  }
  return statuses;
}

}  // namespace

int PeerHelper(const Args& a) {
  const Rendezvous rv(a.meet);
  RawPod pod = OpenPod();
  Mapping memory;
  const int hello = pod.Hello(Abi());
  const uint32_t rkey = pod.Register(1, kPeerRegionBytes, kAllAccess, kPeerAddr, &memory);
  const auto attacker = rv.Get("attacker");
  if (hello != 0 || rkey == 0 || !attacker) {
    std::fprintf(stderr, "peer: HELLO %s, region key %#x, attacker %s\n", ErrName(hello).c_str(),
                 rkey, attacker ? "found" : "never came");
    return 2;
  }
  std::istringstream in(*attacker);
  uint32_t ip = 0;
  in >> ip;
  std::vector<uint32_t> theirs;
  for (uint32_t qpn; in >> qpn;) theirs.push_back(qpn);
  std::vector<RawQp> qps;
  std::string mine =
      std::to_string(OwnIp(pod)) + " " + std::to_string(rkey) + " " + std::to_string(kPeerAddr);
  for (size_t i = 0; i < theirs.size(); ++i) {
    qps.push_back(pod.CreateQp(IBV_QPT_RC));
    qps.back().hdr()->credits.posted.store(1u << 16);
    qps.back().hdr()->qp_access.store(kAllAccess);
    mine += " " + std::to_string(qps.back().qpn);
  }
  rv.Put("peer", mine);
  if (!rv.Get("named")) return 2;
  std::vector<RawLink> links;  // kept while the attack holds
  std::string results;
  for (size_t i = 0; i < qps.size(); ++i) {
    links.push_back(ConnectTo(pod, qps[i], ip, theirs[i]));
    const int st = links.back().status == 0 ? SendOne(links.back()) : -2;
    results += " " + std::to_string(st);
  }
  rv.Put("peer-result", results);
  std::printf("peer: SEND completions:%s\n", results.c_str());
  // Until the attack is over: an attacker that lists regions of its own ("<rkey> <addr>"
  // each) has one byte written into each, over its links in turn.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (!rv.Get("done", std::chrono::milliseconds(20)) && std::chrono::steady_clock::now() < end) {
    if (const auto regions = rv.Get("regions", std::chrono::milliseconds(0))) {
      rv.Put("writes", WriteEach(*regions, links));
      rv.Get("done", std::chrono::seconds(90));
      break;
    }
  }
  return 0;
}

int Probe(const Args&) {
  const auto start = std::chrono::steady_clock::now();
  RawPod pod = OpenPod();
  const int st = pod.Hello(Abi());
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  std::printf("a fresh pod's HELLO: %s in %lld ms\n", ErrName(st).c_str(),
              static_cast<long long>(took.count()));
  return st == 0 && took <= kProbeLimit ? 0 : 1;
}

}  // namespace ff::adversary
