#!/usr/bin/env bash
# make bench (issue 12): rdma_cm between the same two pods, on one node and across two nodes
# (TLS node links), each figure the median (min..max) of RUNS runs beside its baseline from
# the same run:
#   - connections set up and torn down per second (bench/cm_rate: connect, accept,
#     ESTABLISHED on both sides, disconnect, DISCONNECTED, destroy) beside TCP's
#     connect/accept/close; targets: at least 1/2 of TCP's on one node and 1/4 across nodes
#     (issue 12), and 1/2 across nodes (issue 36, the cross-node data path);
#     one connection at a time (the target's figure), then IN_FLIGHT at a time (for
#     information: how each scales when a program opens many at once, as cmtime does);
#   - one at a time, the CPU time a connection costs: client and server processes (all
#     their threads, cm_rate's own figures) and, for rdma_cm, the router(s) (all threads,
#     /proc/PID/task/*/schedstat over the whole run: the warm-up connection and the
#     sessions' set-up are charged too); on two vCPUs a rate is bounded by 2 s of CPU;
#   - rping's time per ping (the difference of a long and a short run, so that set-up is
#     left out), beside ib_send_lat;
#   - ib_send_lat -R and ib_write_bw -R (connected by rdma_cm) beside the same tools
#     connected over their TCP socket; target: equal within noise (the -R median inside the
#     other's min..max, or within 5% of its median).
set -euo pipefail
BUILD=${1:-build}
RUNS=${RUNS:-5}
CONNS_RDMA=${CM_CONNS_RDMA:-300}
CONNS_TCP=${CM_CONNS_TCP:-2000}
IN_FLIGHT=${CM_IN_FLIGHT:-16}
FF_BUILD=$(cd "$BUILD" && pwd)
export FF_BUILD
cd "$(dirname "$0")/.."
source scripts/lib/cluster.sh
export FF_ROUTER_LOG=info  # cm_wait_listen reads the router's rdma_cm listens
source scripts/lib/measure.sh
CM_RATE=${FF_CM_RATE:-$FF_BUILD/bench/cm_rate}

