#!/usr/bin/env bash
# Installs every Debian package freeflow needs to build, test, benchmark and demo.
# Idempotent and quiet when everything is already there; run as root (or via sudo).
set -euo pipefail

PACKAGES=(
  # toolchain (clang-tidy and python3 check the size limits in tests/style, shellcheck
  # every shell script)
  build-essential cmake pkg-config git clang-tidy python3 shellcheck
  # LLVM's linker, which links the build in a third of GNU ld's time (CMakeLists.txt)
  lld
  # fuzz targets (fuzz/): clang, and libclang-rt-14-dev for -fsanitize=fuzzer (libFuzzer)
  clang libclang-rt-14-dev
  # libraries
  libibverbs-dev librdmacm-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  # the /metrics endpoints of the router and the device plugin (GNU libmicrohttpd), and
  # promtool (in prometheus; no daemon starts, see policy-rc.d below) that checks them
  libmicrohttpd-dev prometheus
  libgtest-dev libgmock-dev libbenchmark-dev
  # real clients and baselines used by tests, demo and benchmarks
  perftest ibverbs-utils rdmacm-utils iperf3 sockperf qperf
  # the device as diagnostics read it: ibstat and ibstatus read sysfs (tests/integration/verbs)
  infiniband-diags
  # unmodified socket programs of TCP mode (tests/integration/tcp_mode/tcp_mode.sh); the
  # tests start their own instances in pod namespaces, none may run on the host (see
  # policy-rc.d below)
  nginx redis-server redis-tools openssh-server openssh-client
  # a process-per-connection server (socat's fork) and nginx's load generator (ab)
  socat apache2-utils
  # UCX and Open MPI over freeflow0 (tests/integration/ucx/ucx.sh); libopenmpi-dev lets
  # CMake's find_package(MPI) build the test's MPI program, libucx-dev the UCX client/server
  # program of tests/integration/rdmacm/rdmacm.sh
  ucx-utils openmpi-bin libopenmpi-dev libucx-dev
  # libfabric's verbs provider over rdma_cm (fi_pingpong, tests/integration/rdmacm/rdmacm.sh)
  libfabric-bin
  # namespaces, bridges, processes
  iproute2 procps util-linux psmisc strace binutils curl
  # control plane used by later tests
  etcd-server etcd-client
  # TLS on node links (the router links libssl), etcd's TLS files checked with libcrypto,
  # and certificates (scripts/ff-certs.sh)
  libssl-dev openssl
  # small frames of direct connections sealed by nettle (into the preloaded library statically)
  nettle-dev
  # container images (make images: a Debian root file system, made an OCI image) and the
  # end-to-end run on a real runtime (make e2e: a private containerd, runc, CNI bridge)
  mmdebstrap umoci containerd runc containernetworking-plugins
  # reading the manifests kubectl kustomize builds (tests/unit/deploy_check.py, tests/e2e)
  python3-yaml
)
# kubectl (its `kustomize` builds deploy/ in the tests): Debian's kubernetes-client, unless
# a kubectl is already installed (another package of it would conflict on /usr/bin/kubectl).
if ! command -v kubectl >/dev/null 2>&1; then
  PACKAGES+=(kubernetes-client)
fi
# AES-128-GCM of direct connections by intel-ipsec-mb's AVX2 and AVX-512 code (Debian ships it
# for amd64 only; elsewhere the seal is OpenSSL's and nettle's alone, core/src/frame_seal.cc)
if [[ $(dpkg --print-architecture) == amd64 ]]; then
  PACKAGES+=(libipsec-mb-dev)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  SUDO=sudo
else
  SUDO=
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# nginx, redis-server and openssh-server start their daemon from their postinst (invoke-rc.d)
# on a machine without systemd: port 80, 6379 and 22 on the host, for nobody. A policy-rc.d
# that denies every start (exit 101) keeps them stopped; one already there is left alone.
policy=/usr/sbin/policy-rc.d
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\n# install-deps.sh: no daemon starts while packages install\nexit 101\n' |
    $SUDO tee "$policy" >/dev/null
  $SUDO chmod 0755 "$policy"
  trap '$SUDO rm -f "$policy"' EXIT
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
