// A stream's bells (core/include/freeflow/stream_segment.h): how one end wakes the other
// when the other sleeps. The router gives each end two descriptors, the read end of its own
// bell and the write end of the other's; a byte there wakes a sleeper in poll, epoll or a
// blocking call for a system call on a Unix socket, where a byte on the kernel TCP
// connection costs the kernel's TCP path through veth and a bridge (docs/tcp-mode.md,
// "Bells").
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

// Takes the bells the router gave for stream `s`; a stream keeps none when there is no room
// for them.
void AdoptBells(Sock& s, ff::UniqueFd read_end, ff::UniqueFd write_end);
// Stream `s` is gone from the process: its bells are closed.
void CloseBells(Sock& s);
// What a sleeper of `s` writes into its armed word: kArmBell when it waits on its bell too,
// else kArmKernel (no bell; a process confined by seccomp, which keeps to read/write/poll
// on the kernel socket).
uint32_t ArmValue(const Sock& s);
// Rings the other end's bell: true when it will wake (a byte sent, or its bell already
// full); false when the kernel connection must carry the bell instead.
bool RingBell(Sock& s, char b);
// Takes what waits on this end's bell (each byte only says "look again").
void DrainBell(Sock& s);
// The program is about to close or replace descriptor `fd` (close, dup2, dup3) or every
// descriptor in [lo, hi] (close_range, closefrom; hi < 0: no end): a bell among them is
// forgotten by its stream first, so that the library never writes to a reused number.
void DisownBell(int fd);
void DisownBellsIn(int lo, int hi);
// How many bell descriptors the process holds (tests).
int BellFdsHeld();

void BellsPrepareFork();
void BellsAfterFork();

}  // namespace ff::fsocket
