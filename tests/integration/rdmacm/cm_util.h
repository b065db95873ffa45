// What the rdma_cm programs of the tests and the benchmark (cm_errors, cm_rate: plain
// librdmacm programs run in pods) share: waiting for one event with a deadline, so that none
// of them can hang on an event that never comes, the active side's resolve steps, a small RC
// QP, and a watchdog for the whole process.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace cmtest {

inline double NowMs() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// The process ends with status 3 and a line saying so when it is still running `seconds`
// from now: a missing event or a call that blocks cannot make a test hang.
inline void Watchdog(unsigned seconds) {
  struct sigaction sa {};
  sa.sa_handler = [](int) {
    static const char kMsg[] = "watchdog: still running at the deadline (a call blocked)\n";
    (void)!::write(2, kMsg, sizeof(kMsg) - 1);
    ::_exit(3);
  };
  ::sigaction(SIGALRM, &sa, nullptr);
  ::alarm(seconds);
}

inline void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// Parses "a.b.c.d" and a port into `out`; false (and a message) when it is not an address.
inline bool ParseAddr(const char* ip, int port, sockaddr_in* out) {
  std::memset(out, 0, sizeof(*out));
  out->sin_family = AF_INET;
  out->sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, ip, &out->sin_addr) != 1) {
    std::fprintf(stderr, "not an IPv4 address: %s\n", ip);
    return false;
  }
  return true;
}

// An event channel whose descriptor is non-blocking (as a program that polls it sets it).
inline rdma_event_channel* OpenChannel() {
  rdma_event_channel* ch = rdma_create_event_channel();
  if (ch == nullptr) {
    std::fprintf(stderr, "rdma_create_event_channel: %s\n", std::strerror(errno));
    return nullptr;
  }
  const int flags = ::fcntl(ch->fd, F_GETFL);
  if (flags < 0 || ::fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    std::fprintf(stderr, "O_NONBLOCK on the event channel: %s\n", std::strerror(errno));
    rdma_destroy_event_channel(ch);
    return nullptr;
  }
  return ch;
}

// Waits at most `timeout_ms` for the next event on `ch`. 0 and the event in `*ev` (the
// caller acks it), ETIMEDOUT when none came, or the errno of poll / rdma_get_cm_event.
inline int NextEvent(rdma_event_channel* ch, int timeout_ms, rdma_cm_event** ev) {
  const double deadline = NowMs() + timeout_ms;
  for (;;) {
    const int left = static_cast<int>(deadline - NowMs());
    if (left <= 0) return ETIMEDOUT;
    pollfd p{ch->fd, POLLIN, 0};
    const int n = ::poll(&p, 1, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return ETIMEDOUT;
    if (rdma_get_cm_event(ch, ev) == 0) return 0;
    // A readable descriptor without an event (a spurious wake-up): wait again.
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return errno;
  }
}

// Waits for the next event and checks it is `want`: 0, or 1 with a line naming what came
// instead (or that nothing came). The event is acked unless `keep` takes it.
inline int Expect(rdma_event_channel* ch, rdma_cm_event_type want, int timeout_ms,
                  rdma_cm_event** keep = nullptr) {
  rdma_cm_event* ev = nullptr;
  const int err = NextEvent(ch, timeout_ms, &ev);
  if (err != 0) {
    std::fprintf(stderr, "waiting for %s: %s after %d ms\n", rdma_event_str(want),
                 err == ETIMEDOUT ? "no event" : std::strerror(err), timeout_ms);
    return 1;
  }
  if (ev->event != want) {
    std::fprintf(stderr, "waiting for %s: got %s (status %d)\n", rdma_event_str(want),
                 rdma_event_str(ev->event), ev->status);
    rdma_ack_cm_event(ev);
    return 1;
  }
  if (keep != nullptr) {
    *keep = ev;
  } else {
    rdma_ack_cm_event(ev);
  }
  return 0;
}

// The active side's first step: resolve `dst`'s address (2 s, as rping).
inline int ResolveAddr(rdma_cm_id* id, rdma_event_channel* ch, sockaddr_in* dst) {
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(dst), 2000) != 0) {
    std::fprintf(stderr, "rdma_resolve_addr: %s\n", std::strerror(errno));
    return 1;
  }
  return Expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, 3000);
}

// The second: resolve the route to the address resolved.
inline int ResolveRoute(rdma_cm_id* id, rdma_event_channel* ch) {
  if (rdma_resolve_route(id, 2000) != 0) {
    std::fprintf(stderr, "rdma_resolve_route: %s\n", std::strerror(errno));
    return 1;
  }
  return Expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, 3000);
}

// Both.
inline int Resolve(rdma_cm_id* id, rdma_event_channel* ch, sockaddr_in* dst) {
  const int st = ResolveAddr(id, ch, dst);
  return st != 0 ? st : ResolveRoute(id, ch);
}

// A small RC QP on `id` over `pd` and `cq` (send and receive share it); 0 or 1.
inline int MakeQp(rdma_cm_id* id, ibv_pd* pd, ibv_cq* cq) {
  ibv_qp_init_attr attr{};
  attr.qp_type = IBV_QPT_RC;
  attr.send_cq = cq;
  attr.recv_cq = cq;
  attr.cap.max_send_wr = 4;
  attr.cap.max_recv_wr = 4;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  if (rdma_create_qp(id, pd, &attr) != 0) {
    std::fprintf(stderr, "rdma_create_qp: %s\n", std::strerror(errno));
    return 1;
  }
  return 0;
}

// Connection parameters as the example programs use them, with `data` as private data.
inline rdma_conn_param ConnParam(const void* data, uint8_t len) {
  return rdma_conn_param{.private_data = data,
                         .private_data_len = len,
                         .responder_resources = 1,
                         .initiator_depth = 1,
                         .retry_count = 7,
                         .rnr_retry_count = 7};
}

}  // namespace cmtest
