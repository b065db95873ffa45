#!/usr/bin/env bash
# make demo: two pods on one node run an unmodified RDMA benchmark (perftest) over
# freeflow, printed beside the same measurement over TCP between the same pods.
set -euo pipefail
BUILD=${1:-build}
FF_BUILD=$(cd "$BUILD" && pwd)
export FF_BUILD
cd "$(dirname "$0")/.."
source scripts/lib/cluster.sh
source scripts/lib/measure.sh
if [[ $(id -u) -ne 0 ]]; then
  echo "make demo creates network namespaces: run it as root" >&2
  exit 1
fi
trap cluster_down EXIT
echo "== one node, two pods: $(ff_pod_ns 0) ($(ff_pod_ip 0)) and $(ff_pod_ns 1) ($(ff_pod_ip 1))"
cluster_up 2
router_up
echo "== the virtual RDMA device as pod 1 sees it (ibv_devices):"
pod_run 1 ibv_devices
echo "== unmodified perftest over freeflow (LD_PRELOAD=/freeflow/libffverbs.so)"
wbw=$(perftest_run 0 1 bw ib_write_bw -s 65536 -n 5000)
slat=$(perftest_run 0 1 typical ib_send_lat -s 2 -n 5000)
echo "== the same two pods over TCP (iperf3, sockperf)"
tcp=$(iperf3_gbps 0 1 3)
tlat=$(sockperf_half_rtt_us 0 1 2)
printf '\n%-34s %14s %14s\n' "" "freeflow RDMA" "TCP"
printf '%-34s %14s %14s\n' "bandwidth, 64 KiB, Gbit/s" "$wbw" "$tcp"
printf '%-34s %14s %14s\n' "one-way latency, 2 B, usec" "$slat" "$tlat"
printf '\n(ib_write_bw vs iperf3 single stream; ib_send_lat t_typical vs sockperf ping-pong p50)\n'
