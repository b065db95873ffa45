// Channels across a router's replacement (docs/handover.md, "Channels to other nodes"): the
// bookkeeping of parked channels, on the router that stays and on the successor alike.
//
// A router about to hand over says so on each of its links (wire::kHandingOver). When such
// a link goes down within kResumeGraceNs, its direct channels (and, on links this router
// dialled, its rdma_cm ids) are not failed but parked: moved to a parked link of the peer
// node, one per direction (the channels this router initiated, on links it dialled; those
// the node initiated, on links it dialled here). A parked link is a LinkId no transport
// gives out (from kFirstParked on): what the forwarder, the executor or the CM would send
// on it goes nowhere, as on a link that is gone. The successor imports the old router's
// channels and ids parked the same way.
//
// The router that holds parked initiated channels or ids dials the node again (DialDue)
// and sends kResume on that link, listing the channels; they move to it then. The
// router that holds parked channels the node initiated waits for that kResume on a link the
// node dialled: it moves the listed ones to it, drops the rest (their initiator is gone)
// and answers kResumed with the listed ones it holds no channel for, which the initiator
// then fails. A node that has not resumed by the deadline has its parked channels failed as
// on a lost link. Only the node itself resumes its channels: the node a link's peer is (its
// certificate, with TLS) names what it may resume.
//
// Threading: the loop's thread only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nodes/node_transport.h"

namespace ff::router {

class LinkResume {
 public:
  // `grace_ns`: how long parked channels wait for their node (kResumeGraceNs; tests
  // shorten it).
  explicit LinkResume(uint64_t grace_ns) : grace_ns_(grace_ns) {}
  static constexpr LinkId kFirstParked = 0x8000'0000;

  // The peer of `link`, router `node`, said it is being replaced (kHandingOver), at `now`;
  // `dialled`: this router dialled the link (its channels are ones this router initiated).
  // Remembered here because a transport forgets a link before it reports it down.
  void Announced(LinkId link, const std::string& node, bool dialled, uint64_t now) {
    announced_[link] = {now + grace_ns_, node, dialled};
  }
  // A link this router dialled to resume `node`'s channels (kResume sent on it), not
  // answered yet: if it goes down, they park again.
  void Resuming(LinkId link, const std::string& node) { resuming_[link] = node; }
  bool Resuming(const std::string& node) const;
  bool ResumingLink(LinkId link) const { return resuming_.count(link) != 0; }
  // kResumed came on `link`: false when no kResume was sent on it (a protocol violation).
  bool Answered(LinkId link) { return resuming_.erase(link) != 0; }
  // Whether the channels of `link`, going down at `now`, park rather than fail (it
  // announced a replacement within the grace, or it was dialled to resume channels and is
  // not answered yet), with the node and direction it had; forgets it.
  bool ParksOnDown(LinkId link, uint64_t now, std::string* node, bool* dialled);
  // Links that router `node` announced its replacement on, which this router did not dial
  // and which are still up as far as this knows (a node that resumes on another link has
  // their channels parked first).
  std::vector<LinkId> AnnouncedBy(const std::string& node) const;
  // Forgets announcements older than the grace (links that never went down).
  void Expire(uint64_t now);

  // The parked link of node `node` for channels this router initiated (`initiated`) or the
  // node did; made on first use, with the deadline `now` + the grace.
  LinkId Park(const std::string& node, bool initiated, uint64_t now);
  // The parked link of `node`, or kNoLink.
  LinkId Parked(const std::string& node, bool initiated) const;
  // Its channels in that direction moved to a real link (resumed).
  void Unpark(const std::string& node, bool initiated);
  // Nodes with a parked link, and their deadlines.
  struct Node {
    std::string name;
    LinkId initiated = kNoLink;
    LinkId received = kNoLink;
    uint64_t deadline_ns = 0;
    uint64_t next_dial_ns = 0;
    uint32_t dials = 0;
  };
  std::vector<Node> Nodes() const;
  // A dial to resume `node`'s channels is due at `now`: the first at once, the next
  // kResumeDialNs on, each wait twice the last up to a second (a successor that cannot bind
  // the node's port yet is not dialled in a tight loop).
  bool DialDue(const std::string& node, uint64_t now);
  // Forgets `node`'s parked links (resumed and empty, or failed at the deadline).
  void Forget(const std::string& node) { nodes_.erase(node); }
  bool empty() const { return nodes_.empty() && announced_.empty() && resuming_.empty(); }

 private:
  uint64_t grace_ns_;
  LinkId next_ = kFirstParked;
  struct Announcement {
    uint64_t until_ns;  // a loss before then parks its channels
    std::string node;
    bool dialled;
  };
  std::map<LinkId, Announcement> announced_;
  std::map<LinkId, std::string> resuming_;  // link -> the node whose channels it resumes
  std::map<std::string, Node> nodes_;
};

}  // namespace ff::router
