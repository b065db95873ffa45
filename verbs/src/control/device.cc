// The virtual device: discovery, opening and closing contexts, every query verb, and
// asynchronous events.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/exports.h"
#include "datapath/completion.h"
#include "datapath/recv_path.h"
#include "datapath/send_queue.h"
#include "direct/direct.h"
#include "freeflow/ipv4.h"
#include "rdmacm/device_files.h"
#include "session/session.h"

namespace ff::verbs {
namespace {

// Once the process has the device, programs may check its nodes (device_files.h).
void ServeDeviceNodes(Session* s) {
  ServeDeviceNode(DeviceNodePath(s->device.dev.dev_name));
  ServeCmNode();
}

constexpr uint32_t kGidTableLen = 2;  // 0: RoCE v1 (link-local), 1: RoCE v2 (IPv4-mapped)

struct DeviceIds {
  uint32_t vendor_id;
  uint32_t part_id;
};

// FFV_VENDOR=mlx5 reports a ConnectX-5 id so that programs take their mlx5 paths
// (perftest then uses create_qp_ex and the ibv_wr_* API); the default is freeflow's own.
DeviceIds Ids() {
  const char* v = std::getenv("FFV_VENDOR");
  if (v != nullptr && std::strcmp(v, "mlx5") == 0) return {0x02c9, 4119};
  return {0x4646, 1};
}

uint64_t NodeGuid(uint32_t ip) {
  uint8_t gid[16];
  ff::LinkLocalGid(ip, gid);
  uint64_t guid;
  std::memcpy(&guid, gid + 8, 8);  // already in network order
  return guid;
}

void FillDeviceAttr(const Session* s, ibv_device_attr* a) {
  std::memset(a, 0, sizeof(*a));
  std::snprintf(a->fw_ver, sizeof(a->fw_ver), "freeflow-0.1");
  a->node_guid = NodeGuid(s->ip);
  a->sys_image_guid = a->node_guid;
  a->max_mr_size = ff::kMaxMrSize;
  a->page_size_cap = 0xfffff000;
  const DeviceIds ids = Ids();
  a->vendor_id = ids.vendor_id;
  a->vendor_part_id = ids.part_id;
  a->hw_ver = 1;
  a->max_qp = ff::kMaxQpsPerPod;
  a->max_qp_wr = ff::kMaxQpWr;
  a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SRQ_RESIZE |
                        IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_SYS_IMAGE_GUID |
                        IBV_DEVICE_CHANGE_PHY_PORT | IBV_DEVICE_MEM_WINDOW |
                        IBV_DEVICE_MEM_WINDOW_TYPE_2B;
  a->max_sge = ff::kMaxSge;
  a->max_sge_rd = ff::kMaxSge;
  a->max_cq = ff::kMaxObjectsPerPod;
  a->max_cqe = ff::kMaxCqe;
  a->max_mr = ff::kMrTableSlots - 1;
  a->max_mw = ff::kMrTableSlots - 1;  // windows are MR-table entries too
  a->max_pd = ff::kMaxObjectsPerPod;
  a->max_qp_rd_atom = ff::kMaxRdAtomic;
  a->max_qp_init_rd_atom = ff::kMaxRdAtomic;
  a->max_res_rd_atom = ff::kMaxRdAtomic * ff::kMaxQpsPerPod;
  a->atomic_cap = IBV_ATOMIC_HCA;
  a->max_srq = ff::kMaxObjectsPerPod;
  a->max_srq_wr = ff::kMaxQpWr;
  a->max_srq_sge = ff::kMaxSge;
  a->max_pkeys = 1;
  a->local_ca_ack_delay = 16;
  a->phys_port_cnt = 1;
}

void FillPortAttr(const Session* s, ibv_port_attr* p, size_t len) {
  ibv_port_attr a{};
  a.state = IBV_PORT_ACTIVE;
  a.max_mtu = IBV_MTU_4096;
  a.active_mtu = IBV_MTU_4096;
  a.gid_tbl_len = kGidTableLen;
  a.port_cap_flags = IBV_PORT_CM_SUP;
  a.max_msg_sz = static_cast<uint32_t>(ff::kMaxMsgSize);
  a.pkey_tbl_len = 1;
  a.lid = s->lid;
  a.max_vl_num = 1;
  a.active_width = 2;   // 4X
  a.active_speed = 32;  // EDR
  a.phys_state = 5;     // LinkUp
  a.link_layer = IBV_LINK_LAYER_ETHERNET;
  std::memcpy(p, &a, len < sizeof(a) ? len : sizeof(a));
}

bool ValidContext(ibv_context* c) { return c != nullptr && ToCtx(c) != nullptr; }

int QueryPortExt(ibv_context* c, uint8_t port, ibv_port_attr* attr, size_t len) {
  if (!ValidContext(c) || port != 1 || attr == nullptr) return EINVAL;
  FillPortAttr(ToCtx(c)->session, attr, len);
  return 0;
}

int QueryDeviceEx(ibv_context* c, const ibv_query_device_ex_input* input, ibv_device_attr_ex* attr,
                  size_t size) {
  if (!ValidContext(c) || attr == nullptr || size < sizeof(ibv_device_attr)) return EINVAL;
  if (input != nullptr && input->comp_mask != 0) return EINVAL;
  ibv_device_attr_ex full{};
  FillDeviceAttr(ToCtx(c)->session, &full.orig_attr);
  full.phys_port_cnt_ex = full.orig_attr.phys_port_cnt;  // equal below 256 ports
  // The kernel's full capability word: the legacy 32 bits are its low half.
  full.device_cap_flags_ex = full.orig_attr.device_cap_flags;
  std::memcpy(attr, &full, size < sizeof(full) ? size : sizeof(full));
  return 0;
}

void InstallOps(Context* ctx, ibv_device* device) {
  verbs_context& v = ctx->vctx;
  std::memset(&v, 0, sizeof(v));
  v.sz = sizeof(verbs_context);
  v.query_port = QueryPortExt;
  v.query_device_ex = QueryDeviceEx;
  v.create_qp_ex = CreateQpEx;
  v.create_cq_ex = CreateCqEx;
  v.open_xrcd = OpenXrcd;
  v.close_xrcd = CloseXrcd;
  v.create_srq_ex = CreateSrqEx;
  ibv_context& c = v.context;
  c.device = device;
  c.cmd_fd = -1;
  c.async_fd = ctx->async_fd.get();
  c.num_comp_vectors = 1;
  c.abi_compat = __VERBS_ABI_IS_EXTENDED;
  pthread_mutex_init(&c.mutex, nullptr);
  c.ops.poll_cq = PollCq;
  c.ops.req_notify_cq = ReqNotifyCq;
  c.ops.post_send = PostSend;
  c.ops.post_recv = PostRecv;
  c.ops.post_srq_recv = PostSrqRecv;
  c.ops.alloc_mw = AllocMw;
  c.ops.bind_mw = BindMw;
  c.ops.dealloc_mw = DeallocMw;
}

int CreateContext(Session* s, Context** out) {
  auto ctx = std::make_unique<Context>();
  ctx->session = s;
  ctx->async_fd.reset(::eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE));
  if (!ctx->async_fd) return errno;
  InstallOps(ctx.get(), &s->device.dev);
  s->registry.AddContext(ctx.get());
  *out = ctx.release();
  return 0;
}

int TakeAsyncEvent(Context* ctx, ibv_async_event* event) {
  uint64_t v;
  if (::read(ctx->async_fd.get(), &v, sizeof(v)) != static_cast<ssize_t>(sizeof(v)))
    return errno != 0 ? errno : EIO;
  std::lock_guard<std::mutex> g(ctx->async_mu);
  if (ctx->async_events.empty()) return EAGAIN;
  const AsyncEvent e = ctx->async_events.front();
  ctx->async_events.pop_front();
  event->event_type = e.type;
  switch (e.type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      event->element.qp = static_cast<ibv_qp*>(e.element);
      break;
    case IBV_EVENT_CQ_ERR:
      event->element.cq = static_cast<ibv_cq*>(e.element);
      break;
    case IBV_EVENT_SRQ_LIMIT_REACHED:
      event->element.srq = static_cast<ibv_srq*>(e.element);
      break;
    default:
      event->element.port_num = 1;
  }
  return 0;
}

template <typename T>
std::vector<T*> Snapshot(Context* ctx, const std::vector<T*>& v) {
  std::lock_guard<AdaptiveLock> l(ctx->lock);
  std::vector<T*> out;
  for (T* x : v)
    if (x != nullptr) out.push_back(x);
  return out;
}

// What the application left open when it closed the device goes with it, as the kernel
// frees a closed context's objects: otherwise the router would keep them (and their ids,
// memory and descriptors) for as long as the process lives. Users first, then what they use.
void ReleaseLeftovers(Context* ctx) {
  const auto qps = Snapshot(ctx, ctx->qps);
  const auto srqs = Snapshot(ctx, ctx->srqs);
  const auto mrs = Snapshot(ctx, ctx->mrs_by_slot);
  const auto cqs = Snapshot(ctx, ctx->cqs);
  const auto channels = Snapshot(ctx, ctx->channels);
  const size_t n = qps.size() + srqs.size() + mrs.size() + cqs.size() + channels.size();
  if (n == 0) return;
  LogDebug("ibv_close_device: releasing %zu objects the application left open", n);
  for (Qp* qp : qps) ibv_destroy_qp(&qp->qpx.qp_base);
  for (Srq* srq : srqs) ibv_destroy_srq(&srq->srq);
  for (Mr* mr : mrs) ibv_dereg_mr(&mr->mr);
  for (Cq* cq : cqs) ibv_destroy_cq(&cq->cq);
  for (Channel* ch : channels) ibv_destroy_comp_channel(&ch->ch);
}

}  // namespace

