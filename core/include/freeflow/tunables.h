// Every compile-time tunable of freeflow, in one place: sizes, limits, budgets and clocks of
// the library, the router and the node links. Runtime options (flags and environment) are
// documented with the programs that read them; their defaults are named here as kDefault*.
// Each value here is a local knob: one program may change it without the others noticing.
// Constants that size or bound what another process maps or is sent (the ABI) are in
// abi_constants.h, included here because knobs are sized by them; constants of one layout
// stay beside it (shm_layout.h, stream_segment.h, stream_pods.h, protocol/). Layout
// constants that other constants depend on are tied together by static_asserts in
// core/include/freeflow/codec.h.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "freeflow/abi_constants.h"

namespace ff {

// ---- shared memory: rings, tables, slots ------------------------------------------------
inline constexpr uint32_t kRcRingBytes = 512 * 1024;  // an RC/UC QP's inbound ring, at least
// Segments of destroyed RC/UC QPs that never left their process, kept for its next QPs
// (verbs-library.md, "Spare QP segments"). Each holds only the pages its QP touched.
inline constexpr size_t kSpareQpSegments = 4;
inline constexpr uint32_t kMaxRcRingBytes = 2 * 1024 * 1024;  // ... at most
inline constexpr uint32_t kRcRingBytesPerRecv = 2048;         // ... sized by the receive queue
inline constexpr uint32_t kUdRingBytes = 64 * 1024;  // each of a UD QP's rings (a message <= MTU)
inline constexpr uint32_t kUdRingsPerQp = 16;        // UD senders a UD QP hears at once
inline constexpr uint32_t kProxyRingBytes = 512 * 1024;  // each ring of a proxy segment

// ---- what the virtual device reports (and enforces) -------------------------------------
// max_msg_sz (kMaxMsgSize) is in abi_constants.h: a peer refuses a longer message.
inline constexpr uint32_t kMtu = 4096;                    // path MTU; the largest UD message
inline constexpr uint32_t kMaxInline = 512;               // max_inline_data
inline constexpr uint32_t kMaxSge = 32;                   // max_sge per work request
inline constexpr uint32_t kMaxQpWr = 16384;               // max_qp_wr and max_srq_wr
inline constexpr uint32_t kMaxCqe = 4 * 1024 * 1024;      // max_cqe
inline constexpr uint32_t kMaxRdAtomic = 16;              // max_qp_rd_atom: READs/atomics in flight
inline constexpr uint64_t kMaxMrSize = kMaxMsgSize * 64;  // max_mr_size

// ---- library: data path ------------------------------------------------------------------
inline constexpr int kDrainBudget = 4096;          // records taken from a ring per poll
inline constexpr int kMaxBatchedLinks = 8;         // links one progress pass publishes at once
inline constexpr int kDefaultRemoteWaitUs = 1000;  // FFV_REMOTE_WAIT_US: longest wake-word sleep
// A thread that would block in the library (awaiting the router's answer, an rdma_cm event
// or a completion event on a blocking channel) polls this long before it sleeps (FFV_SPIN_US
// overrides; 0: sleep at once). What it waits for usually comes within a few microseconds,
// and waking a sleeping thread cost 10-25 us here (a VM whose idle vCPUs halt). It does not
// poll on the CPU where its router last ran (RequestRingControl::router_cpu). Measured with
// that rule, 15, 60, 100 and 200 us showed no steady change from 30 (20 runs each,
// bench/cm_rate, alternating).
inline constexpr int kDefaultAnswerSpinUs = 30;
// A CQ fed from this node that ibv_poll_cq finds empty for longer than kYieldAfterEmptyNs
// gives the CPU away (sched_yield) every kEmptyPollsPerCheck polls from then on: on one node
// the peer's CPU moves the data, and it may be this one (perftest -R's server spins on its
// exchange QP for a whole run). A latency loop's peer answers long before: it never yields.
// The clock is read once per kEmptyPollsPerCheck empty polls, never on a poll that finds work.
inline constexpr uint32_t kEmptyPollsPerCheck = 256;
inline constexpr uint64_t kYieldAfterEmptyNs = 1'000'000;
// A CQ that went to sleeping on each empty poll (its peer was quiet for kYieldAfterEmptyNs)
// spins again once a sleep finds a completion within this (completion.cc).
inline constexpr uint64_t kBusyAgainNs = 250'000;
inline constexpr int kRouterCallTimeoutS = 10;   // a router silent this long is an error
// How long opening the device waits for a router being replaced (FFV_ROUTER_WAIT_MS
// overrides; 0: no wait): a socket path with no router behind it (ECONNREFUSED), or, in a
// process whose router was lost, no socket yet. One wait per outage; later opens try once.
inline constexpr int kDefaultRouterWaitMs = 10'000;
inline constexpr int kRouterRetryMs = 50;  // between connects while it waits
// A session sizes its process's descriptor table for this many descriptors (at most the
// soft RLIMIT_NOFILE) when it opens: the data path receives descriptors later (rings,
// sockets, segments), and a multi-threaded process whose table grows waits for an RCU grace
// period, which took a loaded node seconds (verbs-library.md, "The descriptor table").
inline constexpr int kReservedDescriptors = 1024;
inline constexpr int kSeqlockReadAttempts = 64;  // tries to read an MR entry being changed
inline constexpr int kCreditClaimAttempts = 64;  // CAS tries to claim one receive credit
inline constexpr uint64_t kPendingSendFirstRetryNs = 5'000;  // get_cq_event retries queued sends
inline constexpr uint64_t kPendingSendRetryNs = 200'000;     // ... backing off up to this
inline constexpr int kMaxWakeDrain = 1024;  // wakes taken off a wake socket at once
// The event thread advances sends that wait on one node (a full ring, no receive credit, a
// peer that has not accepted yet) while the program calls nothing: first after this, ...
inline constexpr uint64_t kStallTickMinNs = 50'000;
inline constexpr uint64_t kStallTickMaxNs = 5'000'000;  // ... backing off up to this
inline constexpr uint64_t kStallTickFloorNs = 10'000;   // never sooner (an RNR timer's 10 us)
inline constexpr uint64_t kConsentRetryNs =
    1'000'000;  // first retry of a connect awaiting its peer
