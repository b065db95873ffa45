// The rdma_cm error cases of issue 12, as a plain librdmacm program run in a pod (the real
// librdmacm; freeflow's preload serves /dev/infiniband/rdma_cm). Each subcommand exits 0
// only when it sees exactly the event a real stack gives, and no wait is unbounded (event
// waits poll with a deadline; a watchdog ends the process).
//   cm_errors noconn IP PORT        connect where nobody listens: REJECTED or UNREACHABLE,
//                                   the whole attempt within 1 s
//   cm_errors badaddr IP            resolve an address freeflow cannot reach: ADDR_ERROR
//   cm_errors server PORT [hold|removal]
//                                   accept one connection, print ESTABLISHED, then wait to
//                                   be killed (hold) or for DEVICE_REMOVAL (removal)
//   cm_errors client IP PORT        connect, print ESTABLISHED, then DISCONNECTED must come
//                                   (the test kills the server's process)
//   cm_errors wait-removal IP PORT  connect, print ESTABLISHED, then DEVICE_REMOVAL must
//                                   come (the test kills the router)
//   cm_errors server PORT reopen    as removal, then (the test started a new router) free
//                                   everything, listen again in the same process and accept
//                                   one more connection, which the client disconnects
//   cm_errors reopen IP PORT removal|disconnected
//                                   connect, print ESTABLISHED, expect DEVICE_REMOVAL (own
//                                   router killed) or DISCONNECTED (the server's), then
//                                   connect again in the same process until the new router
//                                   and the server's new listener take it
//   cm_errors both-server PORT N    accept N connections (each moved to a channel of its
//   cm_errors both-client IP PORT N own) and make N: both sides disconnect as soon as they
//                                   are connected, so that their DREQs cross; each side
//                                   must read one DISCONNECTED a connection, and nothing
//                                   after it
//   cm_errors fork-client IP PORT   connect and disconnect (librdmacm now holds the device
//                                   open), fork: the child connects and disconnects with
//                                   the device it opens itself, then the parent again; the
//                                   server is both-server PORT 3. Prints each one's device
//                                   index
// Connections carry private data both ways and each side checks what it received.
// Exit status: 0 as expected, 1 another outcome, 2 usage, 3 the watchdog fired.
#include <infiniband/verbs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cm_util.h"

