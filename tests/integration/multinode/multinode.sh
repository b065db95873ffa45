#!/usr/bin/env bash
# Integration: virtual RDMA across nodes. Two nodes (namespaces on an underlay bridge, a
# router each), two pods per node, host-gateway routes so ordinary TCP between pods works.
#   multinode.sh tools [static|etcd|direct]   perftest + ibverbs tools between nodes (direct:
#                                      pod-to-pod connections across nodes)
#   multinode.sh failures              killed router, cut link, restarts
#   multinode.sh etcd-outage           etcd stopped and restarted under live traffic
#   multinode.sh etcd-secure           etcd with TLS, client certificates and auth on
#   multinode.sh links                 hand-built frames at the node port: plaintext from a
#                                      pod and a node, TLS with another node's certificate
#   multinode.sh fairness              ib_send_lat beside a flood at a receiver that posts
#                                      no receives
#   multinode.sh windows               memory windows (verbs_windows) between pods of two nodes
set -uo pipefail
source "$(dirname "$0")/../../../scripts/lib/cluster.sh"
FAULTS=${FF_FAULTS:-$FF_BUILD/tests/integration/verbs/verbs_faults}
WINDOWS=${FF_WINDOWS:-$FF_BUILD/tests/integration/verbs/verbs_windows}
trap multinode_down EXIT
failures=0
check() { if [[ $2 -eq 0 ]]; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi; }

# pair NAME SERVER_NODE SERVER_POD CLIENT_NODE CLIENT_POD CMD...
pair() {
  local name=$1
  shift
  mn_pair "$@"
  local status=$?
  grep -hE '^ +[0-9]+ +[0-9]+ |iters in' "$FF_DIR/client.log" | tail -n 1
  check "$name" $status
}

# long_pingpong TAG: a long ibv_rc_pingpong from pod 1/0 to pod 0/0, running after 1.5 s;
# its PIDs in pp_server and pp_client, its logs $FF_DIR/TAG-{s,c}.log.
long_pingpong() {
  local tool=${2:-ibv_rc_pingpong}
  mn_pod_bg 0 0 "$tool" -g 1 -n 100000000 >"$FF_DIR/$1-s.log" 2>&1
  pp_server=$FF_LAST_PID
  sleep 0.5
  mn_pod_bg 1 0 "$tool" -g 1 -n 100000000 "$(mn_pod_ip 0 0)" >"$FF_DIR/$1-c.log" 2>&1
  pp_client=$FF_LAST_PID
  sleep 1
}

mode=${1:-tools}
cp=${2:-static}
multinode_up 2 2
# etcd-secure: set up as docs/control-plane.md says; node0 authenticates with its
# certificate alone (flags), node1 with its certificate and a password (ETCDCTL_* env).
node0_args=() node1_wrap=""
if [[ $mode == etcd-secure ]]; then
  FF_ETCD_SECURE=1
  mn_etcd_up || exit 1
  pki=$FF_ETCD_DIR/pki
  auth=(bash "$FF_SRC/scripts/ff-etcd-auth.sh")
  { mn_etcdctl "${auth[@]}" enable >/dev/null && mn_etcdctl "${auth[@]}" node node0 >/dev/null &&
    printf 'pw-node1\n' | mn_etcdctl "${auth[@]}" -s node node1 >/dev/null; } || { echo "etcd auth setup failed"; exit 1; }
  FF_CONTROL_PLANE_ARGS=(--control-plane "etcd:$(mn_etcd_url)" --etcd-cacert "$pki/ca.crt")
  node0_args=(--etcd-cert "$pki/node0.crt" --etcd-key "$pki/node0.key")
  node1_wrap="env ETCDCTL_CERT=$pki/node1.crt ETCDCTL_KEY=$pki/node1.key ETCDCTL_USER=node1:pw-node1"
elif [[ $mode == etcd-outage || $cp == etcd ]]; then
  mn_etcd_up || exit 1
  FF_CONTROL_PLANE_ARGS=(--control-plane "etcd:$(mn_etcd_url)")
