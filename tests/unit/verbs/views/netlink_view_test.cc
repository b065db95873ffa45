// RDMA netlink for freeflow0 (verbs/src/views/netlink_view.cc, netlink_socket.cc): the
// kernel's answers to the NLDEV requests iproute2's `rdma` and rdma-core send, from a
// device's facts; and the socket a program gets where the kernel has no RDMA netlink (this
// machine's kernel has none), through the interposed socket calls.
#include "views/netlink_view.h"

#include <endian.h>
#include <gtest/gtest.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <rdma/rdma_netlink.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "base/fd_marks.h"
#include "views/device_facts.h"

namespace fftest {
namespace {

using ff::verbs::AnswerNetlink;
using ff::verbs::DeviceFacts;

constexpr uint32_t kPortId = 4242;
constexpr uint32_t kSeq = 77;

DeviceFacts Facts() {
  DeviceFacts f;
  f.name = "freeflow0";
  f.uverbs = "uverbs0";
  f.index = 0;
  std::strcpy(f.device.fw_ver, "freeflow-0.1");
  f.device.node_guid = htobe64(0x024646fffe0a0b0cULL);
  f.device.sys_image_guid = f.device.node_guid;
  f.device.phys_port_cnt = 1;
  f.device.device_cap_flags = IBV_DEVICE_MEM_WINDOW;
  f.port.state = IBV_PORT_ACTIVE;
  f.port.phys_state = 5;
  f.port.link_layer = IBV_LINK_LAYER_ETHERNET;
  f.netdev_index = 7;
  f.netdev = "eth0";
  return f;
}

// A request as `rdma` writes it: a header, then u32 attributes.
std::string Request(uint16_t op, uint16_t flags,
                    std::vector<std::pair<uint16_t, uint32_t>> attrs = {},
                    uint16_t client = RDMA_NL_NLDEV) {
  std::string out(NLMSG_HDRLEN, '\0');
  for (const auto& [type, value] : attrs) {
    nlattr a{static_cast<uint16_t>(NLA_HDRLEN + 4), type};
    out.append(reinterpret_cast<const char*>(&a), sizeof(a));
    out.append(reinterpret_cast<const char*>(&value), 4);
  }
  nlmsghdr h{};
  h.nlmsg_len = static_cast<uint32_t>(out.size());
  h.nlmsg_type = static_cast<uint16_t>(RDMA_NL_GET_TYPE(client, op));
  h.nlmsg_flags = static_cast<uint16_t>(NLM_F_REQUEST | flags);
  h.nlmsg_seq = kSeq;
  std::memcpy(out.data(), &h, sizeof(h));
  return out;
}

// One answered message: its header and its attributes by type (raw payloads).
struct Msg {
  nlmsghdr h;
  std::map<uint16_t, std::string> attrs;
  int error = 0;  // NLMSG_ERROR's, or NLMSG_DONE's
  uint32_t U32(uint16_t t) const { return Get<uint32_t>(t); }
  uint64_t U64(uint16_t t) const { return Get<uint64_t>(t); }
  uint8_t U8(uint16_t t) const { return Get<uint8_t>(t); }
  std::string Str(uint16_t t) const {
    const auto it = attrs.find(t);
    return it == attrs.end() || it->second.empty() ? "<none>"
                                                   : it->second.substr(0, it->second.size() - 1);
  }
  template <typename T>
  T Get(uint16_t t) const {
    const auto it = attrs.find(t);
    T v{};
    if (it != attrs.end() && it->second.size() == sizeof(T))
      std::memcpy(&v, it->second.data(), sizeof(T));
    return v;
  }
};

std::vector<Msg> Parse(const std::vector<std::string>& datagrams) {
  std::vector<Msg> out;
  for (const std::string& d : datagrams) {
    int left = static_cast<int>(d.size());
    for (auto* h = reinterpret_cast<const nlmsghdr*>(d.data()); NLMSG_OK(h, left);
         h = NLMSG_NEXT(h, left)) {
      Msg m{};
      m.h = *h;
      const char* p = reinterpret_cast<const char*>(h) + NLMSG_HDRLEN;
      const char* end = reinterpret_cast<const char*>(h) + h->nlmsg_len;
      if (h->nlmsg_type == NLMSG_ERROR || h->nlmsg_type == NLMSG_DONE) {
        std::memcpy(&m.error, p, sizeof(int));
      } else {
        while (p + NLA_HDRLEN <= end) {
          nlattr a;
          std::memcpy(&a, p, sizeof(a));
          m.attrs[a.nla_type] = std::string(p + NLA_HDRLEN, a.nla_len - NLA_HDRLEN);
          p += NLA_ALIGN(a.nla_len);
        }
      }
      out.push_back(m);
    }
  }
  return out;
}

std::vector<Msg> Ask(const DeviceFacts* f, const std::string& request) {
  return Parse(AnswerNetlink(f, request.data(), request.size(), kPortId));
}

TEST(NetlinkView, TheDeviceDumpListsFreeflow0AsTheKernelDescribesARoceDevice) {
  const DeviceFacts f = Facts();
  const auto m = Ask(&f, Request(RDMA_NLDEV_CMD_GET, NLM_F_DUMP | NLM_F_ACK));
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].h.nlmsg_flags & NLM_F_MULTI, NLM_F_MULTI);
  EXPECT_EQ(m[0].h.nlmsg_seq, kSeq);
  EXPECT_EQ(m[0].h.nlmsg_pid, kPortId);
  EXPECT_EQ(m[0].U32(RDMA_NLDEV_ATTR_DEV_INDEX), 0u);
  EXPECT_EQ(m[0].Str(RDMA_NLDEV_ATTR_DEV_NAME), "freeflow0");
  EXPECT_EQ(m[0].U32(RDMA_NLDEV_ATTR_PORT_INDEX), 1u) << "the number of ports";
  EXPECT_EQ(m[0].Str(RDMA_NLDEV_ATTR_FW_VERSION), "freeflow-0.1");
  EXPECT_EQ(m[0].U64(RDMA_NLDEV_ATTR_NODE_GUID), 0x024646fffe0a0b0cULL) << "host order";
  EXPECT_EQ(m[0].U64(RDMA_NLDEV_ATTR_SYS_IMAGE_GUID), 0x024646fffe0a0b0cULL);
  EXPECT_EQ(m[0].U8(RDMA_NLDEV_ATTR_DEV_NODE_TYPE), RDMA_NODE_IB_CA);
  EXPECT_EQ(m[0].U64(RDMA_NLDEV_ATTR_CAP_FLAGS), static_cast<uint64_t>(IBV_DEVICE_MEM_WINDOW));
  EXPECT_EQ(m[0].Str(RDMA_NLDEV_ATTR_DEV_PROTOCOL), "roce");
  EXPECT_EQ(m[1].h.nlmsg_type, NLMSG_DONE);
  EXPECT_EQ(m[1].error, 0);

