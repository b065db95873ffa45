#!/usr/bin/env bash
# Integration (issue 41): the router hand-over on a node of a cluster (two nodes, a static
# control plane, TLS node links), as the DaemonSet's update does it there (docs/handover.md).
# With node 1's router relaying (--cross-node-path=relay), node 0's router refuses while a pair
# is relayed between the nodes (relayed RC channels cannot move), and a successor given
# --take-over-wait-s asks again, not ready, until the pair ends, then takes over. Node 1's
# router is started again with direct connections, and node 0's router is replaced a second
# time under ib_write_bw, ib_send_lat (verbs and rdma_cm) and ucx_perftest between pods of
# the two nodes (direct connections: node 0 holds channels of both directions), a UD
# ib_send_bw (relayed: its channels are given up and linked again) and an iperf3 in TCP mode
# across them. The router of node 1 parks the channels and rdma_cm ids of node 0's links when
# they go down and resumes them with the successor; every program finishes without an error,
# the old routers exit 0, and the pause each program saw is printed beside the router's own
# (pauses_of). A third replacement under an ib_send_lat alone across the nodes prints that
# program's longest iteration too, and new pairs across the nodes work both ways.
set -uo pipefail
source "$(dirname "$0")/../../../scripts/lib/cluster.sh"
export FF_ROUTER_LOG=info
# Every verbs program reports at its exit the longest its send queues waited (send_waits.h).
export FFV_REPORT_WAITS=1
NEW_PID=""
trap '[[ -n $NEW_PID ]] && kill "$NEW_PID" 2>/dev/null; multinode_down' EXIT
multinode_up 2 3
mn_router_up 0 || exit 1
mn_router_up 1 --cross-node-path=relay || exit 1
DIR0=$(mn_dir 0)
S=$(mn_pod_ip 0 0)
failures=0
result() {  # result NAME STATUS
  if [[ $2 -eq 0 ]]; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi
}

# successor_start LOG [ARGS...]: node 0's router again, with --take-over (and ARGS), as the
# DaemonSet's new pod starts it, its ready file LOG.ready; its pid in NEW_PID.
# successor_wait LOG: 0 once it took over and its ready file names it, 1 when it exited first
# or 15 s passed.
successor_start() {
  local log=$DIR0/$1
  shift
  local -a tls
  read -ra tls <<<"$(mn_tls_args node0)"
  ip netns exec "$(mn_node_ns 0)" "$FF_BUILD/router/ffrouter" --dir "$DIR0" --name ffrouter \
    --vnet-prefix 10.244.0.0/16 --host-ip "$(mn_node_ip 0)" --port 7471 --node-name node0 \
    --log-level info "--control-plane=static:$FF_DIR/cluster.json" "${tls[@]}" --take-over \
    --ready-file "$log.ready" "$@" >>"$log" 2>&1 &
  NEW_PID=$!
}
successor_wait() {
  local log=$DIR0/$1 i
  for ((i = 0; i < 300; i++)); do
    # It logs "took over" before it serves and writes its ready file.
    grep -q "took over" "$log" 2>/dev/null &&
      [[ $(cat "$log.ready" 2>/dev/null) == "$NEW_PID" ]] && return 0
    if ! kill -0 "$NEW_PID" 2>/dev/null; then
      wait "$NEW_PID"
      NEW_PID=""
      return 1
    fi
    sleep 0.05
  done
  return 1
}

# retire_old: the old router (OLD) gets SIGTERM, as its DaemonSet pod is deleted next, and
# must exit 0; the successor (NEW_PID) is node 0's router from then on.
retire_old() {
  kill -TERM "$OLD"
  wait_pid "$OLD" 10
  result "the old router exits 0 on SIGTERM" $?
  FF_NODE_ROUTER[0]=$NEW_PID
  NEW_PID=""
}

# tcp_bg NODE POD ARGS...: a program in TCP mode (libfsocket) in pod POD of node NODE.
tcp_bg() {
  local n=$1 i=$2
  shift 2
  ip netns exec "$(mn_pod_ns "$n" "$i")" env LD_PRELOAD="$FF_BUILD/fsocket/libfsocket.so" \
    FFR_NAME=ffrouter FREEFLOW_DIR="$(mn_dir "$n")" VNET_PREFIX=10.244.0.0/16 "$@" &
  FF_LAST_PID=$!
  FF_PIDS+=("$FF_LAST_PID")
}

