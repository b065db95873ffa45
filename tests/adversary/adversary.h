// The adversary suite (docs/security.md, "The adversary suite"): one attack per finding of
// issue 9 ("6") and of later reviews ("37.6": issue 37's sixth), each performed by a hostile
// pod that skips the library and speaks the router's socket protocol and shared memory
// itself (or, for the node port, plain TCP), against real ffrouter processes. An attack
// exits 0 only when every defence it tried held, and says so in one line:
//   DEFENDED <finding> <name>: <what was tried> -> <what it got>
//   BREACHED <finding> <name>: <what was tried> -> <what it got>
// tests/integration/security/adversary.sh runs them between a victim pod and live traffic.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "raw_pod.h"
#include "victim.h"

namespace ff::adversary {

using test::RawLink;
using test::RawPod;
using test::RawQp;

inline constexpr uint32_t kAllAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
inline constexpr auto kMeetTimeout = std::chrono::seconds(20);

// What a command is given: the suite's folder (the victim describes itself there) and the
// folder in it where the processes of this attack meet (<dir>/<attack>).
struct Args {
  std::string dir;
  std::string meet;
};

// Files through which the processes of one attack meet (the attacker, its helper on the
// other node, the script). A value is written whole (a temporary name, then rename) and
// waited for with a bound.
class Rendezvous {
 public:
  explicit Rendezvous(std::string dir);  // made when missing
  void Put(const std::string& key, const std::string& value) const;
  std::optional<std::string> Get(const std::string& key,
                                 std::chrono::milliseconds timeout = kMeetTimeout) const;

 private:
  std::string dir_;
};

// The checks of one attack, and its verdict.
class Report {
 public:
  // `finding`: "6" for issue 9's sixth, "37.6" for issue 37's.
  Report(std::string finding, std::string name)
      : finding_(std::move(finding)), name_(std::move(name)) {}
  // One thing the attacker tried: `held` when the defence held; `got` what it got.
  void Check(bool held, const std::string& tried, const std::string& got);
  // Prints every check and the verdict line; returns the exit status (0: defended).
  int Finish() const;

 private:
  struct Line {
    bool held;
    std::string tried, got;
  };
  std::string finding_;
  std::string name_;
  std::vector<Line> lines_;
};

// The router of this process's pod, found as the library finds it ($FREEFLOW_DIR and
// $FFR_NAME), connected as a raw pod; exits the program when nobody listens there.
RawPod OpenPod();
// The ABI this attacker announces at HELLO: the suite's, or $ADV_ABI (to aim an attack at
// a router of an older protocol).
uint32_t Abi();
// "EINVAL", "EINPROGRESS", ... for a status the router answered (-1: no answer).
std::string ErrName(int status);
// Counts of each answer, as "EHOSTUNREACH x63, EINPROGRESS x1".
std::string Tally(const std::vector<int>& statuses);
// The name of a work completion status, or "no answer" for -1.
std::string WcName(int status);
// This pod's overlay address (host order), from its HELLO answer.
uint32_t OwnIp(const RawPod& pod);

// True when the memory behind `fd` holds the victim's secret marker (mapped read-only).
bool HoldsSecret(int fd);
// Overwrites the victim's marker in the memory behind `fd`; true when that worked.
bool OverwriteSecret(int fd);

// The victim, as it described itself in the suite's folder.
struct Victim {
  uint32_t ip = 0;  // host order
  uint32_t rc_qpn = 0;
  uint32_t ud_qpn = 0;
};
// `file`: where in `dir` it described itself (the SRQ victim's is "srq-victim").
std::optional<Victim> FindVictim(const std::string& dir, const std::string& file = kVictimFile);
// The attacker's pod (its HELLO answered) and the victim it goes for; nothing when either
// could not be had, which `r` records as a failure.
struct Opening {
  RawPod pod;
  Victim victim;
};
std::optional<Opening> OpenAgainstVictim(const Args& a, Report& r);

// ---- attacks across nodes: the attacker and its helper (`peer`) on the other node ------
// The helper's answer to the attacker's QPs: one RC QP per QP of the attacker, a region of
// kPeerRegionBytes at `addr` that its QPs may read and write remotely.
struct Peer {
  uint32_t ip = 0;  // host order
  uint32_t rkey = 0;
  uint64_t addr = 0;
  std::vector<uint32_t> qpns;
};
inline constexpr uint32_t kPeerRegionBytes = 64 * 1024;
// The attacker publishes its QPs, learns the helper's, and names QP i of the helper as the
// peer of its QP i (RTR). Once it returns, the helper connects each of its QPs and sends one
// SEND on each.
std::optional<Peer> MeetPeer(const Rendezvous& rv, RawPod& pod, const std::vector<RawQp*>& ours);
// The completion status the helper got for each of its SENDs (-1: no answer in time, -2:
// its connect was refused).
std::vector<int> PeerResults(const Rendezvous& rv, size_t count);
// Connects `qp` to the helper's QP `qpn` (a proxy through this node's router), asking again
// while the answer is EINPROGRESS.
RawLink ConnectTo(RawPod& pod, const RawQp& qp, uint32_t ip, uint32_t qpn);
// Prints the verdict, tells the script the attack is in place and waits (bounded) until it
// has checked the node, then lets the helper go; returns the attack's exit status.
int Conclude(const Report& r, const Rendezvous& rv);

// ---- what more than one attack does ------------------------------------------------
// Raises this process's soft RLIMIT_NOFILE to its hard limit.
void RaiseDescriptorLimit();
// Takes, each until refused: sessions (kept in *sessions), then in `pod` QPs, CQs and
// regions, and MR-table entries over `pod` and the first of *sessions; a check in `r` each,
// held when a quota's errno ended it.
void TakeAllObjects(RawPod& pod, Report& r, std::vector<RawPod>* sessions);

// What cm-flood does: kChannels rdma_cm channels on `pod`, then on each one id resolved
// again and again toward an address outside the pod network (an ADDR_ERROR event each),
// never reading an event, until the router closes the channel.
struct CmFloodResult {
  std::vector<UniqueFd> channels;  // ours; the router's ends closed show as hung up
  int resolved = 0;
  size_t closed = 0;
  std::vector<int> refusals;
};
CmFloodResult FloodCmEvents(RawPod& pod);
// Whether the router bounded it (every channel opened, some closed before all was resolved),
// what was tried and what it got, as Report lines.
bool CmFloodHeld(const CmFloodResult& f);
extern const std::string kCmFloodTried;
std::string DescribeCmFlood(const CmFloodResult& f);

// ---- the commands --------------------------------------------------------------------
int Attach(const Args& a);         // finding 1
int Wake(const Args& a);           // finding 2
int Shrink(const Args& a);         // finding 3
int Ring(const Args& a);           // finding 4
int MrTable(const Args& a);        // finding 5
int Identity(const Args& a);       // finding 6
int Folder(const Args& a);         // finding 7
int Quota(const Args& a);          // finding 8
int UdFlood(const Args& a);        // issue 37, attack 1
int HelloFlood(const Args& a);     // issue 37, attacks 2 and 3
int CmFlood(const Args& a);        // issue 37, attack 4
int PortFlood(const Args& a);      // issue 37, attacks 6 and 7
int QuotaAll(const Args& a);       // issue 37: one pod at every quota at once
int SrqShare(const Args& a);       // issue 37, attack 5
int PeerHelper(const Args& a);     // the helper of every cross-node attack
int IdentityHost(const Args& a);   // identity's helper with host networking
int PortFloodHost(const Args& a);  // port-flood's helper with host networking
int Probe(const Args& a);

}  // namespace ff::adversary
