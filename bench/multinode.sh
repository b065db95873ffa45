#!/usr/bin/env bash
# The cross-node figures of issue 4, between a pod on node 0 and a pod on node 1, each the
# median (min..max) of RUNS runs, beside iperf3 and sockperf between the same two pods.
set -euo pipefail
BUILD=${1:-build}
RUNS=${RUNS:-5}
export FF_BUILD=$(cd "$BUILD" && pwd)
cd "$(dirname "$0")/.."
source scripts/lib/cluster.sh
source scripts/lib/measure.sh
trap multinode_down EXIT
multinode_up 2 1
# Routers are node infrastructure: run them with real-time priority (ffrouter
# --realtime-priority), as recommended when pods spin on every core (docs/router.md).
RT=${FF_ROUTER_RT:-10}
mn_router_up 0 --realtime-priority "$RT"
mn_router_up 1 --realtime-priority "$RT"
echo "routers: --realtime-priority $RT" >&2

# The measure.sh helpers address one-node pods; map them onto the two nodes' pods.
ff_pod_ns() { mn_pod_ns "$1" 0; }
ff_pod_ip() { mn_pod_ip "$1" 0; }
pod_bg() { local n=$1; shift; mn_pod_bg "$n" 0 "$@"; }
pod_run() { local n=$1; shift; mn_pod_run "$n" 0 "$@"; }

declare -a wbw=() q1=() q8=() tcp=() slat=() tlat=()
for ((r = 1; r <= RUNS; r++)); do
  echo "run $r/$RUNS" >&2
  wbw+=("$(perftest_run 0 1 bw ib_write_bw -s 65536 -n 5000)")
  q1+=("$(perftest_run 0 1 bw ib_write_bw -s 65536 -n 2000 -q 1)")
  q8+=("$(perftest_run 0 1 bw ib_write_bw -s 65536 -n 500 -q 8)")
  slat+=("$(perftest_run 0 1 typical ib_send_lat -s 2 -n 5000)")
  tcp+=("$(iperf3_gbps 0 1 3)")
  tlat+=("$(sockperf_half_rtt_us 0 1 2)")
done
read -r wbw_m wbw_lo wbw_hi <<<"$(stats "${wbw[@]}")"
read -r q1_m q1_lo q1_hi <<<"$(stats "${q1[@]}")"
read -r q8_m q8_lo q8_hi <<<"$(stats "${q8[@]}")"
read -r tcp_m tcp_lo tcp_hi <<<"$(stats "${tcp[@]}")"
read -r sl_m sl_lo sl_hi <<<"$(stats "${slat[@]}")"
read -r tl_m tl_lo tl_hi <<<"$(stats "${tlat[@]}")"
echo
echo "freeflow cross-node benchmark: median (min..max) of $RUNS runs, pods on two nodes"
printf '%-46s %-28s %s\n' "figure" "value" "target"
printf '%-46s %-28s %s\n' "ib_write_bw 64 KiB, Gbit/s" "$wbw_m ($wbw_lo..$wbw_hi)" \
  "$(awk -v a="$wbw_m" -v b="$tcp_m" 'BEGIN{printf "%.0f", 100*a/b}')% of TCP (>= 75%)"
printf '%-46s %-28s %s\n' "  iperf3 single-stream TCP, Gbit/s" "$tcp_m ($tcp_lo..$tcp_hi)" ""
printf '%-46s %-28s %s\n' "ib_send_lat 2 B t_typical, usec" "$sl_m ($sl_lo..$sl_hi)" \
  "$(awk -v a="$sl_m" -v b="$tl_m" 'BEGIN{printf "%.2f", a/b}')x TCP (<= 1.5x)"
printf '%-46s %-28s %s\n' "  sockperf TCP ping-pong p50 (half RTT), usec" "$tl_m ($tl_lo..$tl_hi)" ""
printf '%-46s %-28s %s\n' "ib_write_bw -q 1, Gbit/s" "$q1_m ($q1_lo..$q1_hi)" ""
printf '%-46s %-28s %s\n' "ib_write_bw -q 8 (aggregate), Gbit/s" "$q8_m ($q8_lo..$q8_hi)" \
  "$(awk -v a="$q8_m" -v b="$q1_m" 'BEGIN{print (a >= b) ? "no lower than -q 1: yes" : "no lower than -q 1: NO"}')"
