#include "implementations.h"

namespace ff::cp {

std::unique_ptr<ControlPlane> MakeEtcdControlPlane(std::vector<std::string>, const Endpoint&,
                                                   const Options&) {
  return nullptr;  // not implemented yet
}

}  // namespace ff::cp
