// Moving pages to new backing without losing other threads' writes.
//
// Registration moves a range's pages into a memfd and deregistration moves them back
// (memory.cc): each copies the pages, then maps the copy over them. A write another thread
// made between the copy and the mapping would land in the old pages and be lost. The pages
// at a registration's ends are shared with whatever else the program keeps there (malloc's
// own headers, a librdmacm id's mutex and event count, a neighbour's buffer), so such writes
// are the program's normal work, not a race of its own: a real device pins the pages and
// moves nothing.
//
// A PageSwitch makes the range read-only for the move. A thread that writes to it meanwhile
// takes a SIGSEGV; the library's handler holds that thread until the move has ended and
// then returns, so the write runs again, into the new pages. Reads go on during the move.
// Every other SIGSEGV goes to the handler the program had (or to the default action). The
// handler is installed at the first move and stays: a fault raised during one move may be
// delivered just after it.
//
// What this cannot hold: a system call of another thread that writes into the range during
// the move fails with EFAULT, as there is no fault to hold; a thread that blocks SIGSEGV
// and writes there meanwhile is killed (the kernel does not queue a fault's signal); and a
// thread whose own stack is in the range could not take the signal. A move whose range is
// near the calling thread's stack is done unprotected (that thread is the one writing
// there, and it is busy moving).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ff::verbs {

class PageSwitch {
 public:
  // Makes [start, start+size) read-only (page-aligned; the regions' lock held, so one move at
  // a time). The caller then copies the pages and maps the copy, read-write, over them.
  PageSwitch(uintptr_t start, size_t size);
  // Ends the move: held writers go on. If the caller did not map new pages (it failed), the
  // range is made writable again first.
  ~PageSwitch();
  PageSwitch(const PageSwitch&) = delete;
  PageSwitch& operator=(const PageSwitch&) = delete;

  // The caller mapped new read-write pages over the whole range.
  void Mapped() { mapped_ = true; }

 private:
  uintptr_t start_;
  size_t size_;
  bool protected_ = false;
  bool mapped_ = false;
};

}  // namespace ff::verbs
