// Helpers of the node-link tests: two transport ends on 127.0.0.1, each with its own loop
// driven by the test's thread, and a recorder of what each end's handler heard.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "harness.h"
#include "nodes/tcp_transport.h"

namespace ff::router::test {

inline constexpr uint32_t kLoopback = 0x7f000001;

struct Recorder final : NodeTransport::Handler {
  struct Got {
    LinkId link;
    wire::Type type;
    uint32_t chan;
    std::string body;
  };
  Verdict OnMessage(LinkId link, const NodeMessage& m) override {
    if (hold) {
      ++offers_held;
      held_link = link;
      return Verdict::kHold;
    }
    got.push_back({link, m.type, m.chan, std::string(m.body, m.len)});
    return Verdict::kConsumed;
  }
  void OnDrained(LinkId link) override { drained.push_back(link); }
  void OnLinkDown(LinkId link, const std::string& why) override {
    down.push_back(link);
    last_why = why;
  }
  bool hold = false;
  int offers_held = 0;
  LinkId held_link = kNoLink;
  std::vector<Got> got;
  std::vector<LinkId> drained, down;
  std::string last_why;
};

// One transport with its own loop, driven by the test's thread.
struct End {
  explicit End(const std::string& node, uint32_t timeout_ms = 2000,
               std::shared_ptr<const TlsContext> tls = nullptr)
      : node(node), transport(TcpTransport::Options{node, kLoopback, 0, timeout_ms, tls}) {
    EXPECT_EQ(loop.Init(), 0);
    std::string error;
    EXPECT_TRUE(transport.Start(loop, recorder, &error)) << error;
  }
  // Where it listens, under the name the control plane would give it.
  cp::Endpoint endpoint() const { return {node, kLoopback, transport.port()}; }
  std::string node;
  EventLoop loop;
  Recorder recorder;
  TcpTransport transport;
};

template <typename Pred>
inline bool Pump(std::initializer_list<End*> ends, Pred pred, int ms = 5000) {
  return WaitFor(
      [&] {
        for (End* e : ends) e->loop.RunOnce(0);
        return pred();
      },
      std::chrono::milliseconds(ms));
}

// A frame body of `len` bytes that a kResp frame may carry.
inline std::string RespBody(uint32_t data_len, char fill) {
  RecordHeader h = ResponseHeader(data_len);
  std::string body(sizeof(h) + h.frag_len, fill);
  std::memcpy(body.data(), &h, sizeof(h));
  return body;
}

// A plain TCP connection to a router's port from address `from` (any of 127/8), its
// connect begun and not waited for: a test opening many before it pumps the router's loop
// would otherwise block once the listen backlog is full.
inline UniqueFd ConnectingClient(uint16_t port, uint32_t from = kLoopback) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr.s_addr = htonl(from);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&src), sizeof(src)), 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(kLoopback);
  const int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a));
  EXPECT_TRUE(rc == 0 || errno == EINPROGRESS) << std::strerror(errno);
  return fd;
}

// The same, connected (within 2 s) and blocking.
inline UniqueFd RawClient(uint16_t port, uint32_t from = kLoopback) {
  UniqueFd fd = ConnectingClient(port, from);
  pollfd p{fd.get(), POLLOUT, 0};
  EXPECT_EQ(::poll(&p, 1, 2000), 1) << "connect did not complete";
  int error = 0;
  socklen_t len = sizeof(error);
  EXPECT_EQ(::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &len), 0);
  EXPECT_EQ(error, 0) << std::strerror(error);
  EXPECT_EQ(::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK), 0);
  return fd;
}

}  // namespace ff::router::test
