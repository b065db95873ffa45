#include "loopback_transport.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ff::router {

// One router's end of the network. Its handler runs on its own loop, woken by an eventfd
// that any thread may write; nothing is delivered while net_.mu_ is held.
class LoopbackNetwork::Transport final : public NodeTransport {
 public:
  Transport(LoopbackNetwork& net, cp::Endpoint self) : net_(net), self_(std::move(self)) {}

  ~Transport() override {
    std::lock_guard<std::mutex> g(net_.mu_);
    std::vector<LinkId> mine;
    for (auto& [id, l] : net_.links_)
      if (l.owner == this) mine.push_back(id);
    for (LinkId id : mine) net_.BreakLocked(id, "peer router went away");
    net_.transports_.erase(this);
    net_.notices_.erase(this);
  }

  bool Start(EventLoop& loop, Handler& handler, std::string* error) override {
    handler_ = &handler;
    wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake_ || loop.Watch(wake_.get(), EPOLLIN, [this](uint32_t) { Pump(); }) == 0) {
      *error = std::string("loopback transport: ") + std::strerror(errno);
      return false;
    }
    std::lock_guard<std::mutex> g(net_.mu_);
    net_.transports_.insert(this);
    return true;
  }

  LinkId Dial(const cp::Endpoint& ep) override {
    std::lock_guard<std::mutex> g(net_.mu_);
    for (auto& [id, l] : net_.links_)
      if (l.owner == this && l.dialled && net_.links_.at(l.peer).owner->At(ep)) return id;
    auto target = std::find_if(net_.transports_.begin(), net_.transports_.end(),
                               [&](Transport* t) { return t != this && t->At(ep); });
    if (target == net_.transports_.end()) return kNoLink;
    const LinkId mine = net_.next_link_++;
    const LinkId theirs = net_.next_link_++;
    net_.links_[mine] = LinkState{this, theirs, true};
    net_.links_[theirs] = LinkState{*target, mine, false};
    return mine;
  }

  size_t LinkCount() const override {
    std::lock_guard<std::mutex> g(net_.mu_);
    return static_cast<size_t>(
        std::count_if(net_.links_.begin(), net_.links_.end(),
                      [&](const auto& l) { return l.second.owner == this; }));
  }

  std::vector<LinkView> Links() const override {
    std::lock_guard<std::mutex> g(net_.mu_);
    std::vector<LinkView> out;
    for (const auto& [id, l] : net_.links_) {
      if (l.owner != this) continue;
      auto peer = net_.links_.find(l.peer);
      LinkView v;
      v.id = id;
      v.peer = peer == net_.links_.end() ? "" : peer->second.owner->self_.node;
      v.dialled = l.dialled;
      v.state = "ready";
      v.queued_bytes = l.owed;
      out.push_back(std::move(v));
    }
    return out;
  }

  // The in-memory network keeps no totals: the router's metrics tests use TCP links.
  std::vector<PeerView> Peers() const override { return {}; }

  std::string PeerNode(LinkId link) const override {
    std::lock_guard<std::mutex> g(net_.mu_);
    auto it = net_.links_.find(link);
    if (it == net_.links_.end() || it->second.owner != this) return "";
    auto peer = net_.links_.find(it->second.peer);
    return peer == net_.links_.end() ? "" : peer->second.owner->self_.node;
  }

  bool Dialled(LinkId link) const override {
    std::lock_guard<std::mutex> g(net_.mu_);
    auto it = net_.links_.find(link);
    return it != net_.links_.end() && it->second.owner == this && it->second.dialled;
  }

  void Send(LinkId link, wire::Type type, uint32_t chan, uint16_t flags,
            std::initializer_list<Bytes> parts) override {
    Message m{type, chan, flags, {}};
    for (const Bytes& b : parts) {
      const char* p = static_cast<const char*>(b.data);
      m.body.insert(m.body.end(), p, p + b.len);
    }
    std::lock_guard<std::mutex> g(net_.mu_);
    auto it = net_.links_.find(link);
    if (it == net_.links_.end() || it->second.owner != this) return;
    LinkState& peer = net_.links_.at(it->second.peer);
    it->second.owed += m.body.size() + sizeof(wire::FrameHeader);
    if (it->second.owed >= net_.high_water_) it->second.over_high = true;
    peer.inbox.push_back(std::move(m));
    ++net_.sent_;
    net_.SignalLocked(peer.owner);
  }

  bool Congested(LinkId link) const override {
    std::lock_guard<std::mutex> g(net_.mu_);
    auto it = net_.links_.find(link);
    return it != net_.links_.end() && it->second.owed >= net_.high_water_;
  }

  void Resume(LinkId link) override {
    std::lock_guard<std::mutex> g(net_.mu_);
    auto it = net_.links_.find(link);
    if (it == net_.links_.end() || it->second.owner != this) return;
    it->second.held = false;
    net_.SignalLocked(this);
  }

  bool At(const cp::Endpoint& ep) const {
    return self_.address == ep.address && self_.port == ep.port;
  }
  const std::string& node() const { return self_.node; }
  void Wake() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
  }
  bool paused = false;  // guarded by net_.mu_

 private:
  // Runs on the loop: notices first, then messages, a bounded number per turn.
  void Pump() {
    uint64_t v;
    [[maybe_unused]] ssize_t n = ::read(wake_.get(), &v, sizeof(v));
    std::vector<Notice> notices;
    std::vector<LinkId> ready;
    {
      std::lock_guard<std::mutex> g(net_.mu_);
      notices.swap(net_.notices_[this]);
      for (auto& [id, l] : net_.links_)
        if (!paused && l.owner == this && !l.held && !l.inbox.empty()) ready.push_back(id);
    }
    for (const Notice& notice : notices) {
      if (notice.down) {
        handler_->OnLinkDown(notice.link, notice.why);
      } else {
        handler_->OnDrained(notice.link);
      }
    }
    int budget = kLoopbackPumpBudget;
    for (LinkId link : ready) {
      while (budget > 0 && DeliverOne(link)) --budget;
    }
    if (budget == 0) Wake();  // more to do: come back after the loop's other work
  }

  // Offers the front message of `link` to the handler. false: nothing more to deliver now.
  bool DeliverOne(LinkId link) {
    Message m;
    {
      std::lock_guard<std::mutex> g(net_.mu_);
      auto it = net_.links_.find(link);
      if (paused || it == net_.links_.end() || it->second.held || it->second.inbox.empty())
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
    // Taken: the sender owes that much less; tell it once it drained.
    auto sender = net_.links_.find(it->second.peer);
    if (sender == net_.links_.end()) return true;
    LinkState& s = sender->second;
    s.owed -= std::min(s.owed, m.body.size() + sizeof(wire::FrameHeader));
    if (s.over_high && s.owed < net_.high_water_ / 2) {
      s.over_high = false;
      net_.notices_[s.owner].push_back(Notice{sender->first, false, ""});
      net_.SignalLocked(s.owner);
    }
    return true;
  }

  LoopbackNetwork& net_;
  cp::Endpoint self_;
  Handler* handler_ = nullptr;
  UniqueFd wake_;
};

