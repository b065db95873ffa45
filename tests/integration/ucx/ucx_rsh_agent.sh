#!/usr/bin/env bash
# mpirun's remote shell for pods that are network namespaces (--mca plm_rsh_agent): where
# ssh would log into HOST and run COMMAND, this runs COMMAND inside HOST's pod namespace,
# with that pod's freeflow settings (the library preloaded, its node's router folder), so
# that Open MPI's daemon and the ranks it starts there are processes of that pod.
# Usage (by mpirun): ucx_rsh_agent.sh HOST COMMAND...; the pods are listed in the file
# $FF_MPI_PODS, one "ADDRESS NAMESPACE FREEFLOW_DIR" per line.
set -euo pipefail
host=$1
shift
found=""
while read -r addr ns dir; do
  if [[ $addr == "$host" ]]; then
    found=$ns
    break
  fi
done <"${FF_MPI_PODS:?the pod list}"
if [[ -z $found ]]; then
  echo "ucx_rsh_agent: no pod has the address $host" >&2
  exit 255
fi
exec ip netns exec "$found" env FREEFLOW_DIR="$dir" FFR_NAME=ffrouter \
  LD_PRELOAD="$dir/libffverbs.so" sh -c "$*"
