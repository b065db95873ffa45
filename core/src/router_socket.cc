#include "freeflow/router_socket.h"

#include <cstdlib>

namespace ff {
namespace {

std::string EnvOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

}  // namespace

std::string RouterSocketPath(const std::string& dir, const std::string& name) {
  return dir + "/" + name + ".sock";
}

std::string AdminSocketName(const std::string& dir, const std::string& name) {
  return "freeflow-admin:" + dir + "/" + name;
}

std::string RouterSocketPathFromEnv() {
  return RouterSocketPath(EnvOr("FREEFLOW_DIR", kDefaultFreeflowDir),
                          EnvOr("FFR_NAME", kDefaultRouterName));
}

}  // namespace ff
