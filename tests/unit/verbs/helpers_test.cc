// The pure helpers of libibverbs (strings and rate conversions) answer exactly as the
// system's libibverbs does, for every value of their enums and beyond: programs print them,
// compare them and feed them back into verbs. The real library is loaded beside ours, its
// functions found in it by dlsym on its handle (these call nothing else, so nothing of ours
// can stand in; RTLD_DEEPBIND would say so, but the sanitizers refuse it).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <string>

namespace fftest {
namespace {

class RealLibibverbs {
 public:
  RealLibibverbs() : handle_(::dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL)) {}
  ~RealLibibverbs() {
    if (handle_ != nullptr) ::dlclose(handle_);
  }
  template <typename Fn>
  Fn Get(const char* name) const {
    return handle_ == nullptr ? nullptr : reinterpret_cast<Fn>(::dlsym(handle_, name));
  }
  bool loaded() const { return handle_ != nullptr; }

 private:
  void* handle_;
};

TEST(Helpers, StringsAndRatesAreLibibverbsOwn) {
  RealLibibverbs real;
  ASSERT_TRUE(real.loaded()) << ::dlerror();
  using StrFn = const char* (*)(int);
  // Every value each enum can hold (its enumerators' bit range), named or not.
  const struct {
    const char* name;
    const char* (*ours)(int);
    int low, high;
  } strings[] = {
      {"ibv_wc_status_str", [](int v) { return ibv_wc_status_str(static_cast<ibv_wc_status>(v)); },
       0, 31},
      {"ibv_port_state_str",
       [](int v) { return ibv_port_state_str(static_cast<ibv_port_state>(v)); }, 0, 7},
      {"ibv_event_type_str",
       [](int v) { return ibv_event_type_str(static_cast<ibv_event_type>(v)); }, 0, 31},
      {"ibv_node_type_str", [](int v) { return ibv_node_type_str(static_cast<ibv_node_type>(v)); },
       -8, 7},
  };
  for (const auto& s : strings) {
    auto theirs = real.Get<StrFn>(s.name);
    ASSERT_NE(theirs, nullptr) << s.name;
    for (int v = s.low; v <= s.high; ++v)
      EXPECT_EQ(std::string(s.ours(v)), std::string(theirs(v))) << s.name << "(" << v << ")";
  }
  using RateToInt = int (*)(ibv_rate);
  using IntToRate = ibv_rate (*)(int);
  auto to_mult = real.Get<RateToInt>("ibv_rate_to_mult");
  auto to_mbps = real.Get<RateToInt>("ibv_rate_to_mbps");
  auto from_mult = real.Get<IntToRate>("mult_to_ibv_rate");
  auto from_mbps = real.Get<IntToRate>("mbps_to_ibv_rate");
  ASSERT_TRUE(to_mult && to_mbps && from_mult && from_mbps);
  for (int r = 0; r < 32; ++r) {  // the values ibv_rate can hold
    const auto rate = static_cast<ibv_rate>(r);
    EXPECT_EQ(ibv_rate_to_mult(rate), to_mult(rate)) << "ibv_rate_to_mult(" << r << ")";
    EXPECT_EQ(ibv_rate_to_mbps(rate), to_mbps(rate)) << "ibv_rate_to_mbps(" << r << ")";
    // Every value either side knows, fed back the other way.
    for (const int mult : {ibv_rate_to_mult(rate), r, r * 2})
      EXPECT_EQ(mult_to_ibv_rate(mult), from_mult(mult)) << "mult_to_ibv_rate(" << mult << ")";
    for (const int mbps : {ibv_rate_to_mbps(rate), r * 1000})
      EXPECT_EQ(mbps_to_ibv_rate(mbps), from_mbps(mbps)) << "mbps_to_ibv_rate(" << mbps << ")";
  }
}

}  // namespace
}  // namespace fftest