  const auto none = Ask(nullptr, Request(RDMA_NLDEV_CMD_GET, NLM_F_DUMP));
  ASSERT_EQ(none.size(), 1u) << "no device: the dump is empty";
  EXPECT_EQ(none[0].h.nlmsg_type, NLMSG_DONE);
}

TEST(NetlinkView, ARequestForOneDeviceOrPortIsAnsweredThenAcknowledged) {
  const DeviceFacts f = Facts();
  auto m = Ask(&f, Request(RDMA_NLDEV_CMD_GET, NLM_F_ACK, {{RDMA_NLDEV_ATTR_DEV_INDEX, 0}}));
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].Str(RDMA_NLDEV_ATTR_DEV_NAME), "freeflow0");
  EXPECT_EQ(m[0].h.nlmsg_flags, 0);
  EXPECT_EQ(m[1].h.nlmsg_type, NLMSG_ERROR);
  EXPECT_EQ(m[1].error, 0) << "the acknowledgement";

  m = Ask(&f, Request(RDMA_NLDEV_CMD_PORT_GET, NLM_F_ACK,
                      {{RDMA_NLDEV_ATTR_DEV_INDEX, 0}, {RDMA_NLDEV_ATTR_PORT_INDEX, 1}}));
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].U32(RDMA_NLDEV_ATTR_PORT_INDEX), 1u);
  EXPECT_EQ(m[0].U8(RDMA_NLDEV_ATTR_PORT_STATE), IBV_PORT_ACTIVE);
  EXPECT_EQ(m[0].U8(RDMA_NLDEV_ATTR_PORT_PHYS_STATE), 5);
  EXPECT_EQ(m[0].U32(RDMA_NLDEV_ATTR_NDEV_INDEX), 7u);
  EXPECT_EQ(m[0].Str(RDMA_NLDEV_ATTR_NDEV_NAME), "eth0");
  EXPECT_EQ(m[0].attrs.count(RDMA_NLDEV_ATTR_LID), 0u) << "a RoCE port has no LID attribute";

  m = Ask(&f, Request(RDMA_NLDEV_CMD_PORT_GET, NLM_F_DUMP, {{RDMA_NLDEV_ATTR_DEV_INDEX, 0}}));
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].Str(RDMA_NLDEV_ATTR_NDEV_NAME), "eth0");
  EXPECT_EQ(m[1].h.nlmsg_type, NLMSG_DONE);

  m = Ask(&f, Request(RDMA_NLDEV_CMD_SYS_GET, NLM_F_ACK));
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].U8(RDMA_NLDEV_SYS_ATTR_NETNS_MODE), 0) << "exclusive: a pod sees its own";
  EXPECT_EQ(m[0].U8(RDMA_NLDEV_SYS_ATTR_COPY_ON_FORK), 1);
}

