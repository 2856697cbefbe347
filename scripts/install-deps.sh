#!/usr/bin/env bash
# scripts/install-deps.sh — install the Debian packages dflash-pipe builds against, idempotently.
#
#   scripts/install-deps.sh           install what is missing (apt-get; needs root)
#   scripts/install-deps.sh --check   exit 0 if everything is present, 1 and list what is missing
#
# Run as non-root, it prints the exact command to run instead. The CUDA toolkit (nvcc, cuBLAS,
# cuBLASLt, NCCL) is not a Debian package here: it comes from the CUDA install in /usr/local/cuda,
# and the build works without it (CPU path only).
set -euo pipefail

PKGS=(build-essential pkg-config libnanomsg-dev libmsgpack-dev libjansson-dev libprotobuf-c-dev protobuf-c-compiler check libsubunit-dev libopenblas-pthread-dev gnuplot-nox python3
      libopenmpi-dev openmpi-bin)   # Open MPI: dflash-train's ranks (stages/train/dp.h)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${1:-}" = "--check" ]; then
  if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
  echo "missing packages: ${missing[*]}"
  exit 1
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi

cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: run as root:  sudo sh -c '$cmd'" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
sh -c "$cmd"
