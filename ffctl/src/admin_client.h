// ffctl's side of the router's admin socket (router/src/admin_service.h): connects to the
// abstract socket of the router of host folder DIR and name NAME, makes sure root listens
// there (a process that took the name first is not believed), sends one request line and
// reads the JSON answer. Bounded: kTimeoutMs for each step, kMaxAnswer bytes.
#pragma once

#include <cstddef>
#include <string>

namespace ff::ctl {

inline constexpr int kTimeoutMs = 10'000;
inline constexpr size_t kMaxAnswer = 256u << 20;

// The router's answer to `request` (without the newline), or "" and *error.
std::string Ask(const std::string& dir, const std::string& name, const std::string& request,
                std::string* error);

}  // namespace ff::ctl