uint32_t IfindexOfIp(uint32_t ip) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return 0;
  uint32_t index = 0;
  for (const ifaddrs* a = list; a != nullptr && index == 0; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    const auto* sin = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (ntohl(sin->sin_addr.s_addr) == ip) index = ::if_nametoindex(a->ifa_name);
  }
  ::freeifaddrs(list);
  return index;
}

void PushAsyncEvent(Context* ctx, ibv_event_type type, void* element) {
  {
    std::lock_guard<std::mutex> g(ctx->async_mu);
    ctx->async_events.push_back(AsyncEvent{type, element});
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(ctx->async_fd.get(), &one, sizeof(one));
}

void DropAsyncEvents(Context* ctx, const void* element) {
  size_t dropped = 0;
  {
    std::lock_guard<std::mutex> g(ctx->async_mu);
    auto& q = ctx->async_events;
    const auto before = q.size();
    q.erase(std::remove_if(q.begin(), q.end(),
                           [element](const AsyncEvent& e) { return e.element == element; }),
            q.end());
    dropped = before - q.size();
  }
  // Their counts come off the descriptor too (one per event: a semaphore), so that a reader
  // blocked in ibv_get_async_event keeps waiting for a real one. Never blocks: a count a
  // concurrent reader already took is simply not there.
  for (; dropped > 0; --dropped) {
    pollfd p{ctx->async_fd.get(), POLLIN, 0};
    uint64_t v;
    if (::poll(&p, 1, 0) != 1 || ::read(ctx->async_fd.get(), &v, sizeof(v)) != sizeof(v)) break;
  }
}

ibv_context* OpenContext(Session* s) {
  Context* ctx = nullptr;
  const int rc = s == nullptr ? EINVAL : Guarded([&] { return CreateContext(s, &ctx); });
  return ObjectOrNull(rc, rc == 0 ? &ctx->vctx.context : nullptr);
}

}  // namespace ff::verbs