inline constexpr uint64_t kConsentMaxRetryNs = 50'000'000;  // longest wait between such retries
inline constexpr uint64_t kConsentMinWaitNs =
    2'000'000'000ull;  // least time a peer gets to name us
// A send to a peer that went away fails after the QP's retry budget, but at most this late.
inline constexpr uint64_t kPeerErrorMaxDelayNs = 2'000'000'000ull;
// A UD destination the router could not link to (gone, or never there): its datagrams are
// dropped without asking again for this long, doubling while it stays unreachable.
inline constexpr uint64_t kUdUnreachableRetryNs = 1'000'000;
inline constexpr uint64_t kUdUnreachableMaxRetryNs = 100'000'000;
inline constexpr size_t kUdUnreachableKept = 1024;  // such destinations remembered per QP
// A UD sender on another node that closes its channel (its QP destroyed, its process gone)
// with datagrams still waiting here for room in the target's ring: they keep going into the
// ring for at most this long, then whatever is left is dropped.
inline constexpr uint64_t kUdCloseDrainNs = 1'000'000'000ull;

// ---- library: locks, peers, rdma_cm -------------------------------------------------------
// A context's (and a CQ's poll) lock spins this many times before it sleeps on its futex
// (AdaptiveLock, verbs/src/internal.h).
inline constexpr int kLockSpins = 100;
// How long a program's thread yields the lock to the event thread that waits for it before
// it takes its turn all the same (AdaptiveLock::lock_urgent).
inline constexpr uint64_t kLockYieldNs = 10'000'000ull;
// How many peers a context keeps mapped with no link to them (Context::recent_peers).
inline constexpr size_t kRecentPeers = 4;
// Notes of an rdma_cm peer's address and QP number kept for the RTR that names it
// (verbs/src/cm_table.h, NoteUnnamedPeer): at most this many, the oldest go first.
inline constexpr size_t kMaxUnnamedPeers = 64;
// rdma_cm descriptors below this number are marked in a byte array; above it, a count says
// whether any is an rdma_cm descriptor at all (verbs/src/cm_device.h).
inline constexpr int kCmFastFds = 65536;

