// rdma_cm ids as hand-over records (router/src/cm/cm_handover.cc): a table comes back whole
// (ids, ports in their order, grants, handles and ephemeral ports to come), and a record the
// successor cannot trust is refused: an id of a process it did not take, one bound to another
// pod's address, a port that names an id not bound to it, a bound id that holds no port, a
// child of another process's listener, a state or a number out of range.
#include <gtest/gtest.h>

#include <cerrno>
#include <map>
#include <string>

#include "base/handover_state.h"
#include "cm/cm_table.h"

namespace fftest {
namespace {

using ff::router::CmId;
using ff::router::CmState;
using ff::router::CmTable;
using ff::router::HandoverError;
using ff::router::PodId;
using ff::router::PodIdentity;
using Json = nlohmann::json;

constexpr uint32_t kIpA = 0x0af40001, kIpB = 0x0af40002;

struct Pods {
  std::map<PodId, PodIdentity> who{{1, {100, kIpA, 0}}, {2, {200, kIpB, 0}}};
  const PodIdentity* operator()(PodId p) const {
    auto it = who.find(p);
    return it == who.end() ? nullptr : &it->second;
  }
};

// A listener of pod 1 with a child it has not named yet, a connected id of pod 2 sharing
// nothing, and grants on pod 2's channel.
Json SampleTable() {
  CmTable t;
  CmId* l = t.Create(1, 7);
  EXPECT_EQ(t.Bind(*l, kIpA, 7300), 0);
  l->state = CmState::kListening;
  l->backlog = 8;
  l->children = 1;
  CmId* child = t.Create(1, 7);
  EXPECT_EQ(t.Bind(*child, kIpA, 0), 0);
  child->listener = l->handle;
  child->touched = false;
  child->state = CmState::kRequested;
  child->remote = {kIpB, 40000};
  CmId* c = t.Create(2, 3);
  EXPECT_EQ(t.Bind(*c, kIpB, 0), 0);
  c->state = CmState::kEstablished;
  c->qpn = 0x123;
  c->remote_qpn = 0x456;
  c->deadline_ns = 99;
  uint32_t first = 0;
  EXPECT_TRUE(t.Grant(2, 3, &first));
  return t.Export();
}

std::string Refusal(const Json& j) {
  CmTable t;
  try {
    t.Import(j, Pods());
  } catch (const HandoverError& e) {
    return e.what();
  }
  return "";
}

TEST(CmRecords, ATableComesBackWhole) {
  const Json out = SampleTable();
  CmTable in;
  in.Import(out, Pods());
  EXPECT_EQ(in.Export(), out);
  EXPECT_EQ(in.size(), 3u);
  ASSERT_NE(in.Listener(kIpA, 0, 7300), nullptr);
  EXPECT_EQ(in.Listener(kIpA, 0, 7300)->children, 1u);
  // The successor goes on where the old router was: new handles and ports are new.
  CmId* next = in.Create(1, 7);
  ASSERT_NE(next, nullptr);
  EXPECT_GT(next->handle, out["next_handle"].get<uint32_t>() - 1);
  EXPECT_EQ(in.Bind(*next, kIpA, 7300), EADDRINUSE);  // the listener holds its port
  int error = 0;
  EXPECT_NE(in.CreateGranted(2, 3, out["grants"][0][2][0].get<uint32_t>(), &error), nullptr);
}

TEST(CmRecords, WhatTheSuccessorCannotTrustIsRefused) {
  const Json good = SampleTable();
  ASSERT_EQ(Refusal(good), "");
  Json j = good;
  j["ids"][2]["pod"] = 9u;  // a process the successor did not take
  EXPECT_NE(Refusal(j).find("no session"), std::string::npos);
  j = good;
  j["ids"][2]["local"][0] = kIpA;  // pod 2's id bound on pod 1's address
  EXPECT_NE(Refusal(j).find("not its pod's"), std::string::npos);
  j = good;
  j["ids"][1]["handle"] = j["ids"][0]["handle"];  // a handle twice
  EXPECT_NE(Refusal(j).find("taken"), std::string::npos);
  j = good;
  j["ids"][2]["listener"] = j["ids"][0]["handle"];  // pod 2's id as pod 1's listener's child
  EXPECT_NE(Refusal(j).find("listener"), std::string::npos);
  j = good;
  j["ids"][1]["listener"] = 4242;  // an unnamed child of a listener that is not there
  EXPECT_NE(Refusal(j).find("listener"), std::string::npos);
  j = good;
  j["ids"][0]["state"] = 77;
  EXPECT_NE(Refusal(j).find("state"), std::string::npos);
  j = good;
  j["ids"][0]["retries"] = {9, 9};
  EXPECT_NE(Refusal(j).find("retries"), std::string::npos);
  j = good;
  j["ports"][0][3] = Json::array({j["ids"][2]["handle"]});  // a port naming an id bound elsewhere
  EXPECT_NE(Refusal(j).find("not bound to it"), std::string::npos);
  j = good;
  j["ports"].erase(j["ports"].begin());  // a bound id holding no port
  EXPECT_NE(Refusal(j).find("holds no port"), std::string::npos);
  j = good;
  j["ports"][0][2] = 70000;
  EXPECT_NE(Refusal(j).find("out of range"), std::string::npos);
  j = good;
  j["grants"][0][2][0] = j["ids"][0]["handle"];  // a granted handle an id has
  EXPECT_NE(Refusal(j).find("granted"), std::string::npos);
  j = good;
  j["ids"][0]["uid"] = "x";
  EXPECT_NE(Refusal(j).find("uid"), std::string::npos);
}

}  // namespace
}  // namespace fftest
