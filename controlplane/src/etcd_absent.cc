// MakeEtcdControlPlane for builds without gRPC (FREEFLOW_ETCD=OFF, e.g. the fuzz build): an
// etcd spec is then refused with "this build has no etcd support".
#include "implementations.h"

namespace ff::cp {

std::unique_ptr<ControlPlane> MakeEtcdControlPlane(EtcdConnection, const Endpoint&,
                                                   const Options&) {
  return nullptr;
}

}  // namespace ff::cp