namespace {

using cmtest::Expect;
using cmtest::NextEvent;
using cmtest::NowMs;

constexpr char kRequestData[] = "ffcm-req";  // the client's private data (8 bytes)
constexpr char kReplyData[] = "ffcm-rep";    // the server's
constexpr uint8_t kDataLen = 8;
constexpr int kNoConnBoundMs = 1000;  // issue 12: a connect nobody takes fails within 1 s

// One side of a connection and what it owns.
struct Side {
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
};

// Whether an event's private data starts with `want`.
bool DataIs(const rdma_cm_event* ev, const char* want) {
  const rdma_conn_param& c = ev->param.conn;
  return c.private_data != nullptr && c.private_data_len >= kDataLen &&
         std::memcmp(c.private_data, want, kDataLen) == 0;
}

// PD, CQ and QP for `s.id` (resolved or just requested); 0 or 1.
int MakeResources(Side* s) {
  s->pd = ibv_alloc_pd(s->id->verbs);
  s->cq = s->pd ? ibv_create_cq(s->id->verbs, 8, nullptr, nullptr, 0) : nullptr;
  if (s->cq == nullptr) {
    std::fprintf(stderr, "PD/CQ on the resolved device: %s\n", std::strerror(errno));
    return 1;
  }
  return cmtest::MakeQp(s->id, s->pd, s->cq);
}

// Frees what a side holds.
void Release(Side* s) {
  if (s->id != nullptr) {
    if (s->id->qp != nullptr) rdma_destroy_qp(s->id);
    rdma_destroy_id(s->id);
  }
  if (s->cq != nullptr) ibv_destroy_cq(s->cq);
  if (s->pd != nullptr) ibv_dealloc_pd(s->pd);
  if (s->ch != nullptr) rdma_destroy_event_channel(s->ch);
  *s = Side{};
}

// Tears a side down and says how long that took (it must not block, even when the router
// is gone: the watchdog would end the process).
void Teardown(Side* s) {
  const double t0 = NowMs();
  if (s->id != nullptr) rdma_disconnect(s->id);  // fails harmlessly when the peer or device is gone
  Release(s);
  std::printf("teardown took %.1f ms\n", NowMs() - t0);
}

// The active side up to rdma_connect (sent, not answered): 0 or 1.
int StartConnect(const char* ip, int port, Side* s) {
  sockaddr_in dst;
  if (!cmtest::ParseAddr(ip, port, &dst)) return 1;
  s->ch = cmtest::OpenChannel();
  if (s->ch == nullptr) return 1;
  if (rdma_create_id(s->ch, &s->id, nullptr, RDMA_PS_TCP) != 0) {
    std::fprintf(stderr, "rdma_create_id: %s\n", std::strerror(errno));
    return 1;
  }
  if (cmtest::Resolve(s->id, s->ch, &dst) != 0 || MakeResources(s) != 0) return 1;
  rdma_conn_param p = cmtest::ConnParam(kRequestData, kDataLen);
  if (rdma_connect(s->id, &p) != 0) {
    std::fprintf(stderr, "rdma_connect: %s\n", std::strerror(errno));
    return 1;
  }
  return 0;
}

// Waits at most `bound_ms` for the next event and checks it is `want`; says what came.
int AwaitFinal(Side* s, rdma_cm_event_type want, int bound_ms) {
  const double t0 = NowMs();
  rdma_cm_event* ev = nullptr;
  const int err = NextEvent(s->ch, bound_ms, &ev);
  if (err != 0) {
    std::printf("FAILED: no event within %d ms (%s), expected %s\n", bound_ms, std::strerror(err),
                rdma_event_str(want));
    return 1;
  }
  const rdma_cm_event_type got = ev->event;
  std::printf("%s %s: %s status %d after %.1f ms\n",
              got == want ? "ok" : "FAILED:", rdma_event_str(want), rdma_event_str(got), ev->status,
              NowMs() - t0);
  rdma_ack_cm_event(ev);
  return got == want ? 0 : 1;
}

int NoConn(const char* ip, int port) {
  cmtest::Watchdog(40);
  Side s;
  const double t0 = NowMs();
  if (StartConnect(ip, port, &s) != 0) return 1;
  const double connected_at = NowMs();
  rdma_cm_event* ev = nullptr;
  // Waits well past the bound, so that a late answer is seen and timed, not just missed.
  const int err = NextEvent(s.ch, 30000, &ev);
  const double total = NowMs() - t0;
  if (err != 0) {
    std::printf("FAILED: no answer to a connect nobody takes within 30 s (%s)\n",
                std::strerror(err));
    return 1;
  }
  const rdma_cm_event_type got = ev->event;
  const int status = ev->status;
  rdma_ack_cm_event(ev);
  const bool kind = got == RDMA_CM_EVENT_REJECTED || got == RDMA_CM_EVENT_UNREACHABLE;
  const bool fast = total < kNoConnBoundMs;
  std::printf(
      "%s connect to %s:%d with no listener: %s status %d, %.1f ms from resolve "
      "(%.1f ms after rdma_connect); expected REJECTED or UNREACHABLE within %d ms\n",
      kind && fast ? "ok" : "FAILED:", ip, port, rdma_event_str(got), status, total,
      NowMs() - connected_at, kNoConnBoundMs);
  Teardown(&s);
  return kind && fast ? 0 : 1;
}

int BadAddr(const char* ip) {
  cmtest::Watchdog(10);
  sockaddr_in dst;
  if (!cmtest::ParseAddr(ip, 7174, &dst)) return 2;
  Side s;
  s.ch = cmtest::OpenChannel();
  if (s.ch == nullptr || rdma_create_id(s.ch, &s.id, nullptr, RDMA_PS_TCP) != 0) {
    std::fprintf(stderr, "event channel / rdma_create_id: %s\n", std::strerror(errno));
    return 1;
  }
  if (rdma_resolve_addr(s.id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000) != 0) {
    std::printf(
        "FAILED: rdma_resolve_addr(%s) failed at once (%s) instead of giving "
        "RDMA_CM_EVENT_ADDR_ERROR\n",
        ip, std::strerror(errno));
    return 1;
  }
  const int st = AwaitFinal(&s, RDMA_CM_EVENT_ADDR_ERROR, 5000);
  Teardown(&s);
  return st;
}

// Connects to IP:PORT, checks ESTABLISHED and the server's private data, prints
// ESTABLISHED, then expects `want` within `bound_ms`.
int Connected(const char* ip, int port, rdma_cm_event_type want, int bound_ms) {
  cmtest::Watchdog(bound_ms / 1000 + 30);
  Side s;
  if (StartConnect(ip, port, &s) != 0) return 1;
  rdma_cm_event* ev = nullptr;
  if (Expect(s.ch, RDMA_CM_EVENT_ESTABLISHED, 5000, &ev) != 0) return 1;
  const bool data_ok = DataIs(ev, kReplyData);
  rdma_ack_cm_event(ev);
  if (!data_ok) {
    std::printf("FAILED: ESTABLISHED without the server's private data\n");
    return 1;
  }
  std::printf("ESTABLISHED\n");
  std::fflush(stdout);
  const int st = AwaitFinal(&s, want, bound_ms);
  Teardown(&s);
  return st;
}

// A listener on PORT (any address), which prints LISTENING: 0 or 1.
int Listen(int port, Side* listen) {
  sockaddr_in any;
  cmtest::ParseAddr("0.0.0.0", port, &any);
  listen->ch = cmtest::OpenChannel();
  if (listen->ch == nullptr || rdma_create_id(listen->ch, &listen->id, nullptr, RDMA_PS_TCP) != 0 ||
      rdma_bind_addr(listen->id, reinterpret_cast<sockaddr*>(&any)) != 0 ||
      rdma_listen(listen->id, 4) != 0) {
    std::fprintf(stderr, "listen on port %d: %s\n", port, std::strerror(errno));
    return 1;
  }
  std::printf("LISTENING %d\n", port);
  std::fflush(stdout);
  return 0;
}

constexpr int kAgainBoundMs = 60000;  // the new router and listener found within
constexpr int kAgainPauseMs = 200;    // between attempts

// A listener, made again until the new router serves the device: 0 or 1.
int ListenAgain(int port, Side* listen) {
  const double t0 = NowMs();
  while (Listen(port, listen) != 0) {
    Release(listen);
    if (NowMs() - t0 > kAgainBoundMs) {
      std::printf("FAILED: could not listen again within %d ms\n", kAgainBoundMs);
      return 1;
    }
    cmtest::SleepMs(kAgainPauseMs);
  }
  std::printf("ok listening again %.1f ms after DEVICE_REMOVAL\n", NowMs() - t0);
  return 0;
}

// The server after DEVICE_REMOVAL (`listen`, `conn` its lost objects): frees them, listens
// again and takes one connection, which the client disconnects. 0 or 1.
int ServeAgain(int port, Side* listen, Side* conn) {
  Release(conn);
  Release(listen);
  if (ListenAgain(port, listen) != 0) return 1;
  rdma_cm_event* ev = nullptr;
  if (Expect(listen->ch, RDMA_CM_EVENT_CONNECT_REQUEST, kAgainBoundMs, &ev) != 0) return 1;
  conn->id = ev->id;
  const bool data_ok = DataIs(ev, kRequestData);
  rdma_ack_cm_event(ev);
  rdma_conn_param p = cmtest::ConnParam(kReplyData, kDataLen);
  if (!data_ok || MakeResources(conn) != 0 || rdma_accept(conn->id, &p) != 0) {
    std::printf("FAILED: accepting again (private data %s): %s\n", data_ok ? "ok" : "wrong",
                std::strerror(errno));
    return 1;
  }
  if (Expect(listen->ch, RDMA_CM_EVENT_ESTABLISHED, 5000) != 0 ||
      Expect(listen->ch, RDMA_CM_EVENT_DISCONNECTED, 10000) != 0)
    return 1;
  std::printf("ok accepted again in the same process, then DISCONNECTED\n");
  Release(conn);
  Release(listen);
  return 0;
}

// Accepts one connection on PORT (any address); then hold, removal or reopen.
int Server(int port, const std::string& mode) {
  cmtest::Watchdog(150);
  Side listen, conn;
  if (Listen(port, &listen) != 0) return 1;
  rdma_cm_event* ev = nullptr;
  if (Expect(listen.ch, RDMA_CM_EVENT_CONNECT_REQUEST, 90000, &ev) != 0) return 1;
  conn.id = ev->id;
  const bool data_ok = DataIs(ev, kRequestData);
  rdma_ack_cm_event(ev);
  if (!data_ok) {
    std::printf("FAILED: CONNECT_REQUEST without the client's private data\n");
    return 1;
  }
  if (MakeResources(&conn) != 0) return 1;
  rdma_conn_param p = cmtest::ConnParam(kReplyData, kDataLen);
  if (rdma_accept(conn.id, &p) != 0) {
    std::fprintf(stderr, "rdma_accept: %s\n", std::strerror(errno));
    return 1;
  }
  if (Expect(listen.ch, RDMA_CM_EVENT_ESTABLISHED, 5000) != 0) return 1;
  std::printf("ESTABLISHED\n");
  std::fflush(stdout);
  if (mode == "removal") return AwaitFinal(&listen, RDMA_CM_EVENT_DEVICE_REMOVAL, 60000);
  if (mode == "reopen") {
    if (AwaitFinal(&listen, RDMA_CM_EVENT_DEVICE_REMOVAL, 60000) != 0) return 1;
    return ServeAgain(port, &listen, &conn);
  }
  rdma_cm_event* late = nullptr;
  if (NextEvent(listen.ch, 60000, &late) == 0) {  // held until killed: nothing may come
    std::printf("FAILED: unexpected %s while held\n", rdma_event_str(late->event));
    rdma_ack_cm_event(late);
    return 1;
  }
  return 0;
}

// After a side's DISCONNECTED: nothing more may come on its channel (kQuietMs). 0 or 1.
constexpr int kQuietMs = 100;
int NothingMore(Side* s) {
  rdma_cm_event* ev = nullptr;
  const int err = NextEvent(s->ch, kQuietMs, &ev);
  if (err == ETIMEDOUT) return 0;
  if (err == 0) {
    std::printf("FAILED: %s after DISCONNECTED\n", rdma_event_str(ev->event));
    rdma_ack_cm_event(ev);
  } else {
    std::printf("FAILED: reading the channel after DISCONNECTED: %s\n", std::strerror(err));
  }
  return 1;
}

// A connected side disconnects at once: one DISCONNECTED, then nothing; then it is freed.
int DisconnectAtOnce(Side* s) {
  int st = 1;
  if (rdma_disconnect(s->id) != 0) {
    std::fprintf(stderr, "rdma_disconnect: %s\n", std::strerror(errno));
  } else if (Expect(s->ch, RDMA_CM_EVENT_DISCONNECTED, 5000) == 0) {
    st = NothingMore(s);
  }
  Release(s);
  return st;
}

int BothServer(int port, int n) {
  cmtest::Watchdog(120);
  Side listen;
  if (Listen(port, &listen) != 0) return 1;
  for (int i = 0; i < n; ++i) {
    rdma_cm_event* ev = nullptr;
    if (Expect(listen.ch, RDMA_CM_EVENT_CONNECT_REQUEST, 10000, &ev) != 0) return 1;
    Side conn;
    conn.id = ev->id;
    rdma_ack_cm_event(ev);
    // Its own channel: what comes after DISCONNECTED is this connection's alone.
    conn.ch = cmtest::OpenChannel();
    if (conn.ch == nullptr || rdma_migrate_id(conn.id, conn.ch) != 0) {
      std::fprintf(stderr, "rdma_migrate_id: %s\n", std::strerror(errno));
      return 1;
    }
    rdma_conn_param p = cmtest::ConnParam(kReplyData, kDataLen);
    if (MakeResources(&conn) != 0 || rdma_accept(conn.id, &p) != 0) {
      std::fprintf(stderr, "connection %d: accept: %s\n", i, std::strerror(errno));
      return 1;
    }
    if (Expect(conn.ch, RDMA_CM_EVENT_ESTABLISHED, 5000) != 0 || DisconnectAtOnce(&conn) != 0) {
      std::printf("FAILED: connection %d\n", i);
      return 1;
    }
  }
  std::printf("ok both-disconnect: %d connections, one DISCONNECTED each, nothing after\n", n);
  Release(&listen);
  return 0;
}

// One connection, disconnected at once, that says which device index it ran on: 0 or 1.
int OnceOnDevice(const char* ip, int port, const char* who) {
  Side s;
  if (StartConnect(ip, port, &s) != 0 || Expect(s.ch, RDMA_CM_EVENT_ESTABLISHED, 5000) != 0) {
    std::printf("FAILED: the %s's connection\n", who);
    Release(&s);
    return 1;
  }
  const int index = ibv_get_device_index(s.id->verbs->device);
  if (DisconnectAtOnce(&s) != 0) return 1;
  std::printf("ok %s connected on device index %d\n", who, index);
  return 0;
}

// The parent connects, forks; the child (a process of its own to the router, whose first
// session is a new device index, while librdmacm's copy of the parent's list still holds the
// parent's) connects, then the parent again. 0 or 1.
int ForkClient(const char* ip, int port) {
  cmtest::Watchdog(120);
  if (OnceOnDevice(ip, port, "parent") != 0) return 1;
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("fork");
    return 1;
  }
  if (child == 0) {
    ::_exit(OnceOnDevice(ip, port, "child"));
  }
  int status = 0;
  if (::waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::printf("FAILED: the child ended with status %#x\n", status);
    return 1;
  }
  return OnceOnDevice(ip, port, "parent again");
}

