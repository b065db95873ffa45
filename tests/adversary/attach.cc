// Finding 1: a pod attaches to a neighbour's QP without its consent and takes the memory of
// its registrations. The attacker scans the victim's QP numbers with an RC and a UD QP of its
// own, connects by address and by LID, and asks for every region id it can guess through
// each QP. It must get no ring of an RC QP and no region; the one thing it may get is what a
// fabric gives anyone: a ring to send datagrams into the victim's UD QP. Any descriptor it
// is handed is searched for the victim's secret (and, found, overwritten: the victim
// notices).
#include <arpa/inet.h>

#include <cerrno>
#include <cstdio>
#include <map>
#include <set>

#include "adversary.h"
#include "freeflow/ipv4.h"

namespace ff::adversary {
namespace {

constexpr uint32_t kScanFirst = 0x100;
constexpr uint32_t kScanLast = 0x140;
constexpr uint32_t kGuessedRegions = 32;

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%#x", v);
  return buf;
}

// What the attacker learnt from the descriptors it was handed: whether any holds the secret,
// and whether it could then overwrite it.
struct Loot {
  int fds = 0;
  bool read = false;
  bool wrote = false;
  void Take(const std::vector<UniqueFd>& fds_got) {
    for (const UniqueFd& fd : fds_got) {
      ++fds;
      if (!HoldsSecret(fd.get())) continue;
      read = true;
      wrote |= OverwriteSecret(fd.get());
    }
  }
  std::string Text() const {
    std::string t = std::to_string(fds) + " descriptors";
    if (read) t += wrote ? ", the victim's secret read and overwritten" : ", the secret read";
    return t;
  }
};

// GetRegion for every guessable id through QP `qpn` (the attacker's own, or one it does not
// own): the statuses; what came with them goes to `loot`.
std::vector<int> GuessRegions(RawPod& pod, uint32_t qpn, Loot* loot) {
  std::vector<int> statuses;
  for (uint32_t id = 0; id < kGuessedRegions; ++id) {
    proto::GetRegion g{};
    g.qpn = qpn;
    g.region_id = id;
    std::vector<UniqueFd> fds;
    statuses.push_back(pod.Call(g, {}, &fds).status);
    loot->Take(fds);
  }
  return statuses;
}

bool AllRefused(const std::vector<int>& statuses) {
  for (int s : statuses)
    if (s == 0) return false;
  return true;
}

// Connects `qp` (RC through kConnectQp, UD through kResolveUd) to every QPN in `qpns` at the
// victim's address; each connect that gave descriptors is followed by a round of guesses.
struct Scan {
  std::vector<int> statuses;
  std::map<uint32_t, int> by_qpn;
  std::set<uint32_t> attached;  // QPNs that gave a ring
  std::vector<int> regions;     // GetRegion answers
  Loot loot;
};
Scan ScanQpns(RawPod& pod, const RawQp& qp, bool ud, uint32_t ip, const std::set<uint32_t>& qpns) {
  Scan s;
  for (uint32_t qpn : qpns) {
    RawLink link = pod.Connect(qp, ip, qpn, ud);
    s.statuses.push_back(link.status);
    s.by_qpn[qpn] = link.status;
    if (link.fds.empty()) continue;
    s.attached.insert(qpn);
    s.loot.Take(link.fds);
    const std::vector<int> g = GuessRegions(pod, qp.qpn, &s.loot);
    s.regions.insert(s.regions.end(), g.begin(), g.end());
  }
  const std::vector<int> g = GuessRegions(pod, qp.qpn, &s.loot);
  s.regions.insert(s.regions.end(), g.begin(), g.end());
  return s;
}

// The victim's RC QP by LID instead of address: the same consent applies.
int ConnectByLid(RawPod& pod, const RawQp& qp, const Victim& v, Loot* loot) {
  proto::ConnectQp m{};
  m.qpn = qp.qpn;
  m.dest_qpn = v.rc_qpn;
  m.dest_lid = LidForIp(v.ip, Ipv4Prefix::Containing(OwnIp(pod), pod.hello().prefix_len));
  std::vector<UniqueFd> fds;
  const int status = pod.Call(m, {}, &fds).status;
  loot->Take(fds);
  return fds.empty() ? status : 0;
}

}  // namespace

int Attach(const Args& a) {
  Report r("1", "attach");
  auto start = OpenAgainstVictim(a, r);
  if (!start) return r.Finish();
  RawPod& pod = start->pod;
  const Victim* victim = &start->victim;
  const RawQp rc = pod.CreateQp(IBV_QPT_RC);
  const RawQp ud = pod.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  std::set<uint32_t> qpns = {victim->rc_qpn, victim->ud_qpn};
  for (uint32_t q = kScanFirst; q <= kScanLast; ++q) qpns.insert(q);
  const std::string where = std::to_string(qpns.size()) + " QPNs of " + FormatIpv4(victim->ip) +
                            " (" + Hex(kScanFirst) + "-" + Hex(kScanLast) + ", the victim's RC " +
                            Hex(victim->rc_qpn) + " and UD " + Hex(victim->ud_qpn) + ")";
  // The victim's RC QP must be found and refused for want of its consent (EINPROGRESS):
  // anything else would mean the scan missed it.
  Scan s = ScanQpns(pod, rc, false, victim->ip, qpns);
  r.Check(s.attached.empty() && !s.loot.read && s.by_qpn[victim->rc_qpn] == EINPROGRESS,
          "RC connects to " + where,
          Tally(s.statuses) + " (the victim's RC QP: " + ErrName(s.by_qpn[victim->rc_qpn]) + "); " +
              s.loot.Text());
  const int by_lid = ConnectByLid(pod, rc, *victim, &s.loot);
  r.Check(by_lid != 0, "RC connect by LID to the victim's RC QP", ErrName(by_lid));
  r.Check(AllRefused(s.regions) && !s.loot.read,
          "GetRegion ids 0-31 through its RC QP, after every connect",
          Tally(s.regions) + "; " + s.loot.Text());
  // The victim's UD QP takes datagrams from anyone: reaching it shows the scan hit home.
  Scan u = ScanQpns(pod, ud, true, victim->ip, qpns);
  const bool only_ud = u.attached == std::set<uint32_t>{victim->ud_qpn};
  r.Check(only_ud && !u.loot.read, "UD resolves of " + where,
          Tally(u.statuses) + " (a UD destination takes datagrams from anyone, as on a fabric); " +
              u.loot.Text());
  r.Check(AllRefused(u.regions) && !u.loot.read,
          "GetRegion ids 0-31 through its UD QP, after every resolve",
          Tally(u.regions) + "; " + u.loot.Text());
  Loot theirs;
  std::vector<int> through_victim = GuessRegions(pod, victim->rc_qpn, &theirs);
  const std::vector<int> ud_victim = GuessRegions(pod, victim->ud_qpn, &theirs);
  through_victim.insert(through_victim.end(), ud_victim.begin(), ud_victim.end());
  r.Check(AllRefused(through_victim) && !theirs.read,
          "GetRegion ids 0-31 naming the victim's own QPNs", Tally(through_victim));
  return Conclude(r, Rendezvous(a.meet));
}

}  // namespace ff::adversary