std::unique_ptr<NodeTransport> LoopbackNetwork::Attach(cp::Endpoint self) {
  return std::make_unique<Transport>(*this, std::move(self));
}

void LoopbackNetwork::SignalLocked(Transport* t) { t->Wake(); }

// Removes both ends of the link; each end's owner that is still attached hears of it.
void LoopbackNetwork::BreakLocked(LinkId link, const std::string& why) {
  auto it = links_.find(link);
  if (it == links_.end()) return;
  const LinkId peer = it->second.peer;
  for (LinkId id : {link, peer}) {
    auto l = links_.find(id);
    if (l == links_.end()) continue;
    Transport* owner = l->second.owner;
    links_.erase(l);
    if (transports_.count(owner) == 0) continue;
    notices_[owner].push_back(Notice{id, true, why});
    SignalLocked(owner);
  }
}

void LoopbackNetwork::Sever(const std::string& a, const std::string& b) {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<LinkId> cut;
  for (auto& [id, l] : links_) {
    if (!l.dialled) continue;
    const std::string& from = l.owner->node();
    const std::string& to = links_.at(l.peer).owner->node();
    if ((from == a && to == b) || (from == b && to == a)) cut.push_back(id);
  }
  for (LinkId id : cut) BreakLocked(id, "link severed by the test");
}

void LoopbackNetwork::Pause(const std::string& node, bool paused) {
  std::lock_guard<std::mutex> g(mu_);
  for (Transport* t : transports_) {
    if (t->node() != node) continue;
    t->paused = paused;
    if (!paused) SignalLocked(t);
  }
}

uint64_t LoopbackNetwork::messages_sent() const {
  std::lock_guard<std::mutex> g(mu_);
  return sent_;
}

}  // namespace ff::router
