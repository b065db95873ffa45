#include "freeflow/cm_qp_attr.h"

#include <infiniband/verbs.h>
#include <rdma/rdma_user_cm.h>

#include <cerrno>
#include <cstring>

#include "freeflow/ipv4.h"

namespace ff {

const QpKind* CmIdKind(uint16_t ps, uint8_t qp_type) {
  switch (ps) {
    case RDMA_PS_TCP:
      return &kRcQp;
    case RDMA_PS_UDP:
    case RDMA_PS_IPOIB:
      return &kUdQp;
    case RDMA_PS_IB:
      return QpKindOf(qp_type);
    default:
      return nullptr;
  }
}

void CmFillAh(uint32_t remote_ip, uint8_t tos, ib_uverbs_ah_attr* ah) {
  std::memset(ah, 0, sizeof(*ah));
  Ipv4MappedGid(remote_ip, ah->grh.dgid);
  ah->grh.sgid_index = kCmMappedGidIndex;
  ah->grh.hop_limit = kCmHopLimit;
  ah->grh.traffic_class = tos;
  ah->is_global = 1;
  ah->port_num = kCmPort;
}

void CmFillRoutedPath(uint8_t tos, rdma_ucm_query_route_resp* r) {
  r->num_paths = 1;
  ib_user_path_rec& p = r->ib_route[0];
  p.reversible = 1;
  p.mtu = IBV_MTU_4096;
  p.hop_limit = kCmHopLimit;
  p.traffic_class = tos;
  p.numb_path = 1;
  p.mtu_selector = 2;  // exactly
  p.rate_selector = 2;
  p.rate = 7;  // IB_RATE_40_GBPS: a number; the virtual device has no line rate
  p.packet_life_time_selector = 2;
  p.packet_life_time = 14;
}

int CmInitQpAttr(const proto::CmQpInputs& in, uint32_t qp_state, ib_uverbs_qp_attr* out) {
  std::memset(out, 0, sizeof(*out));
  out->qp_state = qp_state;
  const bool ud = in.qp_type == IBV_QPT_UD;
  switch (qp_state) {
    case IBV_QPS_INIT:
      out->qp_attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
      out->port_num = kCmPort;
      if (ud) {
        out->qkey = in.qkey;
        out->qp_attr_mask |= IBV_QP_QKEY;
      } else {
        // Before the connection the QP takes no remote access; the CM's INIT grants what
        // the connection negotiated.
        if (in.connected) {
          out->qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
          if (in.responder_resources > 0)
            out->qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
        }
        out->qp_attr_mask |= IBV_QP_ACCESS_FLAGS;
      }
      return 0;
    case IBV_QPS_RTR:
      out->qp_attr_mask = IBV_QP_STATE;
      if (ud) return 0;
      if (!in.connected) return EINVAL;
      out->qp_attr_mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      CmFillAh(in.remote_ip, in.tos, &out->ah_attr);
      out->path_mtu = IBV_MTU_4096;
      out->dest_qp_num = in.remote_qpn;
      out->rq_psn = in.remote_psn;
      out->max_dest_rd_atomic = in.responder_resources;
      out->min_rnr_timer = 12;
      return 0;
    case IBV_QPS_RTS:
      out->qp_attr_mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
      out->sq_psn = in.psn;
      if (ud) return 0;
      if (!in.connected) return EINVAL;
      out->qp_attr_mask |=
          IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
      out->timeout = 14;
      out->retry_cnt = in.retry_count;
      out->rnr_retry = in.rnr_retry_count;
      out->max_rd_atomic = in.initiator_depth;
      return 0;
    default:
      return EINVAL;
  }
}

}  // namespace ff