# listening NODE POD PORT: waits (bounded) until a program of pod POD of node NODE listens on
# TCP port PORT (perftest's exchange of QP numbers).
listening() {
  local i
  for ((i = 0; i < 100; i++)); do
    ip netns exec "$(mn_pod_ns "$1" "$2")" ss -ltn 2>/dev/null | grep -q ":$3 " && return 0
    sleep 0.05
  done
  return 1
}

# bw_pair NODE POD SECONDS PORT NAME: ib_write_bw -D SECONDS, its server in pod 0 of node 0
# and its client in pod POD of node NODE, in the background (logs NAME-s, NAME-c); their
# pids in PAIR_S and PAIR_C.
bw_pair() {
  mn_pod_bg 0 0 ib_write_bw -D "$3" -p "$4" >"$FF_DIR/$5-s.log" 2>&1
  PAIR_S=$FF_LAST_PID
  listening 0 0 "$4"
  mn_pod_bg "$1" "$2" ib_write_bw -D "$3" -p "$4" "$S" >"$FF_DIR/$5-c.log" 2>&1
  PAIR_C=$FF_LAST_PID
}

# 1. Node 1's router relays (--cross-node-path=relay): while a pair relayed between the nodes
#    runs, node 0's router refuses, and a waiting successor (--take-over-wait-s) asks again,
#    not ready; once the pair ended it takes over.
bw_pair 1 0 4 18706 relayed
rs=$PAIR_S rc=$PAIR_C
sleep 1.5
OLD=${FF_NODE_ROUTER[0]}
successor_start router2.log --take-over-wait-s 30
sleep 2.5  # asked, refused
grep "asking again" "$DIR0/router2.log" | sed 's/.*ffrouter: //'
[[ ! -e $DIR0/router2.log.ready ]] && grep -q "asking again every 2 s" "$DIR0/router2.log" &&
  grep -q "it relays channels" "$DIR0/router2.log" &&
  ! grep -q "took over" "$DIR0/router2.log" && kill -0 "$OLD"
result "a waiting successor asks again and is not ready while a pair is relayed to node 1" $?
wait_pid "$rc" 30 && wait_pid "$rs" 10 && ! grep -qiE "fail|error" "$FF_DIR"/relayed-{s,c}.log
result "the relayed pair finished on the old router" $?
successor_wait router2.log && [[ $(cat "$DIR0/router2.log.ready" 2>/dev/null) == "$NEW_PID" ]]
result "once the pair ended the successor took over, and is ready" $?
retire_old
mn_router_down 1  # node 1's router again, with direct connections (its pods run nothing)
mn_router_up 1 || exit 1

# 2. Node 0's router is replaced again, under ib_write_bw, ib_send_lat, ucx_perftest and an
#    rdma_cm ib_send_lat across the nodes (direct connections, initiated on both sides), a
#    UD pair and an iperf3 in TCP mode across them.
#    The rdma_cm pair first, while the machine is not yet busy: under the load of the other
#    programs its client nearly always loses perftest's race to the server's second listen
#    (perftest_cm_pair, which starts such a pair again).
cm_server() { mn_pod_bg 0 2 ib_send_lat -R -D 14 -p 18707 >"$FF_DIR/cm-s.log" 2>&1; }
cm_client() { mn_pod_bg 1 1 ib_send_lat -R -D 13 -p 18707 "$(mn_pod_ip 0 2)" >"$FF_DIR/cm-c.log" 2>&1; }
perftest_cm_pair "$DIR0/router2.log" "$(mn_pod_ip 0 2):18707" "$FF_DIR/cm-c.log" cm_server cm_client
cms=$CM_S cmc=$CM_C
bw_pair 1 0 20 18700 cross
xs=$PAIR_S xc=$PAIR_C
mn_pod_bg 1 1 ib_send_lat -D 14 -p 18704 >"$FF_DIR/lat-s.log" 2>&1
lats=$FF_LAST_PID
mn_pod_bg 0 2 ib_send_bw -c UD -D 14 -p 18705 >"$FF_DIR/ud-s.log" 2>&1
uds=$FF_LAST_PID
UCX=(env "UCX_TLS=rc_v,self" UCX_NET_DEVICES=freeflow0:1)
mn_pod_bg 0 1 "${UCX[@]}" timeout 90 ucx_perftest -p 13400 >"$FF_DIR/ucx-s.log" 2>&1
ucxs=$FF_LAST_PID
tcp_bg 0 0 iperf3 -s -1 -B "$S" -p 7401 -J >"$FF_DIR/iperf-s.json" 2>"$FF_DIR/iperf-s.err"
ips=$FF_LAST_PID
sleep 0.5
mn_pod_bg 1 2 "${UCX[@]}" timeout 90 ucx_perftest "$(mn_pod_ip 0 1)" -p 13400 -t tag_lat \
  -n 100000 -f >"$FF_DIR/ucx-c.log" 2>&1
