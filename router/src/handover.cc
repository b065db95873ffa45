// The router hand-over, both sides (docs/handover.md). Version 1 carries the host folder's
// lock and pod socket, every pod session, its quotas and its objects (same-node verbs); a
// router that holds anything else refuses, and the new one exits with the reason while the
// old one serves on.
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/handover_state.h"
#include "base/table_store.h"
#include "freeflow/clock.h"
#include "identity/router_peer.h"
#include "router.h"

namespace ff::router {
namespace {

constexpr int kExchangeTimeoutS = 10;  // each step of the exchange, either side
constexpr unsigned kAskAgainS = 2;     // a successor that waits asks this often
constexpr size_t kMaxStateBytes = 1u << 30;

std::string HandoverName(const std::string& dir, const std::string& name) {
  return "freeflow-handover:" + dir + "/" + name;
}

socklen_t AbstractAddress(const std::string& name, sockaddr_un* sa) {
  *sa = sockaddr_un{};
  sa->sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(sa->sun_path) - 1);
  std::memcpy(sa->sun_path + 1, name.data(), n);  // sun_path[0] == 0: abstract
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

void Timeouts(int sock) {
  const timeval tv{kExchangeTimeoutS, 0};
  ::setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace

bool Router::ListenForSuccessor(std::string* error) {
  sockaddr_un sa;
  const socklen_t len = AbstractAddress(HandoverName(config_.dir, config_.name), &sa);
  successor_listen_.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!successor_listen_ ||
      ::bind(successor_listen_.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0 ||
      ::listen(successor_listen_.get(), 1) != 0) {
    *error = std::string("cannot listen for a successor: ") + std::strerror(errno);
    return false;
  }
  successor_watch_ =
      loop_.Watch(successor_listen_.get(), EPOLLIN, [this](uint32_t) { OnSuccessor(); });
  return successor_watch_ != 0;
}

std::string Router::WhyNoHandover(uint32_t version) const {
  if (!RouterTables().movable())
    return "its tables are sealed memfds (" + RouterTables().why_not() + ")";
  if (std::string why = cm_.WhyNotMovable(version); !why.empty()) return why;
  if (std::string why = sockets_.WhyNotMovable(version); !why.empty()) return why;
  if (version < 4) {
    if (direct_.size() != 0 || listeners_.open() != 0) return "it holds direct connections";
    if (forwarder_.proxies() != 0 || forwarder_.resolving() != 0 || executor_.senders() != 0)
      return "it holds channels to other nodes";
  } else if (transport_) {
    if (listeners_.open() != 0 || direct_.asking() != 0)
      return "direct connections to other nodes are being made";
    if (std::string why = forwarder_.WhyNotMovable(*transport_); !why.empty()) return why;
    if (std::string why = executor_.WhyNotMovable(); !why.empty()) return why;
    if (!resume_.empty()) return "channels of another node's replaced router wait for it";
  }
  bool pending = false;
  tables_.ForEachPod(
      [&](const Pod& p) { pending = pending || quotas_.held(p.id, Quota::kPending) != 0; });
  if (pending) return "requests wait for other nodes";
  return "";
}

void Router::OnSuccessor() {
  UniqueFd sock(::accept4(successor_listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!sock) return;
  std::string why;
  if (!TrustedRouterPeer(sock.get(), &why)) {
    spdlog::warn("refused a connection to the hand-over socket: {}", why);
    return;
  }
  if (successor_) {  // one at a time: the first is about to be served
    spdlog::warn("refused a connection to the hand-over socket: another successor asked first");
    return;
  }
  Timeouts(sock.get());
  successor_ = std::move(sock);
}

void Router::ServeSuccessor() {
  // Not from OnSuccessor: the callbacks after it in the same turn, and the work they and
  // those before it deferred, would run on this router after its state had moved (a pod's
  // request read here after the export, an rdma_cm message delivered here): the pods would
  // see answers the successor knows nothing of.
  UniqueFd sock = std::move(successor_);
  if (HandOver(sock.get())) {
    handed_over_ = true;
    // Kept open: the successor binds the node's ports (metrics, node links) once it ends,
    // which must be after this router has closed them (main.cc).
    handed_over_end_ = std::move(sock);
    loop_.Stop();
  }
}

bool Router::HandOver(int sock) {
  HandoverMessage hello;
  if (ReceiveHandoverMessage(sock, &hello) != 0 || hello.type != HandoverType::kHello) return false;
  const uint64_t version = std::min<uint64_t>(hello.b, kHandoverVersionHigh);
  std::string why;
  if (version < hello.a || version < kHandoverVersionLow)
    why = "it speaks hand-over versions " + std::to_string(kHandoverVersionLow) + "-" +
          std::to_string(kHandoverVersionHigh);
  else
    why = WhyNoHandover(static_cast<uint32_t>(version));
  if (!why.empty()) {
    spdlog::info("a successor asked for this router's state: refused, {}", why);
    SendHandoverMessage(sock, {HandoverType::kRefuse, 0, 0, why});
    return false;
  }
  const uint64_t start = MonotonicNs();
  sessions_.StopGate();
  HandoverState state;
  try {
    state.doc["folder"] = {{"lock", state.PutFd(folder_.lock_fd())},
                           {"listen", state.PutFd(sessions_.listening_fd())},
                           {"socket_ino", folder_.socket_ino()}};
    if (version >= 4 && transport_) {  // before the tables: it changes them
      forwarder_.LoseUdLinks();        // UD keeps no channel: its libraries link again
      executor_.LoseUdSenders();
    }
    quotas_.Export(state);
    tables_.Export(state);
    sessions_.Export(state);
    if (version >= 2) cm_.Export(state);
    if (version >= 3) sockets_.Export(state);
    if (version >= 4 && transport_) {
      state.doc["nodes"] = {{"direct", direct_.Export()},
                            {"forwarder", forwarder_.Export(*transport_)},
                            {"executor", executor_.Export(*transport_)}};
      AnnounceHandover();  // the peers park these channels for the successor when links end
    }
  } catch (const HandoverError& e) {  // a segment that cannot be reopened (MappedFile)
    spdlog::error("a successor asked for this router's state: refused, {}", e.what());
    SendHandoverMessage(sock, {HandoverType::kRefuse, 0, 0, e.what()});
    if (std::string error; !sessions_.RestartGate(&error))
      spdlog::error("cannot take pods' connections again: {}", error);
    return false;
  }
  HandoverMessage reply;
  const bool sent = SendHandoverMessage(sock, {HandoverType::kAccept, version, 0, ""}) == 0 &&
                    state.Send(sock) == 0;
  if (sent && ReceiveHandoverMessage(sock, &reply) == 0 && reply.type == HandoverType::kServing) {
    spdlog::info("handed over to a successor: {} sessions, {} descriptors, paused {} ms",
                 sessions_.count(), state.fds(), (MonotonicNs() - start) / 1'000'000);
    return true;
  }
  spdlog::error("the hand-over failed ({}); serving on",
                reply.type == HandoverType::kFailed ? reply.text : "the successor went away");
  if (std::string error; !sessions_.RestartGate(&error))
    spdlog::error("cannot take pods' connections again: {}", error);
  return false;
}

bool Router::TakeOverOrWait(bool* took_over, std::string* error) {
  const uint64_t deadline = MonotonicNs() + uint64_t{config_.take_over_wait_s} * 1'000'000'000;
  std::string said;
  for (;;) {
    bool retry = false;
    if (TakeOver(error, &retry)) {
      *took_over = true;
      return true;
    }
    if (!retry || MonotonicNs() >= deadline) return false;
    if (*error != said) {  // each new reason once
      spdlog::warn("{}; asking again every {} s", *error, kAskAgainS);
      said = *error;
    }
    ::sleep(kAskAgainS);
    if (folder_.Take(config_.dir, config_.name, config_.library_source, error)) {
      spdlog::info("the router that served {} stopped: starting as the first one",
                   folder_.socket_path());
      return true;
    }
    if (!folder_.held_by_another()) return false;
  }
}

bool Router::TakeOver(std::string* error, bool* retry) {
  const std::string held = *error;
  *retry = true;
  sockaddr_un sa;
  const socklen_t len = AbstractAddress(HandoverName(config_.dir, config_.name), &sa);
  UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock || ::connect(sock.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    *error = held + " (and it takes no hand-over: " + std::strerror(errno) + ")";
    return false;
  }
  Timeouts(sock.get());
  HandoverMessage m;
  if (SendHandoverMessage(
          sock.get(), {HandoverType::kHello, kHandoverVersionLow, kHandoverVersionHigh, ""}) != 0 ||
      ReceiveHandoverMessage(sock.get(), &m) != 0) {
    *error = held + " (the hand-over broke off)";
    return false;
  }
  if (m.type == HandoverType::kRefuse) {
    *error = held + ", which refuses to hand over: " + m.text;
    return false;
  }
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  HandoverState state;
  std::string why;
  if (m.type == HandoverType::kAccept &&
      (m.a < kHandoverVersionLow || m.a > kHandoverVersionHigh)) {
    *error = held + ": it chose hand-over version " + std::to_string(m.a) + ", not one of " +
             std::to_string(kHandoverVersionLow) + "-" + std::to_string(kHandoverVersionHigh);
    return false;
  }
  if (m.type != HandoverType::kAccept ||
      state.Receive(sock.get(), files.rlim_cur > 256 ? files.rlim_cur - 128 : 128, kMaxStateBytes,
                    &why) != 0) {
    *error = held + ": its state did not come (" + why + ")";
    return false;
  }
  *retry = false;  // what comes next is taken, and not given back if it fails
  try {
    const nlohmann::json& f = HandoverState::Object(state.doc, "folder");
    UniqueFd lock = state.TakeFd(f.at("lock"), FdKind::kSocket);
    UniqueFd listen = state.TakeFd(f.at("listen"), FdKind::kSocket);
    quotas_.Import(state);
    tables_.Import(state);
    sessions_.Import(state, config_.overlay);
    const uint64_t now = MonotonicNs();
    cm_.Import(state, resume_, now);
    sockets_.Import(state);
    if (const auto nodes = state.doc.find("nodes"); nodes != state.doc.end()) {
      if (!transport_)
        throw HandoverError("it has channels to other nodes, and this router no links");
      direct_.Import(HandoverState::Object(*nodes, "direct"),
                     [this](PodId pod) { return sessions_.Identity(pod) != nullptr; });
      forwarder_.Import(HandoverState::Object(*nodes, "forwarder"), resume_, now);
      executor_.Import(HandoverState::Object(*nodes, "executor"), resume_, now);
    }
    if (state.untaken() != 0) throw HandoverError("descriptors no record names");
    if (!folder_.Adopt(std::move(lock), HandoverState::U64(f, "socket_ino"), config_.library_source,
                       &why) ||
        !sessions_.Listen(std::move(listen), &why))
      throw HandoverError(why);
  } catch (const std::exception& e) {  // HandoverError, or a record nlohmann could not read
    SendHandoverMessage(sock.get(), {HandoverType::kFailed, 0, 0, e.what()});
    *error = std::string("the old router's state is refused: ") + e.what();
    return false;
  }
  SendHandoverMessage(sock.get(), {HandoverType::kServing, 0, 0, ""});
  // The old router now closes everything it held (its admin socket, metrics and node ports
  // among them, which Start binds next); the end of this socket says it has.
  char end;
  while (::recv(sock.get(), &end, 1, 0) > 0) {
  }
  spdlog::info("took over {} sessions from the router that served {}", sessions_.count(),
               folder_.socket_path());
  return true;
}

}  // namespace ff::router
