// The router's resource tables: what each pod connection holds (channels, CQs, SRQs,
// registered regions, its MR table and QPs) and which QP produces into which ring of
// another. Plain data and lookups: no sockets, no protocol. Everything a pod handed over is
// kept here until it releases it or its connection closes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "freeflow/fd.h"
#include "freeflow/protocol.h"
#include "freeflow/qp_kind.h"
#include "freeflow/shm_layout.h"
#include "identity/identity.h"
#include "objects/memory_windows.h"
#include "objects/mr_table.h"

namespace ff::router {

using PodId = uint32_t;  // one pod connection (a process); 0 is never used

// Who produces into one ring of a QP: nobody, a QP of this node, or a remote sender (a QP on
// another node, through the executor).
struct Producer {
  enum class Kind : uint8_t { kNone, kLocalQp, kRemote };
  Kind kind = Kind::kNone;
  uint32_t id = 0;  // the local QPN, or the remote sender's id
  static Producer Local(uint32_t qpn) { return {Kind::kLocalQp, qpn}; }
  static Producer Remote(uint32_t sender) { return {Kind::kRemote, sender}; }
  bool operator==(const Producer&) const = default;
};

struct Region {
  UniqueFd fd;
  uint64_t size = 0;
  uint32_t remote_mrs = 0;    // live registrations in it with a remote access flag
  uint32_t writable_mrs = 0;  // of those, the ones that grant remote write or atomics
  Mapping map;  // the router's own mapping, made when a remote initiator first reaches it
  bool map_writable = false;
};

struct Cq {
  uint32_t notify_slot = proto::kNoId;
  uint32_t chan_id = proto::kNoId;
};

// A notify word and the wake socket to send on when its owner armed it.
struct WakeTarget {
  NotifySlot* slot = nullptr;
  int fd = -1;
  explicit operator bool() const { return slot != nullptr; }
};

struct Pod {
  PodId id = 0;
  PodIdentity who;
  UniqueFd notify_seg;  // the process's notify words (CQ events, wake word)
  UniqueFd wake_fd;     // wake socket: rung after cross-node deliveries when armed
  // Its network namespace, pinned (identity/netns_probe.h: OpenPeerNamespace), where the
  // router opens the listeners of its direct connections. Opened on the first one, charged
  // to its kFds quota; empty for a process identified without a namespace (netns 0: tests),
  // whose listeners are opened in the router's own.
  UniqueFd netns;
  MrTable mr;
  Windows windows;                        // the memory windows among mr's entries
  std::map<uint32_t, UniqueFd> channels;  // completion channel id -> its wake socket
  std::map<uint32_t, Cq> cqs;
  std::map<uint32_t, UniqueFd> srqs;  // SRQ id -> segment
  std::map<uint32_t, Region> regions;
  std::set<uint32_t> qps;
  // QP numbers granted for posted RC/UC creates (proto::CreateQp), reserved in the tables
  // until used or the session ends.
  std::vector<uint32_t> qpn_grants;

  // The notify words, mapped on first use; nullptr when they cannot be mapped.
  NotifySlot* NotifySlots();
  // The event word (slot index) and channel wake socket of CQ `cq_id`; false when it has no
  // completion channel.
  bool CqChannel(uint32_t cq_id, uint32_t* slot, int* fd) const;
  // The same, as a word to write: mapped, ready for WakeIfArmed.
  WakeTarget CqWake(uint32_t cq_id);
  // Wakes the process if it sleeps on its wake word (see proto::kWakeSlot).
  void WakeProcess();
  // Region `region_id` mapped into the router, on first use, for an access needing `need`
  // (ibv_access_flags); nullptr when unknown, or when `need` writes and the owner sealed
  // the region read-only.
  Region* MappedRegion(uint32_t region_id, uint32_t need);

 private:
  Mapping notify_map_;
};

struct Qp {
  uint32_t qpn = 0;
  const QpKind* kind = nullptr;  // from its create (CreateQp checked the type)
  PodId owner = 0;
  UniqueFd seg;
  // FreezeSeals was done on `seg`: it went to another process, or the router mapped it for
  // remote senders (its owner never reuses it, see verbs-library.md "Spare QP segments").
  bool seg_frozen = false;
  uint32_t num_rings = 0;
  uint32_t ring_bytes = 0;
  uint32_t srq_id = proto::kNoId;
  uint32_t recv_cq_id = proto::kNoId;
  uint32_t send_cq_id = proto::kNoId;
  std::vector<Producer> producers;  // who produces into each ring
  std::vector<uint64_t> given_at;   // UD: when each ring went to its producer (a count)
  uint64_t rings_given = 0;
  std::set<uint32_t> produces_into;  // local QPs whose rings this QP produces into
  // UD: the memfd of each sender's own ring (kConnectOwnRing), made by the router per
  // sender; the owner maps it when told (kUdRing).
  std::vector<UniqueFd> ud_rings;
  // RC/UC: the peer its owner named at RTR (overlay IP, also when it was named by LID; and
  // QPN). Only that QP is given a ring of this one.
  struct Named {
    uint32_t ip = 0;
    uint32_t qpn = proto::kNoId;
    bool operator==(const Named&) const = default;
  } named;
  // RC/UC: this QP asked for a link to the QP it named, which had not named it (a connect
  // on this node answered EINPROGRESS; across nodes, from the request on until its answer
  // is not EINPROGRESS): it is told (kPeerNamed) when that QP names it. A QP that never
  // asked is not told; its library links when it first needs to (its first send).
  bool asked = false;

