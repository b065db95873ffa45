#!/usr/bin/env bash
# The cross-node figures of issues 4 and 10, between a pod on node 0 and a pod on node 1, each
# the median (min..max) of RUNS runs, beside iperf3 and sockperf between the same two pods.
# Every run measures with node links in TLS (the default) and in plaintext
# (--insecure-node-links), restarting both routers in between.
set -euo pipefail
BUILD=${1:-build}
RUNS=${RUNS:-5}
FF_BUILD=$(cd "$BUILD" && pwd)
export FF_BUILD
cd "$(dirname "$0")/.."
source scripts/lib/cluster.sh
source scripts/lib/measure.sh
trap multinode_down EXIT
multinode_up 2 1
# Routers run at normal priority, as deployed by default; FF_ROUTER_RT=N runs them with
# --realtime-priority N (docs/router.md has the figures of both).
RT=${FF_ROUTER_RT:-0}
echo "routers: --realtime-priority $RT" >&2
# routers tls|plain: (re)starts both routers with node links in TLS or in plaintext.
routers() {
  mn_router_down 0
  mn_router_down 1
  FF_INSECURE_NODE_LINKS=$([[ $1 == plain ]] && echo 1 || echo 0)
  mn_router_up 0 --realtime-priority "$RT"
  mn_router_up 1 --realtime-priority "$RT"
}

# The measure.sh helpers address one-node pods; map them onto the two nodes' pods.
pods_on_nodes

declare -a wbw=() q1=() q8=() tcp=() slat=() tlat=() wbw_tls=() slat_tls=()
for ((r = 1; r <= RUNS; r++)); do
  echo "run $r/$RUNS" >&2
  routers tls
  wbw_tls+=("$(perftest_run 0 1 bw ib_write_bw -s 65536 -n 5000)")
  slat_tls+=("$(perftest_run 0 1 typical ib_send_lat -s 2 -n 5000)")
  routers plain
  wbw+=("$(perftest_run 0 1 bw ib_write_bw -s 65536 -n 5000)")
  q1+=("$(perftest_run 0 1 bw ib_write_bw -s 65536 -n 2000 -q 1)")
  q8+=("$(perftest_run 0 1 bw ib_write_bw -s 65536 -n 500 -q 8)")
  slat+=("$(perftest_run 0 1 typical ib_send_lat -s 2 -n 5000)")
  tcp+=("$(iperf3_gbps 0 1 3)")
  tlat+=("$(sockperf_half_rtt_us 0 1 2)")
done
# The CPU the routers spend while one cross-node stream runs: what the node pays for a pod's
# traffic, outside every pod's CPU limit. Both routers, TLS node links, a 10 s ib_write_bw.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
routers_ticks() { echo $(($(cpu_ticks "${FF_NODE_ROUTER[0]}") + $(cpu_ticks "${FF_NODE_ROUTER[1]}"))); }
routers tls
ticks0=$(routers_ticks)
start=$(date +%s.%N)
stream_gbps=$(perftest_run 0 1 bw ib_write_bw -s 65536 -D 10)
router_cores=$(awk -v t="$(($(routers_ticks) - ticks0))" -v hz="$(getconf CLK_TCK)" \
  -v s="$start" -v e="$(date +%s.%N)" 'BEGIN{printf "%.2f", t / hz / (e - s)}')
