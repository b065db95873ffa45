#!/usr/bin/env bash
# Integration: extended CQs with real traffic (polled on one side, event-driven on the
# other) and fork() after registering memory, between two pods on one node and between pods
# on two nodes (verbs_portable.cc says what each checks, including that the GID entries name
# the pod's own interface).
set -uo pipefail
source "$(dirname "$0")/../../../scripts/lib/cluster.sh"
PROG=${FF_PORTABLE:-$FF_BUILD/tests/integration/verbs/verbs_portable}
LIFECYCLE=${FF_LIFECYCLE:-$FF_BUILD/tests/integration/verbs/verbs_lifecycle}
failures=0
port=19400

result() {  # result NAME STATUS
  if [[ $2 -eq 0 ]]; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi
}

# pair WHERE MODE SERVER_RUN CLIENT_RUN SERVER_IP: a fresh server and client.
pair() {
  local where=$1 mode=$2 srun=$3 crun=$4 ip=$5 spid c s
  port=$((port + 1))
  $srun "$PROG" server $port "$mode" >"$FF_DIR/server.log" 2>&1
  spid=$FF_LAST_PID
  $crun timeout 60 "$PROG" client "$ip" $port "$mode" >"$FF_DIR/client.log" 2>&1
  c=$?
  wait_pid "$spid" 30
  s=$?
  cat "$FF_DIR/server.log" "$FF_DIR/client.log"
  [[ $c -eq 0 && $s -eq 0 ]]
  result "$mode ($where)" $?
}

same_server() { pod_bg 0 "$@"; }
same_client() { pod_run 1 "$@"; }
cross_server() { mn_pod_bg 0 0 "$@"; }
cross_client() { mn_pod_run 1 0 "$@"; }

trap cluster_down EXIT
cluster_up 2
router_up || exit 1
for mode in cqex fork; do pair "same node" $mode same_server same_client "$(ff_pod_ip 0)"; done
cluster_down

trap multinode_down EXIT
multinode_up 2 1
mn_router_up 0 || exit 1
mn_router_up 1 || exit 1
for mode in cqex fork; do pair "two nodes" $mode cross_server cross_client "$(mn_pod_ip 0 0)"; done
# Opening and closing the device 1,000 times against a router with a node link (the router's
# own counters are checked in verbs_lifecycle.sh).
mn_pod_run 1 0 timeout 120 "$LIFECYCLE" cycles 1000 - leave
result "1000 open/close cycles (two nodes)" $?

echo "$failures failure(s)"
[[ $failures -eq 0 ]]
