#!/usr/bin/env bash
# freeflow on a real container runtime (make e2e; root): a private containerd with runc and
# the CNI bridge, the images of `make images`, and the manifests of deploy/overlays/single-node.
# It plays kubelet, since there is none: it starts the router and device plugin containers
# as their DaemonSets say (tests/e2e/kubelet_spec.py), asks the device plugin to Allocate
# freeflow/vrdma over its gRPC API (ff-kubelet-allocate), applies the answer to the app
# containers as kubelet would, and runs verbs programs in app containers that are non-root,
# without capabilities, under the default seccomp profile, with a read-only root file
# system and their own PID namespace. Figures: container start to first verbs call, and
# perftest in containers beside the same tools in plain namespaces (scripts/lib/cluster.sh).
#
#   tests/e2e/run.sh [BUILD_DIR]        (FF_E2E_RUNS: perftest runs per figure, default 3)
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(cd "${1:-$SRC/build}" && pwd)
RUNS=${FF_E2E_RUNS:-3}
declare -A FIG  # perftest figures by <one|two>_<ct|ns>_<bw|lat>
TAG=${FF_IMAGE_TAG:-dev}
export FF_BUILD=$BUILD
# shellcheck source=../../scripts/lib/containers.sh
source "$SRC/scripts/lib/containers.sh"
# shellcheck source=../../scripts/lib/cluster.sh
source "$SRC/scripts/lib/cluster.sh"
# shellcheck source=../../scripts/lib/measure.sh
source "$SRC/scripts/lib/measure.sh"
# shellcheck source=e2e_lib.sh
source "$SRC/tests/e2e/e2e_lib.sh"

[[ $(id -u) -eq 0 ]] || { echo "e2e: needs root (containerd, namespaces)" >&2; exit 1; }
ARCHIVE=$BUILD/images/freeflow-images.oci.tar
KUBELET=$BUILD/tests/e2e/ff-kubelet-allocate
for f in "$ARCHIVE" "$KUBELET"; do
  [[ -e $f ]] || { echo "e2e: $f is missing (make images; cmake --build --target ff-kubelet-allocate)" >&2; exit 1; }
done
trap 'ct_down; cluster_down; multinode_down' EXIT

step "a private containerd, the images"
ct_up
e2e_time ct_import "$ARCHIVE"
ok "images imported in ${E2E_MS} ms: $(ct images ls -q | tr '\n' ' ')"

step "node 0: network namespace, the manifests of deploy/overlays/single-node"
ct_node_up 0
NODE_ROOT=$(node_root 0)
mkdir -p "$NODE_ROOT/var/lib/kubelet/device-plugins"
# The node's own address (status.hostIP); one node has no peers, so on its loopback.
ip -n "$(ct_node_ns 0)" addr add "$(ct_node_ip 0)/32" dev lo
kubectl kustomize "$SRC/deploy/overlays/single-node" >"$CT_DIR/manifest.yaml" 2>/dev/null
ok "$(grep -c '^kind:' "$CT_DIR/manifest.yaml") objects"

step "the router container, as DaemonSet freeflow-router says"
e2e_daemonset router freeflow-router "freeflow-router:$TAG" 0 "$CT_DIR/manifest.yaml"
wait_for 10 test -S "$NODE_ROOT/freeflow/ffrouter.sock" || fail "no router socket" "$CT_DIR/router.log"
router_probe startupProbe || fail "the router's startup probe fails" "$CT_DIR/router.log"
router_liveness
# shellcheck disable=SC2012  # a listing for the reader
ok "serving $NODE_ROOT/freeflow ($(ls "$NODE_ROOT/freeflow" | tr '\n' ' '))"

step "the device plugin container (virtual mode) and kubelet's Allocate"
"$KUBELET" "$NODE_ROOT/var/lib/kubelet/device-plugins" freeflow/vrdma 20000 \
  >"$CT_DIR/allocate.json" 2>"$CT_DIR/kubelet.log" &
KUBELET_PID=$!
e2e_daemonset plugin rdma-device-plugin "freeflow-router:$TAG" 0 "$CT_DIR/manifest.yaml"
wait_pid "$KUBELET_PID" 25 || fail "no allocation" "$CT_DIR/kubelet.log" "$CT_DIR/plugin.log"
ok "$(tail -n 1 "$CT_DIR/kubelet.log" | sed 's/^ff-kubelet-allocate: //'): $(cat "$CT_DIR/allocate.json")"

step "two pods: CNI bridge addresses, app containers restricted as a pod's securityContext says"
ct_pod_net 0 0
POD0=$CT_POD_IP
ct_pod_net 0 1
POD1=$CT_POD_IP
ok "pod 0 $POD0, pod 1 $POD1"
app_check 0:0
e2e_start_to_verbs 0:0 5
ok "container start to first verbs call answered: $(fmt_stats "$(stats "${E2E_STARTS[@]}")") ms"

