// A ucma client for tests: writes rdma_cm commands to a descriptor exactly as librdmacm
// does (one write of struct rdma_ucm_cmd_hdr + body, <rdma/rdma_user_cm.h>), for tests that
// drive the rdma_cm device without librdmacm (verbs/src/rdmacm/cm_device.h; the router's side).
#pragma once

#include <gtest/gtest.h>
#include <rdma/rdma_user_cm.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace fftest {

// Event numbers (librdmacm's enum rdma_cm_event_type, whose header clashes with the uapi
// one this file needs).
inline constexpr uint32_t kAddrResolved = 0;
inline constexpr uint32_t kAddrError = 1;
inline constexpr uint32_t kRouteResolved = 2;
inline constexpr uint32_t kConnectRequest = 4;
inline constexpr uint32_t kConnectResponse = 5;
inline constexpr uint32_t kUnreachable = 7;
inline constexpr uint32_t kRejected = 8;
inline constexpr uint32_t kEstablished = 9;
inline constexpr uint32_t kDisconnected = 10;
inline constexpr uint32_t kDeviceRemoval = 11;
inline constexpr uint32_t kMulticastJoin = 12;

// One command as librdmacm writes it.
template <typename Body>
struct Wire {
  rdma_ucm_cmd_hdr hdr;
  Body body;
};

template <typename Body>
ssize_t WriteCmd(int fd, uint32_t cmd, const Body& body, uint16_t out = 0) {
  Wire<Body> w{};
  w.hdr.cmd = cmd;
  w.hdr.in = sizeof(Body);
  w.hdr.out = out;
  w.body = body;
  return ::write(fd, &w, sizeof(w));
}

// 0, or the errno of a command that failed (a partial write fails the test).
template <typename Body>
int CmdErrno(int fd, uint32_t cmd, const Body& body, uint16_t out = 0) {
  errno = 0;
  const ssize_t n = WriteCmd(fd, cmd, body, out);
  if (n == static_cast<ssize_t>(sizeof(Wire<Body>))) return 0;
  EXPECT_EQ(n, -1);
  return errno;
}

inline uint64_t Ptr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// CREATE_ID: the new id's handle.
inline uint32_t CreateId(int fd, uint64_t uid, uint16_t ps = RDMA_PS_TCP) {
  rdma_ucm_create_id_resp resp{~0u};
  rdma_ucm_create_id b{};
  b.uid = uid;
  b.response = Ptr(&resp);
  b.ps = ps;
  b.qp_type = ps == RDMA_PS_UDP ? 4 /* IBV_QPT_UD */ : 2 /* IBV_QPT_RC */;
  EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_CREATE_ID, b, sizeof(resp)), 0);
  return resp.id;
}

// DESTROY_ID: its events_reported (~0u when it failed).
inline uint32_t DestroyId(int fd, uint32_t id) {
  rdma_ucm_destroy_id_resp resp{~0u};
  rdma_ucm_destroy_id b{};
  b.response = Ptr(&resp);
  b.id = id;
  EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_DESTROY_ID, b, sizeof(resp)), 0);
  return resp.events_reported;
}

// GET_EVENT: 0 and the event in *out, or the errno.
inline int GetEvent(int fd, rdma_ucm_event_resp* out, uint16_t room = sizeof(rdma_ucm_event_resp)) {
  rdma_ucm_get_event b{};
  b.response = Ptr(out);
  return CmdErrno(fd, RDMA_USER_CM_CMD_GET_EVENT, b, room);
}

}  // namespace fftest