ucxc=$FF_LAST_PID
iperf_at=$(date +%s.%N)
tcp_bg 1 0 timeout 30 iperf3 -c "$S" -p 7401 -t 12 -i 0.1 -J >"$FF_DIR/iperf-c.json" \
  2>"$FF_DIR/iperf-c.err"
ipc=$FF_LAST_PID
listening 1 1 18704
mn_pod_bg 0 1 ib_send_lat -D 13 -p 18704 "$(mn_pod_ip 1 1)" >"$FF_DIR/lat-c.log" 2>&1
latc=$FF_LAST_PID
mn_pod_bg 1 2 ib_send_bw -c UD -D 13 -p 18705 "$(mn_pod_ip 0 2)" >"$FF_DIR/ud-c.log" 2>&1
udc=$FF_LAST_PID
sleep 2
OLD=${FF_NODE_ROUTER[0]}
successor_start router3.log --take-over-wait-s 30
successor_wait router3.log
handed=$(grep -h "handed over to a successor" "$DIR0/router2.log" | sed 's/.*info ffrouter: //')
echo "$handed"
running=0
for p in $xc $latc $cmc $ucxc $ipc $udc; do kill -0 "$p" 2>/dev/null && running=$((running + 1)); done
[[ -n $NEW_PID && $running -eq 6 && $(cat "$DIR0/router3.log.ready" 2>/dev/null) == "$NEW_PID" ]]
result "a successor took over under ib_write_bw, ib_send_lat (verbs and rdma_cm), UD ib_send_bw, ucx_perftest and iperf3 in TCP mode across the nodes, and is ready" $?
retire_old
for ((i = 0; i < 60; i++)); do
  [[ $(grep -c "resumed [0-9]* channels" "$(mn_dir 1)/router.log" "$DIR0/router3.log" |
    awk -F: '{ n += ($2 > 0) } END { print n }') -eq 2 ]] && break
  sleep 0.1
done
grep -h "channels wait for it\|resumed [0-9]* channels" "$(mn_dir 1)/router.log" "$DIR0/router3.log" |
  sed 's/.*info ffrouter: //'
grep -q "resumed [1-9][0-9]* channels from its pods (0 of them gone)" "$(mn_dir 1)/router.log" &&
  grep -q "resumed [1-9][0-9]* channels from its pods (0 of them gone)" "$DIR0/router3.log"
result "node 1's router and the successor resumed each other's channels, none gone" $?
ok=0
for p in $xc $xs $latc $lats $cmc $cms $udc $uds $ucxc $ucxs $ipc $ips; do
  wait_pid "$p" 90 || ok=1
done
for f in cross-s.log cross-c.log lat-s.log lat-c.log cm-s.log cm-c.log ud-s.log ud-c.log \
  ucx-s.log ucx-c.log iperf-s.err iperf-c.err; do
  if grep -qiE "fail|error" "$FF_DIR/$f"; then
    ok=1
    echo "$f:"
    log_tail "$FF_DIR/$f"
  fi
