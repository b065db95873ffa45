// The rest of the libibverbs surface: string and rate helpers, the kernel-ABI marshalling
// helpers librdmacm uses (fork support: fork.cc), and clear
// refusals (EOPNOTSUPP) for what a virtual device cannot offer. Everything libibverbs
// exports is defined here or elsewhere in this library, so no call ever reaches the
// system's libibverbs with one of our objects.
#include <fcntl.h>
#include <infiniband/sa.h>
#include <limits.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/exports.h"

using namespace ff::verbs;

namespace {

const char* Lookup(const char* const* table, size_t n, size_t i) {
  return i < n && table[i] != nullptr ? table[i] : "unknown";
}

// An enum argument's value as the caller passed it, whatever it is: C programs pass values
// no enumerator has, and reading one through the enum type would be undefined in C++.
template <typename Enum>
int RawValue(const Enum& e) {
  static_assert(sizeof(Enum) == sizeof(int));
  int v;
  std::memcpy(&v, &e, sizeof(v));
  return v;
}

size_t Index(int v) { return v < 0 ? SIZE_MAX : static_cast<size_t>(v); }

// libibverbs' tables: the rates of the FDR/EDR family (14, 56, 112, 168, 25, 100, 200 and 300
// Gb/s) have no multiple of 2.5 Gb/s there (-1), the others do.
struct RateRow {
  ibv_rate rate;
  int mult;
  int mbps;
};
constexpr RateRow kRates[] = {
    {IBV_RATE_2_5_GBPS, 1, 2500},       {IBV_RATE_5_GBPS, 2, 5000},
    {IBV_RATE_10_GBPS, 4, 10000},       {IBV_RATE_20_GBPS, 8, 20000},
    {IBV_RATE_30_GBPS, 12, 30000},      {IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},      {IBV_RATE_80_GBPS, 32, 80000},
    {IBV_RATE_120_GBPS, 48, 120000},    {IBV_RATE_14_GBPS, -1, 14062},
    {IBV_RATE_56_GBPS, -1, 56250},      {IBV_RATE_112_GBPS, -1, 112500},
    {IBV_RATE_168_GBPS, -1, 168750},    {IBV_RATE_25_GBPS, -1, 25781},
    {IBV_RATE_100_GBPS, -1, 103125},    {IBV_RATE_200_GBPS, -1, 206250},
    {IBV_RATE_300_GBPS, -1, 309375},    {IBV_RATE_28_GBPS, 11, 28125},
    {IBV_RATE_50_GBPS, 20, 53125},      {IBV_RATE_400_GBPS, 160, 425000},
    {IBV_RATE_600_GBPS, 240, 637500},   {IBV_RATE_800_GBPS, 320, 850000},
    {IBV_RATE_1200_GBPS, 480, 1275000},
};

// The `to` field of the row whose `from` field is `v`; `none` when no row has it.
template <typename From, typename To>
To ConvertRate(From RateRow::*from, From v, To RateRow::*to, To none) {
  for (const RateRow& r : kRates)
    if (r.*from == v) return r.*to;
  return none;
}

// The `to` field of `rate`'s row, read from the caller's bits (RawValue): -1 when no row has
// it, as libibverbs answers for an unknown rate.
int FromRate(ibv_rate rate, int RateRow::*to) {
  const int v = RawValue(rate);
  for (const RateRow& r : kRates)
    if (static_cast<int>(r.rate) == v) return r.*to;
  return -1;
}

// The kernel's address vector (ib_uverbs_ah_attr) as libibverbs has it; the kernel's
// reserved bytes have no counterpart.
void CopyAhAttr(ibv_ah_attr* dst, const ib_uverbs_ah_attr& src) {
  std::memcpy(dst->grh.dgid.raw, src.grh.dgid, sizeof(dst->grh.dgid.raw));
  dst->grh.flow_label = src.grh.flow_label;
  dst->grh.sgid_index = src.grh.sgid_index;
  dst->grh.hop_limit = src.grh.hop_limit;
  dst->grh.traffic_class = src.grh.traffic_class;
  dst->dlid = src.dlid;
  dst->sl = src.sl;
  dst->src_path_bits = src.src_path_bits;
  dst->static_rate = src.static_rate;
  dst->is_global = src.is_global;
  dst->port_num = src.port_num;
}

// Every attribute the kernel reports, except qp_state: the caller set it to the state it
// asked about (rdma_init_qp_attr), and libibverbs leaves it alone too. rate_limit has no
// kernel field.
void CopyQpAttr(ibv_qp_attr* dst, const ib_uverbs_qp_attr& src) {
  dst->cur_qp_state = static_cast<ibv_qp_state>(src.cur_qp_state);
  dst->path_mtu = static_cast<ibv_mtu>(src.path_mtu);
  dst->path_mig_state = static_cast<ibv_mig_state>(src.path_mig_state);
  dst->qkey = src.qkey;
  dst->rq_psn = src.rq_psn;
  dst->sq_psn = src.sq_psn;
  dst->dest_qp_num = src.dest_qp_num;
  dst->qp_access_flags = src.qp_access_flags;
  dst->cap.max_send_wr = src.max_send_wr;
  dst->cap.max_recv_wr = src.max_recv_wr;
  dst->cap.max_send_sge = src.max_send_sge;
  dst->cap.max_recv_sge = src.max_recv_sge;
  dst->cap.max_inline_data = src.max_inline_data;
  CopyAhAttr(&dst->ah_attr, src.ah_attr);
  CopyAhAttr(&dst->alt_ah_attr, src.alt_ah_attr);
  dst->pkey_index = src.pkey_index;
  dst->alt_pkey_index = src.alt_pkey_index;
  dst->en_sqd_async_notify = src.en_sqd_async_notify;
  dst->sq_draining = src.sq_draining;
  dst->max_rd_atomic = src.max_rd_atomic;
  dst->max_dest_rd_atomic = src.max_dest_rd_atomic;
  dst->min_rnr_timer = src.min_rnr_timer;
  dst->port_num = src.port_num;
  dst->timeout = src.timeout;
  dst->retry_cnt = src.retry_cnt;
  dst->rnr_retry = src.rnr_retry;
  dst->alt_port_num = src.alt_port_num;
  dst->alt_timeout = src.alt_timeout;
}

// A path record both ways (ib_user_path_rec <-> ibv_sa_path_rec): the same fields, already
// in network order where the wire has them so (LIDs, flow label, P_Key).
template <typename Dst, typename Src>
void CopyPathRec(Dst* dst, const Src& src) {
  std::memcpy(&dst->dgid, &src.dgid, 16);
  std::memcpy(&dst->sgid, &src.sgid, 16);
  dst->dlid = src.dlid;
  dst->slid = src.slid;
  dst->raw_traffic = src.raw_traffic;
  dst->flow_label = src.flow_label;
  dst->hop_limit = src.hop_limit;
  dst->traffic_class = src.traffic_class;
  dst->reversible = src.reversible;
  dst->numb_path = src.numb_path;
  dst->pkey = src.pkey;
  dst->sl = src.sl;
  dst->mtu_selector = src.mtu_selector;
  dst->mtu = src.mtu;
  dst->rate_selector = src.rate_selector;
  dst->rate = src.rate;
  dst->packet_life_time_selector = src.packet_life_time_selector;
  dst->packet_life_time = src.packet_life_time;
  dst->preference = src.preference;
}
static_assert(sizeof(ibv_gid) == 16 && sizeof(ib_user_path_rec::dgid) == 16);

}  // namespace

