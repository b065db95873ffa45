// The process's socket session with its node's router (docs/tcp-mode.md): found through
// FREEFLOW_DIR / FFR_NAME, opened on first use with SockHello, opened again by a forked
// child (which must not share its parent's request stream). While the router cannot be
// reached the library keeps to kernel TCP and tries again after
// ff::kSockRouterRetryNs.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "freeflow/fd.h"
#include "freeflow/ipv4.h"
#include "freeflow/protocol.h"
#include "freeflow/stream_pods.h"

namespace ff::fsocket {

// What the environment says, read once. TCP mode is on only with a valid VNET_PREFIX.
struct Config {
  bool enabled = false;
  ff::Ipv4Prefix prefix;
  std::string socket_path;  // <FREEFLOW_DIR or /freeflow>/<FFR_NAME or ffrouter>.sock
};
const Config& GetConfig();

// True when `addr_host_order` is inside VNET_PREFIX (false when TCP mode is off).
bool InOverlay(uint32_t addr_host_order);

// One request and its answer: 0 and the answer's status in *status, or a local errno
// (ENOTCONN: no router now, ETIMEDOUT, EPROTO). Received descriptors go to fds (at most
// max_fds; *nfds says how many).
int RouterCall(const void* req, size_t len, int* status, ff::proto::Response* resp,
               ff::UniqueFd* fds, int max_fds, int* nfds);
// A posted request (kPostedSeq; only IsPostable ops): 0 or ENOTCONN.
int RouterPost(const void* req, size_t len);
// How many sessions this process has opened: a listener registered in an earlier one is
// unknown to the router now (it restarted).
uint64_t SessionGeneration();
// This pod's overlay address (host order) from the session's HELLO, opening the session if
// needed; 0 when there is no session.
uint32_t OwnAddress();
// What the router's pod list (stream_pods.h) says of host-order address `ip`, opening the
// session if needed: kNo means no connection with it can be accelerated, so a connect or an
// accept needs no round trip to the router; kUnknown (no session, no list, a list being
// rewritten) means ask.
ff::PodListed ListedPod(uint32_t ip);
// An accepted connection from host-order `client_ip`:`client_port` to this pod's
// `server_port`: kNo when the pod list does not hold the client or this pod's claims table
// (stream_claims.h) has no record of the connection (the client chose kernel TCP) — no need
// to ask — and the session shows the router that wrote them is still there; else kUnknown.
ff::PodListed AcceptedFrom(uint32_t client_ip, uint16_t client_port, uint16_t server_port);

// This process's ID without a system call (glibc no longer caches it): read once, and again
// in a child of fork(). A vfork() child shares its parent's memory and so its answer.
pid_t ProcessId();

// fork support (pthread_atfork handlers, installed at load).
void RouterLinkPrepareFork();
void RouterLinkParentAfterFork();
void RouterLinkChildAfterFork();

}  // namespace ff::fsocket
