// What the suite's two victim programs (victim.cc, srq_victim.cc) do alike with the real
// library: they link libibverbs only (they run under LD_PRELOAD=libffverbs.so), not the raw
// pod client the attacks use.
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace ff::adversary {

// A QP of `type` on `cq` (send and receive), every send signaled; on `srq` when given.
ibv_qp* NewQp(ibv_pd* pd, ibv_cq* cq, ibv_qp_type type, ibv_srq* srq = nullptr);
// A UD QP from RESET to RTS on port 1 with the victims' Q_Key (victim.h).
bool UdToRts(ibv_qp* qp);
// The fatal asynchronous events the device reported (without waiting): what the library
// reports when it lost its router and failed every QP of the process. "" when none.
std::string FatalEvents(ibv_context* ctx);

}  // namespace ff::adversary