extern "C" {

// The name tables stay packed, in the order of their enums.
// clang-format off
FFV_EXPORT const char* ibv_wc_status_str(ibv_wc_status status) {
  static const char* const kNames[] = {
      "success", "local length error", "local QP operation error", "local EE context operation error",
      "local protection error", "Work Request Flushed Error", "memory management operation error",
      "bad response error", "local access error", "remote invalid request error",
      "remote access error", "remote operation error", "transport retry counter exceeded",
      "RNR retry counter exceeded", "local RDD violation error",
      "remote invalid RD request", "aborted error", "invalid EE context number",
      "invalid EE context state", "fatal error", "response timeout error", "general error",
      "TM error", "TM software rendezvous"};
  return Lookup(kNames, sizeof(kNames) / sizeof(kNames[0]), Index(RawValue(status)));
}

FFV_EXPORT const char* ibv_node_type_str(ibv_node_type type) {
  static const char* const kNames[] = {"InfiniBand channel adapter", "InfiniBand switch",
                                       "InfiniBand router", "iWARP NIC", "usNIC", "usNIC UDP",
                                       "unspecified"};
  const int i = RawValue(type) - 1;
  return i >= 0 ? Lookup(kNames, sizeof(kNames) / sizeof(kNames[0]), static_cast<size_t>(i))
                : "unknown";
}

FFV_EXPORT const char* ibv_port_state_str(ibv_port_state state) {
  static const char* const kNames[] = {"no state change (NOP)", "down", "init", "armed",
                                       "active", "active defer"};
  return Lookup(kNames, sizeof(kNames) / sizeof(kNames[0]), Index(RawValue(state)));
}

FFV_EXPORT const char* ibv_event_type_str(ibv_event_type event) {
  static const char* const kNames[] = {
      "CQ error", "local work queue catastrophic error", "invalid request local work queue error",
      "local access violation work queue error", "communication established",
      "send queue drained", "path migrated", "path migration request error",
      "local catastrophic error", "port active", "port error", "LID change", "P_Key change",
      "SM change", "SRQ catastrophic error", "SRQ limit reached", "last WQE reached",
      "client reregistration", "GID table change", "WQ fatal"};
  return Lookup(kNames, sizeof(kNames) / sizeof(kNames[0]), Index(RawValue(event)));
}
// clang-format on

// Unknown rates are -1 one way and IBV_RATE_MAX (0) the other, as in libibverbs.
FFV_EXPORT int ibv_rate_to_mult(ibv_rate rate) { return FromRate(rate, &RateRow::mult); }
FFV_EXPORT ibv_rate mult_to_ibv_rate(int mult) {
  if (mult <= 0) return IBV_RATE_MAX;  // never a row's "no multiple" (-1)
  return ConvertRate(&RateRow::mult, mult, &RateRow::rate, IBV_RATE_MAX);
}
FFV_EXPORT int ibv_rate_to_mbps(ibv_rate rate) { return FromRate(rate, &RateRow::mbps); }
FFV_EXPORT ibv_rate mbps_to_ibv_rate(int mbps) {
  return ConvertRate(&RateRow::mbps, mbps, &RateRow::rate, IBV_RATE_MAX);
}

FFV_EXPORT int ibv_attach_mcast(ibv_qp*, const ibv_gid*, uint16_t) { return EOPNOTSUPP; }
FFV_EXPORT int ibv_detach_mcast(ibv_qp*, const ibv_gid*, uint16_t) { return EOPNOTSUPP; }

FFV_EXPORT int ibv_query_qp_data_in_order(ibv_qp*, ibv_wr_opcode, uint32_t) {
  return 1;  // the same-node path places every message in order
}
FFV_EXPORT int ibv_query_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }
FFV_EXPORT int ibv_set_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }

