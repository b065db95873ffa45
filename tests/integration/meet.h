// What the integration verbs programs share: meeting the peer over TCP as perftest does,
// and moving an RC QP through INIT, RTR and RTS towards a peer named by its GID.
#pragma once

#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace ffit {

[[noreturn]] inline void Die(const char* what) {
  std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what, std::strerror(errno));
  std::exit(2);
}

inline void WriteAll(int fd, const void* p, size_t n) {
  if (::send(fd, p, n, MSG_NOSIGNAL) != static_cast<ssize_t>(n)) Die("tcp send");
}
inline void ReadAll(int fd, void* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, static_cast<char*>(p) + got, n - got, 0);
    if (r <= 0) Die("tcp recv");
    got += static_cast<size_t>(r);
  }
}

// Accepts one connection on `port`.
inline int Listen(int port) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(s, 1) != 0)
    Die("listen");
  const int c = ::accept(s, nullptr, nullptr);
  ::close(s);
  return c;
}

// Connects to `ip`:`port`, for 5 s at most.
inline int Dial(const char* ip, int port) {
  for (int i = 0; i < 100; ++i) {
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, ip, &a.sin_addr);
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return s;
    ::close(s);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Die("connect");
}

// The first RDMA device, opened (freeflow0 under the preload).
inline ibv_context* OpenFirstDevice() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n == 0) Die("no RDMA device");
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (ctx == nullptr) Die("open device");
  return ctx;
}

// RESET -> INIT, allowing remote write, read and atomics.
inline void ToInit(ibv_qp* qp) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = 1;
  attr.qp_access_flags =
      IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  if (ibv_modify_qp(qp, &attr,
                    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    Die("INIT");
}

// INIT -> RTR -> RTS towards QP `peer_qpn` at GID `peer_gid` (index 1, RoCE v2).
inline void ToRts(ibv_qp* qp, uint32_t peer_qpn, const uint8_t* peer_gid, uint8_t rnr_retry) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = IBV_MTU_4096;
  attr.dest_qp_num = peer_qpn;
  attr.max_dest_rd_atomic = 4;
  attr.min_rnr_timer = 1;  // 10 us between RNR retries
  attr.ah_attr.is_global = 1;
  std::memcpy(attr.ah_attr.grh.dgid.raw, peer_gid, 16);
  attr.ah_attr.grh.sgid_index = 1;
  attr.ah_attr.port_num = 1;
  if (ibv_modify_qp(qp, &attr,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    Die("RTR");
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = 14;
  attr.retry_cnt = 7;
  attr.rnr_retry = rnr_retry;
  attr.max_rd_atomic = 4;
  if (ibv_modify_qp(qp, &attr,
                    IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                        IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
    Die("RTS");
}

}  // namespace ffit
