// A second "router" in its own process, for the crash test:
//   controlplane_etcd_peer SPEC NODE LEASE_TTL_MS IP...
// publishes the IPs, prints "ready" once connected, then runs until its stdin closes
// (clean exit: the lease is revoked) or it is killed (the lease expires). alarm() bounds
// its life in case the test that started it is gone.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>

#include "freeflow/controlplane.h"
#include "freeflow/ipv4.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s SPEC NODE LEASE_TTL_MS IP...\n", argv[0]);
    return 2;
  }
  ::alarm(120);
  ff::cp::Options options;
  options.lease_ttl = std::chrono::milliseconds(std::stoi(argv[3]));
  std::string error;
  auto cp = ff::cp::MakeControlPlane(argv[1], {argv[2], 0x7f000009, 7479}, options, &error);
  if (!cp) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  for (int i = 4; i < argc; ++i) cp->Publish(ff::ParseIpv4(argv[i]).value_or(0));
  if (!cp->Start(&error)) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  for (int i = 0; i < 1000 && !cp->Healthy(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!cp->Healthy()) return 1;
  std::printf("ready\n");
  std::fflush(stdout);
  char c;
  while (::read(0, &c, 1) > 0) {
  }
  return 0;
}