done
grep -h -B1 -E '^ +[0-9]+ +[0-9]+ ' "$FF_DIR"/{cross,lat,cm,ud}-c.log | grep -v "^-*$"
grep -E '^ +100000 ' "$FF_DIR/ucx-c.log"
bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bytes"])' "$FF_DIR/iperf-c.json" 2>/dev/null)
echo "iperf3 in TCP mode across the nodes and the hand-over: ${bytes:-no} bytes"
echo "the pause each program saw (node 0's old router $(grep -o "paused [0-9]* ms" <<<"$handed"); goal: under 100 ms):"
FF_HANDOVER_WINDOW=$(handover_window "$DIR0/router2.log")
F=$FF_DIR
pauses_of "ib_write_bw -D 20 (client, node 1)" "waits:$F/cross-c.log"
pauses_of "ib_send_lat (client node 0, server node 1)" "client=waits:$F/lat-c.log" \
  "server=waits:$F/lat-s.log"
pauses_of "ib_send_lat over rdma_cm (client node 1, server node 0)" "client=waits:$F/cm-c.log" \
  "server=waits:$F/cm-s.log"
pauses_of "UD ib_send_bw (client, node 1)" "waits:$F/ud-c.log"
pauses_of "ucx_perftest tag_lat over rc_v (client node 1, server node 0)" \
  "client=waits:$F/ucx-c.log" "server=waits:$F/ucx-s.log"
pauses_of "iperf3 in TCP mode (client, node 1)" "iperf3:$F/iperf-c.json:$iperf_at"
[[ $ok -eq 0 && ${bytes:-0} -gt 0 ]] && grep -qE '^ +100000 ' "$FF_DIR/ucx-c.log"
result "ib_write_bw, ib_send_lat (verbs and rdma_cm), UD ib_send_bw, ucx_perftest and iperf3 in TCP mode across the nodes ran across the hand-over without an error" $?

# 3. The pause a program across the nodes sees: node 0's router is replaced a third time
#    while an ib_send_lat -n runs between node 0 and node 1 (nothing else runs); its longest
#    one-way time (t_max) holds the pause, printed beside the old router's own.
mn_pod_bg 1 0 ib_send_lat -n 600000 -p 18708 >"$FF_DIR/pause-s.log" 2>&1
pauses=$FF_LAST_PID
listening 1 0 18708
mn_pod_bg 0 0 ib_send_lat -n 600000 -p 18708 "$(mn_pod_ip 1 0)" >"$FF_DIR/pause-c.log" 2>&1
pausec=$FF_LAST_PID
sleep 2
OLD=${FF_NODE_ROUTER[0]}
successor_start router4.log --take-over-wait-s 30
successor_wait router4.log
st=$?
kill -0 "$pausec" 2>/dev/null
running=$?
router_pause=$(grep -ho "paused [0-9]* ms" "$DIR0/router3.log" | tail -n 1)
[[ $st -eq 0 && $running -eq 0 ]]
result "a successor took over while ib_send_lat ran across the nodes" $?
retire_old
wait_pid "$pausec" 60 && wait_pid "$pauses" 10 && ! grep -qiE "fail|error" "$FF_DIR"/pause-{s,c}.log
st=$?
line=$(grep -E '^ +2 +600000 ' "$FF_DIR/pause-c.log")
read -r _ _ t_min t_max t_typical _ <<<"$line"
echo "ib_send_lat 2 B across the nodes, node 0's router replaced meanwhile: t_typical ${t_typical:-?} us, t_min ${t_min:-?} us, t_max ${t_max:-?} us (the old router ${router_pause:-paused ? ms})"
FF_HANDOVER_WINDOW=$(handover_window "$DIR0/router3.log")
pauses_of "that ib_send_lat (client node 0, server node 1)" "client=waits:$FF_DIR/pause-c.log" \
  "server=waits:$FF_DIR/pause-s.log"
[[ $st -eq 0 && -n $line ]]
result "ib_send_lat across the nodes ran across the hand-over without an error, its longest wait printed" $?

# 4. The successor links to node 1: pairs across the nodes, both ways.
mn_pair 0 0 1 0 ib_send_bw -n 1000 >/dev/null
result "a pair with its server on node 0's successor works across the nodes" $?
mn_pair 1 1 0 1 ib_send_bw -n 1000 >/dev/null
result "a pair with its client on node 0's successor works across the nodes" $?

[[ $failures -ne 0 && -n ${FF_KEEP_LOGS:-} ]] && cp -r "$FF_DIR" "$FF_KEEP_LOGS"
echo "$((failures == 0 ? 1 : 0)) suites ok"
[[ $failures -eq 0 ]]
