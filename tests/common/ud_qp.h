// A UD QP's walk from RESET to RTS, as every test program that sends or receives datagrams
// makes it (the victim programs of the adversary suite, the cluster tests). Header only:
// it needs libibverbs' entry points and nothing of ours.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace fftest {

// INIT on port 1 with `qkey`, then RTR and RTS: 0, or the first failing ibv_modify_qp's
// result.
inline int UdQpToRts(ibv_qp* qp, uint32_t qkey) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = qkey;
  if (const int rc =
          ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
    return rc;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  if (const int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE)) return rc;
  a.qp_state = IBV_QPS_RTS;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
}

}  // namespace fftest
