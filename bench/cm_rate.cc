// Connection set-up and tear-down rate (issue 12's performance figure), rdma_cm beside TCP,
// between the same two pods. One connection at a time, as a program that connects on
// demand would, or IN_FLIGHT at a time (cm_rate_window.cc), as one that connects to many:
//   rdma_cm: create id, resolve address and route, QP, connect; the server accepts (its QP
//            made on CONNECT_REQUEST); ESTABLISHED on both sides; the client disconnects,
//            DISCONNECTED on both sides; QPs and ids destroyed;
//   TCP:     connect; the server accepts; the client shuts down its side and waits for the
//            server's close (the same two-sided tear-down); both close.
//   cm_rate rdma-server|tcp-server PORT COUNT [IN_FLIGHT]   serve COUNT connections, exit
//   cm_rate rdma-client|tcp-client IP PORT COUNT [IN_FLIGHT]
// The client makes one untimed connection first (retrying while the server is not yet
// listening), then COUNT timed ones, and prints
//   <kind> connections: COUNT in S s with W in flight, rate R per second, median one
//   connection M us
//   <kind> one connection us: p90 P p99 Q max X
// and, one at a time, the median of each rdma_cm step. One at a time, client and server
// also print the CPU time their process (all its threads) spent a connection, the client
// over its timed connections, the server over those after the warm-up:
//   <kind> client|server cpu us a connection: user U sys S
// Every wait has a deadline and a watchdog ends a process that blocks. Exit 0 or 1.
#include "cm_rate.h"

#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using cmrate::kStepMs;
using cmrate::RdmaClient;
using cmtest::Expect;
using cmtest::NowMs;

constexpr double kWarmupMs = 10000;  // how long the first connection may wait for a listener
constexpr int kBacklog = 1024;       // both servers' listen backlog: IN_FLIGHT at most

// Where a client's connection spends its time: the steps of RdmaOnce, timed for every
// connection and printed as medians with the result.
enum Step {
  kCreateId,
  kResolveAddr,
  kResolveRoute,
  kCreateQp,
  kConnect,
  kDisconnect,
  kDestroy,
  kSteps
};
constexpr const char* kStepNames[kSteps] = {
    "create_id", "resolve_addr", "resolve_route", "create_qp", "connect", "disconnect", "destroy"};
std::vector<double> g_step_ms[kSteps];
double g_lap_ms = 0;

// Ends step `s`: the time since the previous lap is charged to it.
void Lap(Step s) {
  const double now = NowMs();
  g_step_ms[s].push_back(now - g_lap_ms);
  g_lap_ms = now;
}

// The CPU time this process has used so far, user and system, in microseconds.
struct Cpu {
  double user_us = 0, sys_us = 0;
};
Cpu CpuNow() {
  rusage r{};
  ::getrusage(RUSAGE_SELF, &r);
  const auto us = [](const timeval& t) { return t.tv_sec * 1e6 + t.tv_usec; };
  return {us(r.ru_utime), us(r.ru_stime)};
}
void PrintCpu(const char* kind, const char* who, const Cpu& from, int count) {
  const Cpu to = CpuNow();
  std::printf("%s %s cpu us a connection: user %.1f sys %.1f\n", kind, who,
              (to.user_us - from.user_us) / count, (to.sys_us - from.sys_us) / count);
}

double MedianOf(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Ends a connection the client made: disconnect, DISCONNECTED, destroy.
int RdmaTearDown(RdmaClient* c, rdma_cm_id* id) {
  int st = 0;
  if (rdma_disconnect(id) != 0) {
    std::fprintf(stderr, "rdma_disconnect: %s\n", std::strerror(errno));
    st = 1;
  } else {
    st = Expect(c->ch, RDMA_CM_EVENT_DISCONNECTED, kStepMs);
  }
  Lap(kDisconnect);
  rdma_destroy_qp(id);
  rdma_destroy_id(id);
  Lap(kDestroy);
  return st;
}

// Resolves the server's address: 0, 1, or 4 when no pod has it yet (ADDR_ERROR with
// EHOSTUNREACH: the server process, started beside this one, has not reached its router).
int ResolveServer(RdmaClient* c, rdma_cm_id* id) {
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&c->dst), 2000) != 0) {
    std::fprintf(stderr, "rdma_resolve_addr: %s\n", std::strerror(errno));
    return 1;
  }
  rdma_cm_event* ev = nullptr;
  if (const int err = cmtest::NextEvent(c->ch, kStepMs, &ev)) {
    std::fprintf(stderr, "waiting for ADDR_RESOLVED: %s\n", std::strerror(err));
    return 1;
  }
  const rdma_cm_event_type got = ev->event;
  const int status = ev->status;
  rdma_ack_cm_event(ev);
  if (got == RDMA_CM_EVENT_ADDR_RESOLVED) return 0;
  if (got == RDMA_CM_EVENT_ADDR_ERROR && status == -EHOSTUNREACH) return 4;
  std::fprintf(stderr, "waiting for ADDR_RESOLVED: got %s (status %d)\n", rdma_event_str(got),
               status);
  return 1;
}

