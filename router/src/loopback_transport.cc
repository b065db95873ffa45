#include "loopback_transport.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ff::router {
namespace {
// Messages one pump delivers before it lets the loop do other work.
constexpr int kPumpBudget = 256;
}  // namespace

// ---- the network ----------------------------------------------------------------------

void LoopbackNetwork::Register(LoopbackTransport* t) {
  std::lock_guard<std::mutex> g(mu_);
  transports_.insert(t);
}

void LoopbackNetwork::Unregister(LoopbackTransport* t) {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<LinkId> mine;
  for (auto& [id, l] : links_)
    if (l.owner == t) mine.push_back(id);
  for (LinkId id : mine) BreakLocked(id, "peer router went away");
  transports_.erase(t);
  notices_.erase(t);
}

void LoopbackNetwork::Signal(LoopbackTransport* t) {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(t->wake_.get(), &one, sizeof(one));
}

// Removes both ends of the link; each end's owner that is still registered hears of it.
void LoopbackNetwork::BreakLocked(LinkId link, const std::string& why) {
  auto it = links_.find(link);
  if (it == links_.end()) return;
  const LinkId peer = it->second.peer;
  for (LinkId id : {link, peer}) {
    auto l = links_.find(id);
    if (l == links_.end()) continue;
    LoopbackTransport* owner = l->second.owner;
    links_.erase(l);
    if (transports_.count(owner) == 0) continue;
    notices_[owner].push_back(Notice{id, true, why});
    Signal(owner);
  }
}

void LoopbackNetwork::Sever(const std::string& a, const std::string& b) {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<LinkId> cut;
  for (auto& [id, l] : links_) {
    auto peer = links_.find(l.peer);
    if (!l.dialled || peer == links_.end()) continue;
    const std::string& from = l.owner->self_.node;
    const std::string& to = peer->second.owner->self_.node;
    if ((from == a && to == b) || (from == b && to == a)) cut.push_back(id);
  }
  for (LinkId id : cut) BreakLocked(id, "link severed by the test");
}

void LoopbackNetwork::Pause(const std::string& node, bool paused) {
  std::lock_guard<std::mutex> g(mu_);
  for (LoopbackTransport* t : transports_) {
    if (t->self_.node != node) continue;
    t->paused_ = paused;
    if (!paused) Signal(t);
  }
}

uint64_t LoopbackNetwork::messages_sent() const {
  std::lock_guard<std::mutex> g(mu_);
  return sent_;
}

// ---- one router's end -------------------------------------------------------------------

LoopbackTransport::LoopbackTransport(LoopbackNetwork& net, cp::Endpoint self)
    : net_(net), self_(std::move(self)) {}

LoopbackTransport::~LoopbackTransport() { net_.Unregister(this); }

bool LoopbackTransport::Start(EventLoop& loop, Handler& handler, std::string* error) {
  loop_ = &loop;
  handler_ = &handler;
  wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_ || loop.Watch(wake_.get(), EPOLLIN, [this](uint32_t) { Pump(); }) == 0) {
    *error = std::string("loopback transport: ") + std::strerror(errno);
    return false;
  }
  net_.Register(this);
  return true;
}

LinkId LoopbackTransport::Dial(const cp::Endpoint& ep) {
  std::lock_guard<std::mutex> g(net_.mu_);
  for (auto& [id, l] : net_.links_) {
    if (l.owner != this || !l.dialled) continue;
    const LoopbackTransport* peer = net_.links_.at(l.peer).owner;
    if (peer->self_.address == ep.address && peer->self_.port == ep.port) return id;
  }
  LoopbackTransport* target = nullptr;
  for (LoopbackTransport* t : net_.transports_)
    if (t != this && t->self_.address == ep.address && t->self_.port == ep.port) target = t;
  if (target == nullptr) return kNoLink;
  const LinkId mine = net_.next_link_++;
  const LinkId theirs = net_.next_link_++;
  auto& a = net_.links_[mine];
  a.owner = this;
  a.peer = theirs;
  a.dialled = true;
  a.peer_name = target->self_.node;
  auto& b = net_.links_[theirs];
  b.owner = target;
  b.peer = mine;
  b.peer_name = self_.node;
  return mine;
}

bool LoopbackTransport::Dialled(LinkId link) const {
  std::lock_guard<std::mutex> g(net_.mu_);
  auto it = net_.links_.find(link);
  return it != net_.links_.end() && it->second.owner == this && it->second.dialled;
}

