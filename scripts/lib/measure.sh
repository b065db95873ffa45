# shellcheck shell=bash
# Measurement helpers shared by the demo and the benchmark. Each prints one number.
# Requires scripts/lib/cluster.sh to be sourced and a cluster with a router to be up.

# perftest_run POD_SERVER POD_CLIENT FIELD TOOL ARGS...: runs an unmodified perftest
# tool between two pods over freeflow and prints one column of its result line
# (FIELD: bw = BW average [Gbit/s], mpps = MsgRate, typical = t_typical [usec]). With -R
# the pair meets over rdma_cm instead of a TCP socket.
perftest_run() {
  local s=$1 c=$2 field=$3 attempt
  shift 3
  # With -R, perftest's client may lose perftest's own race (tests/integration/rdmacm/rdmacm.sh,
  # again_if_perftest_raced): it is rejected, its server waits for nobody. Run it again.
  for ((attempt = 1; attempt <= 5; attempt++)); do
    perftest_run_once "$s" "$c" "$@" && break
  done
  perftest_field "$field" "$FF_DIR/pt-client.log"
}

# perftest_run_once S C TOOL ARGS...: one server/client pair; false only when a -R client
# was rejected for want of a listener (perftest's race), after stopping the server.
perftest_run_once() {
  local s=$1 c=$2 mark=0
  shift 2
  [[ " $* " == *" -R "* ]] && mark=$(cm_listen_mark "$s")
  pod_bg "$s" "$@" >"$FF_DIR/pt-server.log" 2>&1
  local spid=$FF_LAST_PID
  if [[ " $* " == *" -R "* ]]; then
    cm_wait_listen "$s" "$spid" "$mark" || true
  else
    wait_listen "$s" "$spid" 18515 || true
  fi
  pod_run "$c" timeout 60 "$@" "$(ff_pod_ip "$s")" >"$FF_DIR/pt-client.log" 2>&1
  if [[ " $* " == *" -R "* ]] && perftest_lost_race "$FF_DIR/pt-client.log"; then
    wait_pid "$spid" 1 >/dev/null || true
    return 1
  fi
  wait_pid "$spid" 30 >/dev/null || true
}

# perftest_field FIELD LOG: one column of the result line of a perftest client's output
# (see perftest_run); nothing when there is none.
perftest_field() {
  local line
  line=$(grep -E '^ +[0-9]+ +[0-9]+ ' "$2" | tail -n 1)
  [[ -n $line ]] || return 0  # no result: no figure (stats leaves it out)
  case $1 in
    bw) awk '{printf "%.2f\n", $4 * 1048576 * 8 / 1e9}' <<<"$line" ;;
    mpps) awk '{printf "%.3f\n", $5}' <<<"$line" ;;
    typical) awk '{printf "%.3f\n", $5}' <<<"$line" ;;
  esac
}

# iperf3_gbps POD_SERVER POD_CLIENT SECONDS: single-stream TCP between two pods.
iperf3_gbps() {
  ip netns exec "$(ff_pod_ns "$1")" iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
  local spid=$!
  FF_PIDS+=("$spid")
  sleep 0.3
  ip netns exec "$(ff_pod_ns "$2")" iperf3 -c "$(ff_pod_ip "$1")" -p 5201 -t "$3" -f g 2>/dev/null |
    awk '/receiver/ {printf "%.2f\n", $7}'
  wait_pid "$spid" 10 >/dev/null || true
}

# sockperf_half_rtt_us POD_SERVER POD_CLIENT SECONDS: TCP ping-pong, p50 of half the
# round trip (what sockperf reports), in microseconds.
sockperf_half_rtt_us() {
  ip netns exec "$(ff_pod_ns "$1")" sockperf sr --tcp -i "$(ff_pod_ip "$1")" -p 11111 >/dev/null 2>&1 &
  local spid=$!
  FF_PIDS+=("$spid")
  sleep 0.3
  ip netns exec "$(ff_pod_ns "$2")" sockperf pp --tcp -i "$(ff_pod_ip "$1")" -p 11111 -t "$3" -m 14 2>/dev/null |
    awk '/percentile 50.000 =/ {printf "%.3f\n", $NF}'
  kill "$spid" 2>/dev/null || true
  wait "$spid" 2>/dev/null || true
}

# stats V1 V2 ...: "median min max" of the numbers (empty ones, failed runs, left out).
stats() {
  printf '%s\n' "$@" | sort -g | awk 'NF {v[++n] = $1} END {
    if (n == 0) { print "n/a n/a n/a"; exit }
    m = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    printf "%.3f %.3f %.3f\n", m, v[1], v[n] }'
}

# fmt_stats "MEDIAN MIN MAX": "MEDIAN (MIN..MAX)", as the benchmark tables print a figure.
fmt_stats() { awk '{ if ($1 == "n/a") print "n/a"; else printf "%s (%s..%s)", $1, $2, $3 }' <<<"$1"; }