// ---- TCP mode (libfsocket.so, docs/tcp-mode.md) -------------------------------------------
// Each direction of a TCP-mode connection's segment. 4 MiB, like the kernel's own TCP buffer
// ceilings (tcp_wmem 4 MiB, tcp_rmem 6 MiB): with 1 MiB a writer filled the ring and slept
// often enough that same-node iperf3 fell to 27-29 Gbit/s in some runs; the cost is up to
// 8 MiB of a pod's memory per busy connection (pages are touched as the rings turn).
inline constexpr uint32_t kStreamRingBytes = 4u << 20;
inline constexpr uint32_t kMaxSockListenersPerPod = 1024;  // listening ports a pod registers
inline constexpr uint32_t kMaxStreamRecordsPerPod =
    4096;  // connections a pod made with kSockConnect
inline constexpr uint64_t kStreamGcPeriodNs = 2'000'000'000;  // records of closed connections go
// A record whose connection neither end's namespace has shown yet (the client asks before
// its kernel connect) is kept this long at least: a client that never connects loses it then.
inline constexpr uint64_t kStreamUnseenGraceNs = 60'000'000'000ull;
inline constexpr uint64_t kStreamSpinNs =
    50'000;  // a waiting socket spins this long before it sleeps
// A process's bells (fsocket/src/bells.h): at most this many descriptors (one a stream), from
// this number up (lower when RLIMIT_NOFILE is lower): a program meets them only near its
// limit. A stream beyond the budget is rung on its kernel connection.
inline constexpr int kMaxBellFds = 4096;
inline constexpr int kBellFdFloor = 4096;
// ... and then sleeps at most this long at a time: a bell another process of the pod took
// (two processes sharing one socket after fork) delays a wake-up by no more than this.
inline constexpr int kStreamMaxSleepMs = 50;
// How often a process looks again whether waits may spin (fsocket/src/spin.h: runnable
// threads against usable CPUs).
inline constexpr uint64_t kSpinCheckNs = 1'000'000;
// A spinning wait only pauses the CPU for this long, then yields it at each step.
inline constexpr uint64_t kStreamPauseOnlyNs = 5'000;
// While poll/epoll_wait spins on streams, it looks at the other (kernel) descriptors this
// often.
inline constexpr uint64_t kKernelLookNs = 10'000;
// A non-blocking read that finds a stream's ring empty looks at its kernel connection (FIN,
// reset) only when this process has not found that connection empty within this long: a
// program that reads until EAGAIN then waits (every event loop) learns of a FIN in the wait,
// which looks at the kernel socket; one that reads in a loop and never waits, this late.
inline constexpr uint64_t kKernelQuietNs = 1'000'000;
// A library that cannot reach its router (or is refused) keeps to kernel TCP and tries again
// after this long.
inline constexpr uint64_t kSockRouterRetryNs = 1'000'000'000;
// Connections too short to pay for their segment (fsocket/src/dial_policy.h): a connection
// whose client made fewer than kShortStreamExchanges calls that moved bytes on it (sends and
// receives) and moved fewer than kShortStreamBytes both ways is short, however long it
// lived. An accelerated connection costs about 430 us more to set up than the kernel's
// between pods of one node and saves some microseconds an exchange: 64 calls (32 requests
// and their answers) are about where it pays. After kShortStreamRun short ones in a row to one
// address and port, the next kShortSkipFirst connects there are kernel TCP, then one is
// accelerated again to look; each look that is short again doubles the run of kernel ones,
// up to kShortSkipMost. A long one, or kShortForgetNs without a short one, starts afresh.
inline constexpr uint64_t kShortStreamExchanges = 64;
inline constexpr uint64_t kShortStreamBytes = 1u << 20;
inline constexpr uint32_t kShortStreamRun = 3;
inline constexpr uint32_t kShortSkipFirst = 64;
inline constexpr uint32_t kShortSkipMost = 4096;
inline constexpr uint64_t kShortForgetNs = 1'000'000'000;
// A library trusts its router's tables (pod list, claims table) to say "no round trip" for
// this long after its session last showed the router alive (a poll of it).
inline constexpr uint64_t kSockTableTrustNs = 10'000'000;

