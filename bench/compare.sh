#!/usr/bin/env bash
# Before and after, in one run: the key same-node and cross-node figures of two builds (two
# commits' build folders), alternating build by build within each run so that both meet the
# same machine, each the median (min..max) of RUNS runs between the same pods.
#   bench/compare.sh BEFORE_BUILD AFTER_BUILD
# Both builds need router/ffrouter and verbs/libffverbs.so; the scripts are this tree's.
set -euo pipefail
[[ $# -eq 2 ]] || { echo "usage: $0 BEFORE_BUILD AFTER_BUILD" >&2; exit 2; }
BUILDS=("$(cd "$1" && pwd)" "$(cd "$2" && pwd)")
RUNS=${RUNS:-5}
cd "$(dirname "$0")/.."
source scripts/lib/cluster.sh
source scripts/lib/measure.sh

declare -A fig=()
# add KEY VALUE: appends a figure of this run.
add() { fig[$1]="${fig[$1]:-} $2"; }

same_node() {
  local b=$1
  FF_BUILD=${BUILDS[$b]}
  router_up
  add "same_wbw_$b" "$(perftest_run 0 1 bw ib_write_bw -s 65536 -n 20000)"
  add "same_mpps_$b" "$(perftest_run 0 1 mpps ib_send_bw -s 64 -n 200000)"
  add "same_slat_$b" "$(perftest_run 0 1 typical ib_send_lat -s 2 -n 20000)"
  router_down
}

cross_node() {
  local b=$1
  FF_BUILD=${BUILDS[$b]}
  mn_router_down 0
  mn_router_down 1
  mn_router_up 0
  mn_router_up 1
  add "cross_wbw_$b" "$(perftest_run 0 1 bw ib_write_bw -s 65536 -n 5000)"
  add "cross_slat_$b" "$(perftest_run 0 1 typical ib_send_lat -s 2 -n 5000)"
}

trap cluster_down EXIT
cluster_up 2
for ((r = 1; r <= RUNS; r++)); do
  echo "same node, run $r/$RUNS" >&2
  same_node 0
  same_node 1
done
cluster_down
trap multinode_down EXIT
multinode_up 2 1
pods_on_nodes
for ((r = 1; r <= RUNS; r++)); do
  echo "across nodes, run $r/$RUNS" >&2
  cross_node 0
  cross_node 1
done

echo
echo "before: ${BUILDS[0]}"
echo "after:  ${BUILDS[1]}"
echo "median (min..max) of $RUNS runs each, alternating"
printf '%-40s %-28s %-28s %s\n' "figure" "before" "after" "after/before"
row() {
  local label=$1 key=$2 b a
  # shellcheck disable=SC2086  # the figures are a space-separated list
  b=$(stats ${fig[${key}_0]})
  # shellcheck disable=SC2086
  a=$(stats ${fig[${key}_1]})
  printf '%-40s %-28s %-28s %s\n' "$label" "$(fmt_stats "$b")" "$(fmt_stats "$a")" \
    "$(awk -v x="${a%% *}" -v y="${b%% *}" 'BEGIN{ if (y > 0) printf "%.2f", x / y; else print "n/a" }')"
}
row "same node ib_write_bw 64 KiB, Gbit/s" same_wbw
row "same node ib_send_bw 64 B, Mmsg/s" same_mpps
row "same node ib_send_lat 2 B, usec" same_slat
row "across nodes ib_write_bw 64 KiB, Gbit/s" cross_wbw
row "across nodes ib_send_lat 2 B, usec" cross_slat
