#include "etcd_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

namespace ff::cp::testing {
namespace {

using namespace std::chrono_literals;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Plaintext, or TLS as root with the certificates in `dir`.
std::shared_ptr<grpc::ChannelCredentials> Credentials(const std::string& dir) {
  if (dir.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = Slurp(dir + "/ca.crt");
  ssl.pem_cert_chain = Slurp(dir + "/root.crt");
  ssl.pem_private_key = Slurp(dir + "/root.key");
  return grpc::SslCredentials(ssl);
}

std::string PrefixEnd(std::string prefix) {
  prefix.back() = static_cast<char>(prefix.back() + 1);
  return prefix;
}

}  // namespace

uint16_t FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  uint16_t port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  if (fd >= 0) ::close(fd);
  return port;
}

std::string EtcdServer::Binary() {
  if (const char* env = ::getenv("FF_ETCD"); env && ::access(env, X_OK) == 0) return env;
  if (::access("/usr/bin/etcd", X_OK) == 0) return "/usr/bin/etcd";
  return {};
}

EtcdServer::EtcdServer() : EtcdServer(Tls{}) {}

EtcdServer::EtcdServer(Tls tls) : tls_(std::move(tls)) {
  char tmpl[] = "/tmp/ff-cp-etcd-XXXXXX";
  if (::mkdtemp(tmpl)) dir_ = tmpl;
  client_port_ = FreePort();
  peer_port_ = FreePort();
  while (peer_port_ == client_port_) peer_port_ = FreePort();
}

EtcdServer::~EtcdServer() {
  Stop();
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

std::string EtcdServer::url() const {
  return (tls_.dir.empty() ? "http://" : "https://") + target();
}
std::string EtcdServer::target() const { return "127.0.0.1:" + std::to_string(client_port_); }

bool EtcdServer::Start(std::string* error) {
  if (pid_ > 0) return true;
  const std::string binary = Binary();
  if (binary.empty() || dir_.empty() || client_port_ == 0 || peer_port_ == 0) {
    *error = "no etcd binary, temporary directory or free port";
    return false;
  }
  const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
  std::vector<std::string> args = {binary,
                                   "--name=default",
                                   "--data-dir=" + dir_ + "/data",
                                   "--listen-client-urls=" + url(),
                                   "--advertise-client-urls=" + url(),
                                   "--listen-peer-urls=" + peer,
                                   "--initial-advertise-peer-urls=" + peer,
                                   "--initial-cluster=default=" + peer,
                                   "--heartbeat-interval=10",
                                   "--election-timeout=100"};
  if (!tls_.dir.empty()) {
    for (const char* arg :
         {"--cert-file=/localhost.crt", "--key-file=/localhost.key", "--trusted-ca-file=/ca.crt"}) {
      std::string a = arg;
      args.push_back(a.insert(a.find('=') + 1, tls_.dir));
    }
    args.push_back("--client-cert-auth");
    if (tls_.auth_token_ttl_s > 0)
      args.push_back("--auth-token-ttl=" + std::to_string(tls_.auth_token_ttl_s));
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  char path_env[] = "PATH=/usr/bin:/bin";
  char* envp[] = {path_env, nullptr};

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  const std::string log = dir_ + "/etcd.log";
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  const int rc = ::posix_spawn(&pid_, binary.c_str(), &actions, nullptr, argv.data(), envp);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    pid_ = -1;
    *error = "posix_spawn etcd: " + std::string(strerror(rc));
    return false;
  }

  // A channel that retries connecting every 20 ms (the default backoff starts at 1 s).
  grpc::ChannelArguments channel_args;
  channel_args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
  channel_args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20);
  channel_args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 100);
  auto kv = etcdserverpb::KV::NewStub(
      grpc::CreateCustomChannel(target(), Credentials(tls_.dir), channel_args));
  for (auto end = std::chrono::steady_clock::now() + 15s; std::chrono::steady_clock::now() < end;) {
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      *error = "etcd exited at start; see " + log;
      return false;
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 100ms);
    context.set_wait_for_ready(true);
    etcdserverpb::RangeRequest request;
    request.set_key("health");
    etcdserverpb::RangeResponse response;
    if (kv->Range(&context, request, &response).ok()) return true;
    std::this_thread::sleep_for(10ms);
  }
  *error = "etcd did not answer within 15 s; see " + log;
  Stop();
  return false;
}

