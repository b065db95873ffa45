// Which registrations an epoll set follows: only those of sockets connect() may still make
// streams (a TCP socket made here, not connected yet) and of streams. A settled kernel
// socket's registration is the kernel's alone, so a program's epoll_ctl on it costs nothing
// more than the call (redis-benchmark makes five a request).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "epoll.h"
#include "freeflow/fd.h"
#include "freeflow/protocol.h"
#include "freeflow/stream_segment.h"
#include "real.h"
#include "sock.h"
#include "stream.h"
#include "stream_fixture.h"

namespace ff::fsocket::testing {
namespace {

class EpollFollowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    lst_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(lst_);
    addr_.sin_family = AF_INET;
    addr_.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(lst_.get(), reinterpret_cast<sockaddr*>(&addr_), sizeof(addr_)), 0);
    socklen_t len = sizeof(addr_);
    ASSERT_EQ(::getsockname(lst_.get(), reinterpret_cast<sockaddr*>(&addr_), &len), 0);
    ASSERT_EQ(::listen(lst_.get(), 4), 0);
    ep_ = ::epoll_create1(EPOLL_CLOEXEC);
    ASSERT_GE(ep_, 0);
  }
  void TearDown() override {
    if (ep_ >= 0) ::close(ep_);
  }

  size_t Followed() {
    Ref e = Lookup(ep_);
    return e && e->shadow ? e->shadow->tracked.load() : SIZE_MAX;
  }
  int Dial(int fd) { return ::connect(fd, reinterpret_cast<sockaddr*>(&addr_), sizeof(addr_)); }
  void Add(int fd, uint64_t data, uint32_t events = EPOLLIN) {
    epoll_event ev{events, {}};
    ev.data.u64 = data;
    ASSERT_EQ(::epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev), 0);
  }
  // The one registration epoll_wait must report now, with EPOLLIN.
  void Reports(uint64_t data) {
    epoll_event out[4];
    ASSERT_EQ(::epoll_wait(ep_, out, 4, 2000), 1);
    const uint64_t got = out[0].data.u64;  // epoll_event is packed
    EXPECT_EQ(got, data);
    EXPECT_TRUE(out[0].events & EPOLLIN);
  }

  ff::UniqueFd lst_;
  sockaddr_in addr_{};
  int ep_ = -1;
};

TEST_F(EpollFollowTest, OnlyTcpSocketsMadeHereMayBecomeStreams) {
  ff::UniqueFd tcp(::socket(AF_INET, SOCK_STREAM, 0));
  ff::UniqueFd tcp6(::socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK, IPPROTO_TCP));
  ff::UniqueFd udp(::socket(AF_INET, SOCK_DGRAM, 0));
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  EXPECT_TRUE(MayBecomeStream(tcp.get()));
  EXPECT_TRUE(MayBecomeStream(tcp6.get()));
  EXPECT_FALSE(MayBecomeStream(udp.get()));
  EXPECT_FALSE(MayBecomeStream(pair[0]));
  EXPECT_FALSE(MayBecomeStream(lst_.get())) << "a listener never connects";
  const int copy = ::dup(tcp.get());
  EXPECT_TRUE(MayBecomeStream(copy)) << "either number may be connected";
  ASSERT_EQ(::close(copy), 0);
  EXPECT_FALSE(MayBecomeStream(copy)) << "the number is free for another descriptor";
  ASSERT_EQ(Dial(tcp.get()), 0);
  EXPECT_FALSE(MayBecomeStream(tcp.get())) << "connect() decided it";
  ff::UniqueFd accepted(::accept(lst_.get(), nullptr, nullptr));
  ASSERT_TRUE(accepted);
  EXPECT_FALSE(MayBecomeStream(accepted.get()));
  ::close(pair[0]);
  ::close(pair[1]);
}