step "ibv_rc_pingpong between the app containers"
app_pair pingpong 0:0 0:1 30 ibv_rc_pingpong -g 1 -n 1000 -- "$POD0"
grep -q '1000 iters' "$CT_DIR/pingpong-c.log" || fail "pingpong" "$CT_DIR/pingpong-c.log" "$CT_DIR/pingpong-s.log"
ok "$(grep iters "$CT_DIR/pingpong-c.log")"

step "rping (rdma_cm) between the app containers"
app_rping 0:0 0:1 "$POD0" ||
  fail "rping" "$CT_DIR/rping-c.log" "$CT_DIR/rping-s.log" "$CT_DIR/router.log" "$CT_DIR/containerd.log"
ok "100 pings verified by both (-V); the client's last: $(grep '^ping data' "$CT_DIR/rping-c.log" | tail -n 1 | cut -c1-40)"

step "the router's /metrics, as Prometheus scrapes it"
router_metrics 0
ok "$(grep -c '^# TYPE' "$CT_DIR/metrics-0.txt") families, promtool check metrics passes; $E2E_METRICS"
# The pingpong's 2,000 SENDs (1,000 each way) and rping's, as the pods' libraries count them.
sends=$(operations 0 same_node send)
[[ ${sends:-0} -ge 2000 ]] || fail "router 0 counts $sends SENDs between its pods, not 2000 or more" "$CT_DIR/metrics-0.txt"
ok "operations between pods of node 0: $sends SENDs, $(operations 0 same_node read) READs, $(operations 0 same_node write) WRITEs"

