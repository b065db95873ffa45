// The rdma_cm emulation's process state (cm_table.h).
#include "rdmacm/cm_channel.h"

#include <infiniband/verbs.h>
#include <rdma/rdma_user_cm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <unordered_map>

#include "freeflow/cm_qp_attr.h"
#include "freeflow/tunables.h"
#include "rdmacm/cm_device.h"

namespace ff::verbs {

namespace cmtable {
namespace {

struct Key {
  Session* session;
  uint32_t handle;
  bool operator<(const Key& o) const {
    return session != o.session ? session < o.session : handle < o.handle;
  }
};
struct IdState {
  uint32_t channel;
  uint64_t uid;
  uint32_t reported;                           // events of this id the program has read
  std::shared_ptr<ff::proto::CmIdState> last;  // the router's newest snapshot, if any
  CmPhase phase = CmPhase::kUnknown;
  bool ended = false;  // the program read the end of its connection (Ends)
};
struct UnnamedPeer {
  Session* session;
  uint32_t ip, qpn;
};
struct JoinState {
  uint32_t parent;  // the id that joined
  uint32_t reported;
};

struct Table {
  std::mutex mu;
  std::unordered_map<int, std::shared_ptr<CmChannel>> fds;
  std::map<Key, IdState> ids;
  std::map<Key, JoinState> joins;
  std::vector<UnnamedPeer> unnamed;  // NoteUnnamedPeer, oldest first
};

// Never destroyed: the interposers may run during exit, after static destructors.
Table& T() {
  static Table* t = new Table;
  return *t;
}

void Mark(int fd, bool on) { g_library_fds.Set(fd, FdKind::kCmChannel, on); }

// The socket's identity straight from the kernel (the fstat interposer would answer for the
// device instead).
bool Identity(int fd, dev_t* dev, ino_t* ino) {
  struct stat st {};
  if (::syscall(SYS_fstat, fd, &st) != 0) return false;
  *dev = st.st_dev;
  *ino = st.st_ino;
  return true;
}

// Keeps `st` as its id's state unless a newer one is kept already (an event read late
// carries an older snapshot than the commands answered since).
void NoteStateLocked(Table& t, Session* s, const ff::proto::CmIdState& st) {
  if (st.handle == 0) return;
  auto it = t.ids.find(Key{s, st.handle});
  if (it == t.ids.end()) return;
  std::shared_ptr<ff::proto::CmIdState>& last = it->second.last;
  if (last != nullptr && static_cast<int32_t>(st.version - last->version) <= 0) return;
  if (last == nullptr) last = std::make_shared<ff::proto::CmIdState>();
  *last = st;
}

void EraseJoinsOf(Table& t, Session* s, uint32_t parent) {
  for (auto it = t.joins.begin(); it != t.joins.end();) {
    if (it->first.session == s && it->second.parent == parent)
      it = t.joins.erase(it);
    else
      ++it;
  }
}

// The channel is gone for the program: so are its ids (the router destroys them when it
// sees the channel's socket close).
void ForgetLocked(Table& t, int fd) {
  auto it = t.fds.find(fd);
  if (it == t.fds.end()) return;
  CmChannel& ch = *it->second;
  ch.open = false;
  for (auto id = t.ids.begin(); id != t.ids.end();) {
    if (id->first.session == ch.session && id->second.channel == ch.id) {
      EraseJoinsOf(t, ch.session, id->first.handle);
      id = t.ids.erase(id);
    } else {
      ++id;
    }
  }
  Mark(fd, false);
  t.fds.erase(it);
}

// The id `handle` of ch's session when it lives on `ch`, else nullptr.
IdState* IdOnLocked(Table& t, const CmChannel& ch, uint32_t handle) {
  auto it = t.ids.find(Key{ch.session, handle});
  return it != t.ids.end() && it->second.channel == ch.id ? &it->second : nullptr;
}

// The events that end a connection (or its attempt): after one, nothing more of it follows.
bool Ends(uint32_t event) {
  return event == RDMA_CM_EVENT_DISCONNECTED || event == RDMA_CM_EVENT_UNREACHABLE ||
         event == RDMA_CM_EVENT_REJECTED || event == RDMA_CM_EVENT_CONNECT_ERROR;
}

// Forgets the id or join under `key`; the events reported for it (0: unknown).
template <typename Map>
uint32_t TakeLocked(Map& m, const Key& key) {
  auto it = m.find(key);
  if (it == m.end()) return 0;
  const uint32_t reported = it->second.reported;
  m.erase(it);
  return reported;
}

}  // namespace

ff::proto::CmEvent OwnEvent(uint64_t uid, uint32_t handle, uint32_t event) {
  rdma_ucm_event_resp resp{};
  resp.uid = uid;
  resp.id = handle;
  resp.event = event;
  ff::proto::CmEvent ev{};
  ev.owner = handle;
  std::memcpy(ev.resp, &resp, sizeof(resp));
  return ev;
}

void AddChannel(int fd, std::shared_ptr<CmChannel> ch) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  ch->fd = fd;
  Identity(fd, &ch->dev, &ch->ino);
  ForgetLocked(t, fd);  // a stale entry for the number (closed where we did not see it)
  t.fds[fd] = std::move(ch);
  Mark(fd, true);
}

std::shared_ptr<CmChannel> Find(int fd) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  auto it = t.fds.find(fd);
  if (it == t.fds.end()) return nullptr;
  dev_t dev;
  ino_t ino;
  if (!Identity(fd, &dev, &ino) || dev != it->second->dev || ino != it->second->ino) {
    ForgetLocked(t, fd);
    return nullptr;
  }
  return it->second;
}

