// The rdma_cm device (verbs/src/rdmacm/cm_device.h) against the fake router: a pod whose session
// serves the device (ff::verbs::UseCmSession), and helpers that play the router's side of a
// channel (events in, commands answered); commands are written with ucma_client.h. The test
// executable links the library's objects, so its open(), write() and close() reach the interposers
// as a preloaded program's do.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <rdma/rdma_user_cm.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "cm_event.h"
#include "pod.h"
#include "rdmacm/cm_device.h"
#include "ucma_client.h"

namespace fftest {

static_assert(offsetof(rdma_ucm_event_resp, id) == 8 && offsetof(rdma_ucm_event_resp, event) == 12,
              "MakeCmEvent's offsets");

class CmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(pod_.session, nullptr);
    ff::verbs::UseCmSession(pod_.session);
    // The fake router's CREATE_ID / JOIN answers: handles from 100 on.
    pod_.router.OnCmCommand([this](const ff::proto::CmCommand& c, ff::proto::CmReply* r) {
      if (c.cmd == RDMA_USER_CM_CMD_CREATE_ID || c.cmd == RDMA_USER_CM_CMD_JOIN_IP_MCAST ||
          c.cmd == RDMA_USER_CM_CMD_JOIN_MCAST) {
        const uint32_t id = next_handle_++;
        std::memcpy(r->out, &id, sizeof(id));
        r->out_len = sizeof(id);
      }
      if (c.cmd == RDMA_USER_CM_CMD_DESTROY_ID || c.cmd == RDMA_USER_CM_CMD_MIGRATE_ID ||
          c.cmd == RDMA_USER_CM_CMD_LEAVE_MCAST) {
        const uint32_t bogus = 99;  // the library's count must replace it
        std::memcpy(r->out, &bogus, sizeof(bogus));
        r->out_len = sizeof(bogus);
      }
      // DISCONNECT asking for the library to write DISCONNECTED (kCmEventWritten) gets the
      // flag back once, unless the router reported the id's end itself (RouterEnded).
      if (c.cmd == RDMA_USER_CM_CMD_DISCONNECT && (c.flags & ff::proto::kCmEventWritten) != 0) {
        rdma_ucm_disconnect d;
        std::memcpy(&d, c.body, sizeof(d));
        if (router_ended_.insert(d.id).second) r->flags = ff::proto::kCmEventWritten;
      }
      auto it = status_.find(c.cmd);
      return it == status_.end() ? 0 : it->second;
    });
  }
  void TearDown() override {
    for (int fd : open_) ::close(fd);
    ff::verbs::UseProcessCmSession();
  }

  // An rdma_cm descriptor as librdmacm opens it; its channel id in *channel.
  int Open(int flags = O_RDWR | O_CLOEXEC, uint32_t* channel = nullptr) {
    const int fd = ::open(ff::verbs::kCmDevicePath, flags);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    if (fd >= 0) open_.push_back(fd);
    if (channel != nullptr) *channel = pod_.router.last_cm_channel();
    return fd;
  }
  // Closes a descriptor Open made (so that TearDown does not close its reused number).
  void Close(int fd) {
    std::erase(open_, fd);
    EXPECT_EQ(::close(fd), 0);
  }

  static uint32_t CreateId(int fd, uint64_t uid) { return fftest::CreateId(fd, uid); }
  // SET_OPTION's command for `id`: the option's value at `value`, `len` bytes.
  static rdma_ucm_set_option SetOption(uint32_t id, uint32_t level, uint32_t name,
                                       const void* value, uint32_t len) {
    rdma_ucm_set_option b{};
    b.optval = Ptr(value);
    b.id = id;
    b.level = level;
    b.optname = name;
    b.optlen = len;
    return b;
  }
  static uint32_t DestroyId(int fd, uint32_t id) { return fftest::DestroyId(fd, id); }

  // The router writes an event for `owner` into channel `channel`; with `qp_type`, the
  // event carries a snapshot of `id` (version `version`) of a QP of that type.
  void SendEvent(uint32_t channel, uint32_t owner, uint32_t event, uint32_t id, uint64_t uid = 0,
                 int qp_type = -1, uint32_t version = 1) {
    ff::proto::CmEvent ev = MakeCmEvent(owner, event, id, uid);
    if (qp_type >= 0) {
      ev.state.handle = id;
      ev.state.version = version;
      ev.state.qp.seen = 1;
      ev.state.qp.qp_type = static_cast<uint8_t>(qp_type);
    }
    const int fd = pod_.router.cm_channel_fd(channel);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, &ev, sizeof(ev), MSG_DONTWAIT), static_cast<ssize_t>(sizeof(ev)));
  }

  static bool Readable(int fd, int timeout_ms = 0) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN) != 0;
  }

  // For each command of kind `cmd` the router received, in order: whether it was posted.
  std::vector<bool> PostedOf(uint32_t cmd) {
    std::vector<bool> out;
    for (const auto& c : Received(cmd)) out.push_back(c.h.seq == ff::proto::kPostedSeq);
    return out;
  }

  // Commands of kind `cmd` the router received.
  std::vector<ff::proto::CmCommand> Received(uint32_t cmd) {
    std::vector<ff::proto::CmCommand> out;
    for (const auto& c : pod_.router.cm_commands())
      if (c.cmd == cmd) out.push_back(c);
    return out;
  }

  // The router reported the end of id `id` (its DISCONNECTED went out): a DISCONNECT
  // flagged kCmEventWritten is answered without the flag.
  void RouterEnded(uint32_t id) { router_ended_.insert(id); }

  std::map<uint32_t, int> status_;  // cmd -> the router's status for it
  std::set<uint32_t> router_ended_;
  uint32_t next_handle_ = 100;
  std::vector<int> open_;
  // Last, so that it goes first: its router thread answers commands with the members above
  // until the pod is gone.
  Pod pod_;
};

}  // namespace fftest
