// Process-wide registry of live contexts and QPs, so that the event thread can find the
// QP a router notification names without touching any context's data-path lock.
#pragma once

#include <mutex>
#include <unordered_map>
#include <vector>

#include "internal.h"

namespace ffv {

class Registry {
 public:
  static Registry& Get();
  void AddContext(Context* c);
  void RemoveContext(Context* c);
  void AddQp(uint32_t qpn, Qp* qp);
  void RemoveQp(uint32_t qpn);
  void OnPeerGone(uint32_t qpn, bool died);
  void OnFatal();

 private:
  std::mutex mu_;
  std::vector<Context*> contexts_;
  std::unordered_map<uint32_t, Qp*> qps_;
};

}  // namespace ffv
