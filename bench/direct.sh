#!/usr/bin/env bash
# Issue 36's figures: a pod on node 0 and a pod on node 1 over the direct path (the bytes go
# pod to pod on one TCP connection, sealed), beside the same pods' kernel TCP (iperf3,
# sockperf) and the relay through the routers, all in the same run; each figure the median
# (min..max) of RUNS runs. Node links in TLS (the default) throughout; the direct path with
# its default seal (encrypt) unless a row says otherwise.
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
pods_on_nodes

# routers PATH [SEAL]: (re)starts both routers with --cross-node-path PATH.
routers() {
  mn_router_down 0
  mn_router_down 1
  local args=(--cross-node-path "$1")
  [[ $1 == direct ]] && args+=(--direct-datagrams)
  [[ -n ${2:-} ]] && args+=(--direct-seal "$2")
  mn_router_up 0 "${args[@]}"
  mn_router_up 1 "${args[@]}"
}

# sockperf_msg_rate POD_SERVER POD_CLIENT SECONDS: TCP throughput mode, 64-byte messages,
# messages per second in millions (sockperf's "SentMessages" rate at the receiver).
sockperf_msg_rate() {
  ip netns exec "$(ff_pod_ns "$1")" sockperf sr --tcp -i "$(ff_pod_ip "$1")" -p 11112 >/dev/null 2>&1 &
  local spid=$!
  FF_PIDS+=("$spid")
  sleep 0.3
  ip netns exec "$(ff_pod_ns "$2")" sockperf tp --tcp -i "$(ff_pod_ip "$1")" -p 11112 -t "$3" -m 64 2>/dev/null |
    awk '/Summary: Message Rate is/ {for (i = 1; i <= NF; i++) if ($i == "is") {printf "%.3f\n", $(i+1) / 1e6; exit}}'
  kill "$spid" 2>/dev/null || true
  wait "$spid" 2>/dev/null || true
}

# sockperf_rtt_us POD_SERVER POD_CLIENT SECONDS: the whole round trip's p50 (ib_read_lat's).
sockperf_rtt_us() { awk '{printf "%.3f\n", 2 * $1}' <<<"$(sockperf_half_rtt_us "$@")"; }

# ucx_final TLS ARGS...: ucx_perftest, server in pod 0, client in pod 1, UCX_TLS=TLS over
# freeflow0:1 (tcp: UCX's own tcp transport over the pods' network); the client's "Final:"
# line's fields (iterations, typical/average/overall latency in usec, average/overall
# bandwidth in MB/s, message rates), "n/a" when it failed.
ucx_final() {
  local tls=$1
  shift
  local list="$tls,self" env
  env=(env UCX_TLS="$list" UCX_NET_DEVICES=freeflow0:1)
  [[ $tls == tcp ]] && env=(env UCX_TLS="$list")
  pod_bg 0 "${env[@]}" timeout 60 ucx_perftest -p 13337 >"$FF_DIR/ucx-server.log" 2>&1
  local spid=$FF_LAST_PID
  wait_listen 0 "$spid" 13337 || true
  pod_run 1 "${env[@]}" timeout 60 ucx_perftest "$(ff_pod_ip 0)" -p 13337 "$@" \
    >"$FF_DIR/ucx-client.log" 2>&1 || true
  wait_pid "$spid" 30 >/dev/null || true
  awk '/^Final:/ {$1 = ""; print; found = 1; exit} END {if (!found) print "n/a"}' \
    "$FF_DIR/ucx-client.log"
}
# ucx_bw TLS: tag_bw 1 MiB, overall MB/s. ucx_lat TLS: tag_lat 8 B, typical usec (one way).
ucx_bw() { ucx_final "$1" -t tag_bw -s 1048576 -n "${2:-400}" | awk '{print ($1 == "n/a") ? "n/a" : $6}'; }
ucx_lat() { ucx_final "$1" -t tag_lat -s 8 -n 20000 | awk '{print ($1 == "n/a") ? "n/a" : $2}'; }