// ---- router: its loop and tables ---------------------------------------------------------
inline constexpr int kEpollBatch = 64;          // events taken from epoll per loop turn
// A router loop turn stops taking the events of its batch after this long (the rest come
// again in the next turn), so that a burst of heavy events does not hold every other back.
inline constexpr uint64_t kLoopTurnBudgetNs = 500'000;
inline constexpr uint32_t kFirstQpn = 0x100;    // QPNs below are never handed out
inline constexpr uint32_t kQpnMask = 0xffffff;  // QPNs are 24-bit

// ---- router: pod sessions ----------------------------------------------------------------
inline constexpr int kPodListenBacklog = 128;  // pending pod connections
// What one connection may hold whatever the quotas say (the device reports these).
inline constexpr size_t kMaxQpsPerPod = 65536;      // QPs one pod connection may hold
inline constexpr size_t kMaxObjectsPerPod = 16384;  // channels, CQs, SRQs, regions: each, per pod
inline constexpr int kAcceptBurst = kPodListenBacklog;  // pod connections accepted per gate turn
// The pod socket's gate (router/src/pods/pod_gate.h): connections not identified yet, and
// identified ones the serving loop has not taken yet.
inline constexpr size_t kMaxUnidentifiedClients = 256;
inline constexpr size_t kMaxIdentifiedInFlight = 64;
inline constexpr int kRingRequestsPerTurn = 32;     // requests of one pod's ring served a turn

// ---- router: per-pod quotas (router/src/quotas.h; defaults of the --max-*-per-pod flags) --
// One pod is one overlay address: all its processes and connections share these. Sized so
// that 256 pods at their limits fit a node: 256 x 1024 descriptors under the usual 1 Mi
// RLIMIT_NOFILE (under a lower limit the router lowers the default to fit), 256 x 64 GiB of
// mappings in the router's 128 TiB of address space, and 256 x (32 MiB queued + 8 MiB READ data +
// 64 x 512 KiB proxy response rings) of memory when every pod stalls at once (under a lower
// memory limit the router scales those down to fit, kMemoryReserve below).
inline constexpr uint32_t kDefaultPodSessions = 32;      // processes with the device open
inline constexpr uint32_t kDefaultPodFds = 1024;         // descriptors held for the pod
inline constexpr uint32_t kDefaultPodQps = 512;          // QPs
inline constexpr uint32_t kDefaultPodObjects = 4096;     // CQs + completion channels + SRQs
inline constexpr uint32_t kDefaultPodRegions = 512;      // registered regions (memfds)
inline constexpr uint32_t kDefaultPodMappedMiB = 65536;  // of its memory mapped by the router
inline constexpr uint32_t kDefaultPodMrEntries = 16384;  // MR-table entries
inline constexpr uint32_t kDefaultPodPending = 64;       // requests waiting for another node
inline constexpr uint32_t kDefaultPodProxies = 64;       // cross-node channels (RC and UD)
inline constexpr uint32_t kDefaultPodReadMiB = 8;        // READ/atomic data requested, in flight
inline constexpr uint32_t kDefaultPodQueuedMiB = 32;     // queued because the pod lags
inline constexpr uint64_t kQuotaLogIntervalNs = 10'000'000'000ull;  // one line per pod+quota
inline constexpr int kMaxRefusedSessions = 64;  // refused clients kept until they read why
inline constexpr uint64_t kHelloTimeoutNs = 5'000'000'000ull;  // a client says HELLO by then
// Events queued for a pod whose event socket is full, beyond those that replace a queued one
// (pods/event_backlog.h); each also counts against its queued-bytes and descriptor quotas.
inline constexpr size_t kMaxQueuedEvents = 4096;
inline constexpr uint64_t kFdReserve = 256;  // descriptors the router keeps beyond pods' quotas
// The pods a node's quotas are sized for; a descriptor quota left at its default is lowered
// to what this many pods fit under the router's RLIMIT_NOFILE, but not below kMinPodFds
// (a session's 6, and room for QPs and regions).
inline constexpr uint64_t kPodsPerNode = 256;
inline constexpr uint32_t kMinPodFds = 64;
// Likewise the byte quotas left at their defaults (queued, READ data, and the proxies whose
// response rings the router fills) are scaled down together to what kPodsPerNode pods stalled
// at once fit under the router's memory cgroup limit, beyond kMemoryReserve for the router's
// own (about 31 MiB at 256 pods that keep up), but not below these.
inline constexpr uint64_t kMemoryReserve = 128ull << 20;
inline constexpr uint32_t kMinPodQueuedMiB = 4;
inline constexpr uint32_t kMinPodReadMiB = 1;
inline constexpr uint32_t kMinPodProxies = 8;