// One connection, set up and torn down. 0; 1 on failure; 4 when it was rejected or found
// unreachable (the server not listening yet) and nothing else went wrong.
int RdmaOnce(RdmaClient* c) {
  rdma_cm_id* id = nullptr;
  g_lap_ms = NowMs();
  if (rdma_create_id(c->ch, &id, nullptr, RDMA_PS_TCP) != 0) {
    std::fprintf(stderr, "rdma_create_id: %s\n", std::strerror(errno));
    return 1;
  }
  Lap(kCreateId);
  int st = ResolveServer(c, id);
  Lap(kResolveAddr);
  if (st == 0) st = cmtest::ResolveRoute(id, c->ch);
  Lap(kResolveRoute);
  if (st == 0 && c->pd == nullptr) st = cmrate::OpenPdCq(id->verbs, &c->pd, &c->cq);
  if (st == 0) st = cmtest::MakeQp(id, c->pd, c->cq);
  Lap(kCreateQp);
  rdma_conn_param p = cmtest::ConnParam(nullptr, 0);
  if (st == 0 && rdma_connect(id, &p) != 0) {
    std::fprintf(stderr, "rdma_connect: %s\n", std::strerror(errno));
    st = 1;
  }
  if (st != 0) {
    if (id->qp != nullptr) rdma_destroy_qp(id);
    rdma_destroy_id(id);
    return st;  // 4 only from ResolveServer: not there yet
  }
  rdma_cm_event* ev = nullptr;
  const int err = cmtest::NextEvent(c->ch, kStepMs, &ev);
  const rdma_cm_event_type got = err == 0 ? ev->event : RDMA_CM_EVENT_CONNECT_ERROR;
  if (err == 0) rdma_ack_cm_event(ev);
  Lap(kConnect);
  if (got == RDMA_CM_EVENT_ESTABLISHED) return RdmaTearDown(c, id);
  rdma_destroy_qp(id);
  rdma_destroy_id(id);
  // Nobody listening yet: a real stack rejects (RC), freeflow may say unreachable.
  if (got == RDMA_CM_EVENT_REJECTED || got == RDMA_CM_EVENT_UNREACHABLE) return 4;
  std::fprintf(stderr, "connect: %s\n", err ? std::strerror(err) : rdma_event_str(got));
  return 1;
}

// One TCP connection, set up and torn down: 0, 1, or 4 when refused (not listening yet).
int TcpOnce(const sockaddr_in& dst) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{kStepMs / 1000, 0};
  ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (::connect(s, reinterpret_cast<const sockaddr*>(&dst), sizeof(dst)) != 0) {
    const int e = errno;
    ::close(s);
    if (e == ECONNREFUSED) return 4;
    std::fprintf(stderr, "connect: %s\n", std::strerror(e));
    return 1;
  }
  char b;
  ::shutdown(s, SHUT_WR);
  const ssize_t n = ::read(s, &b, 1);  // the server's close: end of stream
  ::close(s);
  if (n != 0) std::fprintf(stderr, "waiting for the server's close: %s\n", std::strerror(errno));
  return n == 0 ? 0 : 1;
}

