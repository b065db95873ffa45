#!/usr/bin/env bash
# make bench: the one-node performance figures of the virtual RDMA data path, each the
# median (min..max) of RUNS runs, beside its baselines measured in the same run between
# the same two pods: iperf3 single-stream TCP, sockperf TCP ping-pong, and memcpy.
set -euo pipefail
BUILD=${1:-build}
RUNS=${RUNS:-5}
FF_BUILD=$(cd "$BUILD" && pwd)
export FF_BUILD
cd "$(dirname "$0")/.."
source scripts/lib/cluster.sh
source scripts/lib/measure.sh
trap cluster_down EXIT
cluster_up 2
router_up

declare -a wbw=() tcp=() slat=() wlat=() tlat=() mpps=()
for ((r = 1; r <= RUNS; r++)); do
  echo "run $r/$RUNS" >&2
  wbw+=("$(perftest_run 0 1 bw ib_write_bw -s 65536 -n 20000)")
  mpps+=("$(perftest_run 0 1 mpps ib_send_bw -s 64 -n 200000)")
  slat+=("$(perftest_run 0 1 typical ib_send_lat -s 2 -n 20000)")
  wlat+=("$(perftest_run 0 1 typical ib_write_lat -s 2 -n 20000)")
  tcp+=("$(iperf3_gbps 0 1 3)")
  tlat+=("$(sockperf_half_rtt_us 0 1 2)")
done
memcpy=$("$FF_BUILD/bench/memcpy_bench" --benchmark_format=csv 2>/dev/null |
  awk -F, '/BM_Memcpy\/65536\/repeats:5"?,/ && !/_mean|_median|_stddev|_cv/ {printf "%.2f\n", $6 * 8 / 1e9}')
read -r wbw_m wbw_lo wbw_hi <<<"$(stats "${wbw[@]}")"
read -r tcp_m tcp_lo tcp_hi <<<"$(stats "${tcp[@]}")"
read -r mc_m mc_lo mc_hi <<<"$(stats "$memcpy")"
read -r sl_m sl_lo sl_hi <<<"$(stats "${slat[@]}")"
read -r wl_m wl_lo wl_hi <<<"$(stats "${wlat[@]}")"
read -r tl_m tl_lo tl_hi <<<"$(stats "${tlat[@]}")"
read -r mp_m mp_lo mp_hi <<<"$(stats "${mpps[@]}")"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.1f", a / b; else print "n/a" }'; }

echo
echo "freeflow one-node benchmark: median (min..max) of $RUNS runs, two pods on one node"
printf '%-44s %-28s %s\n' "figure" "value" "target"
printf '%-44s %-28s %s\n' "ib_write_bw 64 KiB, Gbit/s" "$wbw_m ($wbw_lo..$wbw_hi)" ""
printf '%-44s %-28s %s\n' "  iperf3 single-stream TCP, Gbit/s" "$tcp_m ($tcp_lo..$tcp_hi)" \
  "ratio $(ratio "$wbw_m" "$tcp_m")x (>= 10x)"
printf '%-44s %-28s %s\n' "  memcpy 64 KiB single thread, Gbit/s" "$mc_m ($mc_lo..$mc_hi)" \
  "ratio $(awk -v a="$wbw_m" -v b="$mc_m" 'BEGIN{printf "%.0f", 100*a/b}')% (>= 50%)"
printf '%-44s %-28s %s\n' "ib_send_lat 2 B t_typical, usec" "$sl_m ($sl_lo..$sl_hi)" \
  "TCP/RDMA $(ratio "$tl_m" "$sl_m")x (>= 15x)"
printf '%-44s %-28s %s\n' "ib_write_lat 2 B t_typical, usec" "$wl_m ($wl_lo..$wl_hi)" \
  "TCP/RDMA $(ratio "$tl_m" "$wl_m")x (>= 15x)"
printf '%-44s %-28s %s\n' "  sockperf TCP ping-pong p50 (half RTT), usec" "$tl_m ($tl_lo..$tl_hi)" ""
printf '%-44s %-28s %s\n' "ib_send_bw 64 B, million messages/s" "$mp_m ($mp_lo..$mp_hi)" "(>= 3)"