  // FreezeSeals on `seg`, once: before it goes to another process or the router maps it.
  int FreezeSegment();
  // True, once, when the QP asked for the peer that has named it now: it is to be told
  // (kPeerNamed); clears `asked`. False for a QP that never asked, or one that needs no
  // consent.
  bool TakeAsked();
  // True when an initiator QP `qpn` of the pod at `ip` may produce into this QP: any for
  // UD, only the one its owner named for RC/UC.
  bool Consents(uint32_t ip, uint32_t qpn) const;

  // The ring `p` produces into, else a free ring; else, for UD, the ring given longest ago
  // (its producer is to lose it); -1 when there is none (RC/UC: the one ring is taken).
  int RingFor(Producer p) const;
  // Ring `ring` (< num_rings) is `p`'s from now on.
  void GiveRing(size_t ring, Producer p);
  // UD: gives ring `ring` to a new sender: a fresh memfd (UdRingBytes(ring_bytes)) that
  // replaces the last sender's, and the event that tells the owner who sends into it
  // (`src_ip` host order). 0 or a positive errno.
  int NewUdRing(uint32_t ring, uint32_t src_ip, uint32_t src_qpn, proto::Event* event);
  // Frees every ring `p` produces into.
  void ReleaseRingsOf(Producer p);
  // Frees ring `ring` (< num_rings): no producer, and no UD sender's ring memfd.
  void FreeRing(size_t ring);
};

class HandoverState;

class ResourceTables {
 public:
  // Hand-over (docs/handover.md): every pod's objects and every QP, descriptors by index,
  // into state.doc["tables"]; and back into empty tables (objects/handover.cc). Import
  // checks every record as it would a request's, and throws HandoverError.
  void Export(HandoverState& state) const;
  void Import(HandoverState& state);
  Pod& AddPod(PodId id, const PodIdentity& who);
  Pod* FindPod(PodId id);
  const Pod* FindPod(PodId id) const;
  void ErasePod(PodId id);

  // Adds a QP under a fresh QP number (unique on this node), or under `reserved`, a number
  // ReserveQpn gave out.
  Qp& AddQp(std::unique_ptr<Qp> qp, uint32_t reserved = 0);
  // A fresh QP number that no QP gets until AddQp is given it or ReleaseQpn frees it.
  uint32_t ReserveQpn();
  void ReleaseQpn(uint32_t qpn);
  Qp* FindQp(uint32_t qpn);
  // QP `qpn` when `pod` owns it.
  Qp* FindOwnedQp(const Pod& pod, uint32_t qpn);
  void EraseQp(uint32_t qpn);
  // QP `qpn` of a pod on this node addressed by overlay IP (host order; 0: by LID).
  Qp* FindDest(uint32_t ip, uint32_t qpn);
  // Stops local QP `src` producing into every QP but `keep`; returns the QPs it left.
  std::vector<uint32_t> Unlink(Qp& src, const Qp* keep = nullptr);

  // What all pods hold (for the router's statistics).
  struct Totals {
    size_t pods = 0, qps = 0, objects = 0, regions = 0, mapped_regions = 0, mr_entries = 0;
  };
  Totals totals() const;
  // Every pod session and every QP, for an admin's view (ffctl, metrics): f(const Pod&),
  // f(const Qp&), in no particular order.
  template <typename F>
  void ForEachPod(F&& f) const {
    for (const auto& [id, pod] : pods_) f(*pod);
  }
  // QPs by their owner's overlay address and type (ibv_qp_type), for the same views.
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> QpsByAddressAndType() const;
  // The node's QPs as the router sees them: UD ("datagram"), RC/UC whose owner named a peer
  // at RTR ("connected"), and RC/UC that have not ("unconnected"). The verbs states in
  // between (INIT, RTS, ERR) live in the owner's library.
  struct QpStates {
    uint64_t unconnected = 0;
    uint64_t connected = 0;
    uint64_t datagram = 0;
  };
  QpStates QpsByState() const;
  template <typename F>
  void ForEachQp(F&& f) const {
    for (const auto& [qpn, qp] : qps_) f(*qp);
  }

 private:
  uint32_t FreshQpn();
  nlohmann::json ExportQp(HandoverState& state, const Qp& qp) const;
  void ImportQp(HandoverState& state, const nlohmann::json& j);

  uint32_t next_qpn_ = kFirstQpn;
  std::unordered_map<PodId, std::unique_ptr<Pod>> pods_;
  std::unordered_map<uint32_t, std::unique_ptr<Qp>> qps_;
  std::unordered_set<uint32_t> reserved_;
};

}  // namespace ff::router
