#include "pods/pod_gate.h"

#include <poll.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <optional>

#include "freeflow/clock.h"
#include "freeflow/tunables.h"

namespace ff::router {
namespace {

// The gate yields to the thread that serves pods and links when both want a CPU; the
// threads it starts to enter namespaces inherit this.
constexpr int kGateNice = 10;
constexpr uint64_t kGateTickNs = 100'000'000;
// How long the gate sleeps while the loop has not taken what it identified.
constexpr int kOutboxWaitMs = 1;

// The inode of the network namespace the peer of `sock` was in when it connected (0 when it
// cannot be told): the line it waits in, not an identity.
uint64_t NetnsOfPeer(int sock) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.pid <= 0) return 0;
  char path[48];
  std::snprintf(path, sizeof(path), "/proc/%d/ns/net", static_cast<int>(cred.pid));
  struct stat st {};
  return ::stat(path, &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

}  // namespace

bool HungUpSilently(int sock) {
  pollfd p{sock, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) != 1 || (p.revents & (POLLHUP | POLLRDHUP)) == 0) return false;
  char byte;
  return ::recv(sock, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;  // nothing queued before the end
}

std::optional<PodGate::Identified> IdentifyClient(IdentityResolver& identity, UniqueFd sock) {
  // Identifying a probe would cost a thread and a namespace switch, and refusing it (it is
  // in the node's network) a warning every few seconds; it wants no answer.
  if (HungUpSilently(sock.get())) {
    spdlog::debug("a client connected and hung up without a word (a probe)");
    return std::nullopt;
  }
  PodGate::Identified c;
  c.sock = std::move(sock);
  if (!identity.Resolve(c.sock.get(), &c.who, &c.error)) {
    if (HungUpSilently(c.sock.get())) {
      spdlog::debug("a client hung up without a word while it was being identified (a probe)");
      return std::nullopt;
    }
    if (c.error.empty()) c.error = "it could not be identified";
  }
  return c;
}

PodGate::PodGate(IdentityResolver& identity, Options options)
    : identity_(identity), options_(std::move(options)) {
  if (!options_.line_of) options_.line_of = NetnsOfPeer;
}

PodGate::~PodGate() {
  if (thread_.joinable()) {
    loop_.Stop();
    thread_.join();
  }
  acceptor_.Stop();
  std::lock_guard<std::mutex> lock(outbox_->mu);
  outbox_->open = false;
  outbox_->deliver = nullptr;
  outbox_->ready.clear();
}

bool PodGate::Start(int listening, EventLoop& deliver_to, OnIdentified on_identified,
                    std::string* error) {
  deliver_to_ = &deliver_to;
  outbox_->deliver = std::move(on_identified);
  int err = loop_.Init();
  if (err == 0) {
    err = acceptor_.Start(loop_, listening, kAcceptBurst, "pod socket",
                          [this](UniqueFd c) { OnAccepted(std::move(c)); });
  }
  if (err == 0) {
    err = tick_.Start(loop_, [this] {
      acceptor_.Resume();
      accept_paused_.store(acceptor_.paused());
      tick_.Arm(kGateTickNs);
    });
  }
  if (err != 0) {
    *error = std::string("cannot watch the pod socket: ") + std::strerror(err);
    return false;
  }
  tick_.Arm(kGateTickNs);
  try {
    thread_ = std::thread([this] { Run(); });
  } catch (const std::system_error& e) {
    *error = std::string("cannot start the pod socket's thread: ") + e.what();
    return false;
  }
  return true;
}

void PodGate::Run() {
  ::pthread_setname_np(::pthread_self(), "ffr-pod-gate");
  // Per thread on Linux: the gate's thread only.
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kGateNice);
  while (!loop_.stopped()) {
    // Take what the backlog holds between two identifications: a newcomer of another
    // namespace gets its turn after at most one of each namespace before it.
    const bool can_identify = total_ > 0 && !OutboxFull();
    loop_.RunOnce(can_identify ? 0 : (total_ > 0 ? kOutboxWaitMs : -1));
    if (total_ > 0 && !OutboxFull()) IdentifyNext();
  }
}

void PodGate::OnAccepted(UniqueFd sock) {
  if (total_ >= kMaxUnidentifiedClients) MakeRoom();
  const uint64_t ns = options_.line_of(sock.get());
  std::deque<Waiting>& line = by_netns_[ns];
  if (line.empty()) turns_.push_back(ns);
  line.push_back({std::move(sock), MonotonicNs()});
  ++total_;
  waiting_.store(total_);
}

// Closes the oldest connection of the namespace with the most waiting.
void PodGate::MakeRoom() {
  auto busiest = by_netns_.end();
  for (auto it = by_netns_.begin(); it != by_netns_.end(); ++it) {
    if (busiest == by_netns_.end() || it->second.size() > busiest->second.size()) busiest = it;
  }
  if (busiest == by_netns_.end()) return;
  const uint64_t ns = busiest->first;
  const size_t held = busiest->second.size();
  busiest->second.pop_front();
  if (busiest->second.empty()) {
    by_netns_.erase(busiest);
    std::erase(turns_, ns);
  }
  --total_;
  waiting_.store(total_);
  evicted_.fetch_add(1);
  uint64_t held_back = 0;
  if (evict_log_.Allow(&held_back)) {
    spdlog::warn(
        "pod socket: closing a connection not identified yet for a newer one, of network "
        "namespace {} ({} waiting, {} of that namespace; {} more since the last line)",
        ns, total_ + 1, held, held_back);
  }
}

void PodGate::IdentifyNext() {
  const uint64_t ns = turns_.front();
  turns_.pop_front();
  auto line = by_netns_.find(ns);
  Waiting w = std::move(line->second.front());
  line->second.pop_front();
  if (line->second.empty()) {
    by_netns_.erase(line);
  } else {
    turns_.push_back(ns);
  }
  --total_;
  waiting_.store(total_);
  if (MonotonicNs() - w.since_ns > options_.stale_ns) {
    uint64_t held_back = 0;
    if (stale_log_.Allow(&held_back)) {
      spdlog::warn(
          "pod socket: closing a connection that waited over {} ms to be identified ({} "
          "waiting; {} more since the last line)",
          options_.stale_ns / 1'000'000, total_, held_back);
    }
    return;
  }
  if (std::optional<Identified> c = IdentifyClient(identity_, std::move(w.sock)))
    Deliver(std::move(*c));
}

void PodGate::Deliver(Identified id) {
  std::lock_guard<std::mutex> lock(outbox_->mu);
  outbox_->ready.push_back(std::move(id));
  if (outbox_->ready.size() > 1) return;  // already posted
  deliver_to_->Post([outbox = outbox_] {
    std::deque<Identified> ready;
    OnIdentified deliver;
    {
      std::lock_guard<std::mutex> lock(outbox->mu);
      ready.swap(outbox->ready);
      if (!outbox->open) return;
      deliver = outbox->deliver;
    }
    for (Identified& r : ready) deliver(std::move(r));
  });
}

bool PodGate::OutboxFull() {
  std::lock_guard<std::mutex> lock(outbox_->mu);
  return outbox_->ready.size() >= kMaxIdentifiedInFlight;
}

}  // namespace ff::router