# router_cpu_ns: the CPU time (ns) the router(s) of this placement have used so far.
router_cpu_ns() {
  local -a pids=("$FF_ROUTER_PID")
  [[ $FF_PLACEMENT == cross ]] && pids=("${FF_NODE_ROUTER[0]}" "${FF_NODE_ROUTER[1]}")
  local p t ns sum=0
  for p in "${pids[@]}"; do
    for t in /proc/"$p"/task/*/schedstat; do
      read -r ns _ <"$t" 2>/dev/null && sum=$((sum + ns))
    done
  done
  echo "$sum"
}

# conn_rate rdma|tcp PORT COUNT [IN_FLIGHT]: connections per second from pod 1 to pod 0
# (nothing when the run failed; its logs stay in $FF_DIR/rate-*.log). One at a time, it
# also appends "CPU_US ROUTER_US" a connection to $FF_DIR/cpu-<kind>.txt: client + server
# (+ router for rdma_cm), and the router's part.
conn_rate() {
  local w=${4:-1} r0 r1
  r0=$(router_cpu_ns)
  pod_bg 0 "$CM_RATE" "$1-server" "$2" "$3" "$w" >"$FF_DIR/rate-server.log" 2>&1
  local spid=$FF_LAST_PID
  pod_run 1 timeout 120 "$CM_RATE" "$1-client" "$(ff_pod_ip 0)" "$2" "$3" "$w" >"$FF_DIR/rate-client.log" 2>&1 || true
  wait_pid "$spid" 30 >/dev/null || true
  r1=$(router_cpu_ns)
  if [[ $w -eq 1 ]]; then
    cat "$FF_DIR/rate-client.log" "$FF_DIR/rate-server.log" | awk -v kind="$1" -v n="$3" \
      -v router_ns=$((r1 - r0)) '/ cpu us a connection: / {sum += $(NF - 2) + $NF; got++}
      END { if (got != 2) exit
            r = (kind == "rdma") ? router_ns / 1000 / (n + 1) : 0
            printf "%.1f %.1f\n", sum + r, r }' >>"$FF_DIR/cpu-$1.txt"
  fi
  awk '/ connections: / {for (i = 1; i < NF; i++) if ($i == "rate") print $(i + 1)}' "$FF_DIR/rate-client.log"
  grep -q ' connections: ' "$FF_DIR/rate-client.log" ||
    { echo "cm_rate $1 failed:"; tail -n 3 "$FF_DIR/rate-client.log" "$FF_DIR/rate-server.log"; } >&2
}

# rping_wall_us COUNT: wall time (usec) of an rping client of COUNT pings, server started first.
rping_wall_us() {
  local mark
  mark=$(cm_listen_mark 0)
  pod_bg 0 rping -s -C "$1" >"$FF_DIR/rping-server.log" 2>&1
  local spid=$FF_LAST_PID t0 t1 st=0
  cm_wait_listen 0 "$spid" "$mark" || true
  t0=$(date +%s%N)
  pod_run 1 timeout 60 rping -c -a "$(ff_pod_ip 0)" -C "$1" >"$FF_DIR/rping-client.log" 2>&1 || st=1
  t1=$(date +%s%N)
  wait_pid "$spid" 30 >/dev/null || st=1
  [[ $st -eq 0 ]] && echo $(((t1 - t0) / 1000))
  [[ $st -eq 0 ]] || { echo "rping -C $1 failed:"; tail -n 3 "$FF_DIR"/rping-*.log; } >&2
  return 0
}

# rping_us: microseconds a ping, from a 5000-ping and a 200-ping run.
rping_us() {
  local long short
  long=$(rping_wall_us 5000)
  short=$(rping_wall_us 200)
  [[ -n $long && -n $short ]] && awk -v l="$long" -v s="$short" 'BEGIN {printf "%.3f\n", (l - s) / 4800}'
  return 0
}

# add ARRAY VALUE: appends VALUE when the run gave one.
add() { [[ -z $2 ]] || eval "$1+=(\"\$2\")"; }

measure() {  # measure WHERE RATE_DIVISORS: the table for one placement of the pods
  local where=$1 divs=$2 r
  local -a cm=() tcp=() cmw=() tcpw=() rp=() lr=() lp=() br=() bp=()
  for ((r = 1; r <= RUNS; r++)); do
    echo "$where: run $r/$RUNS" >&2
    add cm "$(conn_rate rdma $((7700 + r)) "$CONNS_RDMA")"
    add tcp "$(conn_rate tcp $((7800 + r)) "$CONNS_TCP")"  # a fresh port: no TIME_WAIT reuse
    add cmw "$(conn_rate rdma $((7900 + r)) $((CONNS_RDMA * 4)) "$IN_FLIGHT")"
    add tcpw "$(conn_rate tcp $((7600 + r)) $((CONNS_TCP * 4)) "$IN_FLIGHT")"
    add rp "$(rping_us)"
    add lr "$(perftest_run 0 1 typical ib_send_lat -R -s 2 -n 20000)"
    add lp "$(perftest_run 0 1 typical ib_send_lat -s 2 -n 20000)"
    add br "$(perftest_run 0 1 bw ib_write_bw -R -s 65536 -n 5000)"
    add bp "$(perftest_run 0 1 bw ib_write_bw -s 65536 -n 5000)"
  done
  local scm stcp scmw stcpw srp slr slp sbr sbp ccm crt ctcp
  scm=$(stats "${cm[@]}") stcp=$(stats "${tcp[@]}") srp=$(stats "${rp[@]}") slr=$(stats "${lr[@]}")
  ccm=$(stats "$(awk '{print $1}' "$FF_DIR/cpu-rdma.txt" 2>/dev/null)")
  crt=$(stats "$(awk '{print $2}' "$FF_DIR/cpu-rdma.txt" 2>/dev/null)")
  ctcp=$(stats "$(awk '{print $1}' "$FF_DIR/cpu-tcp.txt" 2>/dev/null)")
  scmw=$(stats "${cmw[@]}") stcpw=$(stats "${tcpw[@]}")
  slp=$(stats "${lp[@]}") sbr=$(stats "${br[@]}") sbp=$(stats "${bp[@]}")
  rate_target() {  # rate_target STATS_RDMA STATS_TCP [info]: the ratio, against each target
    awk -v a="${1%% *}" -v b="${2%% *}" -v divs="$divs" -v info="${3:-}" 'BEGIN {
      if (a == "n/a" || b == "n/a" || b == 0) { print "n/a"; exit }
      printf "%.0f%% of TCP", 100 * a / b
      if (info != "") { print " (information)"; exit }
      n = split(divs, d, ",")
      for (i = 1; i <= n; i++) {
        split(d[i], t, ":")
        printf " (>= %.0f%%, issue %s: %s)", 100 / t[1], t[2], (a * t[1] >= b) ? "met" : "NOT met"
      }
      print "" }'
  }
  same_target() {  # same_target STATS_R STATS_BASE: the -R figure equal to the other within noise
    read -r m _ _ <<<"$1"
    read -r bm blo bhi <<<"$2"
    awk -v m="$m" -v bm="$bm" -v lo="$blo" -v hi="$bhi" 'BEGIN {
      if (m == "n/a" || bm == "n/a" || bm == 0) { print "n/a"; exit }
      ok = (m >= lo && m <= hi) || (m - bm <= 0.05 * bm && bm - m <= 0.05 * bm)
      printf "%+.1f%% (equal within noise: %s)", 100 * (m - bm) / bm, ok ? "met" : "NOT met" }'
  }
  echo
  echo "freeflow rdma_cm benchmark, $where: median (min..max) of $RUNS runs"
  printf '%-52s %-30s %s\n' "figure" "value" "target"
  printf '%-52s %-30s %s\n' "rdma_cm connections set up + torn down per second" "$(fmt_stats "$scm")" "$(rate_target "$scm" "$stcp")"
  printf '%-52s %-30s %s\n' "  TCP connect/accept/close per second" "$(fmt_stats "$stcp")" ""
  printf '%-52s %-30s %s\n' "CPU usec a connection: rdma_cm client+server+router" "$(fmt_stats "$ccm")" "router(s): ${crt%% *}"
  printf '%-52s %-30s %s\n' "  CPU usec a connection: TCP client+server" "$(fmt_stats "$ctcp")" ""
  printf '%-52s %-30s %s\n' "the same with $IN_FLIGHT in flight: rdma_cm per second" "$(fmt_stats "$scmw")" "$(rate_target "$scmw" "$stcpw" info)"
  printf '%-52s %-30s %s\n' "  TCP per second, $IN_FLIGHT in flight" "$(fmt_stats "$stcpw")" ""
  printf '%-52s %-30s %s\n' "rping, usec a ping (64 B, 2 SENDs + READ + WRITE)" "$(fmt_stats "$srp")" ""
  printf '%-52s %-30s %s\n' "ib_send_lat -R 2 B t_typical, usec" "$(fmt_stats "$slr")" "$(same_target "$slr" "$slp")"
  printf '%-52s %-30s %s\n' "  ib_send_lat 2 B t_typical, usec" "$(fmt_stats "$slp")" ""
  printf '%-52s %-30s %s\n' "ib_write_bw -R 64 KiB, Gbit/s" "$(fmt_stats "$sbr")" "$(same_target "$sbr" "$sbp")"
  printf '%-52s %-30s %s\n' "  ib_write_bw 64 KiB, Gbit/s" "$(fmt_stats "$sbp")" ""
}

trap two_pods_down EXIT
two_pods_up same
same=$(measure "two pods on one node" 2:12)
two_pods_down
two_pods_up cross
cross=$(measure "pods on two nodes (TLS node links)" 4:12,2:36)
echo "$same"
echo "$cross"
