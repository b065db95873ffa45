// GET_EVENT, the event accounting librdmacm waits on, and DEVICE_REMOVAL when the router
// goes away (verbs/src/rdmacm/cm_events.cc, cm_table.cc), against the fake router.
#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <future>
#include <set>

#include "base/objects.h"
#include "cm_fixture.h"
#include "freeflow/cm_qp_attr.h"

namespace fftest {
namespace {

// A thread blocked in GET_EVENT on `fd` (checked to be still waiting after 100 ms): its
// result and the event it read.
std::future<std::pair<int, rdma_ucm_event_resp>> BlockedReader(int fd) {
  auto waiter = std::async(std::launch::async, [fd] {
    rdma_ucm_event_resp ev{};
    const int rc = GetEvent(fd, &ev);
    return std::make_pair(rc, ev);
  });
  EXPECT_EQ(waiter.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout)
      << "GET_EVENT blocks while nothing is queued";
  return waiter;
}

TEST_F(CmTest, EventsOfLiveIdsAreDeliveredAndCounted) {
  uint32_t channel = 0;
  const int fd = Open(O_RDWR | O_CLOEXEC | O_NONBLOCK, &channel);
  const uint32_t id = CreateId(fd, 0xabc);
  SendEvent(channel, 555, kEstablished, 555, 1);  // an id this process does not hold
  {
    const char junk[10] = {};
    ASSERT_EQ(::send(pod_.router.cm_channel_fd(channel), junk, sizeof(junk), 0), 10);
  }
  SendEvent(channel, id, kEstablished, id, 0xabc);
  rdma_ucm_event_resp ev{};
  ASSERT_EQ(GetEvent(fd, &ev), 0) << "the foreign and the malformed events are dropped";
  EXPECT_EQ(ev.event, kEstablished);
  EXPECT_EQ(ev.id, id);
  EXPECT_EQ(ev.uid, 0xabcu);
  EXPECT_EQ(GetEvent(fd, &ev), EAGAIN) << "nothing else queued";
  EXPECT_FALSE(Readable(fd));
  EXPECT_EQ(DestroyId(fd, id), 1u);
  SendEvent(channel, id, kEstablished, id, 0xabc);
  EXPECT_EQ(GetEvent(fd, &ev), EAGAIN) << "an event of a destroyed id is dropped";
}

TEST_F(CmTest, GetEventNeedsRoomAndCopiesNoMoreThanAsked) {
  uint32_t channel = 0;
  const int fd = Open(O_RDWR | O_CLOEXEC | O_NONBLOCK, &channel);
  const uint32_t id = CreateId(fd, 1);
  const uint16_t smallest = sizeof(rdma_ucm_event_resp) - sizeof(uint32_t) - sizeof(rdma_ucm_ece);
  struct {
    rdma_ucm_event_resp ev;
    char guard[8];
  } out;
  std::memset(&out, 0x7e, sizeof(out));
  EXPECT_EQ(GetEvent(fd, &out.ev, smallest - 1), ENOSPC);
  SendEvent(channel, id, kEstablished, id, 1);
  ASSERT_EQ(GetEvent(fd, &out.ev, smallest), 0);
  EXPECT_EQ(out.ev.event, kEstablished);
  const auto* tail = reinterpret_cast<const unsigned char*>(&out.ev) + smallest;
  for (size_t i = 0; i < sizeof(out) - smallest; ++i)
    ASSERT_EQ(tail[i], 0x7e) << "byte " << smallest + i << " was written";
}

TEST_F(CmTest, AConnectRequestMakesTheNewIdLiveWithTheAcceptedUid) {
  uint32_t channel = 0;
  const int fd = Open(O_RDWR | O_CLOEXEC | O_NONBLOCK, &channel);
  const uint32_t listener = CreateId(fd, 0x11);
  const uint32_t child = 4242;
  SendEvent(channel, listener, kConnectRequest, child, 0x11);
  rdma_ucm_event_resp ev{};
  ASSERT_EQ(GetEvent(fd, &ev), 0);
  EXPECT_EQ(ev.event, kConnectRequest);
  EXPECT_EQ(ev.id, child);
  rdma_ucm_accept acc{};
  acc.uid = 0x22;
  acc.id = child;
  acc.conn_param.valid = 1;
  ASSERT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_ACCEPT, acc), 0);
  SendEvent(channel, child, kEstablished, child, 0x22);
  ASSERT_EQ(GetEvent(fd, &ev), 0) << "the child is a live id";
  EXPECT_EQ(ev.id, child);
  // The router goes: each live id hears DEVICE_REMOVAL with its own uid.
  pod_.router.DropCmChannel(channel);
  std::map<uint32_t, uint64_t> removed;
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(GetEvent(fd, &ev), 0);
    EXPECT_EQ(ev.event, kDeviceRemoval);
    removed[ev.id] = ev.uid;
  }
  EXPECT_EQ(GetEvent(fd, &ev), EAGAIN);
  EXPECT_EQ(removed, (std::map<uint32_t, uint64_t>{{listener, 0x11}, {child, 0x22}}));
  EXPECT_EQ(DestroyId(fd, child), 2u) << "ESTABLISHED and DEVICE_REMOVAL";
  EXPECT_EQ(DestroyId(fd, listener), 2u) << "CONNECT_REQUEST and DEVICE_REMOVAL";
}

