// Direct channels across a router's replacement (link_resume.h, docs/handover.md): moving
// them between links (parked and resumed), and carrying them in a hand-over (version 4).
// Only direct channels move: their bytes go pod to pod, so the routers hold nothing of
// their traffic, only who is joined to whom. The successor reads every record typed and
// bounded and checks it against what it took already: the pod is one of its sessions, the
// QP is that pod's and of a connected type, a target QP names the channel's sender as the
// producer of one of its rings, no channel or sender is named twice.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>
#include <set>

#include "base/handover_state.h"
#include "nodes/executor.h"
#include "nodes/forwarder.h"
#include "nodes/link_resume.h"

namespace ff::router {
namespace {

using Json = nlohmann::json;
using H = HandoverState;
constexpr size_t kMaxChannels = 1u << 20;

// The node a channel's link reaches, for the successor to park it under: "" when the link
// is not ready (refused before: WhyNotMovable).
std::string NodeOf(const NodeTransport& t, LinkId link) {
  return link == kNoLink ? std::string() : t.PeerNode(link);
}

}  // namespace

size_t Forwarder::Move(LinkId from, LinkId to) {
  size_t moved = 0;
  for (auto& [chan, p] : proxies_) {
    if (p->link != from || !p->direct || !p->connected || p->dead) continue;
    p->link = to;
    ++moved;
  }
  return moved;
}

std::vector<uint32_t> Forwarder::ChansOn(LinkId link) const {
  std::vector<uint32_t> chans;
  for (const auto& [chan, p] : proxies_)
    if (p->link == link) chans.push_back(chan);
  return chans;
}

uint32_t Forwarder::AnyDestOn(LinkId link) const {
  for (const auto& [chan, p] : proxies_)
    if (p->link == link) return p->dest_ip;
  return 0;
}

void Forwarder::FailChans(LinkId link, const std::vector<uint32_t>& chans) {
  for (uint32_t chan : chans) {
    Proxy* p = Find(link, chan);
    if (p == nullptr) continue;
    p->link = kNoLink;  // nothing more goes to the peer: it holds no channel
    MarkDead(*p, proto::EventType::kPeerGone);
  }
}

std::string Forwarder::WhyNotMovable(const NodeTransport& t) const {
  if (!resolving_.empty()) return "connects to other nodes wait for their addresses";
  for (const auto& [chan, p] : proxies_) {
    if (!p->connected || p->asking) return "connects to other nodes are under way";
    if (!p->ud && !p->direct)
      return fmt::format("it relays channels to other nodes (client {}'s QP {:#x})", p->pod,
                         p->qpn);
    if (!p->ud && !p->dead && NodeOf(t, p->link).empty())
      return "a channel's link to its node is not ready";
  }
  return "";
}

void Forwarder::LoseUdLinks() {
  std::vector<uint32_t> chans;
  for (const auto& [chan, p] : proxies_)
    if (p->ud) chans.push_back(chan);
  for (uint32_t chan : chans) LoseUd(chan);
}

Json Forwarder::Export(const NodeTransport& t) const {
  Json proxies = Json::array();
  for (const auto& [chan, p] : proxies_) {
    if (p->ud) continue;  // LoseUdLinks went before
    proxies.push_back({{"chan", chan},
                       {"pod", p->pod},
                       {"qpn", p->qpn},
                       {"dest", {p->dest_ip, p->dest_qpn}},
                       {"conn", p->conn},
                       {"dead", p->dead},
                       {"node", p->dead ? std::string() : NodeOf(t, p->link)}});
  }
  return {{"proxies", std::move(proxies)}, {"next_chan", next_chan_}};
}

void Forwarder::Import(const Json& j, LinkResume& resume, uint64_t now) {
  next_chan_ = H::U32(j, "next_chan");
  for (const Json& r : H::Array(j, "proxies", kMaxChannels)) {
    auto p = std::make_unique<Proxy>();
    p->chan = H::U32(r, "chan");
    p->pod = H::U32(r, "pod");
    p->qpn = H::U32(r, "qpn");
    const Json& dest = H::Array(r, "dest", 2);
    if (dest.size() != 2) throw HandoverError("a channel's peer is malformed");
    p->dest_ip = static_cast<uint32_t>(H::At(dest, 0, UINT32_MAX));
    p->dest_qpn = static_cast<uint32_t>(H::At(dest, 1, UINT32_MAX));
    p->conn = H::U64(r, "conn");
    p->dead = H::Bool(r, "dead");
    const std::string node = H::Text(r, "node", H::kMaxNodeName);
    const Qp* q = parts_.tables.FindQp(p->qpn);
    if (p->chan == 0 || p->chan >= next_chan_ || proxies_.count(p->chan) != 0 ||
        parts_.sessions.Identity(p->pod) == nullptr || q == nullptr || q->owner != p->pod ||
        q->kind->datagram || (!p->dead && node.empty()))
      throw HandoverError("a channel to another node names no QP of its pod, or is named twice");
    p->connected = p->direct = p->ask_direct = true;
    p->link = p->dead ? kNoLink : resume.Park(node, true, now);
    by_qp_[p->qpn].insert(p->chan);
    proxies_[p->chan] = std::move(p);
  }
}

size_t Executor::Move(LinkId from, LinkId to) {
  std::vector<Key> keys;
  for (const auto& [key, s] : senders_)
    if (key.first == from && s->direct && !s->closing) keys.push_back(key);
  for (const Key& key : keys) Rekey(key, to);
  return keys.size();
}

void Executor::Rekey(const Key& key, LinkId to) {
  auto node = senders_.extract(key);
  const Key moved{to, key.second};
  node.key() = moved;
  node.mapped()->link = to;
  by_id_[node.mapped()->id] = moved;
  senders_.insert(std::move(node));
  if (waiting_.erase(key) != 0) waiting_.insert(moved);
}

size_t Executor::ChansOn(LinkId link) const {
  size_t n = 0;
  for (const auto& [key, s] : senders_) n += key.first == link ? 1 : 0;
  return n;
}

void Executor::Resume(LinkId parked, LinkId link, const std::vector<uint32_t>& chans,
                      std::vector<uint32_t>* missing) {
  const std::set<uint32_t> listed(chans.begin(), chans.end());
  std::vector<Key> gone;
  for (const auto& [key, s] : senders_)
    if (key.first == parked && listed.count(key.second) == 0) gone.push_back(key);
  // Their initiators went while the link was down: their QPs fail as on a lost peer.
  for (const Key& key : gone) Drop(key, TellPeer::kNo, DropCause::kDied);
  for (uint32_t chan : listed) {
    if (senders_.count({link, chan}) != 0 || senders_.count({parked, chan}) == 0) {
      missing->push_back(chan);
      continue;
    }
    Rekey({parked, chan}, link);
  }
}

std::string Executor::WhyNotMovable() const {
  if (!unresolved_.empty()) return "connects from other nodes wait";
  for (const auto& [key, s] : senders_) {
    if (!s->direct && !s->kind->datagram) {
      return fmt::format("it relays channels of other nodes (into client {}'s QP {:#x})", s->owner,
                         s->target_qpn);
    }
  }
  return "";
}

void Executor::LoseUdSenders() {
  std::vector<Key> keys;
  for (const auto& [key, s] : senders_)
    if (s->kind->datagram) keys.push_back(key);
  // Their initiators hear kPeerGone, as when the ring goes to another sender: they link
  // again (to the successor) when they next send.
  for (const Key& key : keys) Drop(key, TellPeer::kYes, DropCause::kClosed);
}

Json Executor::Export(const NodeTransport& t) const {
  Json senders = Json::array();
  for (const auto& [key, s] : senders_) {
    if (s->kind->datagram) continue;  // LoseUdSenders went before
    senders.push_back({{"id", s->id},
                       {"chan", s->chan},
                       {"src", {s->src_ip, s->src_qpn}},
                       {"target_qpn", s->target_qpn},
                       {"owner", s->owner},
                       {"conn", s->conn},
                       {"node", NodeOf(t, s->link)}});
  }
  return {{"senders", std::move(senders)}, {"next_id", next_id_}};
}

void Executor::Import(const Json& j, LinkResume& resume, uint64_t now) {
  next_id_ = H::U32(j, "next_id");
  for (const Json& r : H::Array(j, "senders", kMaxChannels)) {
    auto s = std::make_unique<Sender>();
    s->id = H::U32(r, "id");
    s->chan = H::U32(r, "chan");
    const Json& src = H::Array(r, "src", 2);
    if (src.size() != 2) throw HandoverError("a channel's initiator is malformed");
    s->src_ip = static_cast<uint32_t>(H::At(src, 0, UINT32_MAX));
    s->src_qpn = static_cast<uint32_t>(H::At(src, 1, UINT32_MAX));
    s->target_qpn = H::U32(r, "target_qpn");
    s->owner = H::U32(r, "owner");
    s->conn = H::U64(r, "conn");
    const std::string node = H::Text(r, "node", H::kMaxNodeName);
    const Qp* q = parts_.tables.FindQp(s->target_qpn);
    bool produces = false;
    if (q != nullptr)
      for (const Producer& p : q->producers) produces = produces || p == Producer::Remote(s->id);
    if (s->id == 0 || s->id >= next_id_ || by_id_.count(s->id) != 0 || node.empty() ||
        q == nullptr || q->owner != s->owner || q->kind->datagram || !produces ||
        parts_.sessions.Identity(s->owner) == nullptr)
      throw HandoverError("a channel from another node names no ring of its QP, or is named twice");
    s->kind = q->kind;
    s->recv_cq_id = q->recv_cq_id;
    s->direct = true;
    const Key key{resume.Park(node, false, now), s->chan};
    if (senders_.count(key) != 0) throw HandoverError("a channel from another node named twice");
    s->link = key.first;
    by_id_[s->id] = key;
    senders_[key] = std::move(s);
  }
}

}  // namespace ff::router
