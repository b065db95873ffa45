// The channels to other nodes across a router's replacement (nodes/link_resume.h,
// docs/handover.md "Channels to other nodes"): kHandingOver, kResume and kResumed, links
// that go down with their channels parked, and parked channels resumed or failed.
#include <spdlog/spdlog.h>

#include <cstring>

#include "freeflow/clock.h"
#include "router.h"

namespace ff::router {
namespace {

std::vector<uint32_t> ChansOf(const NodeMessage& m) {
  std::vector<uint32_t> chans(m.len / sizeof(uint32_t));
  if (!chans.empty()) std::memcpy(chans.data(), m.body, chans.size() * sizeof(uint32_t));
  return chans;
}

}  // namespace

Router::Verdict Router::OnResumeMessage(LinkId link, const NodeMessage& m) {
  const std::string node = transport_->PeerNode(link);
  if (node.empty()) return Verdict::kMalformed;  // links are ready before messages come
  const uint64_t now = MonotonicNs();
  switch (m.type) {
    case wire::Type::kHandingOver:
      resume_.Announced(link, node, transport_->Dialled(link), now);
      spdlog::info("router {} is being replaced: its channels wait for its successor", node);
      return Verdict::kConsumed;
    case wire::Type::kResume: {
      if (transport_->Dialled(link)) return Verdict::kMalformed;  // sent by the dialler
      // Links of the node that announced the replacement and are still up (their end is on
      // its way): their channels are the node's to resume now.
      for (LinkId old : resume_.AnnouncedBy(node))
        if (old != link) executor_.Move(old, resume_.Park(node, false, now));
      const std::vector<uint32_t> chans = ChansOf(m);
      std::vector<uint32_t> missing;
      const LinkId parked = resume_.Parked(node, false);
      if (parked == kNoLink) {
        missing = chans;
      } else {
        executor_.Resume(parked, link, chans, &missing);
        resume_.Unpark(node, false);
      }
      spdlog::info("router {} resumed {} channels from its pods ({} of them gone)", node,
                   chans.size() - missing.size(), missing.size());
      transport_->Send(link, wire::Type::kResumed, 0, 0,
                       {{missing.data(), missing.size() * sizeof(uint32_t)}});
      return Verdict::kConsumed;
    }
    case wire::Type::kResumed: {
      if (!transport_->Dialled(link) || !resume_.Answered(link)) return Verdict::kMalformed;
      const std::vector<uint32_t> gone = ChansOf(m);
      if (!gone.empty())
        spdlog::info("router {} holds no channel for {} resumed ones: they fail", node,
                     gone.size());
      forwarder_.FailChans(link, gone);
      return Verdict::kConsumed;
    }
    default:
      return Verdict::kMalformed;
  }
}

void Router::ParkChannels(LinkId link) {
  const uint64_t now = MonotonicNs();
  const bool resuming = resume_.ResumingLink(link);  // a dial to resume channels
  std::string node;
  bool initiated = false;
  if (!resume_.ParksOnDown(link, now, &node, &initiated) || node.empty()) return;
  const LinkId parked = resume_.Park(node, initiated, now);
  // rdma_cm ids send on links this router dialled, as the channels it initiated do.
  const size_t n = initiated ? forwarder_.Move(link, parked) + cm_.Move(link, parked)
                             : executor_.Move(link, parked);
  if (n == 0) return;
  if (resuming)  // the router is not back yet: dialled again later
    spdlog::debug("link {} to router {} went down before it resumed {} channels", link, node, n);
  else
    spdlog::info("link {} to router {} went down as it is replaced: {} channels wait for it", link,
                 node, n);
}

void Router::TickResume(uint64_t now) {
  resume_.Expire(now);
  for (const LinkResume::Node& n : resume_.Nodes()) {
    const std::vector<uint32_t> chans =
        n.initiated != kNoLink ? forwarder_.ChansOn(n.initiated) : std::vector<uint32_t>();
    const size_t received = n.received != kNoLink ? executor_.ChansOn(n.received) : 0;
    const size_t ids = n.initiated != kNoLink ? cm_.CountOn(n.initiated) : 0;
    if (chans.empty() && received == 0 && ids == 0 && !resume_.Resuming(n.name)) {
      resume_.Forget(n.name);
      continue;
    }
    if (now >= n.deadline_ns) {
      spdlog::warn("router {} did not come back within {} ms: {} channels and {} rdma_cm ids fail",
                   n.name, config_.resume_grace_ns / 1'000'000, chans.size() + received, ids);
      if (n.initiated != kNoLink) forwarder_.OnLinkDown(n.initiated);
      if (n.initiated != kNoLink) cm_.OnLinkDown(n.initiated);
      if (n.received != kNoLink) executor_.OnLinkDown(n.received);
      resume_.Forget(n.name);
      continue;
    }
    if ((chans.empty() && ids == 0) || !resume_.DialDue(n.name, now)) continue;
    const uint32_t peer =
        !chans.empty() ? forwarder_.AnyDestOn(n.initiated) : cm_.AnyPeerOn(n.initiated);
    const std::optional<cp::Endpoint> ep = directory_.Locate(peer);
    if (!ep || ep->node != n.name) continue;  // not known yet (etcd): the next tick asks again
    const LinkId link = transport_->Dial(*ep);
    if (link == kNoLink) continue;
    forwarder_.Move(n.initiated, link);
    cm_.Move(n.initiated, link);
    resume_.Unpark(n.name, true);
    resume_.Resuming(link, n.name);
    transport_->Send(link, wire::Type::kResume, 0, 0,
                     {{chans.data(), chans.size() * sizeof(uint32_t)}});
    cm_.ResendTo(n.name);  // after kResume, on the same link
  }
}

void Router::AnnounceHandover() {
  if (!transport_) return;
  size_t n = 0;
  for (const LinkView& l : transport_->Links()) {
    if (std::strcmp(l.state, "ready") != 0) continue;
    transport_->Send(l.id, wire::Type::kHandingOver, 0, 0, {});
    ++n;
  }
  transport_->FlushNow();
  if (n != 0) spdlog::info("told {} links that a successor resumes their channels", n);
}

}  // namespace ff::router