TEST_F(EpollFollowTest, ASocketRegisteredBeforeItsConnectIsFollowedUntilTheConnect) {
  ff::UniqueFd c(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  Add(c.get(), 7, EPOLLIN | EPOLLOUT | EPOLLET);  // nginx's upstream connect does
  EXPECT_EQ(Followed(), 1u);
  ASSERT_EQ(Dial(c.get()), 0);  // loopback, outside VNET_PREFIX: kernel TCP
  EXPECT_EQ(Followed(), 0u) << "kernel TCP now: the kernel's registration is all";
  ff::UniqueFd peer(::accept(lst_.get(), nullptr, nullptr));
  ASSERT_TRUE(peer);
  epoll_event out[4];
  ASSERT_EQ(::epoll_wait(ep_, out, 4, 2000), 1);  // connected: writable
  ASSERT_EQ(::write(peer.get(), "x", 1), 1);
  Reports(7);
}

TEST_F(EpollFollowTest, AConnectedSocketIsTheKernelsAlone) {
  ff::UniqueFd c(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_EQ(Dial(c.get()), 0);
  ff::UniqueFd peer(::accept(lst_.get(), nullptr, nullptr));
  ASSERT_TRUE(peer);
  Add(c.get(), 11);
  Add(peer.get(), 12);
  EXPECT_EQ(Followed(), 0u);
  ASSERT_EQ(::write(peer.get(), "ab", 2), 2);
  Reports(11);
  epoll_event mod{EPOLLIN, {}};
  mod.data.u64 = 13;
  ASSERT_EQ(::epoll_ctl(ep_, EPOLL_CTL_MOD, c.get(), &mod), 0);
  Reports(13);
  ASSERT_EQ(::epoll_ctl(ep_, EPOLL_CTL_DEL, c.get(), nullptr), 0);
  epoll_event out[4];
  EXPECT_EQ(::epoll_wait(ep_, out, 4, 0), 0);
  EXPECT_EQ(::epoll_ctl(ep_, EPOLL_CTL_DEL, c.get(), nullptr), -1) << "the kernel's answer";
  EXPECT_EQ(errno, ENOENT);
}

// connect() makes a stream of a socket the set already holds (nginx registers an upstream
// connection before it connects): the followed registration becomes the stream's, and the
// stream's bytes are reported with the program's data. The stream is joined here by hand,
// as connect does after the router's answer.
TEST_F(EpollFollowTest, ARegistrationMadeBeforeTheStreamIsTakenOverByIt) {
  ff::UniqueFd c(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  Add(c.get(), 21, EPOLLIN | EPOLLRDHUP | EPOLLET);
  ASSERT_EQ(Followed(), 1u);
  ASSERT_EQ(real::connect(c.get(), reinterpret_cast<sockaddr*>(&addr_), sizeof(addr_)), 0);
  ff::UniqueFd peer(::accept(lst_.get(), nullptr, nullptr));
  ASSERT_TRUE(peer);
  ff::UniqueFd seg;
  ASSERT_EQ(ff::CreateSegment("test-stream", ff::StreamSegmentBytes(kTestRingBytes), &seg), 0);
  Ref ends[2];
  const int fds[2] = {c.get(), peer.get()};
  for (uint32_t role : {ff::proto::kStreamClient, ff::proto::kStreamServer}) {
    ff::UniqueFd side;
    ASSERT_EQ(ff::CreateSegment("test-side", ff::kStreamSideBytes, &side), 0);
    ends[role] = NewSock(Kind::kStream);
    ASSERT_EQ(
        AttachStream(*ends[role], seg.get(), side.get(), ff::UniqueFd(), role, kTestRingBytes), 0);
    Install(fds[role], ends[role].get());
    TagStream(fds[role], *ends[role]);
  }
  EpollStreamCreated(c.get(), ends[ff::proto::kStreamClient].get());
  SetMayBecomeStream(c.get(), false);
  ASSERT_EQ(::write(peer.get(), "hi", 2), 2);
  Reports(21);
  char buf[4];
  EXPECT_EQ(::read(c.get(), buf, sizeof(buf)), 2);
  EXPECT_EQ(KernelBytes(c.get()), 0) << "the bytes went through the segment";
}

}  // namespace
}  // namespace ff::fsocket::testing