// ---- router: forwarding and target execution --------------------------------------------
inline constexpr size_t kForwardRoundBytes = 64 * 1024;  // per proxy per drain round (fairness)
inline constexpr uint64_t kChannelWindow = 2u << 20;     // record bytes in flight per channel
inline constexpr uint64_t kCreditBatch = 256 * 1024;     // executed bytes credited in one message
inline constexpr uint64_t kSourceResolveNs = 3'000'000'000ull;  // a connect's unknown source
inline constexpr uint64_t kRetryTickNs = 200'000;               // timer period while a retry waits
inline constexpr uint64_t kIdleTickNs = 50'000'000;  // timer period otherwise (deadlines, sweeps)
// A router replaced (docs/handover.md): how long the channels of its links stay parked on
// either side for its successor to resume them (then they fail as on a lost link), and how
// often a router dials again to resume the channels it initiated.
inline constexpr uint64_t kResumeGraceNs = 10'000'000'000ull;
inline constexpr uint64_t kResumeDialNs = 50'000'000;
// After sessions end, the router's free heap pages go back to the system (malloc_trim) once
// closes pause for a tick, at most this often.
inline constexpr uint64_t kHeapTrimIntervalNs = 1'000'000'000;
// How often the router touches its heartbeat file (<dir>/<name>.alive), from its timer: the
// DaemonSet's liveness probe fails when the file is older than 10 s (a hung event loop).
inline constexpr uint64_t kHeartbeatNs = 1'000'000'000;

// ---- rdma_cm (router: cm_service.h) --------------------------------------------------------
inline constexpr size_t kMaxCmIdsPerSession = 4096;  // rdma_cm ids one process may hold
inline constexpr uint32_t kCmHandleGrant = 16;  // id handles granted at once for posted CREATE_IDs
inline constexpr size_t kMaxCmChannelsPerSession = 256;  // opens of /dev/infiniband/rdma_cm
inline constexpr size_t kMaxCmBacklog = 4096;     // events queued for a channel that is not read
inline constexpr uint32_t kMaxCmRequests = 1024;  // connect requests a listener holds unclaimed
inline constexpr uint64_t kCmResponseTimeoutNs = 5'000'000'000ull;  // REQ, REP, DREQ unanswered
inline constexpr uint16_t kCmFirstEphemeralPort = 32768;  // as net.ipv4.ip_local_port_range
inline constexpr uint16_t kCmLastEphemeralPort = 60999;

// ---- node links (router <-> router) -------------------------------------------------------
inline constexpr size_t kLinkHighWater = 8u << 20;    // owed bytes that make a link congested
inline constexpr uint32_t kDirectSendBytes = 4096;    // larger records skip the copy to a buffer
inline constexpr size_t kLinkReadChunk = 512 * 1024;  // receive buffer growth step
inline constexpr int kLinkReadBurst = 64;             // reads from one link per loop turn
inline constexpr int kNodeAcceptBurst = 16;           // router connections accepted per turn
inline constexpr size_t kMaxPendingNodeLinks = 64;    // accepted links not authenticated yet
inline constexpr size_t kMaxPendingNodeLinksPerSource = 4;  // of those, from one address
inline constexpr const char* kDefaultTlsDir = "/etc/freeflow/tls";  // ca.crt, tls.crt, tls.key
inline constexpr int kNodeListenBacklog = 64;                       // pending router connections
inline constexpr size_t kLinkCompactBytes = 4u << 20;     // sent bytes kept before the buffer moves
inline constexpr int kLoopbackPumpBudget = 256;           // in-memory links: messages per turn
inline constexpr uint64_t kPingIntervalNs = 100'000'000;  // a dialled link pings this often
inline constexpr uint64_t kDialTimeoutNs = 5'000'000'000ull;  // a dial not connected by then fails
inline constexpr uint32_t kInboundSilenceFactor = 3;  // accepted links (no pings) wait N timeouts
inline constexpr size_t kTlsSendBuffer = 1u << 20;    // encrypted bytes batched into one send()

