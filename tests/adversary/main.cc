// ffadversary: the attacks of the adversary suite, one command per finding, and the helpers
// they need. Run by tests/integration/security/adversary.sh; see adversary.h.
//   ffadversary COMMAND DIR          an attack, or the probe ("hello")
//   ffadversary peer DIR ATTACK      the helper of ATTACK, on the other node
//   ffadversary host DIR ATTACK      the helper of ATTACK, with host networking
#include <cstdio>
#include <cstring>
#include <string>

#include "adversary.h"

namespace {

using ff::adversary::Args;
using Run = int (*)(const Args&);

struct Command {
  const char* name;
  const char* finding;  // nullptr: not an attack
  Run run;
  const char* what;
  Run host = nullptr;  // its helper with host networking, if it has one
};

constexpr Command kCommands[] = {
    {"attach", "1", &ff::adversary::Attach, "attach to the victim's QPs and take its regions"},
    {"wake", "2", &ff::adversary::Wake, "make the router block on a wake descriptor"},
    {"shrink", "3", &ff::adversary::Shrink, "shrink memfds the router maps"},
    {"ring", "4", &ff::adversary::Ring, "steer the router's ring producers outside a ring"},
    {"mr-table", "5", &ff::adversary::MrTable, "write the read-only MR tables"},
    {"identity", "6", &ff::adversary::Identity, "be served with the victim's address",
     &ff::adversary::IdentityHost},
    {"folder", "7", &ff::adversary::Folder, "change the shared folder pods load from"},
    {"quota", "8", &ff::adversary::Quota, "make the router hold all it can"},
    {"ud-flood", "37.1", &ff::adversary::UdFlood,
     "give a victim's UD QP new senders faster than it reads their events"},
    {"hello-flood", "37.2", &ff::adversary::HelloFlood,
     "stall the router by connecting again and again from a namespace of many addresses"},
    {"srq-share", "37.5", &ff::adversary::SrqShare,
     "reach the SRQ a victim's UD QP shares with its RC QPs, and spend its receives"},
    {"cm-flood", "37.4", &ff::adversary::CmFlood,
     "make the router hold rdma_cm events nobody reads"},
    {"port-flood", "37.6", &ff::adversary::PortFlood,
     "keep routers from linking with idle connections to a node port",
     &ff::adversary::PortFloodHost},
    {"quota-all", "37.m", &ff::adversary::QuotaAll,
     "make the router hold all a pod's quotas allow at once, across nodes too"},
    {"hello", nullptr, &ff::adversary::Probe, "a fresh pod's HELLO, answered within 1 s"},
};

int Usage() {
  std::fprintf(stderr, "usage: ffadversary COMMAND DIR | {peer|host} DIR ATTACK\n");
  for (const Command& c : kCommands) {
    std::fprintf(stderr, "  %-10s %s%s%s%s\n", c.name, c.finding ? "finding " : "",
                 c.finding ? c.finding : "", c.finding ? ": " : "", c.what);
  }
  std::fprintf(stderr, "  %-10s ATTACK's helper on the other node\n", "peer");
  std::fprintf(stderr, "  %-10s ATTACK's helper with host networking\n", "host");
  return 2;
}

const Command* Find(const char* name) {
  for (const Command& c : kCommands) {
    if (std::strcmp(name, c.name) == 0) return &c;
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return Usage();
  const std::string dir = argv[2];
  const bool peer = std::strcmp(argv[1], "peer") == 0;
  if (peer || std::strcmp(argv[1], "host") == 0) {
    const Command* attack = argc >= 4 ? Find(argv[3]) : nullptr;
    if (attack == nullptr || (!peer && attack->host == nullptr)) return Usage();
    const Args args{dir, dir + "/" + attack->name};
    return peer ? ff::adversary::PeerHelper(args) : attack->host(args);
  }
  const Command* c = Find(argv[1]);
  if (c == nullptr) return Usage();
  return c->run(Args{dir, dir + "/" + c->name});
}