TEST_F(CmTest, MulticastEventsCountAgainstTheJoinAndItsId) {
  uint32_t channel = 0;
  const int fd = Open(O_RDWR | O_CLOEXEC | O_NONBLOCK, &channel);
  const uint32_t id = CreateId(fd, 5);
  rdma_ucm_create_id_resp join{};
  rdma_ucm_join_ip_mcast j{};
  j.response = Ptr(&join);
  j.uid = 0x55;
  j.id = id;
  ASSERT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_JOIN_IP_MCAST, j, sizeof(join)), 0);
  SendEvent(channel, id, kMulticastJoin, join.id, 0x55);
  rdma_ucm_event_resp ev{};
  ASSERT_EQ(GetEvent(fd, &ev), 0);
  EXPECT_EQ(ev.event, kMulticastJoin);
  rdma_ucm_destroy_id_resp left{~0u};
  rdma_ucm_destroy_id leave{};
  leave.response = Ptr(&left);
  leave.id = join.id;
  ASSERT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_LEAVE_MCAST, leave, sizeof(left)), 0);
  EXPECT_EQ(left.events_reported, 1u);
  EXPECT_EQ(DestroyId(fd, id), 1u);
}

// The router closes the channel while the program waits in GET_EVENT: it wakes with
// DEVICE_REMOVAL, then the descriptor is idle (poll says so, a non-blocking read EAGAIN),
// commands fail with ENODEV, and destroying the id still works.
TEST_F(CmTest, ABlockedReaderWakesWithDeviceRemovalThenTheChannelIsIdle) {
  uint32_t channel = 0;
  const int fd = Open(O_RDWR | O_CLOEXEC, &channel);
  const uint32_t id = CreateId(fd, 0x77);
  auto waiter = BlockedReader(fd);
  pod_.router.DropCmChannel(channel);
  ASSERT_EQ(waiter.wait_for(kWaitLimit), std::future_status::ready);
  const auto [rc, ev] = waiter.get();
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(ev.event, kDeviceRemoval);
  EXPECT_EQ(ev.id, id);
  EXPECT_EQ(ev.uid, 0x77u);
  EXPECT_FALSE(Readable(fd, 50)) << "idle, not EOF";
  EXPECT_EQ((::fcntl(fd, F_GETFD) & FD_CLOEXEC), FD_CLOEXEC);
  EXPECT_TRUE(ff::verbs::IsCmFd(fd));
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  ASSERT_EQ(::fcntl(fd, F_SETFL, O_NONBLOCK), 0);
  rdma_ucm_event_resp more{};
  EXPECT_EQ(GetEvent(fd, &more), EAGAIN);
  rdma_ucm_listen listen{};
  listen.id = id;
  const size_t before = pod_.router.cm_commands().size();
  EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_LISTEN, listen), ENODEV);
  EXPECT_EQ(pod_.router.cm_commands().size(), before) << "nothing goes to the router";
  EXPECT_EQ(DestroyId(fd, id), 1u) << "destroyed locally, with the one event read";
}

// Another thread closes the channel while one waits in GET_EVENT (rping closes it right
// after rdma_destroy_id, while its event thread goes back to rdma_get_cm_event). The kernel's
// read then holds the file and gets nothing more (the ids went with the close): the reader
// keeps waiting, whatever still arrives for those ids, and a signal ends the wait (EINTR).
// It used to read the closed number again and fail with EBADF, and rping exited 1.
void Nothing(int) {}

TEST_F(CmTest, AReaderWhoseChannelAnotherThreadClosesKeepsWaiting) {
  struct sigaction quiet {
  }, old{};
  quiet.sa_handler = Nothing;  // no SA_RESTART
  ASSERT_EQ(::sigaction(SIGUSR1, &quiet, &old), 0);
  uint32_t channel = 0;
  const int fd = Open(O_RDWR | O_CLOEXEC, &channel);
  const uint32_t id = CreateId(fd, 0x61);
  std::promise<pthread_t> who;
  auto reader = std::async(std::launch::async, [fd, &who] {
    who.set_value(::pthread_self());
    rdma_ucm_event_resp ev{};
    return GetEvent(fd, &ev);
  });
  const pthread_t thread = who.get_future().get();
  EXPECT_EQ(reader.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  ASSERT_EQ(::close(fd), 0);
  SendEvent(channel, id, kDisconnected, id, 0x61);  // for an id the close forgot
  if (reader.wait_for(std::chrono::milliseconds(200)) != std::future_status::timeout) {
    ::sigaction(SIGUSR1, &old, nullptr);
    FAIL() << "the reader returned " << reader.get() << " instead of waiting";
  }
  ASSERT_EQ(::pthread_kill(thread, SIGUSR1), 0);
  ASSERT_EQ(reader.wait_for(kWaitLimit), std::future_status::ready);
  EXPECT_EQ(reader.get(), EINTR);
  ::sigaction(SIGUSR1, &old, nullptr);
}

TEST_F(CmTest, ARouterThatDiedReportsDeviceRemoval) {
  uint32_t channel = 0;
  const int fd = Open(O_RDWR | O_CLOEXEC | O_NONBLOCK, &channel);
  const uint32_t id = CreateId(fd, 3);
  pod_.router.Close();
  // Readable once the library sees its session end (it shuts its copy of the router's end).
  ASSERT_TRUE(Readable(fd, 5000));
  rdma_ucm_event_resp ev{};
  ASSERT_EQ(GetEvent(fd, &ev), 0);
  EXPECT_EQ(ev.event, kDeviceRemoval);
  EXPECT_EQ(ev.id, id);
  rdma_ucm_create_id_resp resp{};
  rdma_ucm_create_id b{};
  b.response = Ptr(&resp);
  EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_CREATE_ID, b, sizeof(resp)), ENODEV);
  EXPECT_EQ(DestroyId(fd, id), 1u);
}