using namespace ff::verbs;

extern "C" {

FFV_EXPORT ibv_device** ibv_get_device_list(int* num) {
  auto** list = static_cast<ibv_device**>(std::calloc(2, sizeof(ibv_device*)));
  if (list == nullptr) return ObjectOrNull<ibv_device*>(ENOMEM, nullptr);
  Session* s = nullptr;
  const int rc = Guarded([&] {
    s = GetSession(&ServeDeviceNodes);
    return 0;
  });
  if (rc != 0) {
    std::free(list);
    return ObjectOrNull<ibv_device*>(rc, nullptr);
  }
  int count = 0;
  if (s != nullptr) list[count++] = &s->device.dev;
  if (num != nullptr) *num = count;
  return list;
}

FFV_EXPORT void ibv_free_device_list(ibv_device** list) { std::free(list); }

FFV_EXPORT const char* ibv_get_device_name(ibv_device* device) {
  return device != nullptr ? device->name : nullptr;
}

FFV_EXPORT __be64 ibv_get_device_guid(ibv_device* device) {
  if (device == nullptr) return 0;
  return NodeGuid(reinterpret_cast<Device*>(device)->session->ip);
}

FFV_EXPORT int ibv_get_device_index(ibv_device* device) {
  return device != nullptr ? reinterpret_cast<Device*>(device)->index : -1;
}

FFV_EXPORT ibv_context* ibv_open_device(ibv_device* device) {
  // A device whose router was lost is gone, as a removed device is: the program lists the
  // devices again for the one that replaced it.
  Session* s = ProcessSession();
  if (device == nullptr || s == nullptr || device != &s->device.dev || s->fatal.load())
    return ObjectOrNull<ibv_context>(ENODEV, nullptr);
  return OpenContext(s);
}

FFV_EXPORT int ibv_close_device(ibv_context* context) {
  if (!ValidContext(context)) return EINVAL;
  Context* ctx = ToCtx(context);
  FlushDirectAnswers(ctx->session);
  ReleaseLeftovers(ctx);
  ctx->session->registry.RemoveContext(ctx);
  pthread_mutex_destroy(&context->mutex);
  delete ctx;
  return 0;
}

FFV_EXPORT int ibv_query_device(ibv_context* context, ibv_device_attr* attr) {
  if (!ValidContext(context) || attr == nullptr) return EINVAL;
  FillDeviceAttr(ToCtx(context)->session, attr);
  return 0;
}

// The exported symbol fills the compat layout (which ends before port_cap_flags2).
FFV_EXPORT int ibv_query_port(ibv_context* context, uint8_t port, _compat_ibv_port_attr* attr) {
  if (!ValidContext(context) || port != 1 || attr == nullptr) return EINVAL;
  FillPortAttr(ToCtx(context)->session, reinterpret_cast<ibv_port_attr*>(attr),
               offsetof(ibv_port_attr, port_cap_flags2));
  return 0;
}

FFV_EXPORT int ibv_query_gid(ibv_context* context, uint8_t port, int index, ibv_gid* gid) {
  if (!ValidContext(context) || port != 1 || gid == nullptr || index < 0 || index > 1) {
    return -1;
  }
  const uint32_t ip = ToCtx(context)->session->ip;
  if (index == 0) {
    ff::LinkLocalGid(ip, gid->raw);
  } else {
    ff::Ipv4MappedGid(ip, gid->raw);
  }
  return 0;
}

// As the kernel's GID ioctls answer: a bad port, unknown flags or an index past the table are
// EINVAL (ENODATA is for an unused entry inside it, which this table has none of).
FFV_EXPORT int _ibv_query_gid_ex(ibv_context* context, uint32_t port, uint32_t index,
                                 ibv_gid_entry* entry, uint32_t flags, size_t entry_size) {
  if (!ValidContext(context) || entry == nullptr || port != 1 || index >= kGidTableLen ||
      flags != 0)
    return EINVAL;
  ibv_gid_entry e{};
  ibv_query_gid(context, 1, static_cast<int>(index), &e.gid);
  e.gid_index = index;
  e.port_num = 1;
  e.gid_type = index == 0 ? IBV_GID_TYPE_ROCE_V1 : IBV_GID_TYPE_ROCE_V2;
  e.ndev_ifindex = IfindexOfIp(ToCtx(context)->session->ip);
  std::memcpy(entry, &e, entry_size < sizeof(e) ? entry_size : sizeof(e));
  return 0;
}

// The whole table or nothing: a buffer too small for it is EINVAL (rdma-core and the kernel).
FFV_EXPORT ssize_t _ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries,
                                        size_t max_entries, uint32_t flags, size_t entry_size) {
  if (!ValidContext(context) || entry_size < sizeof(ibv_gid_entry) || flags != 0 ||
      entries == nullptr || max_entries < kGidTableLen)
    return -EINVAL;
  for (uint32_t i = 0; i < kGidTableLen; ++i) {
    auto* entry =
        reinterpret_cast<ibv_gid_entry*>(reinterpret_cast<char*>(entries) + i * entry_size);
    if (const int rc = _ibv_query_gid_ex(context, 1, i, entry, 0, entry_size)) return -rc;
  }
  return kGidTableLen;
}