// The client loop: one warm-up connection (retried while refused), then `count` timed,
// one at a time (`in_flight` 1) or by `window` (count, in_flight, each connection's time).
template <typename Once, typename Window>
int Measure(const char* kind, int count, int in_flight, Once once, Window window) {
  const double start = NowMs();
  int st;
  while ((st = once()) == 4 && NowMs() - start < kWarmupMs) ::usleep(50 * 1000);
  if (st != 0) {
    std::fprintf(stderr, "%s: the first connection failed%s\n", kind,
                 st == 4 ? " (nobody listening after 10 s)" : "");
    return 1;
  }
  for (auto& v : g_step_ms) v.clear();  // the warm-up's steps are not counted
  std::vector<double> each;
  each.reserve(count);
  const Cpu cpu0 = CpuNow();
  const double t0 = NowMs();
  for (int i = 0; in_flight == 1 && i < count; ++i) {
    const double t = NowMs();
    if (once() != 0) {
      std::fprintf(stderr, "%s: connection %d of %d failed\n", kind, i + 1, count);
      return 1;
    }
    each.push_back(NowMs() - t);
  }
  if (in_flight > 1 && window(count, in_flight, &each) != 0) return 1;
  const double secs = (NowMs() - t0) / 1000;
  std::sort(each.begin(), each.end());
  const auto at = [&each](double q) {
    return each[static_cast<size_t>(q * (each.size() - 1))] * 1000;
  };
  std::printf(
      "%s connections: %d in %.3f s with %d in flight, rate %.1f per second, median one "
      "connection %.1f us\n",
      kind, count, secs, in_flight, count / secs, at(0.5));
  std::printf("%s one connection us: p90 %.1f p99 %.1f max %.1f\n", kind, at(0.9), at(0.99),
              at(1.0));
  if (in_flight == 1 && !g_step_ms[kCreateId].empty()) {
    std::printf("%s median us a step:", kind);
    for (int s = 0; s < kSteps; ++s)
      std::printf(" %s %.1f", kStepNames[s], MedianOf(g_step_ms[s]) * 1000);
    std::printf("\n");
  }
  if (in_flight == 1) PrintCpu(kind, "client", cpu0, count);
  return 0;
}

int RdmaClientMain(const char* ip, int port, int count, int in_flight) {
  RdmaClient c;
  if (!cmtest::ParseAddr(ip, port, &c.dst)) return 1;
  c.ch = cmtest::OpenChannel();
  if (c.ch == nullptr) return 1;
  const int st = Measure(
      "rdma_cm", count, in_flight, [&c] { return RdmaOnce(&c); },
      [&c](int n, int w, std::vector<double>* each) { return cmrate::RdmaWindow(&c, n, w, each); });
  if (c.cq != nullptr) ibv_destroy_cq(c.cq);
  if (c.pd != nullptr) ibv_dealloc_pd(c.pd);
  rdma_destroy_event_channel(c.ch);
  return st;
}

int TcpClientMain(const char* ip, int port, int count, int in_flight) {
  sockaddr_in dst;
  if (!cmtest::ParseAddr(ip, port, &dst)) return 1;
  return Measure(
      "tcp", count, in_flight, [&dst] { return TcpOnce(dst); },
      [&dst](int n, int w, std::vector<double>* each) {
        return cmrate::TcpWindow(dst, n, w, each);
      });
}

// The server's side of one event; `done` counts connections that ended.
int RdmaServe(rdma_cm_event* ev, ibv_pd** pd, ibv_cq** cq, int* done) {
  rdma_cm_id* id = ev->id;
  switch (ev->event) {
    case RDMA_CM_EVENT_CONNECT_REQUEST: {
      if (*pd == nullptr && cmrate::OpenPdCq(id->verbs, pd, cq) != 0) return 1;
      rdma_conn_param p = cmtest::ConnParam(nullptr, 0);
      if (cmtest::MakeQp(id, *pd, *cq) != 0 || rdma_accept(id, &p) != 0) {
        std::fprintf(stderr, "accept: %s\n", std::strerror(errno));
        return 1;
      }
      return 0;
    }
    case RDMA_CM_EVENT_ESTABLISHED:
    case RDMA_CM_EVENT_TIMEWAIT_EXIT:  // a real stack may report it; nothing to do
      return 0;
    case RDMA_CM_EVENT_DISCONNECTED:
      rdma_disconnect(id);  // the passive side answers the disconnect
      ++*done;
      return 0;
    default:
      std::fprintf(stderr, "server: unexpected %s (status %d)\n", rdma_event_str(ev->event),
                   ev->status);
      return 1;
  }
}

