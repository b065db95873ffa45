// cm_rate with several connections in flight (IN_FLIGHT > 1), the way a program that opens
// connections to many peers or a pool does, and the way rdma_cm's own rate tool (cmtime)
// measures: the client keeps IN_FLIGHT connections going at once, each through every step
// of the one-at-a-time mode, and starts a new one as soon as one ends. TCP the same way:
// non-blocking connects, the client's shutdown, the server's close, both closed.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cm_rate.h"

namespace cmrate {
namespace {

using cmtest::NowMs;

// One rdma_cm connection of the client in flight: the id's context.
struct RdmaConn {
  double start_ms = 0;
};

// Starts one connection: create the id, resolve the address. 0 or 1.
int RdmaStart(rdma_event_channel* ch, const sockaddr_in& dst, RdmaConn* conn) {
  rdma_cm_id* id = nullptr;
  conn->start_ms = NowMs();
  if (rdma_create_id(ch, &id, conn, RDMA_PS_TCP) != 0) {
    std::fprintf(stderr, "rdma_create_id: %s\n", std::strerror(errno));
    return 1;
  }
  sockaddr_in to = dst;
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&to), 2000) != 0) {
    std::fprintf(stderr, "rdma_resolve_addr: %s\n", std::strerror(errno));
    rdma_destroy_id(id);
    return 1;
  }
  return 0;
}

// Moves a connection on by the event it got: 0, 1 on failure, 2 when it ended (the event
// must then be acked before its id is destroyed: `*ended` says which id).
int RdmaStep(RdmaClient* c, rdma_cm_event* ev, rdma_cm_id** ended) {
  rdma_cm_id* id = ev->id;
  switch (ev->event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      if (rdma_resolve_route(id, 2000) == 0) return 0;
      std::fprintf(stderr, "rdma_resolve_route: %s\n", std::strerror(errno));
      return 1;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: {
      if (c->pd == nullptr && OpenPdCq(id->verbs, &c->pd, &c->cq) != 0) return 1;
      rdma_conn_param p = cmtest::ConnParam(nullptr, 0);
      if (cmtest::MakeQp(id, c->pd, c->cq) != 0) return 1;
      if (rdma_connect(id, &p) == 0) return 0;
      std::fprintf(stderr, "rdma_connect: %s\n", std::strerror(errno));
      return 1;
    }
    case RDMA_CM_EVENT_ESTABLISHED:
      if (rdma_disconnect(id) == 0) return 0;
      std::fprintf(stderr, "rdma_disconnect: %s\n", std::strerror(errno));
      return 1;
    case RDMA_CM_EVENT_DISCONNECTED:
      *ended = id;
      return 2;
    default:
      std::fprintf(stderr, "client: unexpected %s (status %d)\n", rdma_event_str(ev->event),
                   ev->status);
      return 1;
  }
}

}  // namespace

int OpenPdCq(ibv_context* verbs, ibv_pd** pd, ibv_cq** cq) {
  *pd = ibv_alloc_pd(verbs);
  *cq = *pd != nullptr ? ibv_create_cq(verbs, 16, nullptr, nullptr, 0) : nullptr;
  if (*cq != nullptr) return 0;
  std::fprintf(stderr, "PD/CQ: %s\n", std::strerror(errno));
  return 1;
}

int RdmaWindow(RdmaClient* c, int count, int in_flight, std::vector<double>* each) {
  std::vector<RdmaConn> conns(static_cast<size_t>(in_flight));
  std::vector<RdmaConn*> idle;
  for (RdmaConn& conn : conns) idle.push_back(&conn);
  int started = 0, done = 0;
  while (done < count) {
    while (started < count && !idle.empty()) {
      if (RdmaStart(c->ch, c->dst, idle.back()) != 0) return 1;
      idle.pop_back();
      ++started;
    }
    rdma_cm_event* ev = nullptr;
    if (const int err = cmtest::NextEvent(c->ch, kStepMs, &ev)) {
      std::fprintf(stderr, "client: no event (%s) with %d of %d connections done\n",
                   std::strerror(err), done, count);
      return 1;
    }
    rdma_cm_id* ended = nullptr;
    const int st = RdmaStep(c, ev, &ended);
    rdma_ack_cm_event(ev);
    if (st == 1) return 1;
    if (ended == nullptr) continue;
    auto* conn = static_cast<RdmaConn*>(ended->context);
    rdma_destroy_qp(ended);
    rdma_destroy_id(ended);
    each->push_back(NowMs() - conn->start_ms);
    idle.push_back(conn);
    ++done;
  }
  return 0;
}

