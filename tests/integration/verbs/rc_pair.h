// What the integration test programs (plain verbs programs run in pods) share: the
// out-of-band TCP exchange two of them meet over, and bringing an RC QP to RTS towards a
// peer addressed by GID index 1 (the IPv4-mapped one).
#pragma once

#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace rcpair {

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
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(s, 1) != 0)
    Die("listen");
  const int c = ::accept(s, nullptr, nullptr);
  ::close(s);
  if (c < 0) Die("accept");
  return c;
}

// Connects to ip:port, retrying for up to 10 s while the server starts.
inline int Dial(const char* ip, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, ip, &a.sin_addr) != 1) Die("address");
  for (int i = 0; i < 200; ++i) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return s;
    ::close(s);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Die("connect");
}

// The first (freeflow's only) device, opened.
inline ibv_context* OpenFirstDevice() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n == 0) Die("no RDMA device");
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (ctx == nullptr) Die("open device");
  return ctx;
}

// RESET -> INIT with `access` (remote rights).
inline void ToInit(ibv_qp* qp, unsigned access) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = 1;
  attr.qp_access_flags = access;
  if (ibv_modify_qp(qp, &attr,
                    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    Die("modify to INIT");
}

// An RC QP with `depth` WRs of one SGE each way, in INIT with `access` (remote rights).
inline ibv_qp* NewRcQp(ibv_pd* pd, ibv_cq* send_cq, ibv_cq* recv_cq, uint32_t depth,
                       unsigned access) {
  ibv_qp_init_attr init{};
  init.send_cq = send_cq;
  init.recv_cq = recv_cq;
  init.qp_type = IBV_QPT_RC;
  init.cap = {depth, depth, 1, 1, 0};
  ibv_qp* qp = ibv_create_qp(pd, &init);
  if (qp == nullptr) Die("create qp");
  ToInit(qp, access);
  return qp;
}

// INIT -> RTR -> RTS towards QP `peer_qpn` at GID `peer_gid`.
inline void ToRts(ibv_qp* qp, uint32_t peer_qpn, const uint8_t* peer_gid, uint8_t rnr_retry,
                  uint8_t rd_atomic) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = IBV_MTU_4096;
  attr.dest_qp_num = peer_qpn;
  attr.max_dest_rd_atomic = rd_atomic;
  attr.min_rnr_timer = 1;  // 10 us between RNR retries
  attr.ah_attr.is_global = 1;
  std::memcpy(attr.ah_attr.grh.dgid.raw, peer_gid, 16);
  attr.ah_attr.grh.sgid_index = 1;
  attr.ah_attr.port_num = 1;
  if (ibv_modify_qp(qp, &attr,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    Die("modify to RTR");
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = 14;
  attr.retry_cnt = 7;
  attr.rnr_retry = rnr_retry;
  attr.max_rd_atomic = rd_atomic;
  if (ibv_modify_qp(qp, &attr,
                    IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                        IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
    Die("modify to RTS");
}

}  // namespace rcpair
