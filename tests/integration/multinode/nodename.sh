#!/usr/bin/env bash
# Integration: one router per node name. Three nodes (namespaces, a router each, one pod
# each); node 1's router is started under a name that node 0's router holds.
#   nodename.sh etcd     refused by node0's key in etcd; node 0 keeps its key and serves;
#                        node 0 restarts on its address after a crash; once node 0 stops,
#                        the name is free
#   nodename.sh static   refused by the file (node0 at node 0's address, node 1's address
#                        named node1); a node the file does not list starts with a warning
set -uo pipefail
source "$(dirname "$0")/../../../scripts/lib/cluster.sh"
trap multinode_down EXIT
failures=0
check() { if [[ $2 -eq 0 ]]; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi; }

# expect_refusal N NAME TEXT...: node N's router, started as NAME, must exit non-zero
# within 20 s, never listen on its pod socket or router port, and log every TEXT.
expect_refusal() {
  local n=$1 name=$2 dir pid i served=0 status text missing=0
  shift 2
  dir=$(mn_dir "$n")
  : >"$dir/router.log"
  FF_MN_NODE_NAME=$name mn_router_start "$n"
  pid=${FF_NODE_ROUTER[$n]}
  for ((i = 0; i < 400; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    [[ -S "$dir/ffrouter.sock" ]] && served=1
    ip netns exec "$(mn_node_ns "$n")" ss -ltn 2>/dev/null | grep -q ':7471 ' && served=1
    sleep 0.05
  done
  wait_pid "$pid" 1
  status=$?
  FF_NODE_ROUTER[$n]=""
  grep -E ' error ' "$dir/router.log" | tail -n 1
  for text in "$@"; do
    grep -qF -- "$text" "$dir/router.log" || { echo "not logged: $text"; missing=1; }
  done
  [[ $status -ne 0 && $status -ne 124 && $served -eq 0 && $missing -eq 0 ]] || {
    echo "exit $status, served $served"; cat "$dir/router.log"; return 1; }
}

# lease_of KEY: the lease etcd holds KEY under (empty when absent).
lease_of() { mn_etcd_get "$1" -w fields | awk '/"Lease"/ {print $3}'; }

etcd_case() {
  local key=/freeflow/v2/nodes/node0/endpoint lease ip0 ip1
  ip0=$(mn_node_ip 0)
  ip1=$(mn_node_ip 1)
  lease=$(lease_of "$key")
  expect_refusal 1 node0 "node name \"node0\" is taken" "a live router at $ip0:7471" \
    "serves node links on $ip1:7471" "--node-name"
  check "a second router named node0 at another address is refused" $?
  [[ -n "$lease" && "$(lease_of "$key")" == "$lease" ]] &&
    mn_etcd_get "$key" --print-value-only | grep -qF "\"$ip0\""
  check "node0's key keeps node 0's address and lease" $?
  mn_pair 0 0 2 0 ibv_rc_pingpong -g 1 -n 100
  check "node 0 still serves: ping-pong with node 2" $?

  # A crash: node 0's lease lives on for its TTL; the same address takes the key over.
  mn_router_down 0 KILL
  mn_router_up 0 --peer-timeout-ms 1000 && grep -q "taking it over" "$(mn_dir 0)/router.log" &&
    [[ "$(lease_of "$key")" != "$lease" ]]
  check "node 0 restarted on its address takes its name over" $?
  mn_pair 2 0 0 0 ibv_rc_pingpong -g 1 -n 100
  check "after the restart, ping-pong with node 2" $?

  # node 0 stops cleanly (its lease is revoked): the name is free for another address.
  mn_router_down 0
  FF_MN_NODE_NAME=node0 mn_router_up 1 && mn_etcd_get "$key" --print-value-only | grep -qF "\"$ip1\""
  check "once node 0 is gone, node 1 may take the name" $?
}

static_case() {
  local ip0 ip1
  ip0=$(mn_node_ip 0)
  ip1=$(mn_node_ip 1)
  expect_refusal 1 node0 "it lists node \"node0\" at $ip0:7471, but this router serves node links on $ip1:7471" \
    "--node-name node1"
  check "node 1's router named node0 is refused by the file" $?
  expect_refusal 1 "$(hostname)-x" "but its address $ip1:7471 is, as node \"node1\"" \
    "start this router with --node-name node1"
  check "node 1's router under a name the file lacks is told its name" $?
  mn_pair 0 0 2 0 ibv_rc_pingpong -g 1 -n 100
  check "node 0 serves: ping-pong with node 2" $?
  # A file that does not list node 1 yet (a new node): it starts, and says so.
  python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
d["nodes"] = [n for n in d["nodes"] if n["name"] != "node1"]
json.dump(d, open(sys.argv[2], "w"))' "$FF_DIR/cluster.json" "$FF_DIR/partial.json"
  FF_CONTROL_PLANE_ARGS=("--control-plane=static:$FF_DIR/partial.json")
  mn_router_up 1 && grep -qF "node \"node1\" is not in it" "$(mn_dir 1)/router.log"
  check "a node the file does not list starts with a warning" $?
}

mode=${1:-etcd}
multinode_up 3 1
if [[ $mode == etcd ]]; then
  mn_etcd_up || exit 1
  FF_CONTROL_PLANE_ARGS=(--control-plane "etcd:$(mn_etcd_url)")
fi
mn_router_up 0 --peer-timeout-ms 1000 || exit 1
mn_router_up 2 --peer-timeout-ms 1000 || exit 1
case $mode in
  etcd) etcd_case ;;
  static) static_case ;;
  *) echo "usage: $0 etcd|static"; exit 2 ;;
esac
[[ $failures -eq 0 ]]