FFV_EXPORT int ibv_query_gid_type(ibv_context* context, uint8_t port, unsigned int index,
                                  int* type) {
  // enum ibv_gid_type_sysfs of rdma-core's driver.h: 0 = IB/RoCE v1, 1 = RoCE v2.
  if (!ValidContext(context) || port != 1 || index > 1 || type == nullptr)
    return ZeroOrMinusOne(EINVAL);
  *type = index == 0 ? 0 : 1;
  return 0;
}

FFV_EXPORT int ibv_query_pkey(ibv_context* context, uint8_t port, int index, __be16* pkey) {
  if (!ValidContext(context) || port != 1 || index != 0 || pkey == nullptr) return -1;
  *pkey = htons(0xffff);
  return 0;
}

FFV_EXPORT int ibv_get_pkey_index(ibv_context* context, uint8_t port, __be16 pkey) {
  // The P_Key index, or -1 with errno set.
  if (!ValidContext(context) || port != 1) return ZeroOrMinusOne(EINVAL);
  return ntohs(pkey) == 0xffff ? 0 : ZeroOrMinusOne(ENOENT);
}

FFV_EXPORT int ibv_get_async_event(ibv_context* context, ibv_async_event* event) {
  if (!ValidContext(context) || event == nullptr) return -1;
  return ZeroOrMinusOne(TakeAsyncEvent(ToCtx(context), event));
}

FFV_EXPORT void ibv_ack_async_event(ibv_async_event*) {}

}  // extern "C"