int RdmaServerMain(int port, int count) {
  sockaddr_in any;
  cmtest::ParseAddr("0.0.0.0", port, &any);
  rdma_event_channel* ch = cmtest::OpenChannel();
  rdma_cm_id* listen = nullptr;
  if (ch == nullptr || rdma_create_id(ch, &listen, nullptr, RDMA_PS_TCP) != 0 ||
      rdma_bind_addr(listen, reinterpret_cast<sockaddr*>(&any)) != 0 ||
      rdma_listen(listen, kBacklog) != 0) {
    std::fprintf(stderr, "listen on port %d: %s\n", port, std::strerror(errno));
    return 1;
  }
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  int done = 0, st = 0;
  Cpu cpu0;
  while (st == 0 && done < count + 1) {  // the client's warm-up connection, then COUNT
    if (done == 1 && cpu0.user_us == 0 && cpu0.sys_us == 0) cpu0 = CpuNow();
    rdma_cm_event* ev = nullptr;
    if (cmtest::NextEvent(ch, 60000, &ev) != 0) {
      std::fprintf(stderr, "server: no event for 60 s after %d connections\n", done);
      return 1;
    }
    rdma_cm_id* id = ev->id;
    const bool ended = ev->event == RDMA_CM_EVENT_DISCONNECTED;
    st = RdmaServe(ev, &pd, &cq, &done);
    rdma_ack_cm_event(ev);
    if (ended) {
      rdma_destroy_qp(id);
      rdma_destroy_id(id);
    }
  }
  if (st == 0) PrintCpu("rdma_cm", "server", cpu0, count);
  rdma_destroy_id(listen);
  if (cq != nullptr) ibv_destroy_cq(cq);
  if (pd != nullptr) ibv_dealloc_pd(pd);
  rdma_destroy_event_channel(ch);
  return st;
}

int TcpServerMain(int port, int count, int in_flight) {
  const int l = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in any;
  cmtest::ParseAddr("0.0.0.0", port, &any);
  if (::bind(l, reinterpret_cast<sockaddr*>(&any), sizeof(any)) != 0 ||
      ::listen(l, kBacklog) != 0) {
    std::fprintf(stderr, "listen on port %d: %s\n", port, std::strerror(errno));
    return 1;
  }
  if (in_flight > 1) {  // the warm-up connection, then COUNT
    const int st = cmrate::TcpServeWindow(l, count + 1);
    ::close(l);
    return st;
  }
  Cpu cpu0;
  for (int i = 0; i < count + 1; ++i) {  // the warm-up connection, then COUNT
    if (i == 1) cpu0 = CpuNow();
    pollfd p{l, POLLIN, 0};
    if (::poll(&p, 1, 60000) != 1) {
      std::fprintf(stderr, "server: no connection for 60 s after %d\n", i);
      return 1;
    }
    const int s = ::accept(l, nullptr, nullptr);
    timeval tv{kStepMs / 1000, 0};
    ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char b;
    const ssize_t n = ::read(s, &b, 1);  // the client's shutdown
    ::close(s);
    if (n != 0) {
      std::fprintf(stderr, "server: connection %d did not end cleanly\n", i);
      return 1;
    }
  }
  PrintCpu("tcp", "server", cpu0, count);
  ::close(l);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "";
  const bool server = mode == "rdma-server" || mode == "tcp-server";
  const bool client = mode == "rdma-client" || mode == "tcp-client";
  const int base = server ? 4 : 5;  // the arguments before IN_FLIGHT
  if (!(server || client) || argc < base || argc > base + 1) {
    std::fprintf(stderr,
                 "usage: cm_rate rdma-server|tcp-server PORT COUNT [IN_FLIGHT]\n"
                 "       cm_rate rdma-client|tcp-client IP PORT COUNT [IN_FLIGHT]\n");
    return 2;
  }
  const int count = std::atoi(argv[base - 1]);
  const int in_flight = argc > base ? std::atoi(argv[base]) : 1;
  if (count < 1 || count > 1000000 || in_flight < 1 || in_flight > kBacklog) {
    std::fprintf(stderr, "COUNT must be 1..1000000 and IN_FLIGHT 1..%d\n", kBacklog);
    return 2;
  }
  // A bound on the whole run: 50 ms a connection (far above either rate) and a minute.
  cmtest::Watchdog(60 + static_cast<unsigned>(count) / 20);
  if (mode == "rdma-server") return RdmaServerMain(std::atoi(argv[2]), count);
  if (mode == "tcp-server") return TcpServerMain(std::atoi(argv[2]), count, in_flight);
  if (mode == "rdma-client") return RdmaClientMain(argv[2], std::atoi(argv[3]), count, in_flight);
  return TcpClientMain(argv[2], std::atoi(argv[3]), count, in_flight);
}
