// ffadversary: the attacks of the adversary suite, one command per finding of issue 9, and
// the two helpers they need. Run by tests/integration/security/adversary.sh; see adversary.h.
//   ffadversary COMMAND DIR          an attack, or the probe ("hello")
//   ffadversary peer DIR ATTACK      the helper of ATTACK, on the other node
//   ffadversary host DIR ATTACK      the helper of ATTACK, with host networking
#include <cstdio>
#include <cstring>
#include <string>

#include "adversary.h"

namespace {

using ff::adversary::Args;

struct Command {
  const char* name;
  int finding;  // 0: not an attack
  int (*run)(const Args&);
  const char* what;
};

constexpr Command kCommands[] = {
    {"attach", 1, &ff::adversary::Attach, "attach to the victim's QPs and take its regions"},
    {"wake", 2, &ff::adversary::Wake, "make the router block on a wake descriptor"},
    {"shrink", 3, &ff::adversary::Shrink, "shrink memfds the router maps"},
    {"ring", 4, &ff::adversary::Ring, "steer the router's ring producers outside a ring"},
    {"mr-table", 5, &ff::adversary::MrTable, "write the read-only MR tables"},
    {"identity", 6, &ff::adversary::Identity, "be served with the victim's address"},
    {"folder", 7, &ff::adversary::Folder, "change the shared folder pods load from"},
    {"quota", 8, &ff::adversary::Quota, "make the router hold all it can"},
    {"peer", 0, &ff::adversary::PeerHelper, "ATTACK: the helper of a cross-node attack"},
    {"host", 0, &ff::adversary::HostHelper, "ATTACK: the helper run with host networking"},
    {"hello", 0, &ff::adversary::Probe, "a fresh pod's HELLO, answered within 1 s"},
};

int Usage() {
  std::fprintf(stderr, "usage: ffadversary COMMAND DIR [ATTACK]\n");
  for (const Command& c : kCommands) {
    if (c.finding != 0) {
      std::fprintf(stderr, "  %-9s finding %d: %s\n", c.name, c.finding, c.what);
    } else {
      std::fprintf(stderr, "  %-9s %s\n", c.name, c.what);
    }
  }
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return Usage();
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    const bool helper = c.run == &ff::adversary::PeerHelper || c.run == &ff::adversary::HostHelper;
    if (helper && argc < 4) return Usage();
    const Args args{argv[2], std::string(argv[2]) + "/" + (helper ? argv[3] : c.name)};
    return c.run(args);
  }
  return Usage();
}
