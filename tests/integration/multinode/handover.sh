#!/usr/bin/env bash
# Integration (issue 41): the router hand-over on a node of a cluster (two nodes, a static
# control plane, TLS node links), as the DaemonSet's update does it there (docs/handover.md).
# While a pair of pods of two nodes talks over a direct connection, node 0's router refuses
# (hand-over version 2 carries no direct connection) and serves on: the successor exits with
# the reason and the pair finishes; a successor given --take-over-wait-s asks again, not
# ready, until the pair ends, then takes over under traffic between pods of node 0; the old
# router exits 0; the successor links to node 1 again, and pairs across the nodes work
# both ways.
set -uo pipefail
source "$(dirname "$0")/../../../scripts/lib/cluster.sh"
export FF_ROUTER_LOG=info
NEW_PID=""
trap '[[ -n $NEW_PID ]] && kill "$NEW_PID" 2>/dev/null; multinode_down' EXIT
multinode_up 2 2
mn_router_up 0 || exit 1
mn_router_up 1 || exit 1
DIR0=$(mn_dir 0)
S=$(mn_pod_ip 0 0)
failures=0
result() {  # result NAME STATUS
  if [[ $2 -eq 0 ]]; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi
}

# successor LOG [ARGS...]: node 0's router again, with --take-over (and ARGS), as the
# DaemonSet's new pod starts it, its ready file LOG.ready; 0 once it took over, 1 when it
# exited first (its status in SUCCESSOR_STATUS).
successor() {
  local log=$DIR0/$1 i
  shift
  local -a tls
  read -ra tls <<<"$(mn_tls_args node0)"
  ip netns exec "$(mn_node_ns 0)" "$FF_BUILD/router/ffrouter" --dir "$DIR0" --name ffrouter \
    --vnet-prefix 10.244.0.0/16 --host-ip "$(mn_node_ip 0)" --port 7471 --node-name node0 \
    --log-level info "--control-plane=static:$FF_DIR/cluster.json" "${tls[@]}" --take-over \
    --ready-file "$log.ready" "$@" >>"$log" 2>&1 &
  NEW_PID=$!
  for ((i = 0; i < 300; i++)); do
    grep -q "took over" "$log" && return 0
    if ! kill -0 "$NEW_PID" 2>/dev/null; then
      wait "$NEW_PID"
      SUCCESSOR_STATUS=$?
      NEW_PID=""
      return 1
    fi
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
  sleep 0.3
  mn_pod_bg "$1" "$2" ib_write_bw -D "$3" -p "$4" "$S" >"$FF_DIR/$5-c.log" 2>&1
  PAIR_C=$FF_LAST_PID
}

# 1. A direct connection between pods of the two nodes: refused, the old router serves on.
bw_pair 1 0 6 18700 cross
xs=$PAIR_S xc=$PAIR_C
sleep 2
SUCCESSOR_STATUS=0
successor router-refused.log
st=$?
tail -n 1 "$DIR0/router-refused.log"
[[ $st -ne 0 && $SUCCESSOR_STATUS -ne 0 ]] &&
  grep -q "refuses to hand over: it holds direct connections" "$DIR0/router-refused.log" &&
  kill -0 "${FF_NODE_ROUTER[0]}"
result "a router with a direct connection to another node refuses; the successor exits with the reason" $?
wait_pid "$xc" 30 && wait_pid "$xs" 10 && ! grep -qiE "fail|error" "$FF_DIR"/cross-{s,c}.log
result "the pair across the nodes finished on the old router" $?

# 2. As the DaemonSet's successor (--take-over-wait-s): while the pair crosses to node 1
#    the old router refuses, and the successor asks again, not ready; once the pair ends it
#    takes over, under ib_write_bw between node 0's pods, and is ready; the old router
#    exits 0.
bw_pair 1 0 5 18702 cross2
xs=$PAIR_S xc=$PAIR_C
bw_pair 0 1 10 18701 bw
bws=$PAIR_S bwc=$PAIR_C
sleep 1.5
OLD=${FF_NODE_ROUTER[0]}
successor router2.log --take-over-wait-s 30 &
sleep 3  # two asks, both refused
grep "asking again" "$DIR0/router2.log" | sed 's/.*ffrouter: //'
[[ ! -e $DIR0/router2.log.ready ]] && grep -q "asking again every 2 s" "$DIR0/router2.log" &&
  ! grep -q "took over" "$DIR0/router2.log" && kill -0 "$OLD"
result "a waiting successor asks again and is not ready while a pair crosses to node 1" $?
wait_pid "$xc" 30 && wait_pid "$xs" 10
for ((i = 0; i < 100; i++)); do grep -q "took over" "$DIR0/router2.log" && break; sleep 0.1; done
NEW_PID=$(cat "$DIR0/router2.log.ready" 2>/dev/null)
grep -h "handed over to a successor" "$DIR0/router.log" | sed 's/.*info ffrouter: //'
[[ -n $NEW_PID ]] && grep -q "took over" "$DIR0/router2.log" && kill -0 "$bwc" 2>/dev/null
result "once the pair ended it took over, under ib_write_bw between node 0's pods, and is ready" $?
kill -TERM "$OLD"
wait_pid "$OLD" 10
result "the old router exits 0 on SIGTERM" $?
FF_NODE_ROUTER[0]=$NEW_PID
NEW_PID=""
wait_pid "$bwc" 30 && wait_pid "$bws" 10 && ! grep -qiE "fail|error" "$FF_DIR"/bw-{s,c}.log
result "ib_write_bw between node 0's pods ran across the hand-over without an error" $?

# 3. The successor links to node 1: pairs across the nodes, both ways.
mn_pair 0 0 1 0 ib_send_bw -n 1000 >/dev/null
result "a pair with its server on node 0's successor works across the nodes" $?
mn_pair 1 1 0 1 ib_send_bw -n 1000 >/dev/null
result "a pair with its client on node 0's successor works across the nodes" $?

echo "$((failures == 0 ? 1 : 0)) suites ok"
[[ $failures -eq 0 ]]
