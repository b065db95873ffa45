// Finding 8: nothing bounded what one pod made the router hold. The attacker takes all it
// can, each kind until the router refuses: sessions (HELLOs of new connections), then in
// one session QPs, CQs and regions (a memfd each), and in two MR-table entries. Each must end in a
// quota's errno (EMFILE for sessions and descriptors, ENOSPC for objects) within a bound
// far above the defaults, and the router must keep serving the attacker afterwards. It holds
// everything while the script checks that a fresh pod opens its device and other pods'
// ping-pongs complete, and lets go at once when released (the ping-pongs after it check that
// the router gave it all back in time).
#include <sys/resource.h>

#include <functional>

#include "adversary.h"

namespace ff::adversary {
namespace {

// Far above every default quota (tunables.h): an attack that gets this far was not stopped.
constexpr int kBound = 40000;

struct Flood {
  int granted = 0;
  int refusal = -1;  // the errno that ended it; -1: none within kBound
};

// Calls `take` (0 or an errno) until it fails or kBound calls succeeded.
Flood Take(const std::function<int()>& take) {
  Flood f;
  while (f.granted < kBound) {
    const int st = take();
    if (st != 0) {
      f.refusal = st;
      break;
    }
    ++f.granted;
  }
  return f;
}

void Expect(Report& r, const std::string& what, const Flood& f, std::initializer_list<int> ok) {
  bool held = false;
  for (int e : ok) held = held || f.refusal == e;
  r.Check(held, "taking " + what + " until refused",
          std::to_string(f.granted) + " granted, then " + ErrName(f.refusal));
}

}  // namespace

void TakeAllObjects(RawPod& pod, Report& r, std::vector<RawPod>* sessions_out) {
  std::vector<RawPod>& sessions = *sessions_out;
  Expect(r, "sessions", Take([&] {
           sessions.push_back(OpenPod());
           return sessions.back().Hello(Abi());
         }),
         {EMFILE});

  Expect(r, "QPs", Take([&] {
           return pod.CreateQp(IBV_QPT_RC, 1, kMinRingBytes).status;  // its segment stays
         }),
         {ENOSPC, EMFILE});

  uint32_t next_cq = 100;
  Expect(r, "CQs", Take([&] {
           proto::CreateCq m{};
           m.cq_id = next_cq++;
           m.notify_slot = proto::kNoId;
           m.chan_id = proto::kNoId;
           return pod.Call(m).status;
         }),
         {ENOSPC});

  uint32_t next_region = 1;
  Expect(r, "regions", Take([&] {
           UniqueFd fd;
           if (CreateSegment("quota", 4096, &fd) != 0) return -1;
           uint32_t key = 0;
           const uint32_t id = next_region++;
           return pod.RegisterWith(std::move(fd), id, 4096, kAllAccess, uint64_t{id} << 12, &key);
         }),
         {ENOSPC, EMFILE});

  // Spread over two sessions, so that the pod's quota, not one session's table, ends it.
  uint64_t next_addr = 1ull << 40;
  RawPod* takers[] = {&pod, &sessions.front()};
  Expect(r, "MR-table entries (two sessions' tables)", Take([&] {
           proto::RegMr m{};  // memory without remote access: an entry and no region
           m.addr = next_addr += 4096;
           m.length = 4096;
           m.access = IBV_ACCESS_LOCAL_WRITE;
           m.region_id = proto::kNoRegion;
           return takers[(next_addr >> 12) & 1]->Call(m).status;
         }),
         {ENOSPC});
}

void RaiseDescriptorLimit() {
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    nofile.rlim_cur = nofile.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &nofile);
  }
}

int Quota(const Args& a) {
  Report r("8", "quota");
  const Rendezvous rv(a.meet);
  RaiseDescriptorLimit();  // the attacker's own limit must not be what stops it
  auto start = OpenAgainstVictim(a, r);
  if (!start) return r.Finish();
  RawPod& pod = start->pod;

  std::vector<RawPod> sessions;
  TakeAllObjects(pod, r, &sessions);
  // The router still answers the pod, and still refuses it.
  proto::CreateCq more{};
  more.cq_id = 99;
  more.notify_slot = proto::kNoId;
  more.chan_id = proto::kNoId;
  const int st = pod.Call(more).status;
  r.Check(st == ENOSPC, "one more CQ after the floods", ErrName(st));
  return Conclude(r, rv);
}

}  // namespace ff::adversary
