// The rdma_cm emulation's process state (cm_device.h): which descriptors are channels, and
// the ids the program holds on them with their event counts.
//
// Threading: one mutex guards the whole table; it is never held while calling the router
// or blocking on a channel, and never taken while holding the session lock. The marks that
// MaybeCmFd reads are written under it. A channel is shared (shared_ptr) between the table
// and the commands running on it, so a close() racing a command leaves the command a valid
// (closed) channel.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "freeflow/fd.h"
#include "freeflow/protocol.h"

namespace ff::verbs {

struct Session;

// The ucma event numbers, by librdmacm's names (proto::CmEventType).
using enum ff::proto::CmEventType;

struct CmChannel {
  Session* session = nullptr;  // nullptr in a forked child: commands fail with ENODEV
  uint32_t id = 0;             // CmOpenChannel's channel, unique in the session
  int fd = -1;                 // the program's descriptor
  dev_t dev = 0;               // of the socket behind `fd`: a reused number is not this
  ino_t ino = 0;               // channel (table lock)
  bool open = true;            // false once the program closed it (table lock)
  uint32_t grant_next = 0;     // handles granted for posted CREATE_IDs: [grant_next,
  uint32_t grant_end = 0;      // grant_end) unused (table lock; cmtable::NoteGrant)
  // DEVICE_REMOVAL (cm_events.cc), under removal_mu: once set, `fd` reads from a socket
  // the library made, `removal_tx` is its writing end and `pending` what did not fit yet.
  std::mutex removal_mu;
  std::atomic<bool> removed{false};
  ff::UniqueFd removal_tx;
  std::vector<ff::proto::CmEvent> pending;
  // A copy of the router's end of the channel socket (protocol.h, CmOpenChannel): the
  // library writes there the events of the commands it answers itself (ROUTE_RESOLVED,
  // cm_commands.cc). `unsent` holds those the socket had no room for, oldest first; they
  // follow as the program reads (under removal_mu; has_unsent mirrors !unsent.empty()).
  ff::UniqueFd router_end;
  std::vector<ff::proto::CmEvent> unsent;
  std::atomic<bool> has_unsent{false};
};

// A live id as DEVICE_REMOVAL reports it.
struct CmLiveId {
  uint64_t uid;
  uint32_t handle;
};

// What to do with an event read from a channel.
enum class CmEventFate { kDeliver, kDrop };

// What the events the program has read say of an id's connection, for the commands whose
// outcome follows from it (cm_commands.cc posts them instead of waiting for the router):
//   kRtuDue     CONNECT_RESPONSE read, nothing sent since: ACCEPT is the active side's RTU,
//               which the router carries out whatever the program passes;
//   kConnected  ESTABLISHED or DISCONNECTED read, or the RTU posted: the router's id is
//               established, disconnecting or done, and DISCONNECT succeeds in each;
//   kRequested  the id is a CONNECT_REQUEST's new id, nothing sent since: the router's id
//               awaits ACCEPT or REJECT, and its peer has no QP number of this side yet
//               (the REP, which ACCEPT sends, carries it);
//   kRouteResolved  ROUTE_RESOLVED read, nothing sent since: the router's id awaits CONNECT;
//   kAddrResolved  ADDR_RESOLVED read, nothing sent since that moves an id on (a
//               SET_OPTION of IB_PATH resolves the route too): the router's id awaits
//               RESOLVE_ROUTE (or CONNECT, which the router refuses then).
// A CONNECT, ACCEPT, REJECT or DISCONNECT sent to the router makes it kUnknown (the router
// decides), and so does a SET_OPTION of IB_PATH; the other commands leave the router's id
// where it is in these phases.
enum class CmPhase : uint8_t {
  kUnknown,
  kRtuDue,
  kConnected,
  kRequested,
  kRouteResolved,
  kAddrResolved
};

// The table's operations (cm_table.cc). Ids are keyed by (session, handle), as the router
// numbers them per session; joins (multicast) have their own handles.
namespace cmtable {

// An event of id `handle` that the library writes itself (ROUTE_RESOLVED, DISCONNECTED,
// DEVICE_REMOVAL), without a snapshot (state.handle 0) unless the caller adds one.
ff::proto::CmEvent OwnEvent(uint64_t uid, uint32_t handle, uint32_t event);
// Registers a freshly opened channel under `fd` and marks it.
void AddChannel(int fd, std::shared_ptr<CmChannel> ch);
// The channel behind `fd`, nullptr when it is not one (a number reused after a close the
// library did not see is forgotten here).
std::shared_ptr<CmChannel> Find(int fd);

// The table lock, for the descriptor operations that must be atomic with the table: a
// close or dup that releases a channel's number, and the DEVICE_REMOVAL swap.
void Lock();
void Unlock();
// With the lock held: forgets every channel whose descriptor number is in [first, last].
void ForgetRangeLocked(unsigned first, unsigned last);
// With the lock held: ch's descriptor now names another socket (DEVICE_REMOVAL).
void RenewIdentityLocked(CmChannel* ch);

void IdCreated(const CmChannel& ch, uint32_t handle, uint64_t uid);
// Forgets the id (and its joins); returns the events reported for it (0: unknown).
uint32_t IdDestroyed(Session* s, uint32_t handle);
// Moves the id to `to`; returns its events reported.
uint32_t IdMigrated(const CmChannel& to, uint32_t handle);
void IdAccepted(Session* s, uint32_t handle, uint64_t uid);
void JoinCreated(Session* s, uint32_t parent, uint32_t join);
uint32_t JoinLeft(Session* s, uint32_t join);
// Counts an event read from `ch` if it belongs to a live id (or join) of this process, and
// records the new id of a CONNECT_REQUEST; kDrop for anything else, and for a DISCONNECTED
// of an id whose end (DISCONNECTED, REJECTED, UNREACHABLE, CONNECT_ERROR) the program read
// already (one end per connection, as the kernel reports it).
CmEventFate CountEvent(const CmChannel& ch, const ff::proto::CmEvent& ev);
std::vector<CmLiveId> LiveIds(const CmChannel& ch);
// The router's snapshots of an id (proto::CmIdState): kept when newer than the last; and
// the last of an id on `ch`, from which QUERY_ROUTE and INIT_QP_ATTR are answered without
// asking (false: none, ask the router). A snapshot whose `qp.seen` is 0 is of a listener's
// child the router does not know the program has named: the caller tells it (a posted
// command) and MarkSeen records that it did.
void NoteState(Session* s, const ff::proto::CmIdState& st);
// The ROUTE_RESOLVED event of a kAddrResolved id on `ch`, as the router would write it
// (its state: the last snapshot with the resolved path, one version on), and the id left
// kUnknown until the program reads it; false (nothing changed) for any other id.
bool TakeRouteResolution(const CmChannel& ch, uint32_t handle, ff::proto::CmEvent* ev);
// The DISCONNECTED event of a kConnected RC/UC id on `ch` whose end the program has not
// read (DisconnectedHere: written when the router's answer says so); false for any other id.
bool DisconnectionEvent(const CmChannel& ch, uint32_t handle, ff::proto::CmEvent* ev);
// Whether the program has read the DISCONNECTED of `handle` on `ch` (the router's id is done).
bool DisconnectionRead(const CmChannel& ch, uint32_t handle);
// The router is gone: shuts down the copies of the router's ends of `s`'s channels, so
// that their programs read EOF (then DEVICE_REMOVAL).
void ShutDownChannelsOf(Session* s);
bool LastState(const CmChannel& ch, uint32_t handle, ff::proto::CmIdState* out);
void MarkSeen(Session* s, uint32_t handle);
// Whether `handle` is a live id of this process on `ch`.
bool Owns(const CmChannel& ch, uint32_t handle);
// Whether the program still has `ch` open (a close on another thread forgets it).
bool IsOpen(const CmChannel& ch);
// The id's phase, kUnknown when it is not a live id on `ch`; SetPhase records a command's
// effect (after a command sent to the router, kUnknown; after a posted RTU, kConnected).
CmPhase Phase(const CmChannel& ch, uint32_t handle);
void SetPhase(Session* s, uint32_t handle, CmPhase phase);

// The peer of an RTR that rdma_cm sets up: INIT_QP_ATTR(RTR) of a kRequested id (the
// passive side, in rdma_accept before ACCEPT) or of a kRtuDue one (the active side, after
// CONNECT_RESPONSE, before the RTU) notes the peer's address and QP number, and the
// ibv_modify_qp(RTR) that follows takes the note and names its peer with a posted NameQp
// instead of asking for a link (qp.cc): the passive side's peer cannot have named it yet
// (the router's answer could only be EINPROGRESS), and the active side links when it first
// sends, so that a connection costs no wait for the router at RTR. At most
// ff::kMaxUnnamedPeers notes are kept (the oldest go first); a note is taken once.
void NoteUnnamedPeer(Session* s, uint32_t ip, uint32_t qpn);
bool TakeUnnamedPeer(Session* s, uint32_t ip, uint32_t qpn);

// The handles the router granted a channel for posted CREATE_IDs (proto::CmReply): noted
// from an answered CREATE_ID on it, taken one by one by the CREATE_IDs posted on it.
// TakeGrantedHandle gives none while the session holds half of kMaxCmIdsPerSession ids (the
// router, which also counts requests the program has not read yet, could refuse it then).
void NoteGrant(CmChannel& ch, uint32_t first, uint32_t count);
bool TakeGrantedHandle(CmChannel& ch, uint32_t* handle);

// fork child (cm_device.h): the channels stay, owned by no session; no id is live.
void ForgetInChild();

}  // namespace cmtable

// GET_EVENT on `ch` (cm_events.cc): the next event of a live id, copied to `response`
// (`out` bytes of room); blocks unless the descriptor is non-blocking. When the router has
// gone, the live ids' DEVICE_REMOVAL events. 0 or a positive errno.
int CmGetEvent(CmChannel& ch, uint16_t out, uint64_t response);
// Writes an event the library made into `ch` (its router_end), after those it holds back
// already; one the socket has no room for waits in `unsent` until the program reads.
void CmQueueEvent(CmChannel& ch, const ff::proto::CmEvent& ev);

}  // namespace ff::verbs