namespace {

// Watches `fd` in `ep` for `events`, adding it or changing what is watched: 0 or errno.
int Watch(int ep, int fd, uint32_t events, bool add) {
  epoll_event e{};
  e.events = events;
  e.data.fd = fd;
  return ::epoll_ctl(ep, add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &e) == 0 ? 0 : errno;
}

// One TCP connection of the client in flight, by its descriptor.
struct TcpConn {
  double start_ms = 0;
  bool connected = false;
};

// Starts a non-blocking connect: 0 or 1.
int TcpStart(int ep, const sockaddr_in& dst, std::vector<TcpConn>* conns) {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (s < 0) {
    std::fprintf(stderr, "socket: %s\n", std::strerror(errno));
    return 1;
  }
  if (static_cast<size_t>(s) >= conns->size()) conns->resize(static_cast<size_t>(s) + 1);
  (*conns)[static_cast<size_t>(s)] = TcpConn{NowMs(), false};
  const bool now = ::connect(s, reinterpret_cast<const sockaddr*>(&dst), sizeof(dst)) == 0;
  if (!now && errno != EINPROGRESS) {
    std::fprintf(stderr, "connect: %s\n", std::strerror(errno));
    ::close(s);
    return 1;
  }
  return Watch(ep, s, EPOLLOUT, true) == 0 ? 0 : 1;
}

// A connected socket shuts its side down and waits for the server's close: 0 or 1.
int TcpConnected(int ep, int s, TcpConn* conn) {
  int err = 0;
  socklen_t len = sizeof(err);
  if (::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
    std::fprintf(stderr, "connect: %s\n", std::strerror(err != 0 ? err : errno));
    return 1;
  }
  conn->connected = true;
  ::shutdown(s, SHUT_WR);
  return Watch(ep, s, EPOLLIN, false) == 0 ? 0 : 1;
}

}  // namespace

int TcpWindow(const sockaddr_in& dst, int count, int in_flight, std::vector<double>* each) {
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  std::vector<TcpConn> conns;
  int started = 0, done = 0, open = 0, st = 0;
  while (st == 0 && done < count) {
    for (; st == 0 && started < count && open < in_flight; ++started, ++open)
      st = TcpStart(ep, dst, &conns);
    epoll_event evs[64];
    const int n = st == 0 ? ::epoll_wait(ep, evs, 64, kStepMs) : 0;
    if (st == 0 && n <= 0) {
      std::fprintf(stderr, "client: nothing happened for %d ms (%d of %d done)\n", kStepMs, done,
                   count);
      st = 1;
    }
    for (int i = 0; st == 0 && i < n; ++i) {
      const int s = evs[i].data.fd;
      TcpConn& conn = conns[static_cast<size_t>(s)];
      if (!conn.connected) {
        st = TcpConnected(ep, s, &conn);
        continue;
      }
      char b;
      if (::read(s, &b, 1) != 0) {
        std::fprintf(stderr, "waiting for the server's close: %s\n", std::strerror(errno));
        st = 1;
        continue;
      }
      ::close(s);  // also leaves the epoll set
      each->push_back(NowMs() - conn.start_ms);
      --open;
      ++done;
    }
  }
  ::close(ep);
  return st;
}

int TcpServeWindow(int listener, int count) {
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  ::fcntl(listener, F_SETFL, ::fcntl(listener, F_GETFL) | O_NONBLOCK);
  int st = Watch(ep, listener, EPOLLIN, true) == 0 ? 0 : 1;
  int done = 0;
  while (st == 0 && done < count) {
    epoll_event evs[64];
    const int n = ::epoll_wait(ep, evs, 64, 60000);
    if (n <= 0) {
      std::fprintf(stderr, "server: nothing for 60 s after %d connections\n", done);
      st = 1;
    }
    for (int i = 0; st == 0 && i < n; ++i) {
      const int s = evs[i].data.fd;
      if (s == listener) {
        int a;
        while (st == 0 && (a = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK)) >= 0)
          st = Watch(ep, a, EPOLLIN, true) == 0 ? 0 : 1;
        continue;
      }
      char b;
      const ssize_t got = ::read(s, &b, 1);  // the client's shutdown
      if (got < 0 && errno == EAGAIN) continue;
      ::close(s);
      if (got != 0) {
        std::fprintf(stderr, "server: a connection did not end cleanly\n");
        st = 1;
      }
      ++done;
    }
  }
  ::close(ep);
  return st;
}

}  // namespace cmrate
