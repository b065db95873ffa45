// kubelet's part in the end-to-end run (tests/e2e/run.sh), where there is no kubelet: serves
// v1beta1.Registration on <dir>/kubelet.sock, waits for the device plugin to register the
// resource and list a healthy device, and asks it to Allocate one device for one container,
// as kubelet does when a pod that asks for the resource is admitted. Prints the
// AllocateResponse's container response as JSON (protobuf's JSON names: envs, mounts,
// devices, annotations, cdiDevices) and the milliseconds from start to registration.
//
//   ff-kubelet-allocate DIR RESOURCE TIMEOUT_MS
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kubelet_standin.h"

namespace {

using ff::dp::testing::Clock;
using ff::dp::testing::KubeletStandIn;

int Fail(const std::string& why) {
  std::fprintf(stderr, "ff-kubelet-allocate: %s\n", why.c_str());
  return 1;
}

// The first healthy device of the latest list, or "".
std::string HealthyDevice(const v1beta1::ListAndWatchResponse& list) {
  for (const auto& d : list.devices())
    if (d.health() == "Healthy") return d.id();
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) return Fail("usage: ff-kubelet-allocate DIR RESOURCE TIMEOUT_MS");
  const std::string dir = argv[1];
  const std::string resource = argv[2];
  const auto timeout = std::chrono::milliseconds(std::atol(argv[3]));
  const auto start = Clock::now();
  KubeletStandIn kubelet(dir);
  kubelet.start();
  if (!kubelet.wait_registration(resource, 1, timeout))
    return Fail("no registration of " + resource);
  const auto registered = Clock::now();
  auto list = kubelet.wait_list(
      resource, [](const v1beta1::ListAndWatchResponse& l) { return !HealthyDevice(l).empty(); },
      timeout);
  if (!list) return Fail("no healthy device of " + resource);
  v1beta1::AllocateRequest req;
  req.add_container_requests()->add_devices_ids(HealthyDevice(list->list));
  v1beta1::AllocateResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  const grpc::Status st = kubelet.plugin(resource)->Allocate(&ctx, req, &resp);
  if (!st.ok()) return Fail("Allocate: " + st.error_message());
  if (resp.container_responses_size() != 1) return Fail("Allocate answered no container");
  std::string json;
  google::protobuf::util::JsonPrintOptions opts;
  if (!google::protobuf::util::MessageToJsonString(resp.container_responses(0), &json, opts).ok())
    return Fail("cannot print the answer as JSON");
  std::printf("%s\n", json.c_str());
  std::fprintf(
      stderr, "ff-kubelet-allocate: registered after %lld ms, device %s\n",
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(registered - start).count()),
      HealthyDevice(list->list).c_str());
  kubelet.stop(false);
  return 0;
}
