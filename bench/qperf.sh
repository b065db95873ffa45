#!/usr/bin/env bash
# make bench: event-driven verbs software (qperf, unmodified) beside perftest between the
# same two pods, on one node and across two nodes (TLS node links), and the cost of one
# wake-up between two processes (an eventfd ping-pong). Each figure is the median (min..max)
# of RUNS runs. Targets (issue 11): qperf bandwidth within 20% of perftest's at the same
# message size (64 KiB); qperf's event-mode latency at most perftest's polling latency plus
# one wake-up.
set -euo pipefail
BUILD=${1:-build}
RUNS=${RUNS:-5}
FF_BUILD=$(cd "$BUILD" && pwd)
export FF_BUILD
cd "$(dirname "$0")/.."
source scripts/lib/cluster.sh
source scripts/lib/measure.sh

# run_pair PORT_REGEX SERVER_CMD... -- CLIENT_ARGS...: a server in the server pod, the client
# (the same command plus the server's address) in the client pod; the client's output.
run_pair() {
  local port=$1
  shift
  pod_bg 0 "$@" >"$FF_DIR/bench-server.log" 2>&1
  local spid=$FF_LAST_PID
  wait_listen 0 "$spid" "$port" || true
  pod_run 1 timeout 60 "$@" "$(ff_pod_ip 0)" 2>&1 || true
  wait_pid "$spid" 30 >/dev/null || true
}
# qperf_figure TEST: its result, latency in usec or bandwidth in Gbit/s.
qperf_figure() {
  pod_bg 0 qperf >"$FF_DIR/bench-server.log" 2>&1
  local spid=$FF_LAST_PID
  wait_listen 0 "$spid" 19765 || true
  pod_run 1 timeout 60 qperf -t 2 "$(ff_pod_ip 0)" "$1" 2>&1 | awk '
    /(bw|latency) += / {
      v = $3; u = $4
      if (u == "ns") v /= 1000; else if (u == "ms") v *= 1000
      else if (u == "GB/sec") v *= 8; else if (u == "MB/sec") v *= 0.008; else if (u == "KB/sec") v *= 0.000008
      printf "%.3f\n", v; exit }'
  kill "$spid" 2>/dev/null || true
  wait "$spid" 2>/dev/null || true
}
perftest_bw() { run_pair 18515 "$@" | awk '/^ +[0-9]+ +[0-9]+ / {v = $4} END {printf "%.3f\n", v * 1048576 * 8 / 1e9}'; }
perftest_lat() { run_pair 18515 "$@" | awk '/^ +[0-9]+ +[0-9]+ / {v = $5} END {printf "%.3f\n", v}'; }
wakeup_us() {
  "$FF_BUILD/bench/wakeup_pingpong" --benchmark_format=csv 2>/dev/null |
    awk -F, '/real_time",/ {printf "%.3f\n", $3 / 2000}'
}

measure() {  # measure WHERE: the table for one placement of the pods
  local where=$1 r
  local -a qlat=() qbw=() qwbw=() plat=() elat=() pbw=() pwbw=() wake=()
  for ((r = 1; r <= RUNS; r++)); do
    echo "$where: run $r/$RUNS" >&2
    qlat+=("$(qperf_figure rc_lat)")
    qbw+=("$(qperf_figure rc_bw)")
    qwbw+=("$(qperf_figure rc_rdma_write_bw)")
    plat+=("$(perftest_lat ib_send_lat -s 1 -n 20000)")
    elat+=("$(perftest_lat ib_send_lat -s 1 -e -n 20000)")
    pbw+=("$(perftest_bw ib_send_bw -s 65536 -D 2)")
    pwbw+=("$(perftest_bw ib_write_bw -s 65536 -D 2)")
  done
  mapfile -t wake < <(wakeup_us)
  local ql qb qw pl el pb pw wk
  ql=$(stats "${qlat[@]}") qb=$(stats "${qbw[@]}") qw=$(stats "${qwbw[@]}") pl=$(stats "${plat[@]}")
  el=$(stats "${elat[@]}") pb=$(stats "${pbw[@]}") pw=$(stats "${pwbw[@]}") wk=$(stats "${wake[@]}")
  fmt() { awk '{printf "%s (%s..%s)", $1, $2, $3}' <<<"$1"; }
  pct() { awk -v a="${1%% *}" -v b="${2%% *}" 'BEGIN { if (b > 0) printf "%.0f%%", 100 * a / b; else print "n/a" }'; }
  echo
  echo "freeflow qperf benchmark, $where: median (min..max) of $RUNS runs"
  printf '%-50s %-30s %s\n' "figure" "value" "target"
  printf '%-50s %-30s %s\n' "qperf rc_bw 64 KiB, Gbit/s" "$(fmt "$qb")" "$(pct "$qb" "$pb") of ib_send_bw (>= 80%)"
  printf '%-50s %-30s %s\n' "  ib_send_bw 64 KiB, Gbit/s" "$(fmt "$pb")" ""
  printf '%-50s %-30s %s\n' "qperf rc_rdma_write_bw 64 KiB, Gbit/s" "$(fmt "$qw")" "$(pct "$qw" "$pw") of ib_write_bw (>= 80%)"
  printf '%-50s %-30s %s\n' "  ib_write_bw 64 KiB, Gbit/s" "$(fmt "$pw")" ""
  local bound
  bound=$(awk -v a="${pl%% *}" -v b="${wk%% *}" 'BEGIN {printf "%.3f", a + b}')
  printf '%-50s %-30s %s\n' "qperf rc_lat (event mode) 1 B, usec" "$(fmt "$ql")" \
    "<= ib_send_lat + one wake-up = $bound ($(awk -v a="${ql%% *}" -v b="$bound" 'BEGIN {print (a <= b) ? "met" : "NOT met"}'))"
  printf '%-50s %-30s %s\n' "  ib_send_lat (polling) 1 B t_typical, usec" "$(fmt "$pl")" ""
  printf '%-50s %-30s %s\n' "  ib_send_lat -e (event mode) 1 B t_typical, usec" "$(fmt "$el")" ""
  printf '%-50s %-30s %s\n' "  eventfd ping-pong half round trip, usec" "$(fmt "$wk")" ""
}

trap two_pods_down EXIT
two_pods_up same
same=$(measure "two pods on one node")
two_pods_down
two_pods_up cross
cross=$(measure "pods on two nodes (TLS node links)")
echo "$same"
echo "$cross"
