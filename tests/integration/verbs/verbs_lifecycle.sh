#!/usr/bin/env bash
# Integration: a process opens and closes the device 1,000 times (destroying its objects, or
# leaving them for ibv_close_device), and lists devices 1,000 times. Every cycle succeeds;
# the process (verbs_lifecycle checks itself) and the router end where they started.
set -uo pipefail
source "$(dirname "$0")/../../../scripts/lib/cluster.sh"
PROG=${FF_LIFECYCLE:-$FF_BUILD/tests/integration/verbs/verbs_lifecycle}
CYCLES=${FF_CYCLES:-1000}
trap cluster_down EXIT
cluster_up 1
FF_ROUTER_LOG=info router_up || exit 1
failures=0

result() {  # result NAME STATUS
  if [[ $2 -eq 0 ]]; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi
}

# The router's counters of what it holds (its stats line), without rss and sessions.
router_stats() {
  # shellcheck disable=SC2119  # the router of this node
  router_stats_line | grep -o -E '(pods|qps|objects|regions|mapped_regions|mr_entries|proxies|fds)=[0-9]+' |
    tr '\n' ' '
}

# wait_for TEXT FILE PID: bounded wait until FILE holds TEXT while PID lives.
wait_for() {
  local i
  for ((i = 0; i < 1200; i++)); do
    grep -q "$1" "$2" && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

for variant in destroy leave; do
  go="$FF_DIR/go.$variant"
  log="$FF_DIR/cycles.$variant.log"
  arg=""
  [[ $variant == leave ]] && arg=leave
  pod_bg 0 "$PROG" cycles "$CYCLES" "$go" $arg >"$log" 2>&1
  pid=$FF_LAST_PID
  ok=1
  wait_for BASELINE "$log" "$pid" || ok=0
  before=$(router_stats)
  touch "$go"
  wait_for DONE "$log" "$pid" || ok=0
  after=$(router_stats)
  touch "$go"
  wait_pid "$pid" 60
  c=$?
  cat "$log"
  echo "router before: $before"
  echo "router after:  $after"
  [[ $ok -eq 1 && $c -eq 0 ]]
  result "$CYCLES open/close cycles ($variant): all succeed, no leak in the process" $?
  [[ $ok -eq 1 && -n "$before" && "$before" == "$after" ]]
  result "$CYCLES open/close cycles ($variant): the router holds what it held before" $?
done

pod_run 0 timeout 120 "$PROG" devlist "$CYCLES"
result "$CYCLES device lists: no leak" $?

echo "$failures failure(s)"
[[ $failures -eq 0 ]]
