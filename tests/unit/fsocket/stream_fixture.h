// Two ends of one accelerated connection in one process: a loopback TCP connection (the
// kernel connection every stream keeps) whose two descriptors are joined to one stream
// segment made here, with a side memfd per end and, unless a test asks for none (bells_
// false: every bell on the kernel connection), a bell per end, as the router hands them out.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "freeflow/fd.h"
#include "freeflow/protocol.h"
#include "freeflow/stream_segment.h"
#include "real.h"
#include "sock.h"
#include "stream.h"

namespace ff::fsocket::testing {

inline std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

// Reads exactly n bytes (or fails the test).
inline std::vector<uint8_t> ReadAll(int fd, size_t n) {
  std::vector<uint8_t> out(n);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, out.data() + got, n - got);
    EXPECT_GT(r, 0) << strerror(errno);
    if (r <= 0) break;
    got += r;
  }
  return out;
}

// Bytes waiting in the kernel socket itself (the bells): data must never be there.
inline int KernelBytes(int fd) {
  char buf[4096];
  const ssize_t n = real::recv(fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_PEEK);
  if (n < 0) return 0;
  for (ssize_t i = 0; i < n; ++i)
    if (buf[i] != ff::kBellData && buf[i] != ff::kBellSpace) return -1;
  return static_cast<int>(n);
}

inline constexpr uint32_t kTestRingBytes = 64 * 1024;

class StreamPair : public ::testing::Test {
 protected:
  void SetUp() override {
    ff::UniqueFd lst(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(lst);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(lst.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    socklen_t len = sizeof(a);
    ASSERT_EQ(::getsockname(lst.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
    ASSERT_EQ(::listen(lst.get(), 4), 0);
    client_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(client_, 0);
    ASSERT_EQ(::connect(client_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    server_ = ::accept4(lst.get(), nullptr, nullptr, SOCK_CLOEXEC);
    ASSERT_GE(server_, 0);
    ASSERT_EQ(ff::CreateSegment("test-stream", ff::StreamSegmentBytes(ring_bytes_), &seg_), 0);
    if (bells_) {
      int sv[2];
      ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
      bell_[ff::proto::kStreamClient].reset(sv[0]);
      bell_[ff::proto::kStreamServer].reset(sv[1]);
    }
    Join(client_, ff::proto::kStreamClient);
    Join(server_, ff::proto::kStreamServer);
  }

  void TearDown() override {
    if (client_ >= 0) ::close(client_);
    if (server_ >= 0) ::close(server_);
  }

  // The ring `role` produces into, as the peer sees it (for attacks).
  ff::StreamRingHeader* RingOf(uint32_t ring) {
    return reinterpret_cast<ff::StreamRingHeader*>(view_.as<uint8_t>() +
                                                   ring * ff::kStreamRingHeaderStride);
  }
  ff::Mapping& View() {
    if (!view_.get()) {
      EXPECT_EQ(ff::MapSegment(seg_.get(), ff::StreamSegmentBytes(ring_bytes_), true, &view_), 0);
    }
    return view_;
  }

  uint32_t ring_bytes_ = kTestRingBytes;
  bool bells_ = true;
  int client_ = -1, server_ = -1;
  ff::UniqueFd bell_[2];  // per end (role): its side of the bell pair (the stream has a dup)
  ff::UniqueFd seg_;
  ff::Mapping view_;

 private:
  void Join(int fd, uint32_t role) {
    ff::UniqueFd side;
    ASSERT_EQ(ff::CreateSegment("test-side", ff::kStreamSideBytes, &side), 0);
    Ref s = NewSock(Kind::kStream);
    ff::UniqueFd bell;
    if (bells_) bell.reset(::dup(bell_[role].get()));
    ASSERT_EQ(AttachStream(*s, seg_.get(), side.get(), std::move(bell), role, ring_bytes_), 0);
    Install(fd, s.get());
    TagStream(fd, *s);  // as connect and accept do
  }
};

}  // namespace ff::fsocket::testing
