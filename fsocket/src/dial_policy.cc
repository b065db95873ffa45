#include "dial_policy.h"

#include <arpa/inet.h>

#include <algorithm>
#include <mutex>

#include "freeflow/clock.h"
#include "freeflow/tunables.h"
#include "log.h"

namespace ff::fsocket {
namespace {

// One destination's recent history. A slot is the destination's by its hash; another
// destination with the same hash takes it over (both then judge afresh).
struct Destination {
  uint64_t key = 0;        // address << 16 | port; 0: unused
  uint32_t short_run = 0;  // short connections in a row
  uint32_t skip_left = 0;  // connects still to give the kernel
  uint32_t next_skip = kShortSkipFirst;
  bool looking = false;  // a look is under way: the connects meanwhile are kernel TCP
  uint64_t last_short_ns = 0;

  // The kernel has had a turn here (a run was granted) and it is over: the next connect
  // looks whether connections are still short.
  bool LookDue() const { return skip_left == 0 && next_skip > kShortSkipFirst; }
  // The look at `k` ended, or was never made: the next connect there may look.
  void LookOver(uint64_t k) {
    if (key == k) looking = false;
  }
};

constexpr uint32_t kSlots = 256;

struct Table {
  std::mutex mu;
  Destination slots[kSlots];
};
Table& TheTable() {
  static Table* t = new Table;  // never destroyed: interposers run during exit
  return *t;
}

uint64_t KeyOf(uint32_t ip_net, uint16_t port) {
  return static_cast<uint64_t>(ip_net) << 16 | port;
}

Destination& SlotOf(Table& t, uint64_t key) { return t.slots[(key * 0x9E3779B97F4A7C15ull) >> 56]; }

}  // namespace

Dial DialKind(uint32_t ip_net, uint16_t port_net) {
  const uint64_t key = KeyOf(ip_net, ntohs(port_net));
  Table& t = TheTable();
  std::lock_guard lock(t.mu);
  Destination& d = SlotOf(t, key);
  if (d.key != key || (d.skip_left == 0 && !d.LookDue())) return Dial::kAccelerate;
  if (MonotonicNs() - d.last_short_ns > kShortForgetNs) {
    // The pattern stopped a while ago (or a look has been open that long): judge afresh.
    d = Destination{};
    return Dial::kAccelerate;
  }
  if (d.skip_left > 0) {
    --d.skip_left;
    return Dial::kKernel;
  }
  if (d.looking) return Dial::kKernel;  // one look at a time
  d.looking = true;
  return Dial::kLook;
}

void LookNotMade(uint32_t ip_net, uint16_t port_net) {
  const uint64_t key = KeyOf(ip_net, ntohs(port_net));
  Table& t = TheTable();
  std::lock_guard lock(t.mu);
  SlotOf(t, key).LookOver(key);
}

void NoteDialed(Sock& s, bool look) {
  s.dialed = true;
  s.look = look;
}

void NoteDialedEnd(const Sock& s) {
  if (!s.dialed) return;
  const uint64_t now = MonotonicNs();
  const bool rings = s.tx != nullptr && s.rx != nullptr;
  // Ring positions count every byte since the start; a peer's numbers only sway this guess.
  const uint64_t moved = rings ? s.tx->tail.load(std::memory_order_relaxed) +
                                     s.rx->tail.load(std::memory_order_relaxed)
                               : 0;
  // Judged by what it carried, not by how long it lived: a connection whose server takes
  // its time (a forked database backend's start) is no more worth a segment for that.
  const bool is_short = s.exchanges.load(std::memory_order_relaxed) < kShortStreamExchanges &&
                        moved < kShortStreamBytes;
  const uint64_t key = KeyOf(s.peer_ip_net, s.peer_port);
  Table& t = TheTable();
  std::lock_guard lock(t.mu);
  Destination& d = SlotOf(t, key);
  if (s.look) d.LookOver(key);
  if (!rings) return;
  if (d.key != key) {
    if (!is_short) return;
    d = Destination{};
    d.key = key;
  }
  if (!is_short) {
    d = Destination{};
    return;
  }
  d.last_short_ns = now;
  if (++d.short_run < kShortStreamRun) return;
  // A run of short ones, or a look after the kernel's turn that was short again.
  d.skip_left = d.next_skip;
  d.next_skip = std::min(d.next_skip * 2, kShortSkipMost);
  d.short_run = kShortStreamRun - 1;  // the next look decides alone
  LogDebug("connections to port %u are short: the next %u there are kernel TCP",
           static_cast<unsigned>(s.peer_port), d.skip_left);
}

void DialPolicyPrepareFork() { TheTable().mu.lock(); }
void DialPolicyAfterFork() { TheTable().mu.unlock(); }

}  // namespace ff::fsocket
