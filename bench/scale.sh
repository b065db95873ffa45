#!/usr/bin/env bash
# make bench (issue 40): one router and N pods for N in STEPS (1 64 256), each pod a network
# namespace whose process (bench/scale_pod) opens the device, creates QPS RC QPs, registers
# MIB MiB and brings every QP to RTS towards a QP of its partner pod (pods added in one step
# pair up; one left over pairs its QPs with each other), and holds it all. At each N, while
# they hold it:
#   - a probe pair of pods on the node's bridge: ib_send_lat's t_typical (2 B), and the time
#     one rdma_cm connection takes (bench/cm_rate, connect to ESTABLISHED and torn down),
#     each the median (min..max) of RUNS runs;
#   - the router, from its /metrics: sessions, QPs, regions, descriptors, resident memory,
#     the CPU it used over the step (the pods' set-up and the probes), and the p99 of its
#     loop's turns over the step (from the turn histogram: the bucket it falls in).
# Then every scale pod is killed -9 at once, and the router must come back to where it was
# before the first one: sessions, pods, QPs, objects, regions, MR entries and descriptors
# exactly, resident memory reported beside it; the probes run once more.
# Goals (issue 40): at 256 pods and 16,384 QPs the probe's ib_send_lat within 1.5x of its
# figure at one pod, a connect within 2x, the router under 1 GiB resident and its loop's p99
# under 1 ms; back to the baseline after the mass kill.
set -euo pipefail
BUILD=${1:-build}
STEPS=${SCALE_STEPS:-"1 64 256"}
QPS=${SCALE_QPS:-64}
MIB=${SCALE_MIB:-1}
RUNS=${RUNS:-5}
CONNS=${SCALE_CONNS:-100}
QUIET_S=${SCALE_QUIET_S:-10}
FF_BUILD=$(cd "$BUILD" && pwd)
export FF_BUILD
cd "$(dirname "$0")/.."
FF_POD_FDS=""  # the router's own descriptor quota, fitted to its limit, as a node's would be
source scripts/lib/cluster.sh
export FF_ROUTER_LOG=info  # cm_wait_listen reads the router's rdma_cm listens
source scripts/lib/measure.sh
SCALE_POD=$FF_BUILD/bench/scale_pod
CM_RATE=$FF_BUILD/bench/cm_rate
SCALE_PIDS=()

scale_ns() { echo "ff${FF_TAG}s$1"; }
# Scale pods live in the two /24s above the probe pods' (FF_NET stays below 180: valid LIDs).
scale_ip() { echo "10.244.$((FF_NET + 1 + $1 / 200)).$((10 + $1 % 200))"; }

# metrics FILE: the router's /metrics, scraped from the node's namespace, into FILE.
metrics() {
  ip netns exec "$FF_NODE" python3 -c 'import sys, urllib.request
sys.stdout.write(urllib.request.urlopen("http://" + sys.argv[1] + "/metrics", timeout=10).read().decode())' \
    "$METRICS" >"$1"
}
# metric FILE NAME: the value of the unlabelled sample NAME.
metric() { awk -v n="$2" '$1 == n {printf "%.0f\n", $2; f = 1} END {exit !f}' "$1"; }
# turn_counts BEFORE AFTER: the loop's turns between two scrapes, by bucket (not cumulative).
turn_counts() {
  awk '/^freeflow_router_loop_turn_seconds_bucket/ {
         match($0, /le="[^"]*"/); le = substr($0, RSTART + 4, RLENGTH - 5)
         if (FNR == NR) before[le] = $2; else { n++; les[n] = le; after[le] = $2 }
       }
       END { prev = 0
             for (i = 1; i <= n; i++) { c = after[les[i]] - before[les[i]]
               printf "%s%s %d", (i > 1 ? ", " : ""), (les[i] == "+Inf" ? "more" : "<= " les[i] * 1000 " ms"), c - prev
               prev = c }
             print "" }' "$1" "$2"
}
# turn_p99 BEFORE AFTER: the upper bound (ms) of the loop-turn bucket the p99 of the turns
# between two scrapes falls in.
turn_p99() {
  awk '/^freeflow_router_loop_turn_seconds_bucket/ {
         match($0, /le="[^"]*"/); le = substr($0, RSTART + 4, RLENGTH - 5)
         if (FNR == NR) before[le] = $2; else { n++; les[n] = le; after[le] = $2 }
       }
       END {
         total = after["+Inf"] - before["+Inf"]
         if (total <= 0) { print "n/a"; exit }
         for (i = 1; i <= n; i++) if (after[les[i]] - before[les[i]] >= 0.99 * total) {
           if (les[i] == "+Inf") print "> last bucket"; else printf "%.3g\n", les[i] * 1000
           exit
         } }' "$1" "$2"
}