void EtcdServer::WaitExit(std::chrono::milliseconds limit) {
  for (auto end = std::chrono::steady_clock::now() + limit; std::chrono::steady_clock::now() < end;
       std::this_thread::sleep_for(10ms)) {
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
  }
}

void EtcdServer::Stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  WaitExit(5s);
  if (pid_ > 0) Kill();
}

void EtcdServer::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

std::unique_ptr<etcdserverpb::KV::Stub> EtcdServer::KV() const {
  return etcdserverpb::KV::NewStub(Channel());
}

std::string EtcdServer::Dump(const std::string& prefix) const {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 2s);
  etcdserverpb::RangeRequest request;
  request.set_key(prefix);
  request.set_range_end(PrefixEnd(prefix));
  etcdserverpb::RangeResponse response;
  if (!KV()->Range(&context, request, &response).ok()) return {};
  std::map<std::string, std::string> lines;
  for (const auto& kv : response.kvs())
    lines[kv.key()] = kv.value() + (kv.lease() ? " leased" : " unleased");
  std::string out;
  for (const auto& [k, v] : lines) out += k + "=" + v + "\n";
  return out;
}

bool EtcdServer::RevokeLeaseOf(const std::string& key) const {
  etcdserverpb::RangeResponse range;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 2s);
    etcdserverpb::RangeRequest request;
    request.set_key(key);
    if (!KV()->Range(&context, request, &range).ok() || range.kvs_size() != 1) return false;
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 2s);
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(range.kvs(0).lease());
  etcdserverpb::LeaseRevokeResponse response;
  auto lease = etcdserverpb::Lease::NewStub(Channel());
  return lease->LeaseRevoke(&context, request, &response).ok();
}

int64_t EtcdServer::LeaseOf(const std::string& key) const {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 2s);
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  etcdserverpb::RangeResponse range;
  if (!KV()->Range(&context, request, &range).ok()) return -1;
  return range.kvs_size() == 1 ? range.kvs(0).lease() : 0;
}

int64_t EtcdServer::Grant(int64_t ttl_seconds) const {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 2s);
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(ttl_seconds);
  etcdserverpb::LeaseGrantResponse response;
  auto lease = etcdserverpb::Lease::NewStub(Channel());
  if (!lease->LeaseGrant(&context, request, &response).ok()) return 0;
  return response.id();
}

bool EtcdServer::KeepAlive(int64_t lease) const {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 2s);
  auto stub = etcdserverpb::Lease::NewStub(Channel());
  auto stream = stub->LeaseKeepAlive(&context);
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseKeepAliveResponse response;
  const bool ok = stream->Write(request) && stream->Read(&response);
  stream->WritesDone();
  return stream->Finish().ok() && ok && response.ttl() > 0;
}

bool EtcdServer::Put(const std::string& key, const std::string& value, int64_t lease) const {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 2s);
  etcdserverpb::PutRequest request;
  request.set_key(key);
  request.set_value(value);
  request.set_lease(lease);
  etcdserverpb::PutResponse response;
  return KV()->Put(&context, request, &response).ok();
}

}  // namespace ff::cp::testing

namespace ff::cp::testing {

std::shared_ptr<grpc::Channel> EtcdServer::Channel() const {
  return grpc::CreateChannel(target(), Credentials(tls_.dir));
}

int EtcdServer::Admin(const std::string& command) const {
  std::vector<std::string> env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "ETCDCTL_API=3",
                                  "ETCDCTL_ENDPOINTS=" + url()};
  if (!tls_.dir.empty()) {
    env.push_back("ETCDCTL_CACERT=" + tls_.dir + "/ca.crt");
    env.push_back("ETCDCTL_CERT=" + tls_.dir + "/root.crt");
    env.push_back("ETCDCTL_KEY=" + tls_.dir + "/root.key");
  }
  std::vector<std::string> args = {"timeout", "30", "/bin/sh", "-c", command};
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  const std::string log = dir_ + "/etcd.log";
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const int rc =
      ::posix_spawn(&pid, "/usr/bin/timeout", &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

}  // namespace ff::cp::testing
