// Extended CQs: the ibv_cq_ex polling interface (ibv_start_poll, ibv_next_poll,
// ibv_end_poll and the ibv_wc_read_* accessors, which libibverbs' inline wrappers call
// through the function pointers in struct ibv_cq_ex). An extended CQ is an ordinary Cq whose
// ibv_cq_ex fields are filled in: the same ring, the same events, the same destroy.
//
// start_poll takes one completion out of the ring (as poll_cq does, under ctx->lock, which
// it does not keep: the application may post work between start_poll and end_poll) into
// Cq::current, where the read functions find it. Cq::poll_lock, held from a successful
// start_poll to end_poll, keeps two threads polling one CQ from sharing `current`; a CQ
// created with IBV_CREATE_CQ_ATTR_SINGLE_THREADED skips it.
#include "datapath/completion.h"

namespace ff::verbs {
namespace {

Cq* Of(ibv_cq_ex* c) { return reinterpret_cast<Cq*>(c); }
const ibv_wc& Cur(ibv_cq_ex* c) { return Of(c)->current; }

// One completion into `current`: 0, ENOENT when there is none, or an errno.
int TakeOne(Cq* cq, bool may_sleep) {
  int n;
  {
    std::lock_guard<AdaptiveLock> l(cq->ctx->lock);
    n = PollLocked(cq, 1, &cq->current, may_sleep);
  }
  if (n < 0) return -n;
  if (n == 0) return ENOENT;
  cq->cqx.wr_id = cq->current.wr_id;
  cq->cqx.status = cq->current.status;
  return 0;
}

int StartPoll(ibv_cq_ex* ibcq, ibv_poll_cq_attr* attr) {
  Cq* cq = Of(ibcq);
  if (attr == nullptr || attr->comp_mask != 0) return EINVAL;
  if (!cq->single_threaded) cq->poll_lock.lock();
  const int rc = TakeOne(cq, true);
  // After a failed start_poll the application does not call end_poll.
  if (rc != 0 && !cq->single_threaded) cq->poll_lock.unlock();
  return rc;
}

// Never sleeps: ENOENT ends the application's batch, and it calls end_poll next.
int NextPoll(ibv_cq_ex* ibcq) { return TakeOne(Of(ibcq), false); }

void EndPoll(ibv_cq_ex* ibcq) {
  Cq* cq = Of(ibcq);
  if (!cq->single_threaded) cq->poll_lock.unlock();
}

ibv_wc_opcode ReadOpcode(ibv_cq_ex* c) { return Cur(c).opcode; }
uint32_t ReadVendorErr(ibv_cq_ex* c) { return Cur(c).vendor_err; }
unsigned int ReadWcFlags(ibv_cq_ex* c) { return Cur(c).wc_flags; }
uint32_t ReadByteLen(ibv_cq_ex* c) { return Cur(c).byte_len; }
__be32 ReadImmData(ibv_cq_ex* c) { return Cur(c).imm_data; }
uint32_t ReadQpNum(ibv_cq_ex* c) { return Cur(c).qp_num; }
uint32_t ReadSrcQp(ibv_cq_ex* c) { return Cur(c).src_qp; }
uint32_t ReadSlid(ibv_cq_ex* c) { return Cur(c).slid; }
uint8_t ReadSl(ibv_cq_ex* c) { return Cur(c).sl; }
uint8_t ReadDlidPathBits(ibv_cq_ex* c) { return Cur(c).dlid_path_bits; }

}  // namespace

// As mlx5 does, only the readers of the requested fields are set; the others stay NULL.
void InstallCqExOps(Cq* cq, uint64_t wc_flags) {
  ibv_cq_ex& x = cq->cqx;
  x.start_poll = StartPoll;
  x.next_poll = NextPoll;
  x.end_poll = EndPoll;
  x.read_opcode = ReadOpcode;
  x.read_vendor_err = ReadVendorErr;
  x.read_wc_flags = ReadWcFlags;
  if (wc_flags & IBV_WC_EX_WITH_BYTE_LEN) x.read_byte_len = ReadByteLen;
  if (wc_flags & IBV_WC_EX_WITH_IMM) x.read_imm_data = ReadImmData;
  if (wc_flags & IBV_WC_EX_WITH_QP_NUM) x.read_qp_num = ReadQpNum;
  if (wc_flags & IBV_WC_EX_WITH_SRC_QP) x.read_src_qp = ReadSrcQp;
  if (wc_flags & IBV_WC_EX_WITH_SLID) x.read_slid = ReadSlid;
  if (wc_flags & IBV_WC_EX_WITH_SL) x.read_sl = ReadSl;
  if (wc_flags & IBV_WC_EX_WITH_DLID_PATH_BITS) x.read_dlid_path_bits = ReadDlidPathBits;
}

}  // namespace ff::verbs
