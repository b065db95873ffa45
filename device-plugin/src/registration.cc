#include "registration.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include "deviceplugin.grpc.pb.h"

namespace ff::dp {

bool GrpcKubeletRegistrar::register_plugin(const v1beta1::RegisterRequest& request,
                                           std::string* error) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
  auto channel =
      grpc::CreateCustomChannel("unix:" + socket_, grpc::InsecureChannelCredentials(), args);
  auto stub = v1beta1::Registration::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout_);
  // Fail fast on a stale or not-yet-listening kubelet.sock: the daemon's loop
  // retries in 50 ms, while waiting here would hold up every other resource.
  ctx.set_wait_for_ready(false);
  v1beta1::Empty reply;
  grpc::Status status = stub->Register(&ctx, request, &reply);
  if (!status.ok()) {
    *error = fmt::format("kubelet at {} refused or did not answer: {} ({})", socket_,
                         status.error_message(), static_cast<int>(status.error_code()));
    return false;
  }
  return true;
}

}  // namespace ff::dp
