// The messages between freeflow's processes, one header per protocol; docs/protocol.md states
// the contracts (who sends what, who checks what, what forces a version bump).
//   protocol/common.h         the pod socket's ops, request header, sentinels and limits
//   protocol/verbs_session.h  a verbs session: HELLO, object requests, answers, events
//   protocol/request_ring.h   a verbs session's request ring: RequestRing, Doorbell
//   protocol/cm.h             rdma_cm: channels, ucma commands, answers, channel events
//   protocol/tcp_mode.h       a TCP-mode socket session (libfsocket.so)
//   protocol/pod_socket.h     what the router accepts on the pod socket, and its answer
//   protocol/node_wire.h      router <-> router frames
// The ABI version and the constants the layouts are made of are in abi_constants.h, the
// shared-memory layouts in shm_layout.h, stream_segment.h and stream_pods.h.
#pragma once

#include "freeflow/protocol/cm.h"
#include "freeflow/protocol/common.h"
#include "freeflow/protocol/node_wire.h"
#include "freeflow/protocol/pod_socket.h"
#include "freeflow/protocol/request_ring.h"
#include "freeflow/protocol/tcp_mode.h"
#include "freeflow/protocol/verbs_session.h"