int BothClient(const char* ip, int port, int n) {
  cmtest::Watchdog(120);
  for (int i = 0; i < n; ++i) {
    Side s;
    if (StartConnect(ip, port, &s) != 0 || Expect(s.ch, RDMA_CM_EVENT_ESTABLISHED, 5000) != 0 ||
        DisconnectAtOnce(&s) != 0) {
      std::printf("FAILED: connection %d\n", i);
      return 1;
    }
  }
  std::printf("ok both-disconnect: %d connections, one DISCONNECTED each, nothing after\n", n);
  return 0;
}

// Connects, loses the connection to `want` (the harness kills a router and starts another),
// then connects again from the same process, retrying while the device or the server's
// listener is not back (REJECTED, UNREACHABLE, ENODEV). 0 or 1.
int Reopen(const char* ip, int port, rdma_cm_event_type want) {
  if (Connected(ip, port, want, 30000) != 0) return 1;
  cmtest::Watchdog(kAgainBoundMs / 1000 + 30);
  const double t0 = NowMs();
  for (int attempt = 1;; ++attempt) {
    Side s;
    rdma_cm_event* ev = nullptr;
    if (StartConnect(ip, port, &s) == 0 && NextEvent(s.ch, 5000, &ev) == 0) {
      const bool up = ev->event == RDMA_CM_EVENT_ESTABLISHED && DataIs(ev, kReplyData);
      rdma_ack_cm_event(ev);
      if (up) {
        std::printf("ok connected again in the same process %.1f ms after %s (attempt %d)\n",
                    NowMs() - t0, rdma_event_str(want), attempt);
        return DisconnectAtOnce(&s);
      }
    }
    Release(&s);
    if (NowMs() - t0 > kAgainBoundMs) {
      std::printf("FAILED: no connection again within %d ms\n", kAgainBoundMs);
      return 1;
    }
    cmtest::SleepMs(kAgainPauseMs);
  }
}

