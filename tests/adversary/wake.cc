// Finding 2: a pod makes the router block on a descriptor it handed over. An eventfd blocks
// its writer once the counter is near its maximum, a wake socket once its queue is full,
// and O_NONBLOCK lives on the open file description the pod shares with the router, so the
// pod can clear it. The attacker offers eventfds at HELLO and for a completion channel (both
// must be refused with EINVAL), makes the wake sockets the router takes instead blocking and
// full, arms its wake word and a CQ event word, and provokes the router into waking it: a
// SEND from the other node lands in its QP, and the answer to its own SEND comes back. The
// router must deliver both; while the attack holds, the script checks that a fresh pod opens
// its device within 1 s and that other pods' ping-pongs complete.
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "adversary.h"

namespace ff::adversary {
namespace {

// The completion channel, the CQ it serves and the CQ's event word.
constexpr uint32_t kChannel = 1, kCq = 2, kCqSlot = 5;

// Makes `fd` something its writer waits on: a wake socket with a full queue, or an eventfd
// one increment short of its maximum; blocking either way. Returns what it did, or "" when
// it could not (the attack would not be real).
std::string Jam(int fd) {
  std::string done;
  if (IsWakeSocket(fd)) {
    const char wake = 1;
    int queued = 0;
    while (queued < (1 << 20) && ::send(fd, &wake, 1, MSG_DONTWAIT) == 1) ++queued;
    if (queued > 0 && errno == EAGAIN)
      done = "a full wake socket (" + std::to_string(queued) + " wakes)";
  } else {
    const uint64_t almost_full = 0xfffffffffffffffeull;
    if (::write(fd, &almost_full, sizeof(almost_full)) == sizeof(almost_full))
      done = "an eventfd at 0xfffffffffffffffe";
  }
  if (::fcntl(fd, F_SETFL, 0) != 0 || (::fcntl(fd, F_GETFL) & O_NONBLOCK) != 0) return "";
  return done.empty() ? done : done + ", made blocking";
}

// The wake descriptors the router took from the attacker (the sending ends) and the
// receiving ends it keeps open, unread, so that the queues stay full.
struct Jammed {
  UniqueFd process, process_rx;
  UniqueFd channel, channel_rx;
};

// HELLO offering an eventfd as the wake fd; when refused, a proper HELLO on a new connection.
RawPod HelloWithEventfd(Report& r, Jammed* j) {
  RawPod pod = OpenPod();
  UniqueFd notify;
  CreateSegment("notify", kNotifySegmentBytes, &notify);
  UniqueFd efd(::eventfd(0, EFD_CLOEXEC));
  j->process = UniqueFd(::dup(efd.get()));
  const int st = pod.HelloWith(std::move(notify), std::move(efd), Abi());
  r.Check(st == EINVAL, "HELLO with an eventfd as its wake fd", ErrName(st));
  if (st == 0) return pod;
  RawPod fresh = OpenPod();
  fresh.Hello(Abi());
  j->process = UniqueFd(::dup(fresh.wake_tx()));
  j->process_rx = UniqueFd(::dup(fresh.wake_fd()));
  return fresh;
}

// A completion channel offered as an eventfd; when refused, as a wake socket.
void ChannelWithEventfd(RawPod& pod, Report& r, Jammed* j) {
  proto::CreateChannel c{};
  c.id = kChannel;
  UniqueFd efd(::eventfd(0, EFD_CLOEXEC));
  const int st = pod.Call(c, {efd.get()}).status;
  r.Check(st == EINVAL, "CreateChannel with an eventfd", ErrName(st));
  if (st == 0) {
    j->channel = std::move(efd);
    return;
  }
  CreateWakePair(&j->channel_rx, &j->channel, true);
  pod.Call(c, {j->channel.get()});
}

}  // namespace

int Wake(const Args& a) {
  Report r("2", "wake");
  const Rendezvous rv(a.meet);
  Jammed j;
  RawPod pod = HelloWithEventfd(r, &j);
  ChannelWithEventfd(pod, r, &j);
  pod.CreateCq(kCq, kCqSlot, kChannel);
  RawQp qp = pod.CreateQp(IBV_QPT_RC, 1, kRcRingBytes, kCq);
  if (qp.qpn == 0) {
    r.Check(false, "setting up a QP on a CQ with a completion channel", ErrName(qp.status));
    return r.Finish();
  }
  qp.hdr()->credits.posted.store(16);
  const std::string process = Jam(j.process.get()), channel = Jam(j.channel.get());
  if (process.empty() || channel.empty()) {
    r.Check(false, "jamming the wake descriptors it handed over", "could not");
    return r.Finish();
  }
  std::printf("  jammed: its wake fd is %s; its channel %s\n", process.c_str(), channel.c_str());
  NotifySlot* words[] = {pod.Slot(proto::kWakeSlot), pod.Slot(kCqSlot)};
  const auto arm = [&] {
    for (NotifySlot* w : words) w->armed.store(1);
  };
  // The router takes an armed word (sets it to 0) when it wakes through the descriptor.
  const auto taken = [&] {
    return test::WaitFor(
        [&] { return words[0]->armed.load() == 0 && words[1]->armed.load() == 0; });
  };
  arm();
  const auto peer = MeetPeer(rv, pod, {&qp});
  const int sent = PeerResults(rv, 1)[0];
  const bool woke = taken();
  r.Check(sent == IBV_WC_SUCCESS && woke,
          "a SEND from the other node into its QP, its wake word and CQ event word armed",
          WcName(sent) + (woke ? "; the router woke it through both and did not wait" : ""));
  std::optional<ProxyResponse> answer;
  if (peer) {
    RawLink link = ConnectTo(pod, qp, peer->ip, peer->qpns[0]);
    arm();
    if (link.status == 0 && test::PostSend(link, 1, "wake me") == RingStatus::kOk)
      answer = test::NextAnswer(link);
  }
  const int got = answer ? answer->status : -1;
  const bool woke_again = taken();
  r.Check(got == IBV_WC_SUCCESS && woke_again,
          "its own SEND to the other node, whose answer wakes it (armed again)",
          WcName(got) + (woke_again ? "; the router woke it through both and did not wait" : ""));
  return Conclude(r, rv);
}

}  // namespace ff::adversary