void Lock() { T().mu.lock(); }
void Unlock() { T().mu.unlock(); }

void ForgetRangeLocked(unsigned first, unsigned last) {
  Table& t = T();
  std::vector<int> doomed;
  for (const auto& [fd, ch] : t.fds)
    if (static_cast<unsigned>(fd) >= first && static_cast<unsigned>(fd) <= last)
      doomed.push_back(fd);
  for (int fd : doomed) ForgetLocked(t, fd);
}

void RenewIdentityLocked(CmChannel* ch) { Identity(ch->fd, &ch->dev, &ch->ino); }

void IdCreated(const CmChannel& ch, uint32_t handle, uint64_t uid) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  t.ids.insert_or_assign(Key{ch.session, handle}, IdState{ch.id, uid, 0, nullptr});
}

uint32_t IdDestroyed(Session* s, uint32_t handle) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  const uint32_t reported = TakeLocked(t.ids, Key{s, handle});
  EraseJoinsOf(t, s, handle);
  return reported;
}

uint32_t IdMigrated(const CmChannel& to, uint32_t handle) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  auto it = t.ids.find(Key{to.session, handle});
  if (it == t.ids.end()) return 0;
  it->second.channel = to.id;
  return it->second.reported;
}

void IdAccepted(Session* s, uint32_t handle, uint64_t uid) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  auto it = t.ids.find(Key{s, handle});
  if (it != t.ids.end()) it->second.uid = uid;
}

void JoinCreated(Session* s, uint32_t parent, uint32_t join) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  t.joins.insert_or_assign(Key{s, join}, JoinState{parent, 0});
}

uint32_t JoinLeft(Session* s, uint32_t join) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  return TakeLocked(t.joins, Key{s, join});
}

