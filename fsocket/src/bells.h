// A stream's bell (core/include/freeflow/stream_segment.h): how one end wakes the other
// when the other sleeps. The router gives each end one side of a Unix stream socket pair:
// the end reads its own wake-ups there and sends the other end's, one byte each. That wakes
// a sleeper in poll, epoll or a blocking call for a send on a Unix socket, where a byte on
// the kernel TCP connection costs the kernel's TCP path through veth and a bridge
// (docs/tcp-mode.md, "Waits and bells").
//
// The descriptors are the library's, not the program's: they are moved to high numbers
// (at least kBellFdFloor, below RLIMIT_NOFILE), a process keeps at most a budget of them
// (a stream without bells is rung on the kernel connection, as every stream was before),
// and a program that closes or replaces one makes its stream forget it first.
#pragma once

#include <cstdint>

#include "freeflow/fd.h"
#include "sock.h"

namespace ff::fsocket {

// Takes the bell the router gave for stream `s`; a stream keeps none when there is no room
// for it.
void AdoptBell(Sock& s, ff::UniqueFd bell);
// Stream `s` is gone from the process: its bell is closed.
void CloseBell(Sock& s);
// The bell a wait of `s` may sleep on, or -1: none, a restricted process (below), or one
// whose other side is closed (DrainBell saw it).
int WaitableBell(const Sock& s);
// What a sleeper of `s` writes into its armed word: kArmBell when it waits on its bell too,
// else kArmKernel (no bell; a process confined by seccomp, which keeps to read/write/poll
// on the kernel socket).
uint32_t ArmValue(const Sock& s);
// Rings the other end's bell: true when it will wake (a byte sent, or its bell already
// full); false when the kernel connection must carry the bell instead.
bool RingBell(Sock& s, char b);
// Takes what waits on this end's bell (each byte only says "look again"); notes a bell
// whose other side is closed, which no wait then uses.
void DrainBell(Sock& s);
// The program is about to close or replace descriptor `fd` (close, dup2, dup3) or every
// descriptor in [lo, hi] (close_range, closefrom; hi < 0: no end): a bell among them is
// forgotten by its stream first, so that the library never writes to a reused number.
void DisownBell(int fd);
void DisownBellsIn(int lo, int hi);
// False when `fd` is surely no bell (no bell held, or a number below where bells go): the
// callers' quick test before they pay for a closer look.
bool MaybeBell(int fd);
// How many bell descriptors the process holds (tests).
int BellFdsHeld();

void BellsPrepareFork();
void BellsAfterFork();

}  // namespace ff::fsocket
