// Registration with kubelet. KubeletRegistrar is the seam: the daemon only
// sees register_plugin(); GrpcKubeletRegistrar dials kubelet.sock afresh for
// every attempt (a restarted kubelet is a new server) and fails fast when
// nobody listens, so the caller's retry loop stays in charge of timing.
#pragma once

#include <chrono>
#include <string>

#include "deviceplugin.pb.h"

namespace ff::dp {

class KubeletRegistrar {
 public:
  virtual ~KubeletRegistrar() = default;
  // Thread-compatible; returns false with a human-readable *error.
  virtual bool register_plugin(const v1beta1::RegisterRequest& request, std::string* error) = 0;
};

class GrpcKubeletRegistrar final : public KubeletRegistrar {
 public:
  GrpcKubeletRegistrar(std::string kubelet_socket, std::chrono::milliseconds timeout)
      : socket_(std::move(kubelet_socket)), timeout_(timeout) {}
  bool register_plugin(const v1beta1::RegisterRequest& request, std::string* error) override;

 private:
  std::string socket_;
  std::chrono::milliseconds timeout_;
};

}  // namespace ff::dp
