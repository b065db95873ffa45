// A kubelet stand-in for device-plugin integration tests and benchmarks: it
// serves v1beta1.Registration on <dir>/kubelet.sock with the real gRPC stack
// and, like kubelet, dials each registered plugin and keeps a ListAndWatch
// stream open. restart() mimics a kubelet restart: every socket in the folder
// is deleted, then kubelet.sock is created again.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "deviceplugin.grpc.pb.h"
#include "pluginregistration.grpc.pb.h"

namespace grpc {
class Server;
class ClientContext;
}  // namespace grpc

namespace ff::dp::testing {

using Clock = std::chrono::steady_clock;

struct Registration {
  v1beta1::RegisterRequest request;
  Clock::time_point at;
};

struct ListUpdate {
  v1beta1::ListAndWatchResponse list;
  Clock::time_point at;
};

class KubeletStandIn {
 public:
  explicit KubeletStandIn(std::string dir);
  ~KubeletStandIn();

  void start();
  // Stops serving; with delete_sockets, removes every socket in the folder.
  void stop(bool delete_sockets);
  // Returns the time kubelet.sock was re-created.
  Clock::time_point restart(std::chrono::milliseconds down_for = std::chrono::milliseconds(0));

  size_t registrations(const std::string& resource) const;
  // Waits for the count-th registration (1-based) of `resource`.
  std::optional<Registration> wait_registration(const std::string& resource, size_t count,
                                                std::chrono::milliseconds timeout) const;
  // Waits until the latest list of `resource` satisfies pred; returns it.
  std::optional<ListUpdate> wait_list(
      const std::string& resource,
      const std::function<bool(const v1beta1::ListAndWatchResponse&)>& pred,
      std::chrono::milliseconds timeout) const;
  // Waits for a registration of `resource` made at or after `since`.
  std::optional<Registration> wait_registration_since(const std::string& resource,
                                                      Clock::time_point since,
                                                      std::chrono::milliseconds timeout) const;
  // A stub on the endpoint `resource` registered with.
  std::unique_ptr<v1beta1::DevicePlugin::Stub> plugin(const std::string& resource) const;

 private:
  class Service;
  struct Watch {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::thread thread;
  };
  void on_register(const v1beta1::RegisterRequest& req);
  void watch_loop(std::string resource, std::string endpoint, grpc::ClientContext* ctx);

  const std::string dir_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<Registration> regs_;
  std::vector<std::pair<std::string, ListUpdate>> lists_;
  std::vector<Watch> watches_;
};

// The real daemon as a child process, stopped by its PID only.
class DaemonProcess {
 public:
  DaemonProcess(const std::string& binary, const std::vector<std::string>& args,
                const std::string& log_path);
  ~DaemonProcess();
  pid_t pid() const { return pid_; }
  void signal(int sig) const;
  // SIGTERM, then waits up to 5 s (SIGKILL after that). Returns the exit status.
  int stop();
  // Waits up to `timeout` for the process to exit by itself; nullopt if still running.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);
  bool alive();
  long rss_kb() const;

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

std::string read_text(const std::string& path);
std::string make_temp_dir(const std::string& tag);
// A TCP port on 127.0.0.1 that was free a moment ago.
int free_loopback_port();
// GET http://127.0.0.1:port/path, body only ("" on failure).
std::string http_get(int port, const std::string& path);

}  // namespace ff::dp::testing