TEST_F(CmTest, EveryLiveIdHearsDeviceRemovalEvenPastTheSocketBuffer) {
  uint32_t channel = 0;
  const int fd = Open(O_RDWR | O_CLOEXEC | O_NONBLOCK, &channel);
  constexpr int kIds = 1500;
  std::set<uint32_t> ids;
  for (int i = 0; i < kIds; ++i) ids.insert(CreateId(fd, 1000 + i));
  ASSERT_EQ(ids.size(), static_cast<size_t>(kIds));
  pod_.router.DropCmChannel(channel);
  std::set<uint32_t> removed;
  rdma_ucm_event_resp ev{};
  for (int i = 0; i < kIds; ++i) {
    ASSERT_EQ(GetEvent(fd, &ev), 0) << "event " << i;
    ASSERT_EQ(ev.event, kDeviceRemoval);
    EXPECT_EQ(ev.uid, 1000u + (ev.id - 100)) << "handles are 100 on, uids 1000 on";
    removed.insert(ev.id);
  }
  EXPECT_EQ(removed, ids);
  EXPECT_EQ(GetEvent(fd, &ev), EAGAIN);
  EXPECT_FALSE(Readable(fd));
}

TEST_F(CmTest, AForkedChildCannotUseTheParentsChannel) {
  const int fd = Open();
  const uint32_t id = CreateId(fd, 9);
  const size_t before = pod_.router.cm_commands().size();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    rdma_ucm_listen listen{};
    listen.id = id;
    const int rc = CmdErrno(fd, RDMA_USER_CM_CMD_LISTEN, listen);
    rdma_ucm_event_resp ev{};
    const int get = GetEvent(fd, &ev);
    ::_exit(rc == ENODEV && get == ENODEV ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(pod_.router.cm_commands().size(), before);
  EXPECT_EQ(DestroyId(fd, id), 0u) << "the parent's channel still works";
}

// DESTROY_ID of an id of this process is posted (the router cannot refuse it and the answer
// is the library's count); a handle the library does not know waits for the router's error.
TEST_F(CmTest, DestroyOfAnOwnIdIsPostedOthersWaitForTheRouter) {
  const int fd = Open();
  const uint32_t id = CreateId(fd, 9);
  EXPECT_EQ(DestroyId(fd, id), 0u);
  status_[RDMA_USER_CM_CMD_DESTROY_ID] = ENOENT;
  rdma_ucm_destroy_id_resp resp{};
  rdma_ucm_destroy_id d{};
  d.id = 555;
  d.response = Ptr(&resp);
  EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_DESTROY_ID, d, sizeof(resp)), ENOENT);
  const auto sent = Received(RDMA_USER_CM_CMD_DESTROY_ID);  // in order: the posted one first
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].h.seq, ff::proto::kPostedSeq);
  EXPECT_NE(sent[1].h.seq, ff::proto::kPostedSeq);
}

// A listener's child is answered from the snapshot its CONNECT_REQUEST carried; the first
// command naming it is posted to the router (which learns the program holds it), later
// ones stay in the process.
TEST_F(CmTest, AChildsFirstQueryIsAnsweredHereAndPostedOnce) {
  uint32_t channel = 0;
  const int fd = Open(O_RDWR | O_CLOEXEC | O_NONBLOCK, &channel);
  const uint32_t listener = CreateId(fd, 0x11);
  const uint32_t child = 4242;
  ff::proto::CmEvent ev = MakeCmEvent(listener, kConnectRequest, child, 0x11);
  ev.state.handle = child;
  ev.state.version = 1;
  ev.state.qp.seen = 0;
  for (size_t i = 0; i < sizeof(ev.state.route); ++i) ev.state.route[i] = static_cast<char>(i);
  const int router_end = pod_.router.cm_channel_fd(channel);
  ASSERT_EQ(::send(router_end, &ev, sizeof(ev), MSG_DONTWAIT), static_cast<ssize_t>(sizeof(ev)));
  rdma_ucm_event_resp got{};
  ASSERT_EQ(GetEvent(fd, &got), 0);
  ASSERT_EQ(got.id, child);
  for (int round = 0; round < 2; ++round) {
    rdma_ucm_query_route_resp route{};
    rdma_ucm_query q{};
    q.id = child;
    q.response = Ptr(&route);
    ASSERT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_QUERY_ROUTE, q, sizeof(route)), 0);
    // As the snapshot has it, but for the device index, which is the session's.
    constexpr size_t kIndexAt = offsetof(rdma_ucm_query_route_resp, ibdev_index);
    EXPECT_EQ(std::memcmp(&route, ev.state.route, kIndexAt), 0) << round;
    EXPECT_EQ(route.ibdev_index, 0u) << round;
    EXPECT_EQ(std::memcmp(reinterpret_cast<const char*>(&route) + kIndexAt + 4,
                          ev.state.route + kIndexAt + 4, sizeof(route) - kIndexAt - 4),
              0)
        << round;
  }
  EXPECT_NE(CreateId(fd, 0x12), 0u);  // a call answered: the posted query came before it
  const auto sent = Received(RDMA_USER_CM_CMD_QUERY_ROUTE);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].h.seq, ff::proto::kPostedSeq);
}