// ---- direct connections between pod processes (docs/direct-path.md) ----------------------
inline constexpr int kDirectListenBacklog = 4;       // a direct listener's pending connections
inline constexpr size_t kDirectCandidates = 4;       // accepted connections it waits on for a hello
inline constexpr int kDirectAcceptBurst = 16;        // connections it accepts per loop turn
// A peer's direct ask that crossed one of ours waits at most this for ours to be answered
// (router/src/direct/direct_connections.h), then makes a connection of its own.
inline constexpr uint64_t kDirectCrossedWaitNs = 500'000'000;
inline constexpr uint64_t kDirectAcceptTimeoutNs = 5'000'000'000ull;  // until a listener gives up
inline constexpr uint64_t kDirectDialTimeoutNs = 3'000'000'000ull;    // a library's dial, hello sent
// While the program polled its connections within this, the event thread leaves them to it
// (a polling receiver needs no thread wake-up); after it, or once the program sleeps, the
// event thread serves them (one-sided operations progress without the program).
inline constexpr uint64_t kDirectAttendNs = 200'000;
// While the program keeps polling, the event thread looks less and less often, down to once
// per this (verbs/src/session/session.cc, DirectWatch).
inline constexpr uint64_t kDirectAttendMaxNs = 1'000'000;
inline constexpr uint64_t kDirectRetryNs = 50'000;  // queued records, unsent bytes: look again
// A record for a channel the router has not installed yet waits this long, then the
// connection ends (a peer may not send on channels nobody opened).
inline constexpr uint64_t kDirectChannelWaitNs = 2'000'000'000ull;
inline constexpr int kDirectReadsPerServe = 4;  // receives from one connection per turn
// A requester whose answered work requests wait on a peer that sent nothing at all for this
// long (no answer, credit or keepalive: a peer that stopped reading or executing) ends the
// connection; its QPs fail as an HCA's do when the peer stops acknowledging (retries
// exceeded). A target that holds records it cannot execute yet (a SEND waiting for a
// receive, RNR) says so every kDirectKeepaliveNs, as an HCA's RNR NAKs do.
inline constexpr uint64_t kDirectPeerSilentNs = 2'000'000'000ull;
inline constexpr uint64_t kDirectKeepaliveNs = 250'000'000;
// Channels a connection remembers as gone (their late records refused, not taken for a
// peer's lie).
inline constexpr size_t kDirectGoneChannels = 4096;
// Answers the program's poll produced wait this long for the program's next post to carry
// them (one write instead of two), and never more than this many bytes.
inline constexpr uint64_t kDirectAnswerDelayNs = 20'000;
inline constexpr size_t kDirectHeldAnswerBytes = 64 * 1024;
// A datagram is never answered, so a UD sender cannot tell a burst by answers owed: a post
// that follows the previous one to the same destination within this time is into a burst
// (a stream posts again as soon as it can; a ping-pong waits a network round trip, which
// across nodes is longer).
inline constexpr uint64_t kDirectDatagramBurstNs = 5'000;
// At exit, how long the library waits at most for its direct connections' sockets to take
// what they still hold (datagrams that completed, answers held back).
inline constexpr uint64_t kDirectExitFlushNs = 2'000'000'000ull;
// --direct-ports: the range direct listeners bind in (a NetworkPolicy must admit it).
inline constexpr uint16_t kDefaultDirectPortLo = 20000, kDefaultDirectPortHi = 20999;
// Direct connections a router keeps per local process (DirectConnections): a process at it
// gets no new one (its next QP pairs with new peer processes are relayed) until one ends.
// A job of N ranks on M nodes needs N - N/M per process.
inline constexpr size_t kMaxDirectConnsPerProcess = 1024;

