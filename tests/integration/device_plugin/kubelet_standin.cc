#include "kubelet_standin.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "scrape.h"

namespace ff::dp::testing {
namespace fs = std::filesystem;

class KubeletStandIn::Service final : public v1beta1::Registration::Service {
 public:
  explicit Service(KubeletStandIn* k) : k_(k) {}
  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* req,
                        v1beta1::Empty*) override {
    // Same checks as kubelet: supported version, extended resource name.
    if (req->version() != "v1beta1")
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "unsupported version " + req->version());
    if (req->resource_name().find('/') == std::string::npos)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "not an extended resource name");
    k_->on_register(*req);
    return grpc::Status::OK;
  }

 private:
  KubeletStandIn* k_;
};

KubeletStandIn::KubeletStandIn(std::string dir) : dir_(std::move(dir)) {}

KubeletStandIn::~KubeletStandIn() { stop(false); }

void KubeletStandIn::start() {
  const std::string path = dir_ + "/kubelet.sock";
  ::unlink(path.c_str());
  service_ = std::make_unique<Service>(this);
  grpc::ServerBuilder b;
  b.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
  b.RegisterService(service_.get());
  server_ = b.BuildAndStart();
  if (!server_) throw std::runtime_error("kubelet stand-in cannot serve " + path);
}

void KubeletStandIn::stop(bool delete_sockets) {
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    server_->Wait();
    server_.reset();
    service_.reset();
  }
  std::vector<Watch> watches;
  {
    std::lock_guard<std::mutex> lock(mu_);
    watches.swap(watches_);
  }
  for (auto& w : watches) w.ctx->TryCancel();
  for (auto& w : watches) w.thread.join();
  if (delete_sockets) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_, ec)) {
      if (e.is_socket()) fs::remove(e.path(), ec);
    }
  } else {
    ::unlink((dir_ + "/kubelet.sock").c_str());
  }
}

Clock::time_point KubeletStandIn::restart(std::chrono::milliseconds down_for) {
  stop(true);
  if (down_for.count() > 0) std::this_thread::sleep_for(down_for);
  auto t = Clock::now();
  start();
  return t;
}

void KubeletStandIn::on_register(const v1beta1::RegisterRequest& req) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  grpc::ClientContext* raw = ctx.get();
  std::lock_guard<std::mutex> lock(mu_);
  regs_.push_back({req, Clock::now()});
  watches_.push_back(
      {std::move(ctx), std::thread(&KubeletStandIn::watch_loop, this, req.resource_name(),
                                   dir_ + "/" + req.endpoint(), raw)});
  cv_.notify_all();
}

void KubeletStandIn::watch_loop(std::string resource, std::string endpoint,
                                grpc::ClientContext* ctx) {
  auto channel = grpc::CreateChannel("unix:" + endpoint, grpc::InsecureChannelCredentials());
  auto stub = v1beta1::DevicePlugin::NewStub(channel);
  ctx->set_wait_for_ready(true);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  auto reader = stub->ListAndWatch(ctx, v1beta1::Empty());
  v1beta1::ListAndWatchResponse resp;
  while (reader->Read(&resp)) {  // ends on cancel, deadline or plugin exit
    std::lock_guard<std::mutex> lock(mu_);
    lists_.push_back({resource, {resp, Clock::now()}});
    cv_.notify_all();
  }
  reader->Finish();
}

size_t KubeletStandIn::registrations(const std::string& resource) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& r : regs_) n += r.request.resource_name() == resource;
  return n;
}

std::optional<Registration> KubeletStandIn::wait_registration(
    const std::string& resource, size_t count, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  std::optional<Registration> found;
  cv_.wait_for(lock, timeout, [&] {
    size_t n = 0;
    for (const auto& r : regs_) {
      if (r.request.resource_name() == resource && ++n == count) {
        found = r;
        return true;
      }
    }
    return false;
  });
  return found;
}

std::optional<Registration> KubeletStandIn::wait_registration_since(
    const std::string& resource, Clock::time_point since, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  std::optional<Registration> found;
  cv_.wait_for(lock, timeout, [&] {
    for (const auto& r : regs_) {
      if (r.request.resource_name() == resource && r.at >= since) {
        found = r;
        return true;
      }
    }
    return false;
  });
  return found;
}

std::optional<ListUpdate> KubeletStandIn::wait_list(
    const std::string& resource,
    const std::function<bool(const v1beta1::ListAndWatchResponse&)>& pred,
    std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  std::optional<ListUpdate> found;
  cv_.wait_for(lock, timeout, [&] {
    for (auto it = lists_.rbegin(); it != lists_.rend(); ++it) {
      if (it->first != resource) continue;
      if (pred(it->second.list)) {
        found = it->second;
        return true;
      }
      return false;  // only the latest list of the resource counts
    }
    return false;
  });
  return found;
}

std::unique_ptr<v1beta1::DevicePlugin::Stub> KubeletStandIn::plugin(
    const std::string& resource) const {
  std::string endpoint;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = regs_.rbegin(); it != regs_.rend(); ++it)
      if (it->request.resource_name() == resource) {
        endpoint = it->request.endpoint();
        break;
      }
  }
  if (endpoint.empty()) return nullptr;
  return v1beta1::DevicePlugin::NewStub(
      grpc::CreateChannel("unix:" + dir_ + "/" + endpoint, grpc::InsecureChannelCredentials()));
}

DaemonProcess::DaemonProcess(const std::string& binary, const std::vector<std::string>& args,
                             const std::string& log_path) {
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    FILE* log = std::fopen(log_path.c_str(), "a");
    if (log) {
      ::dup2(fileno(log), 1);
      ::dup2(fileno(log), 2);
    }
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(binary.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
}

DaemonProcess::~DaemonProcess() {
  if (!status_) stop();
}

void DaemonProcess::signal(int sig) const {
  if (pid_ > 0) ::kill(pid_, sig);
}

std::optional<int> DaemonProcess::wait_exit(std::chrono::milliseconds timeout) {
  if (status_) return status_;
  auto deadline = Clock::now() + timeout;
  do {
    int st = 0;
    pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      return status_;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (Clock::now() < deadline);
  return std::nullopt;
}

bool DaemonProcess::alive() { return !wait_exit(std::chrono::milliseconds(0)).has_value(); }

int DaemonProcess::stop() {
  if (status_) return *status_;
  ::kill(pid_, SIGTERM);
  if (auto st = wait_exit(std::chrono::seconds(5))) return *st;
  ::kill(pid_, SIGKILL);
  return wait_exit(std::chrono::seconds(5)).value_or(-1);
}

long DaemonProcess::rss_kb() const {
  std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string make_temp_dir(const std::string& tag) {
  std::string tmpl = (fs::temp_directory_path() / ("ffdp-" + tag + "-XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return tmpl;
}

int free_loopback_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  ::close(fd);
  return ntohs(sa.sin_port);
}

std::string http_get(int port, const std::string& path) {
  return ff::test::HttpRequest(static_cast<uint16_t>(port), "GET", path).body;
}

}  // namespace ff::dp::testing