# This machine's floor for a message that passes through router processes (no freeflow
# code): one-way latency over loopback TCP, bare and with one or two relay processes.
floor_csv=$("$FF_BUILD/bench/hop_floor" --benchmark_format=csv 2>/dev/null)
floor() {
  awk -F, -v n="$1" '$1 ~ "^\"" n "/" && !/_mean|_median|_stddev|_cv/ {printf "%.2f\n", $3 / 2000}' <<<"$floor_csv"
}
read -r f0_m f0_lo f0_hi <<<"$(stats "$(floor BM_Tcp)")"
read -r f1_m f1_lo f1_hi <<<"$(stats "$(floor BM_OneRelay)")"
read -r f2_m f2_lo f2_hi <<<"$(stats "$(floor BM_TwoRelays)")"
read -r wbw_m wbw_lo wbw_hi <<<"$(stats "${wbw[@]}")"
read -r wt_m wt_lo wt_hi <<<"$(stats "${wbw_tls[@]}")"
read -r st_m st_lo st_hi <<<"$(stats "${slat_tls[@]}")"
read -r q1_m q1_lo q1_hi <<<"$(stats "${q1[@]}")"
read -r q8_m q8_lo q8_hi <<<"$(stats "${q8[@]}")"
read -r tcp_m tcp_lo tcp_hi <<<"$(stats "${tcp[@]}")"
read -r sl_m sl_lo sl_hi <<<"$(stats "${slat[@]}")"
read -r tl_m tl_lo tl_hi <<<"$(stats "${tlat[@]}")"
echo
echo "freeflow cross-node benchmark: median (min..max) of $RUNS runs, pods on two nodes"
echo "(rows without 'TLS': node links in plaintext, --insecure-node-links)"
printf '%-46s %-28s %s\n' "figure" "value" "target"
printf '%-46s %-28s %s\n' "ib_write_bw 64 KiB, TLS node links, Gbit/s" "$wt_m ($wt_lo..$wt_hi)" \
  "$(awk -v a="$wt_m" -v b="$wbw_m" 'BEGIN{printf "%.0f", 100*a/b}')% of plaintext (>= 80%)"
printf '%-46s %-28s %s\n' "ib_send_lat 2 B, TLS node links, usec" "$st_m ($st_lo..$st_hi)" \
  "$(awk -v a="$st_m" -v b="$tl_m" 'BEGIN{printf "%.2f", a/b}')x TCP"
printf '%-46s %-28s %s\n' "ib_write_bw 64 KiB, Gbit/s" "$wbw_m ($wbw_lo..$wbw_hi)" \
  "$(awk -v a="$wbw_m" -v b="$tcp_m" 'BEGIN{printf "%.0f", 100*a/b}')% of TCP (>= 75%)"
printf '%-46s %-28s %s\n' "  iperf3 single-stream TCP, Gbit/s" "$tcp_m ($tcp_lo..$tcp_hi)" ""
printf '%-46s %-28s %s\n' "ib_send_lat 2 B t_typical, usec" "$sl_m ($sl_lo..$sl_hi)" \
  "$(awk -v a="$sl_m" -v b="$tl_m" 'BEGIN{printf "%.2f", a/b}')x TCP (<= 1.5x)"
printf '%-46s %-28s %s\n' "  sockperf TCP ping-pong p50 (half RTT), usec" "$tl_m ($tl_lo..$tl_hi)" ""
xtcp() { awk -v a="$1" -v b="$f0_m" 'BEGIN{printf "%.2fx TCP", a/b}'; }
printf '%-46s %-28s %s\n' "  floor: loopback TCP one-way, usec" "$f0_m ($f0_lo..$f0_hi)" "bench/hop_floor"
printf '%-46s %-28s %s\n' "  floor: + a receiving router process" "$f1_m ($f1_lo..$f1_hi)" "$(xtcp "$f1_m")"
printf '%-46s %-28s %s\n' "  floor: + routers on both sides" "$f2_m ($f2_lo..$f2_hi)" "$(xtcp "$f2_m")"
printf '%-46s %-28s %s\n' "ib_write_bw -q 1, Gbit/s" "$q1_m ($q1_lo..$q1_hi)" ""
printf '%-46s %-28s %s\n' "routers' CPU, 10 s ib_write_bw (TLS), cores" "$router_cores" \
  "both routers together, while the stream moved $stream_gbps Gbit/s"
printf '%-46s %-28s %s\n' "ib_write_bw -q 8 (aggregate), Gbit/s" "$q8_m ($q8_lo..$q8_hi)" \
  "$(awk -v a="$q8_m" -v b="$q1_m" 'BEGIN{print (a >= b) ? "no lower than -q 1: yes" : "no lower than -q 1: NO"}')"
