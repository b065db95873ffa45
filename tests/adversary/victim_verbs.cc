#include "victim_verbs.h"

#include <fcntl.h>

#include "ud_qp.h"
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

bool UdToRts(ibv_qp* qp) { return fftest::UdQpToRts(qp, kVictimQkey) == 0; }

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
