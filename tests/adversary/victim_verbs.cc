#include "victim_verbs.h"

#include <fcntl.h>

#include "victim.h"

namespace ff::adversary {

ibv_qp* NewQp(ibv_pd* pd, ibv_cq* cq, ibv_qp_type type, ibv_srq* srq) {
  ibv_qp_init_attr init{};
  init.send_cq = cq;
  init.recv_cq = cq;
  init.srq = srq;
  init.qp_type = type;
  init.sq_sig_all = 1;
  init.cap.max_send_wr = 16;
  init.cap.max_recv_wr = srq != nullptr ? 0 : 16;
  init.cap.max_send_sge = init.cap.max_recv_sge = 1;
  return ibv_create_qp(pd, &init);
}

bool UdToRts(ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = kVictimQkey;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) != 0)
    return false;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE) != 0) return false;
  a.qp_state = IBV_QPS_RTS;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0;
}

std::string FatalEvents(ibv_context* ctx) {
  const int flags = ::fcntl(ctx->async_fd, F_GETFL);
  if (flags < 0 || ::fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) != 0)
    return "cannot read its asynchronous events";
  std::string fatal;
  ibv_async_event e{};
  for (int i = 0; i < 1000 && ibv_get_async_event(ctx, &e) == 0; ++i) {
    if (e.event_type == IBV_EVENT_DEVICE_FATAL) fatal = "IBV_EVENT_DEVICE_FATAL";
    ibv_ack_async_event(&e);
  }
  return fatal;
}

}  // namespace ff::adversary
