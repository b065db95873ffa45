// Load-time set-up of libfsocket: fork handlers, and the sockets a program inherited
// across exec.
#include <pthread.h>

#include "bells.h"
#include "dial_policy.h"
#include "router_link.h"
#include "sock.h"

namespace ff::fsocket {

void AdoptInherited();  // lifecycle.cc

namespace {

void Prepare() {
  DialPolicyPrepareFork();
  RouterLinkPrepareFork();
  SockPrepareFork();
  BellsPrepareFork();
}
void Parent() {
  BellsAfterFork();
  SockParentAfterFork();
  RouterLinkParentAfterFork();
  DialPolicyAfterFork();
}
void Child() {
  BellsAfterFork();
  SockChildAfterFork();
  RouterLinkChildAfterFork();
  DialPolicyAfterFork();
}

__attribute__((constructor)) void Init() {
  ::pthread_atfork(&Prepare, &Parent, &Child);
  if (GetConfig().enabled) AdoptInherited();
}

}  // namespace
}  // namespace ff::fsocket