step "perftest in containers, then in plain namespaces ($RUNS runs each, median (min..max))"
perftest_figures one_ct app_perftest 0:0 0:1 "$POD0"
cluster_up 2
router_up
perftest_figures one_ns perftest_run 0 1
cluster_down
figures one
[[ -n ${FIG[one_ct_bw]// /} && -n ${FIG[one_ct_lat]// /} ]] ||
  fail "perftest in containers gave no figure" "$CT_DIR/pt-c.log" "$CT_DIR/pt-s.log"

step "the router updated to a new image as the DaemonSet rolls out (maxSurge), under running QPs"
router_update
ok "ib_send_lat -D 10 ran on to its end in both containers; the client: $E2E_UPDATE_LAT"
ok "the old router $E2E_HANDOVER; exited 0 on SIGTERM"

step "the router replaced without a successor (its pod deleted), under running QPs"
router_replacement
ok "running pingpongs failed $E2E_FAIL_MS ms after the old router got SIGTERM ($(grep -ho 'first-exit=[0-9]*' \
  "$CT_DIR"/roll-*.log | sort -u | tr '\n' ' '))"
ok "new router serving in $E2E_BACK_MS ms; new QPs in the same containers: $(grep -h iters "$CT_DIR"/roll-c-*.log)"

step "two nodes from deploy/overlays/static: routers linked over TLS, pods on each"
two_nodes_up 1 2
# shellcheck disable=SC2153  # two_nodes_up sets CT_POD_IP<N> (printf -v)
X1=$CT_POD_IP1 X2=$CT_POD_IP2
printf '{"nodes": [%s, %s]}\n' \
  "$(printf '{"name": "node1", "address": "%s", "port": 7471, "podCIDRs": ["10.244.%d.0/24"]}' \
    "$(ct_node_ip 1)" "$((CT_NET + 1))")" \
  "$(printf '{"name": "node2", "address": "%s", "port": 7471, "podCIDRs": ["10.244.%d.0/24"]}' \
    "$(ct_node_ip 2)" "$((CT_NET + 2))")" >"$CT_DIR/cluster.json"
two_routers static 1 2 --cluster-json "$CT_DIR/cluster.json"
ok "node1 $(ct_node_ip 1) and node2 $(ct_node_ip 2), control plane static, TLS node links"
app_pair xpingpong 1:0 2:0 30 ibv_rc_pingpong -g 1 -n 1000 -- "$X1" ||
  fail "pingpong across nodes" "$CT_DIR/xpingpong-c.log" "$CT_DIR/xpingpong-s.log" "$CT_DIR/router1.log"
ok "ibv_rc_pingpong node1 $X1 <- node2 $X2: $(grep iters "$CT_DIR/xpingpong-c.log")"
ffctl_in router1 links >"$CT_DIR/ffctl-links.txt" 2>&1 || fail "ffctl links in the router container" "$CT_DIR/ffctl-links.txt"
grep -qE '^[0-9]+ +node2 +(dialled|accepted) +ready' "$CT_DIR/ffctl-links.txt" ||
  fail "ffctl links shows no ready link to node2" "$CT_DIR/ffctl-links.txt"
ok "ffctl links in router1's container: $(grep -E 'node2' "$CT_DIR/ffctl-links.txt" | tr -s ' ' | head -n 2 | tr '\n' ';')"
router_metrics 1
sent=$(awk '$1 == "freeflow_router_link_sent_messages_total{peer=\"node2\"}" {print $2}' "$CT_DIR/metrics-1.txt")
if ! grep -q '^freeflow_router_link_up{peer="node2"} [1-9]' "$CT_DIR/metrics-1.txt" || [[ ${sent:-0} -eq 0 ]]; then
  fail "router1's metrics show no link to node2" "$CT_DIR/metrics-1.txt"
fi
ok "router1's metrics: link to node2 up, $sent messages sent to it; $E2E_METRICS"
sends=$(operations 1 direct send node2)
[[ ${sends:-0} -ge 1000 ]] || fail "router1 counts $sends SENDs to node2, not 1000 or more" "$CT_DIR/metrics-1.txt"
ok "operations from node1's pod to node2 over the direct path: $sends SENDs"
perftest_figures two_ct app_perftest 1:0 2:0 "$X1"
# The same across two nodes of namespaces (scripts/lib/cluster.sh), TLS node links too.
multinode_up 2 1
mn_router_up 0
mn_router_up 1
pods_on_nodes
perftest_figures two_ns perftest_run 0 1
multinode_down
figures two
[[ -n ${FIG[two_ct_bw]// /} && -n ${FIG[two_ct_lat]// /} ]] ||
  fail "perftest across nodes in containers gave no figure" "$CT_DIR/pt-c.log" "$CT_DIR/pt-s.log"

step "the same two nodes from deploy/overlays/etcd: etcd over TLS, each router its own etcd user"
two_routers_down 1 2
two_nodes_etcd 1 2
two_routers etcd 1 2 --control-plane "etcd:$CT_ETCD_URL" --etcd-ca "$CT_DIR/pki/ca.crt"
app_pair xetcd 1:0 2:0 30 ibv_rc_pingpong -g 1 -n 1000 -- "$X1" ||
  fail "pingpong across nodes with etcd" "$CT_DIR/xetcd-c.log" "$CT_DIR/xetcd-s.log" \
    "$CT_DIR/router1.log" "$CT_DIR/router2.log" "$CT_DIR/etcd.log"
ok "ibv_rc_pingpong node1 <- node2: $(grep iters "$CT_DIR/xetcd-c.log")"
ok "published: $(ip netns exec "ffe${CT_TAG}u" env ETCDCTL_API=3 ETCDCTL_ENDPOINTS="$CT_ETCD_URL" \
  ETCDCTL_CACERT="$CT_DIR/pki/ca.crt" ETCDCTL_CERT="$CT_DIR/pki/root.crt" \
  ETCDCTL_KEY="$CT_DIR/pki/root.key" etcdctl get --prefix --keys-only /freeflow/ | grep . | tr "\n" " ")"

step "the router's privileges are each needed (node 3: its DaemonSet less one of them)"
least_privilege 3

step "what the routers and the device plugin logged above info level"
grep -E ' (warning|error|critical) ' "$CT_DIR"/router*.log "$CT_DIR/plugin.log" |
  sed "s|^$CT_DIR/|   |" | tail -n 12 || true

step "the shipped DaemonSet holds what the router's quotas promise (issue 40)"
if grep -h 'descriptor limit .* is below' "$CT_DIR"/router*.log "$CT_DIR"/lp-*.log; then
  fail "a router's descriptor limit does not hold 256 pods at its quota"
fi
ok "$(grep -h -m1 -o 'descriptor limit [0-9]*: each pod may hold [0-9]* descriptors' \
  "$CT_DIR/router.log" || echo "descriptor limit holds the default quota")"
# Likewise its memory limit (the DaemonSet's resources.limits.memory, a cgroup limit here as
# under kubelet): the byte quotas fitted to it, and no warning that they do not fit.
if grep -h 'memory limit .* is below' "$CT_DIR"/router*.log "$CT_DIR"/lp-*.log; then
  fail "a router's memory limit does not hold 256 pods stalled at their byte quotas"
fi
grep -q 'memory limit [0-9]* MiB: each pod may queue' "$CT_DIR/router.log" ||
  fail "the router did not fit its byte quotas to the DaemonSet's memory limit"
ok "$(grep -h -m1 -o 'memory limit [0-9]* MiB: each pod may queue [0-9]* MiB, have [0-9]* MiB of READ data in flight and hold [0-9]* proxies' \
  "$CT_DIR/router.log")"

step "clean-up"
ct_down
ok "containers, snapshots, CNI networks, namespaces and containerd removed"
echo "e2e: 1 passed, 0 failed"