# scale_up FIRST COUNT: pods FIRST.. FIRST+COUNT-1 started, paired among themselves, and
# waited for (every one at RTS, at most 600 s); false when one fails.
scale_up() {
  local first=$1 k ns partner last=$(($1 + $2 - 1)) i p
  for ((k = first; k <= last; k++)); do
    ns=$(scale_ns "$k")
    ip netns add "$ns"
    FF_PODS+=("$ns")
    ip -n "$ns" link set lo up
    # A veth to the node, as every pod has (the router checks it), off the bridge: the pod
    # talks to nobody but the router, over its socket.
    ip link add "ffs${FF_TAG}x$k" type veth peer name eth0 netns "$ns"
    ip link set "ffs${FF_TAG}x$k" netns "$FF_NODE"
    ip -n "$FF_NODE" link set "ffs${FF_TAG}x$k" up
    ip -n "$ns" addr add "$(scale_ip "$k")/32" dev eth0
    ip -n "$ns" link set eth0 up
  done
  for ((k = first; k <= last; k++)); do
    partner=$((first + ((k - first) ^ 1)))
    ((partner > last)) && partner=$k
    ip netns exec "$(scale_ns "$k")" env FREEFLOW_DIR="$FF_DIR" FFR_NAME=ffrouter \
      LD_PRELOAD="$FF_DIR/libffverbs.so" "$SCALE_POD" "$MEET" "$k" "$partner" "$QPS" "$MIB" \
      >"$MEET/$k.log" 2>&1 &
    SCALE_PIDS+=("$!")
    FF_PIDS+=("$!")
    disown "$!"  # killed -9 below: no job report for each
  done
  for ((i = 0; i < 12000; i++)); do
    k=$(find "$MEET" -name '*.ready' | wc -l)
    ((k >= last + 1)) && return 0
    for p in "${SCALE_PIDS[@]}"; do
      kill -0 "$p" 2>/dev/null && continue
      echo "a scale pod exited:" >&2
      grep -h . "$MEET"/*.log | sort | uniq -c | head -n 5 >&2
      return 1
    done
    sleep 0.05
  done
  echo "scale pods not ready after 600 s ($k of $((last + 1)))" >&2
  return 1
}

# connect_us PORT: the median time of one rdma_cm connection (CONNS of them, one at a time)
# from probe pod 1 to probe pod 0, in usec; nothing when the run failed.
connect_us() {
  local mark spid
  mark=$(cm_listen_mark 0)
  pod_bg 0 "$CM_RATE" rdma-server "$1" "$CONNS" 1 >"$FF_DIR/cm-server.log" 2>&1
  spid=$FF_LAST_PID
  cm_wait_listen 0 "$spid" "$mark" || true
  pod_run 1 timeout 120 "$CM_RATE" rdma-client "$(ff_pod_ip 0)" "$1" "$CONNS" 1 \
    >"$FF_DIR/cm-client.log" 2>&1 || true
  wait_pid "$spid" 30 >/dev/null || true
  awk '/ connections: / {for (i = 1; i < NF; i++) if ($i == "connection") print $(i + 1)}' \
    "$FF_DIR/cm-client.log"
}

# probes LABEL: RUNS of each probe; sets LAT and CONN to "median min max".
probes() {
  local r
  local -a lat=() conn=()
  for ((r = 1; r <= RUNS; r++)); do
    echo "$1: probes $r/$RUNS" >&2
    lat+=("$(perftest_run 0 1 typical ib_send_lat -s 2 -n 20000)")
    conn+=("$(connect_us $((7700 + r)))")
  done
  LAT=$(stats "${lat[@]}")
  CONN=$(stats "${conn[@]}")
}

ROWS=()
# row N BEFORE SET_UP QUIET AFTER SETUP_S: one line of the table from the scrapes before the
# step, after its pods' set-up, after a quiet while and after the probes.
row() {
  local cpu rss
  cpu=$(awk '$1 == "process_cpu_seconds_total" {if (FNR == NR) a = $2; else b = $2}
             END {printf "%.1f", b - a}' "$2" "$5")
  rss=$(awk '$1 == "process_resident_memory_bytes" {printf "%.0f", $2 / 1048576}' "$5")
  ROWS+=("$(printf '%-6s %-7s %-9s %-24s %-26s %-8s %-7s %-6s %-7s %-7s %-7s %s' "$1" \
    "$(metric "$5" freeflow_router_sessions)" "$(metric "$5" freeflow_router_qps)" \
    "$(fmt_stats "$LAT")" "$(fmt_stats "$CONN")" "$rss" "$(metric "$5" process_open_fds)" \
    "$cpu" "$(turn_p99 "$3" "$4")" "$(turn_p99 "$4" "$5")" "$(turn_p99 "$2" "$3")" "$6")")
}

trap cluster_down EXIT
cluster_up 2
MEET=$FF_DIR/scale  # the pods' meeting folder: outside the node's shared one
mkdir -p "$MEET"
METRICS="10.244.$FF_NET.1:9478"
printf '{"nodes": [{"name": "node0", "address": "10.244.%d.1", "port": 7471, "podCIDRs": ["10.244.%d.0/24", "10.244.%d.0/24", "10.244.%d.0/24"]}]}\n' \
  "$FF_NET" "$FF_NET" $((FF_NET + 1)) $((FF_NET + 2)) >"$FF_DIR/cluster.json"
router_up --control-plane "static:$FF_DIR/cluster.json" --node-name node0 \
  --host-ip "10.244.$FF_NET.1" --port 7471 --insecure-node-links --metrics-address "$METRICS"
grep -h 'descriptor limit' "$FF_DIR/router.log" | sed 's/.*ffrouter: /router: /' >&2 || true

metrics "$FF_DIR/m-base.txt"
have=0
for n in $STEPS; do
  ((n > have)) || continue
  metrics "$FF_DIR/m-$n-0.txt"
  t0=$(date +%s%N)
  scale_up "$have" $((n - have)) || { tail -n 20 "$FF_DIR/router.log" >&2; exit 1; }
  setup=$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN {printf "%.1f", (b - a) / 1e9}')
  have=$n
  metrics "$FF_DIR/m-$n-q.txt"
  sleep "$QUIET_S"  # nothing but the router's own ticks and sweeps over what the pods hold
  metrics "$FF_DIR/m-$n-s.txt"
  probes "$n pods"
  metrics "$FF_DIR/m-$n-1.txt"
  row "$n" "$FF_DIR/m-$n-0.txt" "$FF_DIR/m-$n-q.txt" "$FF_DIR/m-$n-s.txt" "$FF_DIR/m-$n-1.txt" "$setup"
  [[ $n -eq 1 ]] && { LAT1=$LAT CONN1=$CONN; }
  LATN=$LAT CONNN=$CONN
done

# Every scale pod killed -9 at once; the router must let go of all of it.
metrics "$FF_DIR/m-kill-0.txt"
t0=$(date +%s%N)
kill -KILL "${SCALE_PIDS[@]}" 2>/dev/null || true
back=""
GAUGES="freeflow_router_sessions freeflow_router_pods freeflow_router_qps freeflow_router_objects
freeflow_router_regions freeflow_router_mr_entries process_open_fds"
for ((i = 0; i < 600; i++)); do
  metrics "$FF_DIR/m-kill-1.txt"
  same=1
  for g in $GAUGES; do
    [[ $(metric "$FF_DIR/m-kill-1.txt" "$g") == $(metric "$FF_DIR/m-base.txt" "$g") ]] || same=0
  done
  if ((same)); then
    back=$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN {printf "%.1f", (b - a) / 1e9}')
    break
  fi
  sleep 0.1
done
metrics "$FF_DIR/m-kill-q.txt"
sleep "$QUIET_S"
metrics "$FF_DIR/m-kill-s.txt"
probes "after the kill"
metrics "$FF_DIR/m-kill-2.txt"
row "killed" "$FF_DIR/m-kill-0.txt" "$FF_DIR/m-kill-q.txt" "$FF_DIR/m-kill-s.txt" "$FF_DIR/m-kill-2.txt" "$back"

echo
echo "freeflow scale benchmark: one router, N pods x $QPS RC QPs at RTS (paired) + $MIB MiB registered each;"
echo "probes between two more pods, median (min..max) of $RUNS runs; router figures from its /metrics"
echo "(p99: the bucket of the loop-turn histogram (ms) the p99 of its turns falls in: quiet, over"
echo "${QUIET_S} s with the pods holding everything; probes, while they run (two spinning processes"
echo "on this machine's two vCPUs); set-up, while the step's pods start; CPU: the router's over the"
echo "step; set-up s: the step's pods at RTS, or after the kill the router back at its baseline)"
printf '%-6s %-7s %-9s %-24s %-26s %-8s %-7s %-6s %-7s %-7s %-7s %s\n' "pods" "sessns" "QPs" \
  "ib_send_lat 2 B, us" "rdma_cm connect, us" "RSS MiB" "fds" "CPU s" "quiet" "probes" "set-up" \
  "set-up s"
printf '%s\n' "${ROWS[@]}"
echo
ratio() {  # ratio STATS BASE LIMIT: "Rx (<= LIMITx: met|NOT met)"
  awk -v a="${1%% *}" -v b="${2%% *}" -v l="$3" 'BEGIN {
    if (a == "n/a" || b == "n/a" || b == 0) { print "n/a"; exit }
    printf "%.2fx (<= %sx: %s)", a / b, l, (a <= l * b) ? "met" : "NOT met" }'
}
last=${STEPS##* }
lrss=$(awk '$1 == "process_resident_memory_bytes" {printf "%.0f", $2 / 1048576}' "$FF_DIR/m-$last-1.txt")
lp99=$(turn_p99 "$FF_DIR/m-$last-q.txt" "$FF_DIR/m-$last-s.txt")
echo "the loop's turns at $last pods: quiet: $(turn_counts "$FF_DIR/m-$last-q.txt" "$FF_DIR/m-$last-s.txt")"
echo "  during the probes: $(turn_counts "$FF_DIR/m-$last-s.txt" "$FF_DIR/m-$last-1.txt")"
echo "  during the set-up of the step's pods: $(turn_counts "$FF_DIR/m-$last-0.txt" "$FF_DIR/m-$last-s.txt")"
echo "goals at $last pods (the machine's own latency moves between runs: each figure also against"
echo "the same probes after the kill, with the router back at its baseline):"
echo "  ib_send_lat against 1 pod:     $(ratio "$LATN" "${LAT1:-n/a}" 1.5); after the kill: $(ratio "$LATN" "$LAT" 1.5)"
echo "  rdma_cm connect against 1 pod: $(ratio "$CONNN" "${CONN1:-n/a}" 2); after the kill: $(ratio "$CONNN" "$CONN" 2)"
echo "  router resident memory:      $lrss MiB (< 1024: $([[ $lrss -lt 1024 ]] && echo met || echo NOT met))"
echo "  loop turn p99 (quiet):       <= $lp99 ms (< 1 ms: $(awk -v p="$lp99" 'BEGIN {print (p + 0 > 0 && p + 0 <= 1) ? "met" : "NOT met"}'))"
if [[ -n $back ]]; then
  echo "after kill -9 of ${#SCALE_PIDS[@]} pods: back to the baseline in $back s ($GAUGES: as before" \
    "the first pod; RSS $(awk '$1 == "process_resident_memory_bytes" {printf "%.0f", $2 / 1048576}' \
      "$FF_DIR/m-kill-1.txt") MiB against $(awk '$1 == "process_resident_memory_bytes" {printf "%.0f", $2 / 1048576}' \
      "$FF_DIR/m-base.txt") MiB before)" | tr '\n' ' '
  echo
else
  echo "after kill -9 of ${#SCALE_PIDS[@]} pods: NOT back to the baseline within 60 s:"
  for g in $GAUGES; do
    echo "  $g $(metric "$FF_DIR/m-base.txt" "$g") before, $(metric "$FF_DIR/m-kill-1.txt" "$g") now"
  done
  exit 1
fi