fi
# tools direct: the set with pod-to-pod connections across nodes (docs/direct-path.md), the
# default, with UD datagrams on them too (--direct-datagrams); tools static and tools etcd: the same set relayed through the routers, which
# clusters choose with --cross-node-path=relay. The other modes run the default.
path_args=()
[[ $mode == tools && $cp == direct ]] && path_args=(--cross-node-path direct --direct-datagrams)
[[ $mode == tools && $cp != direct ]] && path_args=(--cross-node-path relay)
mn_router_up 0 --peer-timeout-ms 1000 "${path_args[@]}" "${node0_args[@]}" || exit 1
FF_ROUTER_WRAP=$node1_wrap mn_router_up 1 --peer-timeout-ms 1000 "${path_args[@]}" || exit 1
[[ $cp == etcd || $mode == etcd-secure ]] && sleep 0.5  # let both routers publish

case $mode in
  tools)
    for t in rc uc ud srq; do
      pair "ibv_${t}_pingpong across nodes" 0 0 1 0 "ibv_${t}_pingpong" -g 1 -n 200
      pair "ibv_${t}_pingpong -e across nodes" 0 0 1 0 "ibv_${t}_pingpong" -g 1 -e -n 200
    done
    # Without -g the pingpongs address their peer by LID only: unique in the cluster.
    pair "ibv_rc_pingpong by LID across nodes" 0 0 1 0 ibv_rc_pingpong -n 200
    pair "ibv_ud_pingpong by LID across nodes" 0 0 1 0 ibv_ud_pingpong -n 200
    pair "ib_send_bw RC across nodes" 0 0 1 0 ib_send_bw -n 2000
    pair "ib_send_bw UC across nodes" 0 0 1 0 ib_send_bw -c UC -n 2000
    pair "ib_send_bw UD across nodes" 0 0 1 0 ib_send_bw -c UD -n 2000
    pair "ib_send_bw -a across nodes" 0 0 1 0 ib_send_bw -a -n 20
    pair "ib_send_bw -e across nodes" 0 0 1 0 ib_send_bw -e -n 2000
    pair "ib_send_bw -b across nodes" 0 0 1 0 ib_send_bw -b -n 2000
    pair "ib_send_bw --use-srq across nodes" 0 0 1 0 ib_send_bw --use-srq -n 2000
    pair "ib_write_bw -q 4 across nodes" 0 0 1 0 ib_write_bw -q 4 -n 1000
    pair "ib_write_bw -D 2 across nodes" 0 0 1 0 ib_write_bw -D 2
    pair "ib_read_bw -q 30 across nodes" 0 0 1 0 ib_read_bw -q 30 -n 200
    pair "ib_atomic_bw CMP_AND_SWAP across nodes" 0 0 1 0 ib_atomic_bw -A CMP_AND_SWAP -n 1000
    pair "ib_atomic_bw FETCH_AND_ADD across nodes" 0 0 1 0 ib_atomic_bw -A FETCH_AND_ADD -n 1000
    for t in send write read atomic; do pair "ib_${t}_lat across nodes" 0 0 1 0 "ib_${t}_lat" -n 1000; done
    pair "ib_write_bw across nodes, mlx5 path" 0 0 1 0 env FFV_VENDOR=mlx5 ib_write_bw -n 1000
    # A pod polling a CQ that only the router feeds sleeps instead of spinning: the routers
    # need that CPU. Stop the client mid-run and read the server's CPU time for 1 s.
    long_pingpong spin
    spid=$pp_server cpid=$pp_client
    # direct_conns_now: the router of node 0's count of direct connections, asked now.
    direct_conns_now() {
      router_stats_line "${FF_NODE_ROUTER[0]}" "$(mn_dir 0)/router.log" | grep -o 'direct_conns=[0-9]*'
    }
    if [[ $cp == direct ]]; then
      # The routers' own count, asked while the pair runs: the data goes pod to pod.
      conns=$(direct_conns_now)
      echo "router of node 0 during the pair: $conns"
      [[ ${conns#direct_conns=} -ge 1 ]]
      check "the cross-node pair runs on a direct connection (${conns:-no stats})" $?
    fi
    kill -STOP "$cpid"
    sleep 0.2
    cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo -1; }
    t0=$(cpu_ticks "$spid"); sleep 1; t1=$(cpu_ticks "$spid")
    kill -KILL "$cpid"; kill -CONT "$cpid" 2>/dev/null
    wait_pid "$spid" 10 >/dev/null; wait_pid "$cpid" 10 >/dev/null
    busy=$(( (t1 - t0) * 100 / $(getconf CLK_TCK) ))
    echo "server waiting on a stopped cross-node peer: ${busy}% of a CPU (t0=$t0 t1=$t1)"
    [[ $t0 -ge 0 && $t1 -ge 0 && $busy -lt 30 ]]
    check "a pod waiting on a cross-node peer sleeps (${busy}% CPU)" $?
    if [[ $cp == direct ]]; then
      # UD too: the datagrams of a UD pair across nodes go pod to pod. The RC pair's
      # connection went with its processes first.
      for ((i = 0; i < 20; i++)); do
        before=$(direct_conns_now)
        [[ ${before#direct_conns=} == 0 ]] && break
        sleep 0.1
      done
      long_pingpong ud ibv_ud_pingpong
      conns=$(direct_conns_now)
      echo "router of node 0 before the UD pair: $before, during it: $conns"
      kill -KILL "$pp_client" "$pp_server" 2>/dev/null
      wait_pid "$pp_server" 10 >/dev/null; wait_pid "$pp_client" 10 >/dev/null
      [[ ${before#direct_conns=} == 0 && ${conns#direct_conns=} -ge 1 ]]
      check "a cross-node UD pair runs on a direct connection (${conns:-no stats})" $?
    fi
    # Same-node pairs keep the shared-memory path: far above what TCP can carry here.
    out=$(pair "ib_write_bw between pods of one node" 0 0 0 1 ib_write_bw -n 5000)
    echo "$out"
    gbps=$(awk '/^ +65536/ {printf "%d", $4 * 8 / 1000}' <<<"$out")
    [[ ${gbps:-0} -gt 40 ]]
    check "a same-node pair uses the same-node path (${gbps:-?} Gbit/s)" $?
    # A pod that appears after the routers started is reachable from the other node.
    late=$(mn_pod_ns 1 0)x
    ip netns add "$late"; FF_MN_NS+=("$late")
    ip link add "fl${FF_TAG}" type veth peer name eth0 netns "$late"
    ip link set "fl${FF_TAG}" netns "$(mn_node_ns 1)"
    ip -n "$(mn_node_ns 1)" link set "fl${FF_TAG}" master ffbr up
    ip -n "$late" link set lo up
    ip -n "$late" addr add "10.244.$((FF_NET + 1)).99/24" dev eth0
    ip -n "$late" link set eth0 up
    ip -n "$late" route add default via "10.244.$((FF_NET + 1)).1"
    ip netns exec "$late" env FREEFLOW_DIR="$(mn_dir 1)" LD_PRELOAD="$(mn_dir 1)/libffverbs.so" \
      ibv_rc_pingpong -g 1 -n 100 >"$FF_DIR/late.log" 2>&1 &
    lpid=$!; FF_PIDS+=("$lpid")
    sleep 1
    mn_pod_run 0 1 timeout 30 ibv_rc_pingpong -g 1 -n 100 "10.244.$((FF_NET + 1)).99" >"$FF_DIR/late-c.log" 2>&1
    c=$?
    wait_pid "$lpid" 10; s=$?
    check "a pod started after the routers is reachable from the other node" $((c != 0 || s != 0))
    ;;
  windows)
    pair "memory windows: bind, access, invalidate (local and remote) across nodes" \
      0 0 1 0 "$WINDOWS" 19201
    grep -hE '^(ok|FAILED):' "$FF_DIR/server.log" "$FF_DIR/client.log"
    ;;
  failures)
    # Router of the server's node killed: the client gets error completions, not a hang.
    port=19101
    mn_pod_bg 0 0 "$FAULTS" server $port >"$FF_DIR/server.log" 2>&1; spid=$FF_LAST_PID
    mn_pod_bg 1 0 "$FAULTS" client "$(mn_pod_ip 0 0)" $port peer_gone >"$FF_DIR/client.log" 2>&1; cpid=$FF_LAST_PID
    for ((i = 0; i < 200; i++)); do grep -q READY "$FF_DIR/client.log" && break; sleep 0.05; done
    mn_router_down 0 KILL
    wait_pid "$cpid" 30; c=$?
    cat "$FF_DIR/client.log"
    check "killing the peer node's router fails the QP within the bound" $c
    kill -9 "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
    mn_router_up 0 --peer-timeout-ms 1000 || exit 1
    pair "after the router restarts, new QPs work" 0 0 1 0 ibv_rc_pingpong -g 1 -n 100
    # The link of node 0 cut: no FIN, only silence; the peer timeout (1 s) must fire.
    port=19102
    mn_pod_bg 0 0 "$FAULTS" server $port >"$FF_DIR/server.log" 2>&1; spid=$FF_LAST_PID
    mn_pod_bg 1 0 "$FAULTS" client "$(mn_pod_ip 0 0)" $port peer_gone >"$FF_DIR/client.log" 2>&1; cpid=$FF_LAST_PID
    for ((i = 0; i < 200; i++)); do grep -q READY "$FF_DIR/client.log" && break; sleep 0.05; done
    ip -n "$(mn_node_ns 0)" link set eth0 down
    wait_pid "$cpid" 30; c=$?
    cat "$FF_DIR/client.log"
    check "cutting a node's link fails the QPs to it within the peer timeout" $c
    kill -9 "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
    ip -n "$(mn_node_ns 0)" link set eth0 up
    ip -n "$(mn_node_ns 0)" route add "10.244.$((FF_NET + 1)).0/24" via "$(mn_node_ip 1)" 2>/dev/null
    sleep 0.5
    pair "after the link comes back, new QPs work" 0 0 1 0 ibv_rc_pingpong -g 1 -n 100
    ;;
  links)
    # A victim with memory open to remote writes, connected to its real peer on node 1.
    port=19103
    mn_pod_bg 0 0 "$FAULTS" server $port >"$FF_DIR/victim.log" 2>&1; spid=$FF_LAST_PID
    mkfifo "$FF_DIR/go"
    # shellcheck disable=SC2016  # expanded by the inner shell
    mn_pod_bg 1 0 sh -c 'exec "$0" client "$1" "$2" intact 0<>"$3"' "$FAULTS" "$(mn_pod_ip 0 0)" \
      $port "$FF_DIR/go" >"$FF_DIR/client.log" 2>&1; cpid=$FF_LAST_PID
    for ((i = 0; i < 200; i++)); do grep -q VICTIM "$FF_DIR/client.log" && break; sleep 0.05; done
    read -r _ qpn rkey addr src_qpn < <(grep VICTIM "$FF_DIR/client.log")
    attack=(python3 "$FF_SRC/tests/integration/multinode/node_port_attack.py")
    aim=("$(mn_pod_ip 1 0)" "${src_qpn:-0}" "$(mn_pod_ip 0 0)" "${qpn:-0}" "${rkey:-0}" "${addr:-0}")
    mn_pod_run 1 1 "${attack[@]}" plain "$(mn_node_ip 0)" 7471 "${aim[@]}"
    check "hand-built frames from a pod reach nothing" $?
    ip netns exec "$(mn_node_ns 1)" "${attack[@]}" plain "$(mn_node_ip 0)" 7471 "${aim[@]}"
    check "hand-built frames from a node namespace reach nothing" $?
    # A certificate of the cluster's CA, for a node the control plane does not have.
    mn_tls_args node2 >/dev/null
    creds=("$FF_DIR/tls/ca.crt" "$FF_DIR/tls/node2.crt" "$FF_DIR/tls/node2.key")
    ip netns exec "$(mn_node_ns 1)" "${attack[@]}" tls "$(mn_node_ip 0)" 7471 "${creds[@]}" node1 \
      "$(mn_pod_ip 1 0)" "$(mn_pod_ip 0 0)" "${qpn:-0}" closed
    check "a router with node2's certificate cannot say it is node1" $?
    ip netns exec "$(mn_node_ns 1)" "${attack[@]}" tls "$(mn_node_ip 0)" 7471 "${creds[@]}" node2 \
      "$(mn_pod_ip 1 0)" "$(mn_pod_ip 0 0)" "${qpn:-0}" eacces
    check "a router cannot connect as a pod of another node" $?
    echo go >"$FF_DIR/go"
    wait_pid "$cpid" 20; c=$?
    tail -n 1 "$FF_DIR/client.log"
    check "the victim's memory and completion queue are untouched" $c
    kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
    grep -q "TLS with router node0 (TLSv1.3" "$(mn_dir 1)/router.log"
    check "node1 reached node0 over TLS 1.3" $?
    pair "the routers go on serving" 0 1 1 1 ibv_rc_pingpong -g 1 -n 100
    ;;
  fairness)
    # median_lat: ib_send_lat (2 bytes) from pod 1/1 to pod 0/1; its typical (median) latency.
    median_lat() {
      mn_pair 0 1 1 1 ib_send_lat -n 5000 >/dev/null || return 1
      awk '/^ +2 +[0-9]+ / {print $5}' "$FF_DIR/client.log" | tail -n 1
    }
    idle=$(median_lat)
    echo "ib_send_lat across nodes, idle link: median ${idle:-?} us"
    port=19104
    mn_pod_bg 0 0 "$FAULTS" server $port >"$FF_DIR/flood-s.log" 2>&1; spid=$FF_LAST_PID
    mn_pod_bg 1 0 env FF_FLOOD_SECONDS=30 "$FAULTS" client "$(mn_pod_ip 0 0)" $port flood \
      >"$FF_DIR/flood-c.log" 2>&1; cpid=$FF_LAST_PID
    for ((i = 0; i < 200; i++)); do grep -q FLOODING "$FF_DIR/flood-c.log" && break; sleep 0.05; done
    sleep 1  # the flood's channel fills its window
    busy=$(median_lat)
    echo "ib_send_lat across nodes beside the flood: median ${busy:-?} us"
    awk -v b="${busy:-0}" -v i="${idle:-0}" 'BEGIN { exit !(b > 0 && i > 0 && b <= 2 * i) }'
    check "beside a flood at a receiver without receives, the median stays within 2x (${busy:-?} vs ${idle:-?} us)" $?
    kill -0 "$cpid" 2>/dev/null  # it exits at its first completion
    check "the flood's SENDs still wait for receives, none failed" $?
    kill "$cpid" "$spid" 2>/dev/null; wait "$cpid" "$spid" 2>/dev/null
    ! grep -q "closed:" "$(mn_dir 0)/router.log" "$(mn_dir 1)/router.log"
    check "the link the flood shares stayed up" $?
    ;;
  etcd-outage)
    # Traffic started while etcd is up keeps flowing while it is down.
    mn_pod_bg 0 0 ib_write_bw -D 6 >"$FF_DIR/server.log" 2>&1; spid=$FF_LAST_PID
    sleep 0.5
    mn_pod_bg 1 0 ib_write_bw -D 6 "$(mn_pod_ip 0 0)" >"$FF_DIR/client.log" 2>&1; cpid=$FF_LAST_PID
    sleep 2
    mn_etcd_down
    wait_pid "$cpid" 30; c=$?
    wait_pid "$spid" 10; s=$?
    tail -n 2 "$FF_DIR/client.log"
    check "existing cross-node traffic keeps flowing while etcd is down" $((c != 0 || s != 0))
    # A pod on a third node appears while etcd is down; once etcd is back it resolves.
    mn_etcd_up || exit 1
    sleep 3  # routers reconnect with backoff and re-publish
    pair "after etcd returns, routers resolve pods again" 0 1 1 1 ibv_rc_pingpong -g 1 -n 100
    ;;
  etcd-secure)
    pair "ibv_rc_pingpong across nodes, etcd over TLS with auth" 0 0 1 0 ibv_rc_pingpong -g 1 -n 200
    pair "ib_write_bw across nodes, etcd over TLS with auth" 0 0 1 0 ib_write_bw -n 1000
    # While a pod on each node holds a QP, etcd has both nodes' endpoints and pods, each
    # under its node's prefix, and nothing else.
    long_pingpong keys
    kpid0=$pp_server kpid1=$pp_client
    keys=$(mn_etcd_get /freeflow/v2/ --prefix --keys-only | sed '/^$/d')
    kill "$kpid0" "$kpid1" 2>/dev/null; wait "$kpid0" "$kpid1" 2>/dev/null
    echo "$keys"
    [[ $(grep -c '^/freeflow/v2/nodes/node[01]/endpoint$' <<<"$keys") -eq 2 &&
      $(grep -c "^/freeflow/v2/nodes/node0/pods/$(mn_pod_ip 0 0)\$" <<<"$keys") -eq 1 &&
      $(grep -c "^/freeflow/v2/nodes/node1/pods/$(mn_pod_ip 1 0)\$" <<<"$keys") -eq 1 &&
      $(grep -cvE '^/freeflow/v2/nodes/node[01]/(endpoint|pods/[0-9.]+)$' <<<"$keys") -eq 0 ]]
    check "each node's keys are under its own prefix" $?
    # node1's credentials cannot rewrite node0's endpoint.
    before=$(mn_etcd_get /freeflow/v2/nodes/node0/endpoint --print-value-only)
    ip netns exec "ff${FF_TAG}u" env ETCDCTL_API=3 etcdctl --endpoints "$(mn_etcd_url)" --cacert "$pki/ca.crt" \
      --cert "$pki/node1.crt" --key "$pki/node1.key" --user node1:pw-node1 \
      put /freeflow/v2/nodes/node0/endpoint '{"address":"172.31.9.9","port":7471}' >"$FF_DIR/put.log" 2>&1
    # shellcheck disable=SC2181  # the put's status is one of three conditions
    [[ $? -ne 0 ]] && grep -q "permission denied" "$FF_DIR/put.log" &&
      [[ $(mn_etcd_get /freeflow/v2/nodes/node0/endpoint --print-value-only) == "$before" ]]
    check "node1's credentials may not write node0's endpoint" $?
    # node1 restarted with a wrong password: exits at once and says why; with the right
    # one it comes back and serves.
    mn_router_down 1
    FF_ROUTER_WRAP="${node1_wrap%:*}:wrong" mn_router_start 1 --peer-timeout-ms 1000
    wait_pid "${FF_NODE_ROUTER[1]}" 15
    status=$?
    FF_NODE_ROUTER[1]=""
    [[ $status -ne 0 && $status -ne 124 ]] && grep -q 'etcd refused user "node1"' "$(mn_dir 1)/router.log"
    check "a router with a wrong etcd password exits and says so" $?
    FF_ROUTER_WRAP=$node1_wrap mn_router_up 1 --peer-timeout-ms 1000 || exit 1
    sleep 0.5
    pair "after the restart, ping-pong across nodes" 0 1 1 1 ibv_rc_pingpong -g 1 -n 100
    ;;
esac
[[ $failures -eq 0 ]]