TEST(NetlinkView, WhatTheKernelWouldRefuseIsRefusedWithItsError) {
  const DeviceFacts f = Facts();
  struct Case {
    const char* what;
    std::string request;
    int error;
  } cases[] = {
      {"a device that does not exist",
       Request(RDMA_NLDEV_CMD_GET, 0, {{RDMA_NLDEV_ATTR_DEV_INDEX, 3}}), -EINVAL},
      {"a device request without an index", Request(RDMA_NLDEV_CMD_GET, 0), -EINVAL},
      {"a port that does not exist",
       Request(RDMA_NLDEV_CMD_PORT_GET, 0,
               {{RDMA_NLDEV_ATTR_DEV_INDEX, 0}, {RDMA_NLDEV_ATTR_PORT_INDEX, 2}}),
       -EINVAL},
      {"a port dump without a device", Request(RDMA_NLDEV_CMD_PORT_GET, NLM_F_DUMP), -EINVAL},
      {"resources (the router counts them)",
       Request(RDMA_NLDEV_CMD_RES_GET, 0, {{RDMA_NLDEV_ATTR_DEV_INDEX, 0}}), -EOPNOTSUPP},
      {"renaming the device",
       Request(RDMA_NLDEV_CMD_SET, NLM_F_ACK, {{RDMA_NLDEV_ATTR_DEV_INDEX, 0}}), -EOPNOTSUPP},
      {"another netlink client", Request(1, 0, {}, RDMA_NL_IWCM), -EINVAL},
  };
  for (const Case& c : cases) {
    const auto m = Ask(&f, c.request);
    ASSERT_EQ(m.size(), 1u) << c.what;
    EXPECT_EQ(m[0].h.nlmsg_type, NLMSG_ERROR) << c.what;
    EXPECT_EQ(m[0].error, c.error) << c.what;
    EXPECT_EQ(m[0].h.nlmsg_seq, kSeq) << c.what;
  }
  // An attribute that runs past its message: EINVAL, nothing read past the end.
  std::string bad = Request(RDMA_NLDEV_CMD_GET, 0, {{RDMA_NLDEV_ATTR_DEV_INDEX, 0}});
  bad[NLMSG_HDRLEN] = 40;
  const auto m = Ask(&f, bad);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].error, -EINVAL);
  EXPECT_TRUE(Ask(&f, std::string(8, '\0')).empty()) << "less than a header: nothing";
}