// ---- router: pod identity ------------------------------------------------------------
inline constexpr size_t kMaxNetnsEntries = 4096;  // interfaces or addresses read from a pod's netns
inline constexpr int kNetlinkTimeoutMs = 1000;    // an rtnetlink / sock_diag answer takes this long
inline constexpr size_t kMaxPeerFdScan = 65536;   // descriptors of a client examined (no pidfd)
// TCP mode's sock_diag answers that may precede ours on a namespace handle: late answers to
// questions that timed out before.
inline constexpr int kMaxStaleDiagAnswers = 8;

// ---- router: runtime option defaults ------------------------------------------------------
inline constexpr uint16_t kDefaultRouterPort = 7471;        // --port
inline constexpr uint32_t kDefaultPeerTimeoutMs = 2000;     // --peer-timeout-ms
inline constexpr uint32_t kDefaultResolveTimeoutMs = 3000;  // --resolve-timeout-ms
// --spin-us: after answering a pod the router polls this long before it sleeps. An rdma_cm
// connection is a chain of about 16 pod-to-router waits; with it, one-node connections per
// second rose from about 1,900 to 2,600 here (bench/cm_rate; with the library's own spin,
// kDefaultAnswerSpinUs, to about 3,000). Cross-node data does not start the window.
inline constexpr uint32_t kDefaultRouterSpinUs = 30;
// --cm-spin-us: after an rdma_cm event about an id whose peer is a pod of this node, the
// router polls this long. The program that reads the event acts within tens of
// microseconds (a server makes its QP and accepts), longer than --spin-us. One node,
// bench/cm_rate, alternating 0 and 100: 5,576 vs 5,202 and 5,121 vs 5,038 connections/s (32
// runs each); across nodes 2,514 vs 2,535 (20 runs each). Opened for every event, it cost
// the cross-node rate 9%; 200 was no better on one node (5,725 vs 5,712).
inline constexpr uint32_t kDefaultRouterCmSpinUs = 100;

// ---- control plane (controlplane/src) -----------------------------------------------------
// The static control plane stats its file this often, to notice changes when inotify says
// nothing (e.g. network file systems).
inline constexpr std::chrono::milliseconds kStaticFilePollInterval{2000};
// A PEM file larger than this is not a certificate bundle or key.
inline constexpr size_t kMaxPemBytes = 4 << 20;
// etcd: a node key that changes under a claim this many times in a row fails the attempt.
inline constexpr int kEtcdClaimRounds = 8;
// etcd: another router's lease on this router's node key: read its time to live this often,
// and wait at most its time to live plus kEtcdExpiryMargin (etcd reports whole seconds,
// truncated, and revokes expired leases in a periodic sweep), never longer than
// kEtcdMaxHolderWait.
inline constexpr std::chrono::milliseconds kEtcdHolderProbeInterval{100};
inline constexpr std::chrono::milliseconds kEtcdExpiryMargin{1500};
inline constexpr std::chrono::milliseconds kEtcdMaxHolderWait{30000};
// etcd: while another router holds this router's node name, or etcd refuses its
// credentials, the error is repeated this often.
inline constexpr std::chrono::seconds kEtcdRefusalLogInterval{60};

// ---- device plugin (device-plugin/src) ----------------------------------------------------
// Upper bound on the delay from an event (a socket, a signal) to the daemon's action.
inline constexpr std::chrono::milliseconds kPluginLoopTick{50};
// The daemon checks its sockets this often: a safety net for missed inotify events.
inline constexpr std::chrono::milliseconds kPluginSocketCheckPeriod{1000};
// A failed registration with kubelet is retried after a delay that doubles up to this.
inline constexpr std::chrono::milliseconds kPluginMaxBackoff{1000};
// How often a ListAndWatch stream rechecks cancellation, in milliseconds.
inline constexpr int kPluginStreamWakeMs = 200;

}  // namespace ff
