// Two ends of one accelerated connection in one process: a loopback TCP connection (the
// kernel connection every stream keeps) whose two descriptors are joined to one stream
// segment made here, with a side memfd per end, as the router hands them out.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "freeflow/fd.h"
#include "freeflow/protocol.h"
#include "freeflow/stream_segment.h"
#include "real.h"
#include "sock.h"
#include "stream.h"

namespace ff::fsocket::testing {

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
  int client_ = -1, server_ = -1;
  ff::UniqueFd seg_;
  ff::Mapping view_;

 private:
  void Join(int fd, uint32_t role) {
    ff::UniqueFd side;
    ASSERT_EQ(ff::CreateSegment("test-side", ff::kStreamSideBytes, &side), 0);
    Ref s = NewSock(Kind::kStream);
    ASSERT_EQ(AttachStream(*s, seg_.get(), side.get(), role, ring_bytes_), 0);
    Install(fd, s.get());
    TagStream(fd, *s);  // as connect and accept do
  }
};

}  // namespace ff::fsocket::testing