// The active side's RTU (ACCEPT after CONNECT_RESPONSE) and DISCONNECT of an id whose
// ESTABLISHED or DISCONNECTED the program read are posted: the router's answer follows from
// those events. Before them, or once another command went to the router for the id, both
// wait for the router's answer (here EINVAL, which a posted command could not return).
TEST_F(CmTest, TheRtuAndDisconnectOfAConnectedIdArePostedOthersWait) {
  uint32_t channel = 0;
  const int fd = Open(O_RDWR | O_CLOEXEC | O_NONBLOCK, &channel);
  const uint32_t id = CreateId(fd, 0x31);
  status_[RDMA_USER_CM_CMD_ACCEPT] = EINVAL;
  status_[RDMA_USER_CM_CMD_DISCONNECT] = EINVAL;
  rdma_ucm_disconnect disc{};
  disc.id = id;
  rdma_ucm_accept rtu{};
  rtu.id = id;
  EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_DISCONNECT, disc), EINVAL) << "not connected yet";
  EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_ACCEPT, rtu), EINVAL) << "no CONNECT_RESPONSE read";
  SendEvent(channel, id, kConnectResponse, id, 0x31);
  rdma_ucm_event_resp ev{};
  ASSERT_EQ(GetEvent(fd, &ev), 0);
  ASSERT_EQ(ev.event, kConnectResponse);
  EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_ACCEPT, rtu), 0) << "the RTU is posted";
  EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_DISCONNECT, disc), 0) << "connected since the RTU";
  EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_DISCONNECT, disc), 0) << "and again";
  // A second connection: the program rejects the response instead (sent, answered), so a
  // later ACCEPT is the router's to refuse.
  const uint32_t other = CreateId(fd, 0x32);
  SendEvent(channel, other, kConnectResponse, other, 0x32);
  ASSERT_EQ(GetEvent(fd, &ev), 0);
  rdma_ucm_reject rej{};
  rej.id = other;
  EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_REJECT, rej), 0);
  rtu.id = other;
  EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_ACCEPT, rtu), EINVAL);
  // A passive side's id: DISCONNECT is posted once its ESTABLISHED was read.
  const uint32_t listener = CreateId(fd, 0x33);
  const uint32_t child = 4343;
  SendEvent(channel, listener, kConnectRequest, child, 0x33);
  SendEvent(channel, child, kEstablished, child, 0x33);
  ASSERT_EQ(GetEvent(fd, &ev), 0);
  ASSERT_EQ(GetEvent(fd, &ev), 0);
  ASSERT_EQ(ev.event, kEstablished);
  disc.id = child;
  EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_DISCONNECT, disc), 0);
  EXPECT_NE(CreateId(fd, 0x34), 0u);  // a call answered: everything posted came before it
  EXPECT_EQ(PostedOf(RDMA_USER_CM_CMD_ACCEPT), (std::vector<bool>{false, true, false}));
  EXPECT_EQ(PostedOf(RDMA_USER_CM_CMD_DISCONNECT), (std::vector<bool>{false, true, true, true}));
}