FFV_EXPORT ibv_context* ibv_import_device(int) {
  errno = EOPNOTSUPP;
  return nullptr;
}
FFV_EXPORT ibv_pd* ibv_import_pd(ibv_context*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
FFV_EXPORT void ibv_unimport_pd(ibv_pd*) {}
FFV_EXPORT ibv_mr* ibv_import_mr(ibv_pd*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
FFV_EXPORT void ibv_unimport_mr(ibv_mr*) {}
FFV_EXPORT ibv_dm* ibv_import_dm(ibv_context*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
FFV_EXPORT void ibv_unimport_dm(ibv_dm*) {}

FFV_EXPORT int ibv_resolve_eth_l2_from_gid(ibv_context*, ibv_ah_attr*, uint8_t[6], uint16_t*) {
  return EOPNOTSUPP;
}

// Sysfs: the device's own files are served by the library (views/sysfs_view.h), so these
// read them as rdma-core does: one read, a trailing newline dropped and the text terminated;
// a text that fills the buffer without a newline cannot be terminated and fails.
FFV_EXPORT const char* ibv_get_sysfs_path(void) { return "/sys"; }
FFV_EXPORT int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size) {
  if (dir == nullptr || file == nullptr || buf == nullptr || size == 0) {
    errno = EINVAL;
    return -1;
  }
  char path[PATH_MAX];
  if (std::snprintf(path, sizeof(path), "%s/%s", dir, file) >= static_cast<int>(sizeof(path))) {
    errno = ENAMETOOLONG;
    return -1;
  }
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  const ssize_t n = ::read(fd, buf, size);
  const int e = errno;
  ::close(fd);
  if (n < 0) {
    errno = e;
    return -1;
  }
  size_t len = static_cast<size_t>(n);
  if (len > 0 && buf[len - 1] == '\n') {
    buf[--len] = '\0';
  } else if (len < size) {
    buf[len] = '\0';
  } else {
    errno = EOVERFLOW;
    return -1;
  }
  return static_cast<int>(len);
}
// Its verbs_sysfs_dev argument is rdma-core's private provider structure, which this
// library has none of: no provider can call it with one.
FFV_EXPORT int ibv_read_ibdev_sysfs_file(char*, size_t, void*, const char*, ...) {
  errno = ENOENT;
  return -1;
}

// Kernel-ABI marshalling helpers. librdmacm converts the rdma_cm device's answers with
// them (INIT_QP_ATTR, QUERY_ROUTE, UD event parameters), which the router writes in the
// kernel's layouts (cm_device.h).
FFV_EXPORT void ibv_copy_ah_attr_from_kern(void* dst, const void* src) {
  CopyAhAttr(static_cast<ibv_ah_attr*>(dst), *static_cast<const ib_uverbs_ah_attr*>(src));
}
FFV_EXPORT void ibv_copy_qp_attr_from_kern(void* dst, const void* src) {
  CopyQpAttr(static_cast<ibv_qp_attr*>(dst), *static_cast<const ib_uverbs_qp_attr*>(src));
}
FFV_EXPORT void ibv_copy_path_rec_from_kern(void* dst, const void* src) {
  CopyPathRec(static_cast<ibv_sa_path_rec*>(dst), *static_cast<const ib_user_path_rec*>(src));
}
FFV_EXPORT void ibv_copy_path_rec_to_kern(void* dst, const void* src) {
  CopyPathRec(static_cast<ib_user_path_rec*>(dst), *static_cast<const ibv_sa_path_rec*>(src));
}

// Provider registration (called by provider libraries, which never load here).
FFV_EXPORT void ibv_register_driver(const char*, void*) {}
FFV_EXPORT void verbs_register_driver_34(void*) {}
FFV_EXPORT void verbs_set_ops(void*, const void*) {}
FFV_EXPORT void verbs_uninit_context(void*) {}
FFV_EXPORT void verbs_init_cq(void*, void*, void*, void*) {}
FFV_EXPORT void* verbs_open_device(void*, void*) {
  errno = EOPNOTSUPP;
  return nullptr;
}
FFV_EXPORT void* _verbs_init_and_alloc_context(void*, int, size_t, void*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
FFV_EXPORT void __verbs_log(void*, const char*, ...) {}
FFV_EXPORT int execute_ioctl(void*, void*) { return EOPNOTSUPP; }
FFV_EXPORT unsigned int __ioctl_final_num_attrs(unsigned int num, void*) { return num; }

}  // extern "C"
