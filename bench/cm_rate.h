// What cm_rate.cc (one connection at a time, the steps timed) and cm_rate_window.cc
// (several connections in flight) share.
#pragma once

#include <infiniband/verbs.h>
#include <netinet/in.h>

#include <vector>

#include "cm_util.h"

namespace cmrate {

inline constexpr int kStepMs = 5000;  // the deadline of any one step

// What a client's connections share: the channel, and the PD and CQ of the device (made
// on the first route resolved).
struct RdmaClient {
  rdma_event_channel* ch = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  sockaddr_in dst{};
};

// A PD and a small CQ on `verbs` (the QPs' completions are never polled): 0 or 1.
int OpenPdCq(ibv_context* verbs, ibv_pd** pd, ibv_cq** cq);

// `count` connections with `in_flight` at a time, each connection's time (start to end)
// appended to `each`: 0 or 1 (a failure, said on stderr).
int RdmaWindow(RdmaClient* c, int count, int in_flight, std::vector<double>* each);
int TcpWindow(const sockaddr_in& dst, int count, int in_flight, std::vector<double>* each);

// The TCP server for a client with connections in flight: serves `count` connections on
// `listener` (listening) at once, each ended when the client shuts its side down. 0 or 1.
int TcpServeWindow(int listener, int count);

}  // namespace cmrate
