// Finding 3: a pod hands the router memfds it can still shrink (its notify words at HELLO, a
// QP segment, an SRQ segment, a region), shrinks them, and makes the router touch them: a
// SEND from the other node lands in its QP's ring and makes the router read its wake word,
// which on a shrunk memfd is SIGBUS. Each unsealed memfd must be refused; the sealed ones the
// router takes instead must refuse to shrink; and the router must deliver that SEND.
#include <unistd.h>

#include <cerrno>

#include "adversary.h"

namespace ff::adversary {
namespace {

// The memfds the router accepted although they could shrink: shrunk once the QP is set.
struct Shrinkable {
  std::vector<int> fds;
  void Shrink() const {
    for (int fd : fds) (void)!::ftruncate(fd, 0);
  }
};

// Shrinking a sealed memfd must fail, and for its seal (EPERM): any other failure would
// mean the attack was not made.
void TryShrink(int fd, const std::string& what, Report& r) {
  const int rc = ::ftruncate(fd, 0);
  const int err = rc == 0 ? 0 : errno;
  r.Check(err == EPERM, "shrinking the sealed " + what + " the router took",
          rc == 0 ? "shrunk to 0 bytes" : ErrName(err));
}

// HELLO with unsealed notify words; when refused, a proper HELLO on a new connection.
RawPod HelloUnsealed(Report& r, Shrinkable* later, UniqueFd* keep) {
  RawPod pod = OpenPod();
  UniqueFd notify = test::UnsealedSegment(kNotifySegmentBytes);
  UniqueFd rx, tx;
  CreateWakePair(&rx, &tx, true);
  *keep = UniqueFd(::dup(notify.get()));
  const int st = pod.HelloWith(std::move(notify), std::move(tx), Abi());
  r.Check(st != 0, "HELLO with notify words in a memfd that can shrink", ErrName(st));
  if (st == 0) {
    later->fds.push_back(keep->get());
    return pod;
  }
  RawPod fresh = OpenPod();
  const int ok = fresh.Hello(Abi());
  if (ok != 0) r.Check(false, "HELLO with sealed notify words", ErrName(ok));
  TryShrink(fresh.notify_fd(), "notify memfd", r);
  return fresh;
}

// An SRQ segment, unsealed then sealed.
void SrqSegments(RawPod& pod, Report& r, Shrinkable* later, std::vector<UniqueFd>* keep) {
  proto::CreateSrq m{};
  m.id = 1;
  keep->push_back(test::UnsealedSegment(sizeof(SrqSegment)));
  const int st = pod.Call(m, {keep->back().get()}).status;
  r.Check(st != 0, "CreateSrq with a segment that can shrink", ErrName(st));
  if (st == 0) return later->fds.push_back(keep->back().get());
  UniqueFd sealed;
  CreateSegment("srq", sizeof(SrqSegment), &sealed);
  const int ok = pod.Call(m, {sealed.get()}).status;
  if (ok != 0) return r.Check(false, "CreateSrq with a sealed segment", ErrName(ok));
  TryShrink(sealed.get(), "SRQ segment", r);
}

// A region, unsealed then sealed.
void Regions(RawPod& pod, Report& r, Shrinkable* later, std::vector<UniqueFd>* keep) {
  keep->push_back(test::UnsealedSegment(4096));
  uint32_t key = 0;
  const int st =
      pod.RegisterWith(UniqueFd(::dup(keep->back().get())), 1, 4096, kAllAccess, 0x10000, &key);
  r.Check(st != 0, "RegMr with a region memfd that can shrink", ErrName(st));
  if (st == 0) return later->fds.push_back(keep->back().get());
  UniqueFd sealed;
  CreateSegment("region", 4096, &sealed);
  const int ok =
      pod.RegisterWith(UniqueFd(::dup(sealed.get())), 2, 4096, kAllAccess, 0x20000, &key);
  if (ok != 0) return r.Check(false, "RegMr with a sealed region memfd", ErrName(ok));
  TryShrink(sealed.get(), "region memfd", r);
}

}  // namespace

int Shrink(const Args& a) {
  Report r("3", "shrink");
  const Rendezvous rv(a.meet);
  Shrinkable later;
  UniqueFd notify;
  std::vector<UniqueFd> keep;
  RawPod pod = HelloUnsealed(r, &later, &notify);
  pod.CreateCq(1);
  SrqSegments(pod, r, &later, &keep);
  Regions(pod, r, &later, &keep);
  const size_t seg_bytes = QpSegmentBytes(1, kRcRingBytes);
  UniqueFd seg = test::UnsealedSegment(seg_bytes);
  const int seg_fd = seg.get();
  RawQp qp = pod.CreateQpWith(std::move(seg), IBV_QPT_RC, 1, kRcRingBytes);
  r.Check(qp.qpn == 0, "CreateQp with a segment that can shrink", ErrName(qp.status));
  if (qp.qpn == 0) {
    qp = pod.CreateQp(IBV_QPT_RC);
    TryShrink(qp.seg_fd.get(), "QP segment", r);
  } else {
    later.fds.push_back(seg_fd);
  }
  qp.hdr()->credits.posted.store(16);
  later.Shrink();  // from here on nobody may touch those mappings: the attack is armed
  if (!MeetPeer(rv, pod, {&qp}))
    r.Check(false, "meeting the helper on the other node", "no answer");
  const int sent = PeerResults(rv, 1)[0];
  r.Check(sent == IBV_WC_SUCCESS, "a SEND from the other node into its QP (its wake word read)",
          WcName(sent) +
              (sent == IBV_WC_SUCCESS ? ": delivered; nothing the router maps can shrink" : ""));
  return Conclude(r, rv);
}

}  // namespace ff::adversary