// DISCONNECT of a connected RC id whose end the program has not read is sent with
// kCmEventWritten; when the router answers with the flag (it has not reported the id's end
// itself) the library writes DISCONNECTED, once. When the router reported it (the peer's
// DREQ came first), nothing is written: the program reads the router's. After the program
// read its id's DISCONNECTED, DISCONNECT is not sent at all; for a UD id it is posted. A
// second DISCONNECTED for an id whose end was read is dropped (one end per connection).
TEST_F(CmTest, ADisconnectOfAConnectedIdIsReportedByTheLibraryOnce) {
  uint32_t channel = 0;
  const int fd = Open(O_RDWR | O_CLOEXEC | O_NONBLOCK, &channel);
  rdma_ucm_event_resp ev{};
  auto disconnect = [&](uint32_t id) {
    rdma_ucm_disconnect d{};
    d.id = id;
    return CmdErrno(fd, RDMA_USER_CM_CMD_DISCONNECT, d);
  };
  // An id the program connected (its RTU posted), and a passive side's id (ESTABLISHED read).
  auto active = [&](uint64_t uid) {
    const uint32_t id = CreateId(fd, uid);
    SendEvent(channel, id, kConnectResponse, id, uid, IBV_QPT_RC);
    EXPECT_EQ(GetEvent(fd, &ev), 0);
    rdma_ucm_accept rtu{};
    rtu.id = id;
    EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_ACCEPT, rtu), 0);
    return id;
  };
  const uint32_t listener = CreateId(fd, 0x80);
  auto passive = [&](uint32_t child, int qp_type) {
    SendEvent(channel, listener, kConnectRequest, child, 0x80, qp_type);
    SendEvent(channel, child, kEstablished, child, 0x80, qp_type, 2);
    EXPECT_EQ(GetEvent(fd, &ev), 0);
    EXPECT_EQ(GetEvent(fd, &ev), 0);
    EXPECT_EQ(ev.event, kEstablished);
    return child;
  };

  const uint32_t id = active(0x81);
  EXPECT_EQ(disconnect(id), 0);
  ASSERT_EQ(GetEvent(fd, &ev), 0) << "written by the library";
  EXPECT_EQ(ev.event, kDisconnected);
  EXPECT_EQ(ev.id, id);
  EXPECT_EQ(ev.uid, 0x81u);
  EXPECT_EQ(ev.status, 0u);
  EXPECT_EQ(disconnect(id), 0) << "again: neither sent nor written";
  EXPECT_EQ(GetEvent(fd, &ev), EAGAIN);

  // The peer's DREQ first (the router's DISCONNECTED queued, unread), then the program's
  // DISCONNECT: the router's answer has no flag, nothing is written.
  const uint32_t crossed = passive(8181, IBV_QPT_RC);
  SendEvent(channel, crossed, kDisconnected, crossed, 0x80);
  RouterEnded(crossed);
  EXPECT_EQ(disconnect(crossed), 0);
  ASSERT_EQ(GetEvent(fd, &ev), 0);
  EXPECT_EQ(ev.event, kDisconnected);
  EXPECT_EQ(ev.id, crossed);
  EXPECT_FALSE(Readable(fd)) << "no copy written (which would be dropped)";
  EXPECT_EQ(GetEvent(fd, &ev), EAGAIN) << "one DISCONNECTED";
  // A DISCONNECTED after the one read (no router of ours sends it): dropped.
  const uint32_t late = active(0x82);
  EXPECT_EQ(disconnect(late), 0);
  SendEvent(channel, late, kDisconnected, late, 0x82);
  ASSERT_EQ(GetEvent(fd, &ev), 0);
  EXPECT_EQ(ev.event, kDisconnected);
  EXPECT_EQ(GetEvent(fd, &ev), EAGAIN) << "the second is dropped";
  // The program read the peer's DISCONNECTED, then disconnects (as servers do).
  const uint32_t told = passive(8282, IBV_QPT_RC);
  SendEvent(channel, told, kDisconnected, told, 0x80);
  ASSERT_EQ(GetEvent(fd, &ev), 0);
  EXPECT_EQ(disconnect(told), 0);
  EXPECT_EQ(GetEvent(fd, &ev), EAGAIN);
  // UD: the router's to report.
  const uint32_t ud = passive(8383, IBV_QPT_UD);
  EXPECT_EQ(disconnect(ud), 0);
  EXPECT_EQ(GetEvent(fd, &ev), EAGAIN);

  EXPECT_NE(CreateId(fd, 0x84), 0u);  // a call answered: what was posted came before it
  // (posted, flags) of each DISCONNECT the router received
  std::vector<std::pair<bool, uint32_t>> sent;
  for (const auto& c : Received(RDMA_USER_CM_CMD_DISCONNECT))
    sent.emplace_back(c.h.seq == ff::proto::kPostedSeq, c.flags);
  const uint32_t w = ff::proto::kCmEventWritten;
  EXPECT_EQ(sent,
            (std::vector<std::pair<bool, uint32_t>>{{false, w}, {false, w}, {false, w}, {true, 0}}))
      << "id, crossed, late, ud";
}

// The router's `event` for id `id` (owner `owner`, uid `uid`), whose state names an RC peer QP
// `peer_qpn` at 10.244.0.2 (where Pod::Connect's RTR goes), read from `fd` by the program,
// which then asks INIT_QP_ATTR(RTR) for `id`, as librdmacm does before it moves its QP.
void ReadPeerThenAskRtr(int router_end, int fd, uint32_t owner, uint32_t event, uint32_t id,
                        uint64_t uid, uint32_t peer_qpn) {
  ff::proto::CmEvent ev = MakeCmEvent(owner, event, id, uid);
  ev.state.handle = id;
  ev.state.version = 1;
  ev.state.qp.seen = 1;
  ev.state.qp.qp_type = IBV_QPT_RC;
  ev.state.qp.connected = 1;
  ev.state.qp.remote_ip = 0x0af40002;
  ev.state.qp.remote_qpn = peer_qpn;
  ASSERT_EQ(::send(router_end, &ev, sizeof(ev), MSG_DONTWAIT), static_cast<ssize_t>(sizeof(ev)));
  rdma_ucm_event_resp got{};
  ASSERT_EQ(GetEvent(fd, &got), 0);
  ASSERT_EQ(got.event, event);
  ib_uverbs_qp_attr attr{};
  rdma_ucm_init_qp_attr q{};
  q.id = id;
  q.qp_state = IBV_QPS_RTR;
  q.response = Ptr(&attr);
  ASSERT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_INIT_QP_ATTR, q, sizeof(attr)), 0);
  EXPECT_EQ(attr.dest_qp_num, peer_qpn);
}

// After an RTR that rdma_cm set up: the router was not asked for a link; the QP named its
// peer (QP `peer_qpn` at 10.244.0.2) with one posted NameQp and awaits it.
void ExpectNamedWithoutALink(FakeRouter& router, ibv_qp* qp, uint32_t peer_qpn) {
  EXPECT_EQ(ff::verbs::ToQp(qp)->conn.awaited.waiting, true);
  EXPECT_EQ(router.connect_count(qp->qp_num), 0) << "the RTR waited for the router";
  const std::vector<ff::proto::NameQp> names = router.names();
  ASSERT_EQ(names.size(), 1u);
  EXPECT_EQ(names[0].h.seq, ff::proto::kPostedSeq);
  EXPECT_EQ(names[0].qpn, qp->qp_num);
  EXPECT_EQ(ntohl(names[0].dest_ip), 0x0af40002u);
  EXPECT_EQ(names[0].dest_qpn, peer_qpn);
}

