#!/usr/bin/env bash
# Unit: `kubectl kustomize` builds every kustomization under deploy/ (the whole of
# freeflow's overlays, the examples, the device plugin's modes) with the kubectl on PATH
# (Debian's kubernetes-client 1.20 or a newer one), and what it builds has what
# docs/containers.md promises: the router's privileges, probes, downward API, control
# plane; the device plugin in virtual mode; example pods that only ask for freeflow/vrdma.
set -euo pipefail
deploy=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
command -v kubectl >/dev/null || {
  echo "FAIL kubectl is missing (scripts/install-deps.sh installs it)"
  exit 1
}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
built=0

# build KIND NAME DIR: kustomize DIR and check the result.
build() {
  local kind=$1 name=$2 dir=$3
  if ! kubectl kustomize "$dir" >"$out/y" 2>"$out/err"; then
    echo "FAIL kubectl kustomize $dir:"
    cat "$out/err"
    status=1
    return
  fi
  # The warnings allowed: newer kubectl's about `bases:` and `patchesStrategicMerge:`,
  # which kubectl 1.20 (kustomize v2.0) needs.
  if grep -vE "'(bases|patchesStrategicMerge)' is deprecated" "$out/err" | grep -q .; then
    echo "FAIL kubectl kustomize $dir warns:"
    cat "$out/err"
    status=1
  fi
  python3 "$here/deploy_check.py" "$kind" "$name" <"$out/y" || status=1
  built=$((built + 1))
}

for d in "$deploy"/overlays/*/; do build overlay "$(basename "$d")" "$d"; done
build examples examples "$deploy/examples"
build monitoring monitoring "$deploy/monitoring"
for d in "$deploy"/device-plugin/overlays/*/; do build device-plugin "$(basename "$d")" "$d"; done
# Every kustomization in deploy/ was built above (none forgotten).
all=$(find "$deploy" -name kustomization.yaml | grep -vc '/base/')
[[ $all -eq $built ]] || {
  echo "FAIL $all kustomizations (bases aside) but $built built"
  status=1
}
echo "$built kustomizations built with $(kubectl version --client 2>/dev/null | head -n 1)"
exit $status
