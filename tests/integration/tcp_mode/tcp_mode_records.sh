#!/usr/bin/env bash
# Integration: TCP mode's connection records against the real router, the kernel's sock_diag
# and real TCP connections between two pods (network namespaces). tcp_mode_records drives a
# server in pod 1 and a client in pod 0 and checks that a record lives while either end's
# namespace holds the connection and goes once neither does, whichever end closes first.
set -uo pipefail
source "$(dirname "$0")/../../../scripts/lib/cluster.sh"
RECORDS=${FF_TCP_RECORDS:-$FF_BUILD/tests/integration/tcp_mode/tcp_mode_records}
trap cluster_down EXIT
cluster_up 2
FF_ROUTER_LOG=info router_up || exit 1
"$RECORDS" "$FF_DIR/ffrouter.sock" "/run/netns/$(ff_pod_ns 1)" "$(ff_pod_ip 1)" \
  "/run/netns/$(ff_pod_ns 0)" "$(ff_pod_ip 0)" "$FF_ROUTER_PID" "$FF_DIR/router.log"
st=$?
# shellcheck disable=SC2119  # the router of this node
line=$(router_stats_line)
echo "router: $line"
if [[ $st -ne 0 ]]; then
  grep -E "warn|error" "$FF_DIR/router.log" | tail -n 10
  exit 1
fi
# The pods' sessions are gone: so are their listeners, and no record is left.
grep -q " streams=0 listeners=0 " <<<"$line"
