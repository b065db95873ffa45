// The hand-over's state on the wire (router/src/base/handover_state.h): descriptors in
// batches and a document in pieces arrive whole; whatever breaks the rules (too much, a
// descriptor of the wrong kind or named twice, a mistyped field, a message out of place)
// is refused with a reason, never taken in part.
#include "base/handover_state.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <thread>
#include <vector>

namespace fftest {
namespace {

using ff::UniqueFd;
using ff::router::FdKind;
using ff::router::HandoverError;
using ff::router::HandoverMessage;
using ff::router::HandoverState;
using ff::router::HandoverType;

struct Pair {
  UniqueFd a, b;
  Pair() {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0) {
      a.reset(sv[0]);
      b.reset(sv[1]);
    }
  }
};

// Sends `out` on one end from another thread (its socket buffer fills) and receives it on
// the other with the limits given; the receive's result.
int Move(const HandoverState& out, HandoverState* in, size_t max_fds, size_t max_bytes,
         std::string* why) {
  Pair p;
  int sent = -1;
  std::thread sender([&] {
    sent = out.Send(p.a.get());
    ::shutdown(p.a.get(), SHUT_WR);
  });
  const int rc = in->Receive(p.b.get(), max_fds, max_bytes, why);
  p.b.reset();  // a refused receive stops reading: the sender's writes fail, it ends
  sender.join();
  return rc;
}

TEST(HandoverState, DescriptorsAndALargeDocumentArriveWhole) {
  std::vector<UniqueFd> keep;
  HandoverState out;
  auto& list = out.doc["fds"] = HandoverState::Json::array();
  for (int i = 0; i < 40; ++i) {  // more than one batch of 16, of two kinds
    if (i % 2 == 0) {
      keep.emplace_back(::memfd_create("handover-test", MFD_CLOEXEC));
    } else {
      keep.emplace_back(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    }
    ASSERT_TRUE(keep.back());
    list.push_back(out.PutFd(keep.back().get()));
  }
  out.doc["blob"] = HandoverState::Json::binary(std::vector<uint8_t>(200 * 1024, 0xa5));
  out.doc["count"] = 7u;
  HandoverState in;
  std::string why;
  ASSERT_EQ(Move(out, &in, 100, 1 << 20, &why), 0) << why;
  EXPECT_EQ(in.fds(), 40u);
  EXPECT_EQ(in.untaken(), 40u);
  EXPECT_EQ(HandoverState::U64(in.doc, "count", 10), 7u);
  EXPECT_EQ(HandoverState::Bytes(in.doc, "blob", 1 << 20), std::string(200 * 1024, '\xa5'));
  const auto& names = HandoverState::Array(in.doc, "fds", 40);
  for (size_t i = 0; i < names.size(); ++i) {
    UniqueFd fd = in.TakeFd(names[i], i % 2 == 0 ? FdKind::kMemfd : FdKind::kSocket);
    EXPECT_TRUE(fd) << i;
  }
  EXPECT_EQ(in.untaken(), 0u);
  EXPECT_THROW(in.TakeFd(names[0], FdKind::kAny), HandoverError) << "named twice";
  EXPECT_THROW(in.TakeFd(HandoverState::Json(40u), FdKind::kAny), HandoverError) << "past the end";
}

TEST(HandoverState, ADescriptorOfAnotherKindThanItsRecordSaysIsRefused) {
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  UniqueFd mem(::memfd_create("handover-test", MFD_CLOEXEC));
  HandoverState out;
  out.doc["sock"] = out.PutFd(sock.get());
  out.doc["mem"] = out.PutFd(mem.get());
  HandoverState in;
  std::string why;
  ASSERT_EQ(Move(out, &in, 10, 1024, &why), 0) << why;
  EXPECT_THROW(in.TakeFd(in.doc["sock"], FdKind::kMemfd), HandoverError);
  EXPECT_THROW(in.TakeFd(in.doc["mem"], FdKind::kSocket), HandoverError);
  EXPECT_THROW(in.TakeFd(HandoverState::Json("0"), FdKind::kAny), HandoverError) << "not a number";
  EXPECT_EQ(in.untaken(), 2u);
}

TEST(HandoverState, AStateLargerThanTheReceiverTakesIsRefused) {
  std::vector<UniqueFd> keep;
  HandoverState out;
  for (int i = 0; i < 20; ++i) {
    keep.emplace_back(::memfd_create("handover-test", MFD_CLOEXEC));
    out.PutFd(keep.back().get());
  }
  out.doc["blob"] = HandoverState::Json::binary(std::vector<uint8_t>(100 * 1024, 1));
  std::string why;
  HandoverState few;
  EXPECT_EQ(Move(out, &few, 10, 1 << 20, &why), E2BIG);
  EXPECT_NE(why.find("larger"), std::string::npos) << why;
  HandoverState small;
  EXPECT_EQ(Move(out, &small, 100, 64 * 1024, &why), E2BIG);
}

TEST(HandoverState, FieldsAreReadTypedAndBounded) {
  const HandoverState::Json j = {{"n", 5u},
                                 {"neg", -1},
                                 {"s", "x"},
                                 {"b", true},
                                 {"list", {1, 2, 3}},
                                 {"rec", {{"k", 1u}}},
                                 {"bytes", HandoverState::Json::binary({1, 2, 3})}};
  EXPECT_EQ(HandoverState::U64(j, "n"), 5u);
  EXPECT_THROW(HandoverState::U64(j, "n", 4), HandoverError);
  EXPECT_THROW(HandoverState::U64(j, "neg"), HandoverError);
  EXPECT_THROW(HandoverState::U64(j, "s"), HandoverError);
  EXPECT_THROW(HandoverState::U64(j, "missing"), HandoverError);
  EXPECT_THROW(HandoverState::U32(j, "n", 4), HandoverError);
  EXPECT_TRUE(HandoverState::Bool(j, "b"));
  EXPECT_THROW(HandoverState::Bool(j, "n"), HandoverError);
  EXPECT_EQ(HandoverState::Array(j, "list", 3).size(), 3u);
  EXPECT_THROW(HandoverState::Array(j, "list", 2), HandoverError);
  EXPECT_THROW(HandoverState::Array(j, "rec", 9), HandoverError);
  EXPECT_EQ(HandoverState::U64(HandoverState::Object(j, "rec"), "k"), 1u);
  EXPECT_THROW(HandoverState::Object(j, "list"), HandoverError);
  EXPECT_EQ(HandoverState::Bytes(j, "bytes", 3), std::string("\x01\x02\x03", 3));
  EXPECT_THROW(HandoverState::Bytes(j, "bytes", 2), HandoverError);
  EXPECT_THROW(HandoverState::Bytes(j, "s", 9), HandoverError);
}

TEST(HandoverMessages, ControlMessagesRoundTripAndAnythingElseIsRefused) {
  Pair p;
  ASSERT_EQ(ff::router::SendHandoverMessage(p.a.get(), {HandoverType::kRefuse, 1, 2, "why not"}),
            0);
  HandoverMessage m;
  ASSERT_EQ(ff::router::ReceiveHandoverMessage(p.b.get(), &m), 0);
  EXPECT_EQ(m.type, HandoverType::kRefuse);
  EXPECT_EQ(m.a, 1u);
  EXPECT_EQ(m.b, 2u);
  EXPECT_EQ(m.text, "why not");
  // Not a hand-over message (what a stranger would send), then a state message where a
  // control message belongs.
  const char junk[64] = {1, 1, 1, 1};
  ASSERT_EQ(::send(p.a.get(), junk, sizeof(junk), 0), static_cast<ssize_t>(sizeof(junk)));
  EXPECT_EQ(ff::router::ReceiveHandoverMessage(p.b.get(), &m), EPROTO);
  HandoverState s;
  s.doc["x"] = 1u;
  ASSERT_EQ(s.Send(p.a.get()), 0);
  EXPECT_EQ(ff::router::ReceiveHandoverMessage(p.b.get(), &m), EPROTO);
  p.a.reset();
  int rc;
  while ((rc = ff::router::ReceiveHandoverMessage(p.b.get(), &m)) == EPROTO) {
  }
  EXPECT_EQ(rc, ENODATA) << "the peer closed";
}

}  // namespace
}  // namespace fftest