// The passive side's RTR (rdma_accept's, before its ACCEPT) cannot find its peer's consent:
// the peer learns this side's QP number only from the REP. So the router is not asked: the
// peer is named by a posted NameQp, and the QP awaits it as after an EINPROGRESS answer. The
// note INIT_QP_ATTR left is taken once: another RTR to that peer connects as before.
TEST_F(CmTest, APassiveSidesRtrNamesItsPeerWithoutWaiting) {
  uint32_t channel = 0;
  const int fd = Open(O_RDWR | O_CLOEXEC | O_NONBLOCK, &channel);
  const uint32_t listener = CreateId(fd, 0x41);
  const uint32_t child = 4545;
  constexpr uint32_t kPeerQpn = 0x777;
  ASSERT_NO_FATAL_FAILURE(ReadPeerThenAskRtr(pod_.router.cm_channel_fd(channel), fd, listener,
                                             kConnectRequest, child, 0x41, kPeerQpn));
  ibv_qp* qp = pod_.CreateQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(pod_.Connect(qp, kPeerQpn), 0);
  EXPECT_NE(CreateId(fd, 0x42), 0u);  // a call answered: what was posted came before it
  ASSERT_NO_FATAL_FAILURE(ExpectNamedWithoutALink(pod_.router, qp, kPeerQpn));
  ibv_qp* other = pod_.CreateQp();
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(pod_.Connect(other, kPeerQpn), EHOSTUNREACH) << "asked, and refused";
  EXPECT_EQ(pod_.router.connect_count(other->qp_num), 1);
}

// The active side's RTR (after CONNECT_RESPONSE, before its RTU) would find its peer's
// consent (the passive side names it before its ACCEPT), but asks for no link: the peer is
// named by a posted NameQp and the first send links the QP. A connection that sends nothing
// costs no wait for the router at RTR; one that sends links when it first needs to.
TEST_F(CmTest, AnActiveSidesRtrNamesItsPeerAndItsFirstSendLinks) {
  uint32_t channel = 0;
  const int fd = Open(O_RDWR | O_CLOEXEC | O_NONBLOCK, &channel);
  const uint32_t id = CreateId(fd, 0x43);
  constexpr uint32_t kPeerQpn = 0x778;
  ASSERT_NO_FATAL_FAILURE(ReadPeerThenAskRtr(pod_.router.cm_channel_fd(channel), fd, id,
                                             kConnectResponse, id, 0x43, kPeerQpn));
  SameNodePeer peer{kPeerQpn, IBV_QPT_RC, 4096};
  ibv_qp* qp = pod_.CreateQp();
  ASSERT_NE(qp, nullptr);
  pod_.router.AnswerSameNode(qp->qp_num, &peer);
  ASSERT_EQ(pod_.Connect(qp, kPeerQpn), 0);
  EXPECT_NE(CreateId(fd, 0x44), 0u);  // a call answered: what was posted came before it
  ASSERT_NO_FATAL_FAILURE(ExpectNamedWithoutALink(pod_.router, qp, kPeerQpn));
  peer.PostCredits(1);
  Buffer buf(pod_.pd, 64);
  std::memset(buf.data(), 'a', 64);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 64), 7), 0);
  const std::vector<ibv_wc> wcs = PollN(pod_.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 7u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(pod_.router.connect_count(qp->qp_num), 1) << "the first send linked the QP";
  ff::RecordHeader h;
  std::vector<char> payload;
  ASSERT_TRUE(peer.NextRecord(&h, &payload));
  EXPECT_EQ(h.src_qpn, qp->qp_num);
  EXPECT_EQ(std::string(payload.begin(), payload.end()), std::string(64, 'a'));
}