# rstream_gbps: rstream (rsockets over rdma_cm) 64 KiB x 20,000 from pod 1 to pod 0, Gbit/s.
rstream_gbps() {
  local tool=${1:-rstream}
  pod_bg 0 "$tool" -S 65536 -C 20000 >"$FF_DIR/rs-server.log" 2>&1
  local spid=$FF_LAST_PID
  sleep 0.5
  pod_run 1 timeout 60 "$tool" -s "$(ff_pod_ip 0)" -S 65536 -C 20000 \
    >"$FF_DIR/rs-client.log" 2>&1 || true
  wait_pid "$spid" 30 >/dev/null || true
  awk '$1 == "custom" && NF >= 7 {print $(NF - 1); found = 1; exit} END {if (!found) print "n/a"}' \
    "$FF_DIR/rs-client.log"
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
routers_ticks() { echo $(($(cpu_ticks "${FF_NODE_ROUTER[0]}") + $(cpu_ticks "${FF_NODE_ROUTER[1]}"))); }
# routers_cores: both routers' CPU (cores) while a 10 s ib_write_bw runs; prints "cores gbps".
routers_cores() {
  local t0 start gbps
  t0=$(routers_ticks)
  start=$(date +%s.%N)
  gbps=$(perftest_run 0 1 bw ib_write_bw -s 65536 -D 10)
  awk -v t="$(($(routers_ticks) - t0))" -v hz="$(getconf CLK_TCK)" -v s="$start" \
    -v e="$(date +%s.%N)" -v g="$gbps" 'BEGIN{printf "%.2f %s\n", t / hz / (e - s), g}'
}

declare -a tcp=() tlat=() trtt=() trate=() wbw=() slat=() rlat=() sbw=() wbw_auth=() \
  relay_wbw=() relay_slat=() relay_uud_bw=() utcp_bw=() utcp_lat=() urc_bw=() urc_lat=() uud_bw=() rs=() ris=()
for ((r = 1; r <= RUNS; r++)); do
  echo "run $r/$RUNS" >&2
  tcp+=("$(iperf3_gbps 0 1 3)")
  tlat+=("$(sockperf_half_rtt_us 0 1 2)")
  trtt+=("$(sockperf_rtt_us 0 1 2)")
  trate+=("$(sockperf_msg_rate 0 1 2)")
  routers direct
  wbw+=("$(perftest_run 0 1 bw ib_write_bw -s 65536 -n 5000)")
  slat+=("$(perftest_run 0 1 typical ib_send_lat -s 2 -n 5000)")
  rlat+=("$(perftest_run 0 1 typical ib_read_lat -s 2 -n 5000)")
  sbw+=("$(perftest_run 0 1 mpps ib_send_bw -s 64 -n 200000)")
  utcp_bw+=("$(ucx_bw tcp)")
  urc_bw+=("$(ucx_bw rc_v)")
  utcp_lat+=("$(ucx_lat tcp)")
  urc_lat+=("$(ucx_lat rc_v)")
  uud_bw+=("$(ucx_bw ud_v 40)")
  rs+=("$(rstream_gbps rstream)")
  ris+=("$(rstream_gbps riostream)")
  routers direct authenticate
  wbw_auth+=("$(perftest_run 0 1 bw ib_write_bw -s 65536 -n 5000)")
  routers relay
  relay_wbw+=("$(perftest_run 0 1 bw ib_write_bw -s 65536 -n 5000)")
  relay_slat+=("$(perftest_run 0 1 typical ib_send_lat -s 2 -n 5000)")
  relay_uud_bw+=("$(ucx_bw ud_v 40)")
done
routers relay
read -r relay_cores relay_gbps <<<"$(routers_cores)"
routers direct
read -r direct_cores direct_gbps <<<"$(routers_cores)"

med() { stats "$@" | awk '{print $1}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b == 0 || a == "n/a" || b == "n/a") print "n/a"; else printf "%.2f", a / b }'; }
row() { printf '%-50s %-26s %s\n' "$1" "$(fmt_stats "$(stats "${@:3}")")" "$2"; }
# against LABEL TARGET BASE FIGURE: the row of array FIGURE, with the ratio of its median to
# the median of array BASE (measured between the same pods in the same runs) and the target.
against() {
  local -n fig=$4 base=$3
  row "$1" "$(ratio "$(med "${fig[@]}")" "$(med "${base[@]}")")x $2" "${fig[@]}"
}
echo
echo "direct path across nodes: median (min..max) of $RUNS runs, the same two pods; TLS node links"
against "ib_write_bw 64 KiB, Gbit/s" "iperf3 (>= 0.80)" tcp wbw
against "ib_write_bw 64 KiB, seal=authenticate, Gbit/s" "iperf3 (>= 0.95)" tcp wbw_auth
row "  iperf3 single stream, Gbit/s" "" "${tcp[@]}"
against "ib_send_lat 2 B t_typical, usec" "sockperf (<= 1.2)" tlat slat
row "  sockperf ping-pong p50 (half RTT), usec" "" "${tlat[@]}"
against "ib_read_lat 2 B t_typical, usec" "sockperf RTT (<= 1.2)" trtt rlat
row "  sockperf ping-pong p50 (whole RTT), usec" "" "${trtt[@]}"
against "ib_send_bw 64 B, Mmsg/s" "sockperf (>= 1)" trate sbw
row "  sockperf throughput 64 B, Mmsg/s" "" "${trate[@]}"
against "UCX tag_bw 1 MiB over rc_v (direct), MB/s" "UCX tcp (>= 1)" utcp_bw urc_bw
against "UCX tag_bw 1 MiB over ud_v (direct), MB/s" "UCX tcp (>= 0.5)" utcp_bw uud_bw
row "  UCX tag_bw 1 MiB over UCX's tcp, MB/s" "" "${utcp_bw[@]}"
against "UCX tag_lat 8 B over rc_v (direct), usec" "UCX tcp (<= 1.2)" utcp_lat urc_lat
row "  UCX tag_lat 8 B over UCX's tcp, usec" "" "${utcp_lat[@]}"
against "rstream 64 KiB (rsockets), Gbit/s" "iperf3 (>= 0.80)" tcp rs
against "riostream 64 KiB (rsockets), Gbit/s" "iperf3 (>= 0.80)" tcp ris
row "relay (--cross-node-path relay) ib_write_bw, Gbit/s" "" "${relay_wbw[@]}"
row "relay ib_send_lat 2 B, usec" "" "${relay_slat[@]}"
row "relay UCX tag_bw 1 MiB over ud_v, MB/s" "" "${relay_uud_bw[@]}"
printf '%-50s %-26s %s\n' "routers' CPU, 10 s ib_write_bw, relay, cores" "$relay_cores" "at $relay_gbps Gbit/s"
printf '%-50s %-26s %s\n' "routers' CPU, 10 s ib_write_bw, direct, cores" "$direct_cores" "at $direct_gbps Gbit/s"

# One frame sealed and opened by each implementation FrameCipher chooses between
# (bench/seal_bench, medians of 5): the vector code (intel-ipsec-mb) where the CPU has it,
# else nettle's below FrameCipher::kSmallBody and OpenSSL's above.
seal=$("$FF_BUILD/bench/seal_bench" --benchmark_format=csv --benchmark_filter="/body:(96|32768)/" 2>/dev/null || true)
seal_ns() {
  awk -F, -v n="\"BM_$1/body:$2/impl:$3/repeats:5_median\"" '$1 == n {printf "%.0f", $4; f = 1}
    END {if (!f) printf "n/a"}' <<<"$seal"
}
for op in Seal Open; do
  for body in 96 32768; do
    printf '%-50s %s\n' "$op, $body B body, ns" "$(seal_ns "$op" "$body" 2) vector (ipsec-mb), \
$(seal_ns "$op" "$body" 0) nettle, $(seal_ns "$op" "$body" 1) OpenSSL"
  done
done
