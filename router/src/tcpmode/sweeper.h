// The thread that asks the kernel about TCP-mode connections for the socket service, so
// that the router's loop never waits on sock_diag (each question waits up to
// kNetlinkTimeoutMs, and a sweep asks one per open end of every record).
//
// Threading: Start() on the loop's thread; the probe's Look() and `done` run on the
// sweeper's own thread, one sweep at a time; `done` hands the answers back (the socket
// service posts them to its loop). The destructor waits for a sweep under way.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tcpmode/probe.h"

namespace ff::router {

// One question: connection `tuple` in the namespace of `ns`; `answer` is filled in.
struct StreamLook {
  std::shared_ptr<NetnsHandle> ns;
  TcpTuple tuple;
  Presence answer = Presence::kUnknown;
};

class TcpModeSweeper {
 public:
  using Done = std::function<void(std::vector<StreamLook>)>;
  TcpModeSweeper(TcpModeProbe& probe, Done done) : probe_(probe), done_(std::move(done)) {}
  TcpModeSweeper(const TcpModeSweeper&) = delete;
  TcpModeSweeper& operator=(const TcpModeSweeper&) = delete;
  ~TcpModeSweeper();

  // Asks `looks` on the sweeper's thread (started on first use) and calls `done` with the
  // answers, in the same order. false when the thread cannot be started (nothing is asked).
  bool Start(std::vector<StreamLook> looks);

 private:
  void Run();

  TcpModeProbe& probe_;
  Done done_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<StreamLook> next_;
  bool pending_ = false;
  std::atomic<bool> stop_ = false;  // also read between questions: a sweep ends early
  std::thread thread_;
};

}  // namespace ff::router
