// gRPC unary calls between two pods (bench/tcp_mode.sh, tests/integration/tcp_mode; issue
// 39): the shape of an RPC service whose workers sleep between requests.
//   grpc_rr server IP:PORT
//     serves ffbench.Echo (echo.proto) until SIGTERM or SIGINT, then ends with status 0.
//   grpc_rr client IP:PORT CLIENTS SIZE SECONDS
//     CLIENTS threads, each on a channel (a connection) of its own, make blocking unary
//     calls of SIZE bytes for SECONDS; every answer must carry the bytes sent. Prints
//       grpc_rr: CLIENTS clients SIZE B: R requests/s, p50 P us, p99 Q us, max M us,
//       N requests
//     and exits 0; 1 and a reason on any failed call or wrong answer.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "echo.grpc.pb.h"

namespace {

constexpr int kMaxClients = 256;
constexpr long kMaxSize = 4 << 20;   // gRPC's default receive limit is 4 MiB
constexpr int kCallDeadlineS = 10;   // a call that takes longer fails the run
constexpr int kReadyDeadlineS = 10;  // for the server to listen

uint64_t NowNs() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000ull + t.tv_nsec;
}

class EchoService final : public ffbench::Echo::Service {
  grpc::Status Call(grpc::ServerContext*, const ffbench::Payload* in,
                    ffbench::Payload* out) override {
    out->set_data(in->data());
    return grpc::Status::OK;
  }
};

int Serve(const std::string& addr) {
  // SIGTERM and SIGINT are taken by a thread that shuts the server down.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  EchoService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(addr, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    std::fprintf(stderr, "grpc_rr: cannot listen on %s\n", addr.c_str());
    return 1;
  }
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&set, &sig);
    server->Shutdown();
  });
  server->Wait();
  stopper.join();
  return 0;
}

struct ClientResult {
  std::string error;
  std::vector<uint32_t> lat_ns;
  uint64_t count = 0;
};

// One client: its own channel (a local subchannel pool: no connection shared with the
// others), calls until `end_ns`.
void RunClient(const std::string& addr, int id, size_t size, uint64_t end_ns, ClientResult* r) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("ffbench.client", id);
  auto channel = grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 std::chrono::seconds(kReadyDeadlineS))) {
    r->error = "client " + std::to_string(id) + ": no connection to " + addr;
    return;
  }
  auto stub = ffbench::Echo::NewStub(channel);
  ffbench::Payload req, resp;
  std::string data(size, '\0');
  uint32_t x = 2654435761u * static_cast<uint32_t>(id + 1);
  while (NowNs() < end_ns) {
    for (auto& c : data) {
      x = x * 1664525u + 1013904223u;
      c = static_cast<char>(x >> 24);
    }
    req.set_data(data);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(kCallDeadlineS));
    const uint64_t t0 = NowNs();
    const grpc::Status st = stub->Call(&ctx, req, &resp);
    const uint64_t dt = NowNs() - t0;
    if (!st.ok()) {
      r->error = "client " + std::to_string(id) + ": call " + std::to_string(r->count + 1) +
                 " failed: " + st.error_message();
      return;
    }
    if (resp.data() != data) {
      r->error = "client " + std::to_string(id) + ": call " + std::to_string(r->count + 1) +
                 " answered other bytes than it sent";
      return;
    }
    if (r->lat_ns.size() < (1u << 20)) r->lat_ns.push_back(static_cast<uint32_t>(dt));
    ++r->count;
  }
}

int Clients(const std::string& addr, int clients, size_t size, int seconds) {
  const uint64_t end = NowNs() + static_cast<uint64_t>(seconds) * 1'000'000'000ull;
  std::vector<ClientResult> results(clients);
  std::vector<std::thread> threads;
  const uint64_t t0 = NowNs();
  for (int i = 0; i < clients; ++i)
    threads.emplace_back(RunClient, addr, i, size, end, &results[i]);
  for (auto& t : threads) t.join();
  const double elapsed = (NowNs() - t0) / 1e9;
  uint64_t total = 0;
  std::vector<uint32_t> lat;
  for (const ClientResult& r : results) {
    if (!r.error.empty()) {
      std::fprintf(stderr, "grpc_rr: %s\n", r.error.c_str());
      return 1;
    }
    if (r.count == 0) {
      std::fprintf(stderr, "grpc_rr: a client made no call\n");
      return 1;
    }
    total += r.count;
    lat.insert(lat.end(), r.lat_ns.begin(), r.lat_ns.end());
  }
  std::sort(lat.begin(), lat.end());
  std::printf(
      "grpc_rr: %d clients %zu B: %.0f requests/s, p50 %.1f us, p99 %.1f us, max %.1f us, "
      "%llu requests\n",
      clients, size, total / elapsed, lat[lat.size() / 2] / 1e3, lat[lat.size() * 99 / 100] / 1e3,
      lat.back() / 1e3, static_cast<unsigned long long>(total));
  return 0;
}

int Usage() {
  std::fprintf(stderr,
               "usage: grpc_rr server IP:PORT\n"
               "       grpc_rr client IP:PORT CLIENTS SIZE SECONDS\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "server") return Serve(argv[2]);
  if (argc != 6 || std::string(argv[1]) != "client") return Usage();
  const int clients = std::atoi(argv[3]);
  const long size = std::atol(argv[4]);
  const int seconds = std::atoi(argv[5]);
  if (clients < 1 || clients > kMaxClients || size < 0 || size > kMaxSize || seconds < 1 ||
      seconds > 3600)
    return Usage();
  return Clients(argv[2], clients, static_cast<size_t>(size), seconds);
}