TEST(NetlinkSocket, WhereTheKernelHasNoRdmaNetlinkTheProgramGetsOneThatAnswers) {
  const int fd = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_RDMA);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  sockaddr_nl self{};
  self.nl_family = AF_NETLINK;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&self), sizeof(self)), 0);
  socklen_t len = sizeof(self);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len), 0);
  EXPECT_EQ(len, sizeof(sockaddr_nl));
  EXPECT_EQ(self.nl_family, AF_NETLINK);
  EXPECT_NE(self.nl_pid, 0u);
  const int one = 1;
  EXPECT_EQ(::setsockopt(fd, SOL_NETLINK, NETLINK_CAP_ACK, &one, sizeof(one)), 0);

  // Whether this process has a device depends on the tests before (a fake router): the
  // dump lists it or is empty, and ends with DONE either way.
  const std::string req = Request(RDMA_NLDEV_CMD_GET, NLM_F_DUMP | NLM_F_ACK);
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  ASSERT_EQ(
      ::sendto(fd, req.data(), req.size(), 0, reinterpret_cast<sockaddr*>(&kernel), sizeof(kernel)),
      static_cast<ssize_t>(req.size()));
  bool done = false;
  for (int datagram = 0; datagram < 4 && !done; ++datagram) {
    char buf[4096];
    sockaddr_nl from{};
    iovec iov{buf, sizeof(buf)};
    msghdr msg{};
    msg.msg_name = &from;
    msg.msg_namelen = sizeof(from);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    const ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT);
    ASSERT_GT(n, 0) << std::strerror(errno);
    EXPECT_EQ(msg.msg_namelen, sizeof(sockaddr_nl));
    EXPECT_EQ(from.nl_family, AF_NETLINK);
    EXPECT_EQ(from.nl_pid, 0u) << "from the kernel";
    int left = static_cast<int>(n);
    for (auto* h = reinterpret_cast<const nlmsghdr*>(buf); NLMSG_OK(h, left);
         h = NLMSG_NEXT(h, left)) {
      EXPECT_EQ(h->nlmsg_seq, kSeq);
      EXPECT_EQ(h->nlmsg_pid, self.nl_pid);
      if (h->nlmsg_type == NLMSG_DONE) done = true;
    }
  }
  EXPECT_TRUE(done) << "the dump ends with DONE";
  ::close(fd);

  // Other sockets are the kernel's own, also one at the number the library's had.
  const int udp = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(udp, 0);
  EXPECT_EQ(udp, fd) << "the closed socket's number is the lowest free one";
  sockaddr_in any{};
  len = sizeof(any);
  ASSERT_EQ(::getsockname(udp, reinterpret_cast<sockaddr*>(&any), &len), 0);
  EXPECT_EQ(any.sin_family, AF_INET);
  ::close(udp);
  errno = 0;
  EXPECT_EQ(::socket(AF_NETLINK, SOCK_RAW, 31), -1) << "other netlink families are untouched";
}

// A socket that takes the number of one the program released is not looked at: no fstat per
// send for it (the mark goes with the number, whichever call of the close family released
// it), while a call that releases nothing leaves the mark.
TEST(NetlinkSocket, ANumberTheProgramReleasedIsNoLongerMarked) {
  using ff::verbs::FdKind;
  using ff::verbs::g_library_fds;
  const auto made = [] { return ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_RDMA); };
  const auto marked = [](int fd) { return g_library_fds.Maybe(fd, FdKind::kNetlink); };

  int fd = made();
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_TRUE(marked(fd));
  ASSERT_EQ(::close(fd), 0);
  EXPECT_FALSE(marked(fd)) << "close";

  fd = made();
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::close_range(fd, fd, CLOSE_RANGE_CLOEXEC), 0);
  EXPECT_TRUE(marked(fd)) << "close_range(CLOEXEC) releases nothing";
  ASSERT_EQ(::close_range(fd, fd, 0), 0);
  EXPECT_FALSE(marked(fd)) << "close_range";

  fd = made();
  ASSERT_GE(fd, 0);
  const int udp = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(udp, 0);
  ASSERT_EQ(::dup2(udp, fd), fd);
  EXPECT_FALSE(marked(fd)) << "dup2 onto it";
  ::close(fd);
  ::close(udp);

  // The rdma_cm kind shares the table and keeps its own bit.
  fd = made();
  ASSERT_GE(fd, 0);
  g_library_fds.Set(fd, FdKind::kCmChannel, true);
  g_library_fds.ClearLow(static_cast<unsigned>(fd), static_cast<unsigned>(fd), FdKind::kNetlink);
  EXPECT_FALSE(marked(fd));
  EXPECT_TRUE(g_library_fds.Maybe(fd, FdKind::kCmChannel));
  EXPECT_TRUE(g_library_fds.Maybe(fd));
  g_library_fds.Set(fd, FdKind::kCmChannel, false);
  EXPECT_FALSE(g_library_fds.Maybe(fd));
  ::close(fd);
}

}  // namespace
}  // namespace fftest