// A CONNECT of an id whose ROUTE_RESOLVED the program read, and the ACCEPT of a request it
// read, are posted: each starts an exchange whose outcome comes as events. Parameters the
// router would refuse (none given, private data longer than the REQ, REP or SIDR REP holds)
// are sent and refused (EINVAL here), as is a CONNECT before the route.
TEST_F(CmTest, AConnectOfAResolvedIdAndTheAcceptOfARequestArePosted) {
  uint32_t channel = 0;
  const int fd = Open(O_RDWR | O_CLOEXEC | O_NONBLOCK, &channel);
  status_[RDMA_USER_CM_CMD_CONNECT] = EINVAL;
  status_[RDMA_USER_CM_CMD_ACCEPT] = EINVAL;
  // The router's event, with the id's snapshot (the library reads its QP type there).
  auto deliver = [&](uint32_t owner, uint32_t event, uint32_t id, uint8_t qp_type) {
    static uint32_t version = 0;
    SendEvent(channel, owner, event, id, 0x51, qp_type, ++version);
    rdma_ucm_event_resp got{};
    ASSERT_EQ(GetEvent(fd, &got), 0);
  };
  auto connect = [&](uint32_t id, uint8_t valid, uint8_t data_len) {
    rdma_ucm_connect c{};
    c.id = id;
    c.conn_param.valid = valid;
    c.conn_param.private_data_len = data_len;
    return CmdErrno(fd, RDMA_USER_CM_CMD_CONNECT, c);
  };
  auto accept = [&](uint32_t id, uint8_t data_len) {
    rdma_ucm_accept a{};
    a.id = id;
    a.conn_param.valid = 1;
    a.conn_param.private_data_len = data_len;
    return CmdErrno(fd, RDMA_USER_CM_CMD_ACCEPT, a);
  };
  const uint32_t id = CreateId(fd, 0x51);
  EXPECT_EQ(connect(id, 1, 0), EINVAL) << "no ROUTE_RESOLVED read";
  deliver(id, kRouteResolved, id, IBV_QPT_RC);
  EXPECT_EQ(connect(id, 1, ff::kCmReqData), 0) << "posted";
  EXPECT_EQ(connect(id, 1, 0), EINVAL) << "a second CONNECT is the router's to refuse";
  const uint32_t too_long = CreateId(fd, 0x52), no_param = CreateId(fd, 0x53);
  deliver(too_long, kRouteResolved, too_long, IBV_QPT_RC);
  deliver(no_param, kRouteResolved, no_param, IBV_QPT_RC);
  EXPECT_EQ(connect(too_long, 1, ff::kCmReqData + 1), EINVAL);
  EXPECT_EQ(connect(no_param, 0, 0), EINVAL);
  const uint32_t listener = CreateId(fd, 0x54);
  const uint32_t rc_child = 5151, ud_child = 5152;
  deliver(listener, kConnectRequest, rc_child, IBV_QPT_RC);
  deliver(listener, kConnectRequest, ud_child, IBV_QPT_UD);
  EXPECT_EQ(accept(rc_child, ff::kCmRepData), 0) << "posted";
  EXPECT_EQ(accept(rc_child, 0), EINVAL) << "accepted already: the router's to refuse";
  EXPECT_EQ(accept(ud_child, ff::kCmSidrRepData + 1), EINVAL) << "more than a SIDR REP holds";
  EXPECT_NE(CreateId(fd, 0x55), 0u);  // a call answered: what was posted came before it
  EXPECT_EQ(PostedOf(RDMA_USER_CM_CMD_CONNECT),
            (std::vector<bool>{false, true, false, false, false}));
  EXPECT_EQ(PostedOf(RDMA_USER_CM_CMD_ACCEPT), (std::vector<bool>{true, false, false}));
}

// RESOLVE_ROUTE of an id whose ADDR_RESOLVED the program read is posted, and the library
// writes ROUTE_RESOLVED itself, with the routed path QUERY_ROUTE then answers; also when
// the channel has no room yet (the event follows those queued before it). Any other
// RESOLVE_ROUTE (none read, or a second one) is the router's to answer.
TEST_F(CmTest, ARouteAfterAnAddressTheProgramReadIsResolvedByTheLibrary) {
  uint32_t channel = 0;
  const int fd = Open(O_RDWR | O_CLOEXEC | O_NONBLOCK, &channel);
  const int router_end = pod_.router.cm_channel_fd(channel);
  status_[RDMA_USER_CM_CMD_RESOLVE_ROUTE] = EINVAL;
  constexpr uint8_t kTos = 0x20;
  auto address_resolved = [&](uint32_t id, uint64_t uid, uint32_t version) {
    ff::proto::CmEvent ev = MakeCmEvent(id, kAddrResolved, id, uid);
    ev.state.handle = id;
    ev.state.version = version;
    ev.state.qp.seen = 1;
    ev.state.qp.tos = kTos;
    ev.state.route[0] = 0x5a;  // node_guid's first byte: kept
    ASSERT_EQ(::send(router_end, &ev, sizeof(ev), MSG_DONTWAIT), static_cast<ssize_t>(sizeof(ev)));
  };
  auto resolve_route = [&](uint32_t id) {
    rdma_ucm_resolve_route r{};
    r.id = id;
    r.timeout_ms = 2000;
    return CmdErrno(fd, RDMA_USER_CM_CMD_RESOLVE_ROUTE, r);
  };
  const uint32_t id = CreateId(fd, 0x61), other = CreateId(fd, 0x62);
  EXPECT_EQ(resolve_route(other), EINVAL) << "no ADDR_RESOLVED read: the router answers";
  address_resolved(id, 0x61, 7);
  rdma_ucm_event_resp ev{};
  ASSERT_EQ(GetEvent(fd, &ev), 0);
  ASSERT_EQ(ev.event, kAddrResolved);
  EXPECT_EQ(resolve_route(id), 0);
  ASSERT_EQ(GetEvent(fd, &ev), 0);
  EXPECT_EQ(ev.event, kRouteResolved);
  EXPECT_EQ(ev.id, id);
  EXPECT_EQ(ev.uid, 0x61u);
  EXPECT_EQ(ev.status, 0u);
  EXPECT_EQ(resolve_route(id), EINVAL) << "a second one is the router's to refuse";
  rdma_ucm_query_route_resp route{};
  rdma_ucm_query q{};
  q.response = Ptr(&route);
  q.id = id;
  q.option = RDMA_USER_CM_QUERY_PATH;
  ASSERT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_QUERY_ROUTE, q, sizeof(route)), 0);
  rdma_ucm_query_route_resp want{};
  reinterpret_cast<char*>(&want)[0] = 0x5a;
  ff::CmFillRoutedPath(kTos, &want);
  EXPECT_EQ(std::memcmp(&route, &want, sizeof(route)), 0) << "the routed path, from the event";
  EXPECT_EQ(route.num_paths, 1u);
  EXPECT_EQ(route.ib_route[0].traffic_class, kTos);

  // No room: the program has not read what the router queued.
  const uint32_t late = CreateId(fd, 0x63);
  address_resolved(late, 0x63, 9);
  ASSERT_EQ(GetEvent(fd, &ev), 0);
  int queued = 0;
  for (; queued < 100000; ++queued) {
    const ff::proto::CmEvent filler = MakeCmEvent(other, kEstablished, other, 0x62);
    if (::send(router_end, &filler, sizeof(filler), MSG_DONTWAIT) != sizeof(filler)) break;
  }
  ASSERT_GT(queued, 0);
  ASSERT_LT(queued, 100000) << "the socket never filled";
  EXPECT_EQ(resolve_route(late), 0);
  for (int i = 0; i < queued; ++i) {
    ASSERT_EQ(GetEvent(fd, &ev), 0) << i;
    ASSERT_EQ(ev.event, kEstablished) << i;
  }
  ASSERT_EQ(GetEvent(fd, &ev), 0) << "the library's event follows those queued before it";
  EXPECT_EQ(ev.event, kRouteResolved);
  EXPECT_EQ(ev.id, late);
  EXPECT_EQ(GetEvent(fd, &ev), EAGAIN);

  // A path the program set (SET_OPTION IB_PATH) resolved the route at the router already.
  const uint32_t pathed = CreateId(fd, 0x65);
  address_resolved(pathed, 0x65, 11);
  ASSERT_EQ(GetEvent(fd, &ev), 0);
  const ib_path_rec_data path{};
  ASSERT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_SET_OPTION,
                     SetOption(pathed, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, &path, sizeof(path))),
            0);
  EXPECT_EQ(resolve_route(pathed), EINVAL) << "after IB_PATH: the router's to refuse";

  EXPECT_NE(CreateId(fd, 0x64), 0u);  // a call answered: what was posted came before it
  EXPECT_EQ(PostedOf(RDMA_USER_CM_CMD_RESOLVE_ROUTE),
            (std::vector<bool>{false, true, false, true, false}));
}

