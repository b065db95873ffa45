#!/usr/bin/env bash
# Integration: the router soak. A pod process that opens the device, creates QPs and MRs,
# connects them and moves data (soak_client) is killed with SIGKILL at a random point,
# FF_SOAK_CYCLES times (ctest: 200; `make soak`: 1000). Afterwards the router's descriptors,
# resident memory and object counts (its SIGUSR1 stats line) must be back at their baseline,
# taken after a few warm-up cycles; both are printed. Resident memory may exceed the baseline
# by FF_SOAK_RSS_SLACK_KIB (default 1024): what the allocator keeps cached for reuse.
set -uo pipefail
source "$(dirname "$0")/../../../scripts/lib/cluster.sh"
CLIENT=${FF_SOAK_CLIENT:-$FF_BUILD/tests/integration/verbs/soak_client}
CYCLES=${FF_SOAK_CYCLES:-200}
WARMUP=${FF_SOAK_WARMUP:-10}
RSS_SLACK_KIB=${FF_SOAK_RSS_SLACK_KIB:-1024}
trap cluster_down EXIT
cluster_up 1
FF_ROUTER_LOG=info router_up || exit 1

# The router's stats line (it logs one on SIGUSR1), with /proc's view of its descriptors and
# resident memory appended.
stats() {
  # shellcheck disable=SC2119,SC2012  # the router of this node; counting its descriptors
  echo "$(router_stats_line)" \
    "proc_fds=$(ls "/proc/$FF_ROUTER_PID/fd" | wc -l)" \
    "proc_rss_kib=$(awk '/^VmRSS/ {print $2}' "/proc/$FF_ROUTER_PID/status")"
}
figure() { tr ' ' '\n' <<<"$1" | awk -F= -v k="$2" '$1 == k {print $2}'; }

# Waits (bounded) until the router serves no client; prints its stats then.
settled() {
  local s i
  for ((i = 0; i < 100; i++)); do
    s=$(stats)
    [[ $(figure "$s" sessions) == 0 ]] && break
    sleep 0.05
  done
  echo "$s"
}

declare -A landed=()
# One pod process, killed at a random point. Half of them kill themselves (SIGKILL) right
# after a step picked at random (soak_client KILL_AT: every setup step and the first rounds
# of the loop, with work in flight); the others are killed from here a random 0-149 ms after
# they started. Records where each kill landed.
cycle() {
  local kill_at=-1 pid stage
  ((RANDOM % 2 == 0)) && kill_at=$((1 + RANDOM % 20))
  pod_bg 0 "$CLIENT" 30 "$kill_at" >"$FF_DIR/client.log" 2>&1
  pid=$FF_LAST_PID
  ((kill_at < 0)) && sleep "0.$(printf '%03d' $((RANDOM % 150)))" && kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  FF_PIDS=()
  stage=$(tail -n 1 "$FF_DIR/client.log")
  [[ -z $stage ]] && stage="starting"
  [[ $stage == killed* ]] && stage="step${stage##* }"
  landed[$stage]=$((${landed[$stage]:-0} + 1))
}

for ((c = 0; c < WARMUP; c++)); do cycle; done
baseline=$(settled)
landed=()
start=$SECONDS
for ((c = 1; c <= CYCLES; c++)); do
  cycle
  ((c % 100 == 0)) && echo "cycle $c/$CYCLES ($((SECONDS - start)) s)"
done
elapsed=$((SECONDS - start))
final=$(settled)

echo "soak: $CYCLES cycles in $elapsed s; kills landed (stepN: self-killed after step N):" \
  "$(for k in "${!landed[@]}"; do printf '%s=%s\n' "$k" "${landed[$k]}"; done | sort -V | tr '\n' ' ')"
echo "baseline: $baseline"
echo "final:    $final"
failures=0
for key in $(tr ' ' '\n' <<<"$baseline" | cut -d= -f1); do
  b=$(figure "$baseline" "$key")
  f=$(figure "$final" "$key")
  case $key in
    rss_kib | proc_rss_kib) ok=$((f <= b + RSS_SLACK_KIB)) ;;
    *) ok=$((f == b)) ;;
  esac
  if [[ $ok -ne 1 ]]; then
    echo "FAIL $key: $b at the baseline, $f after $CYCLES cycles"
    failures=$((failures + 1))
  fi
done
if ! kill -0 "$FF_ROUTER_PID" 2>/dev/null; then
  echo "FAIL the router died"
  failures=$((failures + 1))
fi
[[ $failures -eq 0 ]] && echo "PASS the router returned to its baseline after $CYCLES killed pods"
[[ $failures -eq 0 ]]
