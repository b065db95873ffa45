// FFV_REPORT_WAITS=1: the longest a send queue of this process waited with work outstanding,
// printed when the process exits ("freeflow info[pid]: ..."), for an operator or a test to
// see what a pause (a router's replacement, a peer's stall) cost the program.
//
// A WQE waits from when it is both posted and at the head of its queue (the one before it
// retired) until it retires, in ibv_poll_cq: the wait therefore counts what the program saw,
// its own time off the CPU included, as perftest's t_max does. The report names the
// kSendWaitsKept longest waits with the wall-clock time each began, so that a wait can be
// matched with what happened then (a hand-over in the router's log). Off (the default), a post
// costs one predictable branch.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace ff::verbs {

inline constexpr int kSendWaitsKept = 8;

namespace send_waits_detail {
extern std::atomic<bool> on;
}
// True when FFV_REPORT_WAITS is set to something other than "0" (read once, at load).
inline bool SendWaitsOn() { return send_waits_detail::on.load(std::memory_order_relaxed); }
// One WQE of QP `qpn` retired after waiting `waited_ns` at the head of its queue.
void NoteSendWait(uint32_t qpn, uint64_t waited_ns);
// The report's text (without the log prefix), as the process's exit prints it.
std::string SendWaitsReport();
// Tests: forgets what was noted, and turns the meter on or off.
void ResetSendWaitsForTest(bool on);

}  // namespace ff::verbs
