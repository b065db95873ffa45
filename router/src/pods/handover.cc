// Pod sessions as the records of a hand-over (docs/handover.md): each session's sockets,
// request ring, traffic ledger and waiting events; the new router watches them as it would
// new ones and reads on from where the old one stopped.
#include <fcntl.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "base/handover_state.h"
#include "freeflow/clock.h"
#include "freeflow/ipv4.h"
#include "pods/event_backlog.h"
#include "pods/pod_sessions.h"
#include "pods/traffic_claims.h"

namespace ff::router {
namespace {

using Json = nlohmann::json;
using H = HandoverState;
constexpr size_t kMaxRecords = 1u << 20;

Json FdOrNull(HandoverState& state, int fd) {
  return fd >= 0 ? Json(state.PutFd(fd)) : Json(nullptr);
}

UniqueFd TakeOrEmpty(HandoverState& state, const Json& j, const char* key, FdKind kind) {
  const auto it = j.find(key);
  if (it == j.end()) throw HandoverError(std::string("field '") + key + "' is missing");
  return it->is_null() ? UniqueFd() : state.TakeFd(*it, kind);
}

}  // namespace

Json EventBacklog::Export(HandoverState& state) const {
  Json out = Json::array();
  for (const Queued& q : queue_) {
    const auto* b = reinterpret_cast<const uint8_t*>(&q.event);
    out.push_back({Json::binary(std::vector<uint8_t>(b, b + sizeof(q.event))),
                   FdOrNull(state, q.fd ? q.fd.get() : -1)});
  }
  return out;
}

void EventBacklog::Import(HandoverState& state, const Json& j) {
  if (!j.is_array() || j.size() > kMaxRecords) throw HandoverError("waiting events are not a list");
  for (const Json& e : j) {
    if (!e.is_array() || e.size() != 2 || !e[0].is_binary() ||
        e[0].get_binary().size() != sizeof(proto::Event))
      throw HandoverError("a waiting event is malformed");
    proto::Event event{};
    std::memcpy(&event, e[0].get_binary().data(), sizeof(event));
    UniqueFd fd = e[1].is_null() ? UniqueFd() : state.TakeFd(e[1], FdKind::kAny);
    if (!Push(event, fd ? fd.get() : -1)) throw HandoverError("too many waiting events");
  }
}

Json TrafficClaims::Export(HandoverState& state) const {
  Json seen = Json::array();
  for (const Seen& s : seen_)
    seen.push_back({s.peer_ip, s.placement,
                    Json(std::vector<uint64_t>(s.ops, s.ops + kTrafficKinds)),
                    Json(std::vector<uint64_t>(s.bytes, s.bytes + kTrafficKinds))});
  return {{"fd", state.PutFd(MappedFile(map_, O_RDONLY))},
          {"read_ns", read_ns_},
          {"seen", std::move(seen)}};
}

void TrafficClaims::Import(HandoverState& state, const Json& j) {
  UniqueFd fd = state.TakeFd(j.at("fd"), FdKind::kMemfd);
  if (Take(fd.get(), H::U64(j, "read_ns")) != 0)
    throw HandoverError("a traffic ledger does not map");
  for (const Json& s : H::Array(j, "seen", kTrafficSlots)) {
    if (!s.is_array() || s.size() != 4 || !s[2].is_array() || !s[3].is_array() ||
        s[2].size() != kTrafficKinds || s[3].size() != kTrafficKinds)
      throw HandoverError("a traffic ledger's slot is malformed");
    Seen to{};
    to.peer_ip = s[0].get<uint32_t>();
    to.placement = s[1].get<uint32_t>();
    for (size_t k = 0; k < kTrafficKinds; ++k) {
      to.ops[k] = s[2][k].get<uint64_t>();
      to.bytes[k] = s[3][k].get<uint64_t>();
    }
    seen_.push_back(to);
  }
}

void PodSessions::Export(HandoverState& state) {
  Json sessions = Json::array();
  for (const auto& [id, s] : sessions_) {
    if (!s->refusal.empty()) continue;  // it only waited to read why: it goes with this router
    if (s->ring_control != nullptr) s->ring.Release();
    sessions.push_back(
        {{"id", id},
         {"sock", state.PutFd(s->sock.get())},
         {"events", FdOrNull(state, s->events ? s->events.get() : -1)},
         {"pid", s->who.pid},
         {"ip", s->who.ip},
         {"netns", s->who.netns},
         {"welcomed", s->welcomed},
         {"kind", static_cast<uint32_t>(s->kind)},
         {"ring", s->ring_control != nullptr ? Json(state.PutFd(MappedFile(s->ring_map, O_RDWR)))
                                             : Json(nullptr)},
         {"traffic", s->traffic.taken() ? s->traffic.Export(state) : Json(nullptr)},
         {"backlog", s->backlog.Export(state)},
         {"charged_event_bytes", s->charged_event_bytes},
         {"charged_event_fds", s->charged_event_fds}});
  }
  state.doc["sessions"] = {{"next_id", next_id_}, {"list", std::move(sessions)}};
}

void PodSessions::Import(HandoverState& state, const Ipv4Prefix& overlay) {
  const Json& all = H::Object(state.doc, "sessions");
  next_id_ = H::U32(all, "next_id");
  for (const Json& j : H::Array(all, "list", kMaxRecords)) {
    auto s = std::make_unique<Session>();
    s->id = H::U32(j, "id");
    if (s->id == 0 || sessions_.count(s->id) != 0)
      throw HandoverError("a session's id is 0 or twice");
    s->sock = state.TakeFd(j.at("sock"), FdKind::kSocket);
    s->events = TakeOrEmpty(state, j, "events", FdKind::kSocket);
    s->who.pid = static_cast<pid_t>(H::U32(j, "pid", INT32_MAX));
    s->who.ip = H::U32(j, "ip");
    s->who.netns = H::U64(j, "netns");
    // A successor configured with another pod network (VNET_PREFIX) would serve an address
    // its own identity rules refuse: the old router, which serves it, keeps it.
    if (!overlay.Contains(s->who.ip))
      throw HandoverError("a session's address " + FormatIpv4(s->who.ip) +
                          " is outside this router's overlay " + overlay.ToString());
    s->welcomed = H::Bool(j, "welcomed");
    const uint32_t kind = H::U32(j, "kind", static_cast<uint32_t>(Kind::kSocket));
    s->kind = static_cast<Kind>(kind);
    if (UniqueFd ring = TakeOrEmpty(state, j, "ring", FdKind::kMemfd)) {
      const size_t bytes = RequestRingSegmentBytes(kRequestRingBytes);
      if (!SealedAtLeast(ring.get(), bytes) ||
          MapSegment(ring.get(), bytes, true, &s->ring_map) != 0)
        throw HandoverError("a request ring does not map");
      s->ring.Attach(RequestRingOf(s->ring_map.get()), kRequestRingBytes);
      if (!s->ring.sane()) throw HandoverError("a request ring's indices are not sane");
      s->ring_control = s->ring_map.as<RequestRingControl>();
      ring_pods_.push_back(s->id);
    }
    if (!j.at("traffic").is_null()) s->traffic.Import(state, j.at("traffic"));
    s->backlog.Import(state, j.at("backlog"));
    // What the backlog holds is in the pod's imported quota ledger already.
    s->charged_event_bytes = H::U64(j, "charged_event_bytes");
    s->charged_event_fds = H::U64(j, "charged_event_fds");
    if (!s->welcomed) hello_deadlines_.emplace_back(MonotonicNs() + hello_timeout_ns_, s->id);
    Session& ref = *s;
    sessions_[s->id] = std::move(s);
    WatchSocket(ref);
    if (!ref.backlog.empty() && ref.events) {
      const PodId id = ref.id;
      ref.events_watch =
          loop_.Watch(ref.events.get(), EPOLLOUT, [this, id](uint32_t) { OnEventsWritable(id); });
    }
  }
}

}  // namespace ff::router
