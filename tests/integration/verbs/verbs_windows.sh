#!/usr/bin/env bash
# Integration: memory windows between two pods of one node, with the real router and the
# system's libibverbs under the preload (verbs_windows.cc says what is checked).
set -uo pipefail
source "$(dirname "$0")/../../../scripts/lib/cluster.sh"
WINDOWS=${FF_WINDOWS:-$FF_BUILD/tests/integration/verbs/verbs_windows}
trap cluster_down EXIT
cluster_up 2
router_up || exit 1
port=19301
pod_bg 0 "$WINDOWS" $port >"$FF_DIR/server.log" 2>&1
spid=$FF_LAST_PID
pod_run 1 timeout 60 "$WINDOWS" $port "$(ff_pod_ip 0)" >"$FF_DIR/client.log" 2>&1
c=$?
wait_pid "$spid" 30
s=$?
echo "--- server (exit $s)"; cat "$FF_DIR/server.log"
echo "--- client (exit $c)"; cat "$FF_DIR/client.log"
[[ $c -eq 0 && $s -eq 0 ]] && grep -q '^ok: READ through the remotely' "$FF_DIR/client.log"
