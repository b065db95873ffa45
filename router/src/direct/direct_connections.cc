#include "direct/direct_connections.h"

#include <openssl/rand.h>

#include <limits>
#include <nlohmann/json.hpp>

#include "base/handover_state.h"
#include "freeflow/tunables.h"

namespace ff::router {
namespace {

// splitmix64's finisher: a bijection of 64-bit numbers (distinct inputs, distinct outputs)
// that maps 0, and only 0, to 0.
uint64_t Mix(uint64_t z) {
  z ^= z >> 30;
  z *= 0xbf58476d1ce4e5b9ull;
  z ^= z >> 27;
  z *= 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z;
}

bool Random64(uint64_t* out) {
  return RAND_bytes(reinterpret_cast<unsigned char*>(out), sizeof(*out)) == 1;
}

}  // namespace

DirectConnections::DirectConnections() {
  if (!Random64(&salt_)) salt_ = 0x5eed5eed5eed5eedull;
  // With the top bit set, salt ^ pod (a 32-bit PodId) is never 0, so its Mix is never 0.
  salt_ |= 1ull << 63;
}

uint64_t DirectConnections::Token(PodId pod) const { return Mix(salt_ ^ pod); }

uint64_t DirectConnections::NewId(PodId pod) const {
  for (int attempt = 0; attempt < 4; ++attempt) {
    uint64_t id = 0;
    if (!Random64(&id)) return 0;
    if (id != 0 && by_id_.count({pod, id}) == 0) return id;
  }
  return 0;
}

const DirectConnections::Conn* DirectConnections::Find(uint32_t peer_ip, uint64_t peer_token,
                                                       PodId pod) const {
  const Pair last{pod, peer_ip, peer_token, std::numeric_limits<uint64_t>::max()};
  auto it = by_pair_.upper_bound(last);
  if (it == by_pair_.begin()) return nullptr;
  --it;
  const auto& [p, ip, token, order] = it->first;
  if (p != pod || ip != peer_ip || token != peer_token) return nullptr;
  return FindById(pod, it->second);
}

const DirectConnections::Conn* DirectConnections::FindById(PodId pod, uint64_t id) const {
  auto it = by_id_.find({pod, id});
  return it == by_id_.end() ? nullptr : &it->second.conn;
}

bool DirectConnections::Full(PodId pod) const { return count(pod) >= kMaxDirectConnsPerProcess; }

bool DirectConnections::Add(const Conn& c) {
  Entry e{c, next_order_++};
  if (!by_id_.emplace(Id{c.pod, c.id}, e).second) return false;
  by_pair_.emplace(PairOf(e), c.id);
  ++counts_[c.pod];
  return true;
}

bool DirectConnections::SetOpen(PodId pod, uint64_t id) {
  auto it = by_id_.find({pod, id});
  if (it == by_id_.end()) return false;
  it->second.conn.state = State::kOpen;
  return true;
}

std::optional<DirectConnections::Conn> DirectConnections::Forget(PodId pod, uint64_t id) {
  auto it = by_id_.find({pod, id});
  if (it == by_id_.end()) return std::nullopt;
  const Entry e = it->second;
  by_id_.erase(it);
  by_pair_.erase(PairOf(e));
  if (--counts_[pod] == 0) counts_.erase(pod);
  return e.conn;
}

void DirectConnections::Asking(PodId pod, uint32_t peer_ip) { ++asking_[{pod, peer_ip}]; }

void DirectConnections::Answered(PodId pod, uint32_t peer_ip) {
  auto it = asking_.find({pod, peer_ip});
  if (it != asking_.end() && --it->second == 0) asking_.erase(it);
}

void DirectConnections::ForgetPod(PodId pod) {
  auto it = by_id_.lower_bound({pod, 0});
  while (it != by_id_.end() && it->first.first == pod) {
    by_pair_.erase(PairOf(it->second));
    it = by_id_.erase(it);
  }
  counts_.erase(pod);
  std::erase_if(asking_, [pod](const auto& a) { return a.first.first == pod; });
}

size_t DirectConnections::count(PodId pod) const {
  auto it = counts_.find(pod);
  return it == counts_.end() ? 0 : it->second;
}

nlohmann::json DirectConnections::Export() const {
  nlohmann::json conns = nlohmann::json::array();
  for (const auto& [id, e] : by_id_) {
    const Conn& c = e.conn;
    conns.push_back({{"id", c.id},
                     {"pod", c.pod},
                     {"peer", {c.peer_ip, c.peer_token}},
                     {"port", c.port},
                     {"dialler", c.dialler},
                     {"open", c.state == State::kOpen},
                     {"order", e.order}});
  }
  return {{"salt", salt_}, {"next_order", next_order_}, {"conns", std::move(conns)}};
}

void DirectConnections::Import(const nlohmann::json& j,
                               const std::function<bool(PodId)>& pod_known) {
  using H = HandoverState;
  salt_ = H::U64(j, "salt");
  next_order_ = H::U64(j, "next_order");
  if ((salt_ >> 63) == 0) throw HandoverError("the direct connections' salt is malformed");
  for (const nlohmann::json& r : H::Array(j, "conns", 1u << 20)) {
    Entry e;
    e.conn.id = H::U64(r, "id");
    e.conn.pod = H::U32(r, "pod");
    const nlohmann::json& peer = H::Array(r, "peer", 2);
    if (peer.size() != 2) throw HandoverError("a direct connection's peer is malformed");
    e.conn.peer_ip = static_cast<uint32_t>(H::At(peer, 0, UINT32_MAX));
    e.conn.peer_token = H::At(peer, 1);
    e.conn.port = static_cast<uint16_t>(H::U64(r, "port", UINT16_MAX));
    e.conn.dialler = H::Bool(r, "dialler");
    e.conn.state = H::Bool(r, "open") ? State::kOpen : State::kPending;
    e.order = H::U64(r, "order");
    if (e.conn.id == 0 || e.order >= next_order_ || !pod_known(e.conn.pod) ||
        by_id_.count({e.conn.pod, e.conn.id}) != 0 || by_pair_.count(PairOf(e)) != 0 ||
        count(e.conn.pod) >= kMaxDirectConnsPerProcess)
      throw HandoverError("a direct connection of no session, or named twice");
    by_id_.emplace(Id{e.conn.pod, e.conn.id}, e);
    by_pair_.emplace(PairOf(e), e.conn.id);
    ++counts_[e.conn.pod];
  }
}

}  // namespace ff::router