std::string LoopbackTransport::PeerName(LinkId link) const {
  std::lock_guard<std::mutex> g(net_.mu_);
  auto it = net_.links_.find(link);
  return it == net_.links_.end() ? "?" : it->second.peer_name;
}

void LoopbackTransport::Send(LinkId link, wire::Type type, uint32_t chan, uint16_t flags,
                             std::initializer_list<Bytes> parts) {
  LoopbackNetwork::Message m{type, chan, flags, {}};
  for (const Bytes& b : parts) {
    const char* p = static_cast<const char*>(b.data);
    m.body.insert(m.body.end(), p, p + b.len);
  }
  std::lock_guard<std::mutex> g(net_.mu_);
  auto it = net_.links_.find(link);
  if (it == net_.links_.end() || it->second.owner != this) return;
  auto peer = net_.links_.find(it->second.peer);
  if (peer == net_.links_.end()) return;
  it->second.owed += m.body.size() + sizeof(wire::FrameHeader);
  if (it->second.owed >= net_.high_water_) it->second.over_high = true;
  peer->second.inbox.push_back(std::move(m));
  ++net_.sent_;
  net_.Signal(peer->second.owner);
}

bool LoopbackTransport::Congested(LinkId link) const {
  std::lock_guard<std::mutex> g(net_.mu_);
  auto it = net_.links_.find(link);
  return it != net_.links_.end() && it->second.owed >= net_.high_water_;
}

void LoopbackTransport::Resume(LinkId link) {
  std::lock_guard<std::mutex> g(net_.mu_);
  auto it = net_.links_.find(link);
  if (it == net_.links_.end() || it->second.owner != this) return;
  it->second.held = false;
  net_.Signal(this);
}

void LoopbackTransport::Pump() {
  uint64_t v;
  [[maybe_unused]] ssize_t n = ::read(wake_.get(), &v, sizeof(v));
  std::vector<LoopbackNetwork::Notice> notices;
  std::vector<LinkId> mine;
  {
    std::lock_guard<std::mutex> g(net_.mu_);
    notices.swap(net_.notices_[this]);
    if (!paused_) {
      for (auto& [id, l] : net_.links_)
        if (l.owner == this && !l.held && !l.inbox.empty()) mine.push_back(id);
    }
  }
  for (const auto& notice : notices) {
    if (notice.down) {
      handler_->OnLinkDown(notice.link, notice.why);
    } else {
      handler_->OnDrained(notice.link);
    }
  }
  int budget = kPumpBudget;
  for (LinkId link : mine) {
    while (budget > 0 && DeliverOne(link)) --budget;
  }
  if (budget == 0) {
    std::lock_guard<std::mutex> g(net_.mu_);
    net_.Signal(this);  // more to do: come back after the loop's other work
  }
}

bool LoopbackTransport::DeliverOne(LinkId link) {
  LoopbackNetwork::Message m;
  {
    std::lock_guard<std::mutex> g(net_.mu_);
    auto it = net_.links_.find(link);
    if (paused_ || it == net_.links_.end() || it->second.held || it->second.inbox.empty())
      return false;
    m = std::move(it->second.inbox.front());
    it->second.inbox.pop_front();
  }
  const NodeMessage msg{m.type, m.chan, m.flags, m.body.data(),
                        static_cast<uint32_t>(m.body.size())};
  const Handler::Verdict verdict = handler_->OnMessage(link, msg);
  std::lock_guard<std::mutex> g(net_.mu_);
  auto it = net_.links_.find(link);
  if (it == net_.links_.end()) return false;
  if (verdict == Handler::Verdict::kMalformed) {
    net_.BreakLocked(link, "malformed message from peer router");
    return false;
  }
  if (verdict == Handler::Verdict::kHold) {
    it->second.held = true;
    it->second.inbox.push_front(std::move(m));
    return false;
  }
  // Consumed: the sender owes that much less; tell it when it drained.
  auto sender = net_.links_.find(it->second.peer);
  if (sender != net_.links_.end()) {
    LoopbackNetwork::LinkState& s = sender->second;
    s.owed -= std::min(s.owed, m.body.size() + sizeof(wire::FrameHeader));
    if (s.over_high && s.owed < net_.high_water_ / 2) {
      s.over_high = false;
      net_.notices_[s.owner].push_back(LoopbackNetwork::Notice{sender->first, false, ""});
      net_.Signal(s.owner);
    }
  }
  return true;
}

}  // namespace ff::router