int Usage() {
  std::fprintf(stderr,
               "usage: cm_errors noconn IP PORT | badaddr IP |\n"
               "       server PORT [hold|removal|reopen] | client IP PORT |\n"
               "       wait-removal IP PORT | both-server PORT N | both-client IP PORT N |\n"
               "       reopen IP PORT removal|disconnected | fork-client IP PORT\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 3) return Usage();
  const std::string cmd = argv[1];
  if (cmd == "noconn" && argc == 4) return NoConn(argv[2], std::atoi(argv[3]));
  if (cmd == "badaddr" && argc == 3) return BadAddr(argv[2]);
  if (cmd == "server" && (argc == 3 || argc == 4))
    return Server(std::atoi(argv[2]), argc == 4 ? argv[3] : "hold");
  if (cmd == "client" && argc == 4)
    return Connected(argv[2], std::atoi(argv[3]), RDMA_CM_EVENT_DISCONNECTED, 30000);
  if (cmd == "both-server" && argc == 4) return BothServer(std::atoi(argv[2]), std::atoi(argv[3]));
  if (cmd == "both-client" && argc == 5)
    return BothClient(argv[2], std::atoi(argv[3]), std::atoi(argv[4]));
  if (cmd == "fork-client" && argc == 4) return ForkClient(argv[2], std::atoi(argv[3]));
  if (cmd == "wait-removal" && argc == 4)
    return Connected(argv[2], std::atoi(argv[3]), RDMA_CM_EVENT_DEVICE_REMOVAL, 30000);
  if (cmd == "reopen" && argc == 5) {
    const std::string want = argv[4];
    if (want != "removal" && want != "disconnected") return Usage();
    return Reopen(argv[2], std::atoi(argv[3]),
                  want == "removal" ? RDMA_CM_EVENT_DEVICE_REMOVAL : RDMA_CM_EVENT_DISCONNECTED);
  }
  return Usage();
}