// The library keeps a copy of the router's end of each channel; a router that dies (its
// session socket closes, no channel is shut down) still gives a blocked reader EOF, then
// DEVICE_REMOVAL: the library shuts its copies down when it loses the router.
TEST_F(CmTest, ARouterThatDiesWakesABlockedReaderDespiteTheLibrarysCopy) {
  uint32_t channel = 0;
  const int fd = Open(O_RDWR | O_CLOEXEC, &channel);
  const uint32_t id = CreateId(fd, 0x71);
  auto waiter = BlockedReader(fd);
  pod_.router.Close();
  ASSERT_EQ(waiter.wait_for(kWaitLimit), std::future_status::ready);
  const auto [rc, ev] = waiter.get();
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(ev.event, kDeviceRemoval);
  EXPECT_EQ(DestroyId(fd, id), 1u);
}

// Once an answered CREATE_ID brought a grant of handles, the channel's next CREATE_IDs are
// posted, each under the next granted handle, which is the program's answer; a port space
// the router would refuse is still sent (and refused), and past the grant they are sent.
TEST_F(CmTest, CreateIdsArePostedUnderTheHandlesTheRouterGranted) {
  constexpr uint32_t kFirst = 500, kCount = 3;
  bool granted = false;
  pod_.router.OnCmCommand([&](const ff::proto::CmCommand& c, ff::proto::CmReply* r) {
    if (c.cmd != RDMA_USER_CM_CMD_CREATE_ID) return 0;
    rdma_ucm_create_id cmd;
    std::memcpy(&cmd, c.body, sizeof(cmd));
    if (cmd.ps == 0) return EINVAL;
    if (c.handle != 0) return 0;  // posted under a granted handle: nothing to answer
    const uint32_t id = next_handle_++;
    std::memcpy(r->out, &id, sizeof(id));
    r->out_len = sizeof(id);
    if (!granted) {
      r->grant_first = kFirst;
      r->grant_count = kCount;
      granted = true;
    }
    return 0;
  });
  const int fd = Open(O_RDWR | O_CLOEXEC);
  EXPECT_EQ(CreateId(fd, 1), 100u);  // answered, with the grant
  EXPECT_EQ(CreateId(fd, 2), kFirst);
  rdma_ucm_create_id_resp resp{};
  rdma_ucm_create_id bad{};
  bad.ps = 0;  // no port space
  bad.response = Ptr(&resp);
  EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_CREATE_ID, bad, sizeof(resp)), EINVAL);
  EXPECT_EQ(CreateId(fd, 3), kFirst + 1);
  EXPECT_EQ(CreateId(fd, 4), kFirst + 2);
  EXPECT_EQ(CreateId(fd, 5), 101u);  // the grant is used up: answered again
  EXPECT_EQ(PostedOf(RDMA_USER_CM_CMD_CREATE_ID),
            (std::vector<bool>{false, true, false, true, true, false}));
  std::vector<uint32_t> handles;
  for (const auto& c : Received(RDMA_USER_CM_CMD_CREATE_ID)) handles.push_back(c.handle);
  EXPECT_EQ(handles, (std::vector<uint32_t>{0, kFirst, 0, kFirst + 1, kFirst + 2, 0}));
}

}  // namespace
}  // namespace fftest
