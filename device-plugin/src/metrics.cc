#include "metrics.h"

#include "freeflow/metrics/exposition.h"

namespace ff::dp {

void Metrics::set_devices(const std::string& resource, int healthy, int unhealthy) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& r = resources_[resource];
  r.healthy = healthy;
  r.unhealthy = unhealthy;
}

void Metrics::count_allocation(const std::string& resource, bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  ok ? ++resources_[resource].alloc_ok : ++resources_[resource].alloc_err;
}

void Metrics::count_registration(const std::string& resource, bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  ok ? ++resources_[resource].reg_ok : ++resources_[resource].reg_err;
}

void Metrics::forget(const std::string& resource) {
  std::lock_guard<std::mutex> lock(mu_);
  resources_.erase(resource);
}

void Metrics::count_reload(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  ok ? ++reload_ok_ : ++reload_err_;
}

std::string Metrics::render() const {
  using metrics::Kind;
  std::lock_guard<std::mutex> lock(mu_);
  metrics::Exposition out;
  out.Family("freeflow_dp_devices", Kind::kGauge, "Devices advertised to kubelet, by health.");
  for (const auto& [name, r] : resources_) {
    out.Sample({{"resource", name}, {"health", "Healthy"}}, static_cast<uint64_t>(r.healthy));
    out.Sample({{"resource", name}, {"health", "Unhealthy"}}, static_cast<uint64_t>(r.unhealthy));
  }
  out.Family("freeflow_dp_allocations_total", Kind::kCounter,
             "Allocate calls per container request.");
  for (const auto& [name, r] : resources_) {
    out.Sample({{"resource", name}, {"result", "ok"}}, r.alloc_ok);
    out.Sample({{"resource", name}, {"result", "error"}}, r.alloc_err);
  }
  out.Family("freeflow_dp_registrations_total", Kind::kCounter, "Registrations with kubelet.");
  for (const auto& [name, r] : resources_) {
    out.Sample({{"resource", name}, {"result", "ok"}}, r.reg_ok);
    out.Sample({{"resource", name}, {"result", "error"}}, r.reg_err);
  }
  out.Family("freeflow_dp_config_reloads_total", Kind::kCounter, "SIGHUP reloads.");
  out.Sample({{"result", "ok"}}, reload_ok_);
  out.Sample({{"result", "error"}}, reload_err_);
  return out.Take();
}

}  // namespace ff::dp
