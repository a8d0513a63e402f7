#!/usr/bin/env bash
# Build the Dockerfile's image without a registry or a container daemon (CI, a laptop as root):
#   1. a Debian bookworm base with python3 made by debootstrap (minbase), imported with buildah;
#   2. `buildah bud` of the Dockerfile on it (chroot isolation, vfs storage: no kernel overlay,
#      no cgroups needed), the host's CA bundle and resolv.conf bind-mounted so pip reaches PyPI.
# Usage: scripts/image.sh STORAGE_DIR [TARGET] [TAG] [BUD_OPTION...]   (TARGET node by default)
#   e.g. scripts/image.sh /var/tmp/img full localhost/cluster-preflight:full \
#          --build-arg TORCH_SPEC=torch==2.11.0 --build-arg TORCH_INDEX_URL=.../whl/cu130
# Everything lives under STORAGE_DIR (buildah storage, the base rootfs tar), so a caller can
# throw it away with rm -rf; BASE_TAR=FILE reuses a base tar made earlier.
# Prints the seconds each step took on stderr; the image is localhost/cluster-preflight:TARGET.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${1:?usage: scripts/image.sh STORAGE_DIR [TARGET] [TAG] [BUD_OPTION...]}
for tool in buildah debootstrap; do
  command -v "$tool" >/dev/null || { echo "image.sh: $tool not found; apt-get install $tool" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "image.sh: needs root (debootstrap, vfs storage); run it with sudo" >&2; exit 2; }
target=${2:-node}
tag=${3:-localhost/cluster-preflight:$target}
shift $(($# < 3 ? $# : 3))
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
b=(buildah --root "$dir/storage" --runroot "$dir/run" --storage-driver vfs)
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

t0=$SECONDS
base_tar=${BASE_TAR:-$dir/base.tar}
if [ ! -s "$base_tar" ]; then
  rm -rf "$dir/rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv bookworm "$dir/rootfs" "$mirror" \
    >"$dir/debootstrap.log" 2>&1 || { tail -20 "$dir/debootstrap.log" >&2; exit 1; }
  rm -rf "$dir"/rootfs/var/cache/apt/archives/*.deb "$dir"/rootfs/var/lib/apt/lists/*
  tar -C "$dir/rootfs" --numeric-owner -cf "$base_tar" .
  rm -rf "$dir/rootfs"
fi
echo "image.sh: base rootfs $((SECONDS - t0)) s" >&2

t1=$SECONDS
# A second target built in the same storage reuses the imported base.
if ! "${b[@]}" inspect --type image localhost/preflight-base:bookworm >/dev/null 2>&1; then
  ctr=$("${b[@]}" from scratch)
  "${b[@]}" add --quiet "$ctr" "$base_tar" / >/dev/null
  "${b[@]}" commit --quiet --rm "$ctr" localhost/preflight-base:bookworm >/dev/null
fi
echo "image.sh: base import $((SECONDS - t1)) s" >&2

t2=$SECONDS
"${b[@]}" bud --quiet --isolation chroot --layers=false \
  --build-arg BASE=localhost/preflight-base:bookworm --target "$target" \
  -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
  -v /etc/resolv.conf:/etc/resolv.conf:ro \
  "$@" -t "$tag" -f Dockerfile . >/dev/null
echo "image.sh: build of target $target $((SECONDS - t2)) s" >&2
"${b[@]}" images --format '{{.Name}}:{{.Tag}} {{.Size}}' "$tag"
