// The router's admin socket, what `ffctl` talks to (docs/metrics.md, "ffctl"): an abstract
// Unix stream socket (core's AdminSocketName) in the router's network namespace, the node's
// (host networking): pods, each in a namespace of its own, can neither see nor reach it, and
// of the processes that can, only root is answered (SO_PEERCRED). A client sends one line, a
// command and its arguments, and gets one JSON document, then the end of the connection.
// At most kMaxClients at once, a request of at most kMaxRequest bytes, kTimeoutNs each.
// Threading: the loop's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "base/event_loop.h"
#include "freeflow/fd.h"

namespace ff::router {

class AdminService {
 public:
  static constexpr size_t kMaxClients = 8;
  static constexpr size_t kMaxRequest = 1024;
  static constexpr uint64_t kTimeoutNs = 5'000'000'000;
  // The JSON document that answers a request line (without its newline).
  using Answer = std::function<std::string(const std::string& request)>;

  AdminService(EventLoop& loop, Answer answer) : loop_(loop), answer_(std::move(answer)) {}
  ~AdminService();
  AdminService(const AdminService&) = delete;
  AdminService& operator=(const AdminService&) = delete;

  // Listens on abstract socket `name`. false + *error (the name is taken, or too long).
  bool Start(const std::string& name, std::string* error);
  // Ends the clients past their deadline (the router's timer).
  void Tick(uint64_t now_ns);
  size_t clients() const { return clients_.size(); }
  uint64_t refused() const { return refused_; }  // not root, or over kMaxClients

 private:
  struct Client {
    UniqueFd fd;
    EventLoop::WatchId watch = 0;
    std::string in;
    std::string out;
    size_t sent = 0;
    uint64_t deadline_ns = 0;
  };
  void Accept();
  void OnEvents(uint64_t id, uint32_t events);
  bool Flush(Client& c);  // true when everything was sent
  void End(uint64_t id);

  EventLoop& loop_;
  Answer answer_;
  UniqueFd listen_;
  EventLoop::WatchId listen_watch_ = 0;
  std::map<uint64_t, Client> clients_;
  uint64_t next_id_ = 1;
  uint64_t refused_ = 0;
};

}  // namespace ff::router