// The kernel counts an event against its id (the listener for a CONNECT_REQUEST, whose
// resp.id is the new id) and a multicast event against the join too (resp.id is the
// join's handle); librdmacm's acks count the same way (ucma_complete_mc_event).
CmEventFate CountEvent(const CmChannel& ch, const ff::proto::CmEvent& ev) {
  rdma_ucm_event_resp resp;
  std::memcpy(&resp, ev.resp, sizeof(resp));
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  if (!ch.open) return CmEventFate::kDrop;
  if (resp.event == RDMA_CM_EVENT_MULTICAST_JOIN || resp.event == RDMA_CM_EVENT_MULTICAST_ERROR) {
    auto join = t.joins.find(Key{ch.session, resp.id});
    if (join == t.joins.end()) return CmEventFate::kDrop;
    ++join->second.reported;
    auto parent = t.ids.find(Key{ch.session, join->second.parent});
    if (parent != t.ids.end()) ++parent->second.reported;
    return CmEventFate::kDeliver;
  }
  auto it = t.ids.find(Key{ch.session, ev.owner});
  if (it == t.ids.end()) return CmEventFate::kDrop;
  // One end per connection, as the kernel reports it: no DISCONNECTED after the program read
  // how its connection ended (the router's answer lets only one writer report it; this
  // holds whatever comes).
  const bool own = resp.id == ev.owner;
  if (own && resp.event == RDMA_CM_EVENT_DISCONNECTED && it->second.ended)
    return CmEventFate::kDrop;
  ++it->second.reported;
  if (own && Ends(resp.event)) it->second.ended = true;
  if (resp.event == RDMA_CM_EVENT_CONNECT_REQUEST)
    t.ids.emplace(Key{ch.session, resp.id}, IdState{ch.id, 0, 0, nullptr, CmPhase::kRequested});
  if (resp.id == ev.owner) {
    if (resp.event == RDMA_CM_EVENT_CONNECT_RESPONSE) {
      it->second.phase = CmPhase::kRtuDue;
    } else if (resp.event == RDMA_CM_EVENT_ESTABLISHED ||
               resp.event == RDMA_CM_EVENT_DISCONNECTED) {
      it->second.phase = CmPhase::kConnected;
    } else if (resp.event == RDMA_CM_EVENT_ROUTE_RESOLVED) {
      it->second.phase = CmPhase::kRouteResolved;
    } else if (resp.event == RDMA_CM_EVENT_ADDR_RESOLVED && resp.status == 0) {
      it->second.phase = CmPhase::kAddrResolved;
    } else {
      it->second.phase = CmPhase::kUnknown;
    }
  }
  NoteStateLocked(t, ch.session, ev.state);
  return CmEventFate::kDeliver;
}

void NoteState(Session* s, const ff::proto::CmIdState& st) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  NoteStateLocked(t, s, st);
}

bool LastState(const CmChannel& ch, uint32_t handle, ff::proto::CmIdState* out) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  const IdState* id = IdOnLocked(t, ch, handle);
  if (id == nullptr || id->last == nullptr) return false;
  *out = *id->last;
  return true;
}

bool TakeRouteResolution(const CmChannel& ch, uint32_t handle, ff::proto::CmEvent* ev) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  IdState* id = IdOnLocked(t, ch, handle);
  if (id == nullptr || id->last == nullptr || id->phase != CmPhase::kAddrResolved ||
      id->last->handle != handle)
    return false;
  ff::proto::CmIdState st = *id->last;
  rdma_ucm_query_route_resp route;
  static_assert(sizeof(route) == sizeof(st.route));
  std::memcpy(&route, st.route, sizeof(route));
  ff::CmFillRoutedPath(st.qp.tos, &route);
  std::memcpy(st.route, &route, sizeof(route));
  ++st.version;  // the router's next snapshot of the id comes later still: it counts this one
  *ev = OwnEvent(id->uid, handle, RDMA_CM_EVENT_ROUTE_RESOLVED);
  ev->state = st;
  id->phase = CmPhase::kUnknown;
  return true;
}

bool DisconnectionRead(const CmChannel& ch, uint32_t handle) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  const IdState* id = IdOnLocked(t, ch, handle);
  // kConnected and ended: the end read was DISCONNECTED (the others leave kUnknown).
  return id != nullptr && id->phase == CmPhase::kConnected && id->ended;
}

