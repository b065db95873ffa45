#!/usr/bin/env bash
# What a direct connection between two pod processes on two nodes can reach on this machine
# (bench/direct_floor.cc: frames sealed, opened and landed as the data path must), beside
# iperf3 and sockperf between the same two pods in the same run: median (min..max) of RUNS.
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
floor="$FF_BUILD/bench/direct_floor"

# direct PODSERVER PODCLIENT bw|lat MODE ARG
direct() {
  ip netns exec "$(ff_pod_ns "$1")" "$floor" serve 7400 "$4" >/dev/null 2>&1 &
  local spid=$!
  FF_PIDS+=("$spid")
  ip netns exec "$(ff_pod_ns "$2")" "$floor" "$3" "$(ff_pod_ip "$1")" 7400 "$4" "$5" || true
  wait_pid "$spid" 20 >/dev/null || true
}

declare -a tcp=() tlat=() bw_auth=() bw_enc=() lat_auth=() lat_enc=()
for ((r = 1; r <= RUNS; r++)); do
  echo "run $r/$RUNS" >&2
  tcp+=("$(iperf3_gbps 0 1 3)")
  tlat+=("$(sockperf_half_rtt_us 0 1 2)")
  bw_auth+=("$(direct 0 1 bw auth 3)")
  bw_enc+=("$(direct 0 1 bw encrypt 3)")
  lat_auth+=("$(direct 0 1 lat auth 20000)")
  lat_enc+=("$(direct 0 1 lat encrypt 20000)")
done
row() { printf '%-52s %s\n' "$1" "$(fmt_stats "$(stats "${@:2}")")"; }
echo
echo "direct connection floor across nodes: median (min..max) of $RUNS runs, same two pods"
row "iperf3 single stream, Gbit/s" "${tcp[@]}"
row "direct frames, authenticated (GMAC), Gbit/s" "${bw_auth[@]}"
row "direct frames, encrypted (AES-128-GCM), Gbit/s" "${bw_enc[@]}"
row "sockperf ping-pong p50 one-way, usec" "${tlat[@]}"
row "direct 2 B frame, authenticated, polling, one-way usec" "${lat_auth[@]}"
row "direct 2 B frame, encrypted, polling, one-way usec" "${lat_enc[@]}"
