#!/usr/bin/env bash
# Integration: qperf (Debian qperf), unmodified, over freeflow. Every one of its 17 RDMA
# tests against a fresh server: between two pods of one node, or between pods of two nodes
# (TLS node links). qperf addresses its peer by LID, waits on completion channels (its
# latency tests take one event per completion and end on an alarm's EINTR) and checks
# atomics' results (ver_*). Usage: qperf.sh same|cross [TEST...]
set -uo pipefail
source "$(dirname "$0")/../../../scripts/lib/cluster.sh"
TESTS=(rc_bw rc_lat uc_bw uc_lat ud_bw ud_lat rc_rdma_read_bw rc_rdma_read_lat rc_rdma_write_bw
  rc_rdma_write_lat rc_rdma_write_poll_lat uc_rdma_write_bw uc_rdma_write_lat
  rc_compare_swap_mr rc_fetch_add_mr ver_rc_compare_swap ver_rc_fetch_add)
mode=${1:-same}
shift
(($# > 0)) && TESTS=("$@")

trap two_pods_down EXIT
two_pods_up "$mode" || exit 1

failures=0
for t in "${TESTS[@]}"; do
  pod_bg 0 qperf >"$FF_DIR/qperf-server.log" 2>&1
  spid=$FF_LAST_PID
  wait_listen 0 "$spid" 19765
  out=$(pod_run 1 timeout 60 qperf -t 1 "$(ff_pod_ip 0)" "$t" 2>&1)
  st=$?
  kill "$spid" 2>/dev/null
  wait "$spid" 2>/dev/null
  # A pass reports its figure and no failure (qperf exits 0 on some server-side errors).
  figure=$(grep -E '^ +(bw|latency|msg_rate|send_bw|recv_bw) += ' <<<"$out" | tr -s ' ' | tr '\n' ';')
  if [[ $st -eq 0 && -n $figure ]] && ! grep -qiE 'failed|error|timed out' <<<"$out"; then
    echo "PASS qperf $t ($mode node):$figure"
  else
    echo "FAIL qperf $t ($mode node), exit $st"
    echo "$out" | tail -n 5
    tail -n 5 "$FF_DIR/qperf-server.log"
    failures=$((failures + 1))
  fi
done
echo "$failures of ${#TESTS[@]} qperf tests failed ($mode node)"
[[ $failures -eq 0 ]]
