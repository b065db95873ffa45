#include "pods/event_backlog.h"

#include <fcntl.h>
#include <sys/socket.h>

#include <cerrno>

#include "freeflow/tunables.h"

namespace ff::router {

bool EventBacklog::KeyOf(const proto::Event& e, Key* key) {
  using T = proto::EventType;
  const auto type = static_cast<uint32_t>(e.type);
  switch (e.type) {
    case T::kUdRing:  // the ring's sender now
      *key = {type, e.qpn, e.ring, 0, 0};
      return true;
    case T::kUdPeerLost:  // the link from `qpn` to that destination is gone
      *key = {type, e.qpn, e.src_ip, e.src_qpn, 0};
      return true;
    case T::kPeerGone:
    case T::kPeerClosed:
    case T::kPeerNamed:
    case T::kProxyDrained:
    case T::kQpRefused:
      *key = {type, e.qpn, 0, 0, 0};
      return true;
    case T::kShutdown:
      *key = {type, 0, 0, 0, 0};
      return true;
    default:  // direct connections and their channels: each one says something of its own
      return false;
  }
}

bool EventBacklog::Push(const proto::Event& e, int fd) {
  Key key;
  const bool keyed = KeyOf(e, &key);
  auto stale = keyed ? by_key_.find(key) : by_key_.end();
  if (stale == by_key_.end() && queue_.size() >= kMaxQueuedEvents) return false;
  UniqueFd dup;
  if (fd >= 0) {
    dup.reset(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    if (!dup) return false;
  }
  if (stale != by_key_.end()) {
    if (stale->second->fd) --fds_;
    queue_.erase(stale->second);
    by_key_.erase(stale);
    ++replaced_;
  }
  if (dup) ++fds_;
  queue_.push_back(Queued{e, std::move(dup), keyed, key});
  if (keyed) by_key_[key] = std::prev(queue_.end());
  return true;
}

int EventBacklog::Flush(int sock) {
  while (!queue_.empty()) {
    Queued& q = queue_.front();
    const int fd = q.fd.get();
    const int rc = SendWithFds(sock, &q.event, sizeof(q.event), &fd, fd >= 0 ? 1 : 0, MSG_DONTWAIT);
    if (rc != 0) return rc == EWOULDBLOCK ? EAGAIN : rc;
    if (q.keyed) by_key_.erase(q.key);
    if (q.fd) --fds_;
    queue_.pop_front();
  }
  return 0;
}

}  // namespace ff::router
