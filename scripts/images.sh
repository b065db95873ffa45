#!/usr/bin/env bash
# Builds freeflow's OCI images on this machine, from Debian packages and our own binaries;
# no registry and no container engine:
#
#   freeflow-router:dev  ffrouter, ffctl, libffverbs.so and libfsocket.so (the router installs them
#                        into the node's /freeflow) and rdma-device-plugin, with their Debian run-time
#                        libraries; runs as root (see docs/containers.md for why).
#   freeflow-app:dev     perftest, ibverbs-utils, rdmacm-utils; user 1000 (app), no
#                        libffverbs.so: pods get it from the node's /freeflow.
#
# Each image is two layers: a Debian root file system made by mmdebstrap (cached by its
# package list under $FF_IMAGE_CACHE, so a warm build only redoes the second layer) and a
# layer with our stripped binaries, staged under /usr/local by the build's install rules
# (`cmake --install`: bin/, lib/freeflow/). The result is one OCI image layout (umoci), plus
# an OCI archive for `ctr images import`:
#
#   scripts/images.sh [BUILD_DIR] [OUT_DIR]     # default build, BUILD_DIR/images
#
# Prints one line per image and the time the whole build took.
set -euo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(cd "${1:-$SRC/build}" && pwd)
OUT=${2:-$BUILD/images}
CACHE=${FF_IMAGE_CACHE:-/var/cache/freeflow-images}
SUITE=${FF_IMAGE_SUITE:-bookworm}
TAG=${FF_IMAGE_TAG:-dev}
LAYOUT=$OUT/oci
START=$(date +%s.%N)

# What the router image ships, as installed under its prefix: the daemons, and the libraries
# the router hands to pods (libfsocket.so: TCP mode, docs/tcp-mode.md).
ROUTER_FILES=(bin/ffrouter bin/ffctl bin/rdma-device-plugin lib/freeflow/libffverbs.so
  lib/freeflow/libfsocket.so)
APP_PACKAGES=(perftest ibverbs-utils rdmacm-utils)
# Slim root file systems: no manuals, documentation or translations.
DPKG_OPTS=(--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*')

for tool in mmdebstrap umoci strip; do
  command -v "$tool" >/dev/null || {
    echo "images: $tool is missing (scripts/install-deps.sh installs it)" >&2
    exit 1
  }
done

WORK=$(mktemp -d /tmp/ff-images.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$CACHE" "$OUT"

# The router image's files, installed from the build.
STAGE=$WORK/router/usr/local
cmake --install "$BUILD" --prefix "$STAGE" >/dev/null || {
  echo "images: cmake --install $BUILD failed; build first (make build)" >&2
  exit 1
}
for f in "${ROUTER_FILES[@]}"; do
  [[ -f $STAGE/$f ]] || {
    echo "images: $f was not installed from $BUILD; build first (make build)" >&2
    exit 1
  }
done

# run_time_packages BINARY...: the Debian packages that hold the shared libraries the
# binaries load (the C library comes with every root file system).
run_time_packages() {
  local lib
  for lib in $(ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u); do
    dpkg-query -S "$(readlink -f "$lib")" 2>/dev/null || dpkg-query -S "$lib"
  done | cut -d: -f1 | sort -u | grep -vx 'libc6' || true
}

# rootfs NAME PACKAGES...: prints the path of a cached root file system tarball holding
# Debian's essential set plus PACKAGES (and, for the app, its user); built when missing.
rootfs() {
  local name=$1
  shift
  local hooks=()
  if [[ $name == app ]]; then
    # shellcheck disable=SC2016  # $1 is the hook's argument (the root file system), for its shell
    hooks=(--customize-hook='echo "app:x:1000:1000:app:/nonexistent:/usr/sbin/nologin" >>"$1/etc/passwd"'
      --customize-hook='echo "app:x:1000:" >>"$1/etc/group"')
  fi
  local key
  key=$(printf '%s\n' "$name" "$SUITE" "$@" "${DPKG_OPTS[@]}" "${hooks[@]}" | sha256sum | cut -c1-16)
  local tarball=$CACHE/$name-$SUITE-$key.tar
  if [[ ! -s $tarball ]]; then
    local include
    include=$(
      IFS=,
      echo "$*"
    )
    mmdebstrap --quiet --mode=root --variant=essential ${include:+--include="$include"} \
      "${DPKG_OPTS[@]}" "${hooks[@]}" "$SUITE" "$WORK/$name.tar" >&2
    mv "$WORK/$name.tar" "$tarball"
  fi
  echo "$tarball"
}

# image NAME BASE_TARBALL OURS_DIR [umoci config options...]: one image of two layers.
image() {
  local name=$1 base=$2 ours=$3
  shift 3
  local ref=$LAYOUT:freeflow-$name:$TAG
  umoci rm --image "$ref" 2>/dev/null || true
  umoci new --image "$ref"
  umoci raw add-layer --image "$ref" "$base"
  tar -C "$ours" --owner=0 --group=0 --numeric-owner -cf "$WORK/$name-ours.tar" .
  umoci raw add-layer --image "$ref" "$WORK/$name-ours.tar"
  umoci config --image "$ref" --config.workingdir=/ --author=freeflow \
    --config.env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
}

[[ -d $LAYOUT ]] || umoci init --layout "$LAYOUT"

# The router image: our binaries and the libraries, stripped, with their run-time packages.
mapfile -t router_pkgs < <(run_time_packages "${ROUTER_FILES[@]/#/$STAGE/}")
router_base=$(rootfs router "${router_pkgs[@]}")
for f in "${ROUTER_FILES[@]}"; do
  strip --strip-unneeded "$STAGE/$f"
done
image router "$router_base" "$WORK/router" --config.user=0:0 \
  --config.entrypoint=/usr/local/bin/ffrouter

# The app image: Debian's verbs programs, run as user 1000; nothing of ours inside.
app_base=$(rootfs app "${APP_PACKAGES[@]}")
mkdir -p "$WORK/app"
image app "$app_base" "$WORK/app" --config.user=1000:1000 --config.cmd=/bin/sh

umoci gc --layout "$LAYOUT"
# Both images in one OCI archive for `ctr images import` (tags from their ref.name).
tar -C "$LAYOUT" -cf "$OUT/freeflow-images.oci.tar" .
echo "images: freeflow-router:$TAG (Debian layer $(du -h "$router_base" | cut -f1), ours $(du -sh "$WORK/router" | cut -f1))"
echo "images: freeflow-app:$TAG (Debian layer $(du -h "$app_base" | cut -f1))"
awk -v s="$START" -v e="$(date +%s.%N)" 'BEGIN { printf "images: built in %.1f s\n", e - s }'
