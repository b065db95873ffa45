// A throwaway etcd for tests: its own data directory under /tmp, client and peer URLs on
// free 127.0.0.1 ports, started and stopped by PID. Restartable on the same directory and
// ports. Plaintext, or TLS with client certificates required (EtcdServer::Tls).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "ff_etcd_rpc.grpc.pb.h"

namespace ff::cp::testing {

class EtcdServer {
 public:
  // https with the certificates scripts/ff-certs.sh made in `dir`: ca.crt,
  // localhost.crt/.key (with IP 127.0.0.1) for the server, root.crt/.key (CN root) for the
  // test's own calls, which are root's once authentication is on.
  struct Tls {
    std::string dir;           // empty: plaintext http
    int auth_token_ttl_s = 0;  // etcd's --auth-token-ttl (simple tokens); 0: its default
  };
  EtcdServer();  // plaintext
  explicit EtcdServer(Tls tls);
  ~EtcdServer();  // stops the server and removes its directory
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  // The etcd binary: $FF_ETCD, else /usr/bin/etcd. Empty when neither exists.
  static std::string Binary();

  // Starts etcd and waits (at most 15 s) until it answers a Range. false + *error if not.
  bool Start(std::string* error);
  // SIGTERM, then SIGKILL after 5 s. No-op when not running.
  void Stop();
  // SIGKILL, as in a crash.
  void Kill();

  std::string url() const;     // http(s)://127.0.0.1:PORT
  std::string target() const;  // 127.0.0.1:PORT
  const std::string& dir() const { return dir_; }

  // A stub on this server for inspecting keys directly.
  std::unique_ptr<etcdserverpb::KV::Stub> KV() const;
  // Every key and value under `prefix`, "key=value lease?" per line, sorted. Empty on error.
  std::string Dump(const std::string& prefix) const;
  // Revokes the lease that `key` is attached to, behind its owner's back. false on error.
  bool RevokeLeaseOf(const std::string& key) const;
  // The lease `key` is attached to: 0 when none or when the key is absent, -1 on error.
  int64_t LeaseOf(const std::string& key) const;
  // A new lease of `ttl_seconds` that nobody keeps alive; 0 on error.
  int64_t Grant(int64_t ttl_seconds) const;
  // Refreshes `lease` once. false on error or when the lease is gone.
  bool KeepAlive(int64_t lease) const;
  // Writes `key` (under `lease`, 0 for none), as another writer would. false on error.
  bool Put(const std::string& key, const std::string& value, int64_t lease) const;
  // A channel to this server with the test's own (root's) credentials.
  std::shared_ptr<grpc::Channel> Channel() const;
  // Runs `command` under /bin/sh (killed after 30 s) with etcdctl's environment pointing
  // at this server as root (ETCDCTL_ENDPOINTS, _CACERT, _CERT, _KEY); its output goes to
  // etcd.log. The exit status, -1 when it could not run.
  int Admin(const std::string& command) const;

 private:
  void WaitExit(std::chrono::milliseconds limit);
  const Tls tls_;
  std::string dir_;
  uint16_t client_port_ = 0;
  uint16_t peer_port_ = 0;
  pid_t pid_ = -1;
};

// A free TCP port on 127.0.0.1 (bound, read back, closed).
uint16_t FreePort();

}  // namespace ff::cp::testing
