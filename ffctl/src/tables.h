// ffctl's human tables: one per command, from the router's JSON answer (the same document
// `-o json` prints).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace ff::ctl {

// The table for `command`'s `answer`; throws nlohmann::json::exception on a document that
// is not the command's.
std::string Table(const std::string& command, const nlohmann::json& answer);

}  // namespace ff::ctl