bool DisconnectionEvent(const CmChannel& ch, uint32_t handle, ff::proto::CmEvent* ev) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  const IdState* id = IdOnLocked(t, ch, handle);
  if (id == nullptr || id->last == nullptr || id->phase != CmPhase::kConnected || id->ended)
    return false;
  const ff::QpKind* kind = ff::QpKindOf(id->last->qp.qp_type);
  if (kind == nullptr || kind->datagram) return false;  // only a connection disconnects
  *ev = OwnEvent(id->uid, handle,
                 RDMA_CM_EVENT_DISCONNECTED);  // no snapshot: a disconnect changes none
  return true;
}

void ShutDownChannelsOf(Session* s) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  for (const auto& [fd, ch] : t.fds)
    if (ch->session == s && ch->router_end) ::shutdown(ch->router_end.get(), SHUT_RDWR);
}

void MarkSeen(Session* s, uint32_t handle) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  auto it = t.ids.find(Key{s, handle});
  if (it != t.ids.end() && it->second.last != nullptr) it->second.last->qp.seen = 1;
}

bool Owns(const CmChannel& ch, uint32_t handle) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  return IdOnLocked(t, ch, handle) != nullptr;
}

bool IsOpen(const CmChannel& ch) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  return ch.open;
}

CmPhase Phase(const CmChannel& ch, uint32_t handle) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  const IdState* id = IdOnLocked(t, ch, handle);
  return id != nullptr ? id->phase : CmPhase::kUnknown;
}

void SetPhase(Session* s, uint32_t handle, CmPhase phase) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  auto it = t.ids.find(Key{s, handle});
  if (it != t.ids.end()) it->second.phase = phase;
}

void NoteGrant(CmChannel& ch, uint32_t first, uint32_t count) {
  if (count == 0 || first == 0 || first + count < first) return;
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  ch.grant_next = first;
  ch.grant_end = first + count;
}

bool TakeGrantedHandle(CmChannel& ch, uint32_t* handle) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  if (ch.grant_next == ch.grant_end || !ch.open) return false;
  const auto held = std::distance(t.ids.lower_bound(Key{ch.session, 0}),
                                  t.ids.upper_bound(Key{ch.session, UINT32_MAX}));
  if (static_cast<size_t>(held) >= ff::kMaxCmIdsPerSession / 2) return false;
  *handle = ch.grant_next++;
  return true;
}

void NoteUnnamedPeer(Session* s, uint32_t ip, uint32_t qpn) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  if (t.unnamed.size() >= ff::kMaxUnnamedPeers) t.unnamed.erase(t.unnamed.begin());
  t.unnamed.push_back(UnnamedPeer{s, ip, qpn});
}

bool TakeUnnamedPeer(Session* s, uint32_t ip, uint32_t qpn) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  for (auto it = t.unnamed.begin(); it != t.unnamed.end(); ++it) {
    if (it->session == s && it->ip == ip && it->qpn == qpn) {
      t.unnamed.erase(it);
      return true;
    }
  }
  return false;
}

std::vector<CmLiveId> LiveIds(const CmChannel& ch) {
  Table& t = T();
  std::lock_guard<std::mutex> g(t.mu);
  std::vector<CmLiveId> out;
  for (const auto& [key, id] : t.ids)
    if (key.session == ch.session && id.channel == ch.id) out.push_back({id.uid, key.handle});
  return out;
}

void ForgetInChild() {
  Table& t = T();
  for (auto& [fd, ch] : t.fds) ch->session = nullptr;
  t.ids.clear();
  t.joins.clear();
  t.unnamed.clear();
  for (auto& [fd, ch] : t.fds) ch->grant_next = ch->grant_end = 0;
}

}  // namespace cmtable
}  // namespace ff::verbs
