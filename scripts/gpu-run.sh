#!/usr/bin/env bash
# scripts/gpu-run.sh — package GPU tests, stages and benchmarks for the GPU machine, and run them
# there (gpu-machine.md: build here, run there).
#
#   BUILD=build scripts/gpu-run.sh pack        (here; `make gpu-test` does this) -> $BUILD/gpu/
#   bash build/gpu/run.sh [tests|bench|all] [FILTER]   (there; run from the repository root; FILTER: an extended
#                                                       regex on the suite's name; GPU_JOBS=N runs N suites at once:
#                                                       all 27 took 129 s with 4 on the H200, RESULTS.md run 52)
#   bash build/gpu/run.sh standard [bench.sh flags]     (there: scripts/bench.sh --gpu with this package, issue 21:
#                                                       ceilings, target alone, trainer alone, whole pipeline)
#
# The package holds the binaries plus libnanomsg.so.5 and Open MPI's libraries (the GPU machine has neither); msgpack,
# jansson, Check and OpenBLAS (the CPU trainer's SGEMMs) are linked statically, cuBLAS/cudart come from
# /usr/local/cuda there.
# On the device tool: run(command="tar -C build -xJf build/gpu.tar.xz && GPU_JOBS=4 bash build/gpu/run.sh all",
# carry=["build/gpu.tar.xz"]) (pack writes the compressed copy: the tool carries at most 64 MiB).
set -euo pipefail
BUILD=${BUILD:-build}
mode=${1:-pack}

if [ "$mode" = pack ]; then
  pkg="$BUILD/gpu"
  rm -rf "$pkg"; mkdir -p "$pkg/bin" "$pkg/tests" "$pkg/bench" "$pkg/lib"
  cp "$BUILD"/bin/* "$pkg/bin/" 2>/dev/null || true
  cp "$BUILD"/gpu-tests/* "$pkg/tests/" 2>/dev/null || true
  cp "$BUILD"/bench/* "$pkg/bench/" 2>/dev/null || true
  cp -L /usr/lib/x86_64-linux-gnu/libnanomsg.so.5 "$pkg/lib/"
  # dflash-train links Open MPI when the build found it (Makefile MPI): its shared libraries travel too (the GPU
  # machine has none); a one-rank dflash-train only loads them, MPI_Init runs for several ranks alone
  if [ -x "$BUILD/bin/dflash-train" ]; then
    ldd "$BUILD/bin/dflash-train" | awk '$3 ~ /(libmpi|libopen-rte|libopen-pal|libhwloc|libevent|libudev|libopenblas|libgfortran|libquadmath)/ {print $3}' |
      while read -r so; do cp -L "$so" "$pkg/lib/"; done
  fi
  strip --strip-debug "$pkg"/bin/* "$pkg"/tests/* "$pkg"/bench/* 2>/dev/null || true
  cp scripts/gpu-run.sh "$pkg/run.sh"
  # what travels: the device tool carries at most 64 MiB, so the package goes compressed
  tar -C "$BUILD" -cf - gpu | xz -T0 -6 >"$BUILD/gpu.tar.xz"
  echo "packed $(du -sh "$pkg" | cut -f1) into $pkg, $(du -sh "$BUILD/gpu.tar.xz" | cut -f1) compressed in $BUILD/gpu.tar.xz"
  echo "on the GPU machine: tar -C $BUILD -xJf $BUILD/gpu.tar.xz && bash $pkg/run.sh all   (device tool: carry [\"$BUILD/gpu.tar.xz\"])"
  exit 0
fi

# ---- on the GPU machine
here=$(cd "$(dirname "$0")" && pwd)
if [ "$mode" = standard ]; then
  shift
  # the tree's scripts/bench.sh, two levels above the package (build/gpu); results under $OUT when the device
  # tool sets it, so they come back
  OUT_DIR=${OUT_DIR:-${OUT:-/tmp/gpu-out}} exec bash "$here/../../scripts/bench.sh" --gpu --pkg "$here" "$@"
fi
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export DFLASH_BIN="$here/bin"
filter=${2:-}
out=${OUT:-/tmp/gpu-out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
summary=()
fails=0
# GPU_JOBS=N runs N suites at a time (default 1); FILTER is an extended regex on the suite's name (a substring works)
one_suite() {
  local t=$1 name r t0
  name=$(basename "$t"); t0=$(date +%s)
  if timeout 300 "$t" >"$out/$name.log" 2>&1; then r=ok; else r=FAIL; fi
  printf '%-30s %-4s %4ss  %s\n' "$name" "$r" $(( $(date +%s) - t0 )) \
    "$(grep -E '^[0-9]+%: Checks:' "$out/$name.log" | tail -1)" >"$out/$name.sum"
}
if [ "$mode" = tests ] || [ "$mode" = all ]; then
  jobs_max=${GPU_JOBS:-1}
  ran=()
  for t in "$here"/tests/*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    [ -z "$filter" ] || [[ $name =~ $filter ]] || continue
    ran+=("$name")
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
    one_suite "$t" &
  done
  wait || true
  for name in "${ran[@]}"; do
    line=$(cat "$out/$name.sum"); rm -f "$out/$name.sum"
    summary+=("$line")
    if [[ $line != *" ok "* ]]; then fails=$((fails + 1)); echo "=== $name (failed): last 30 lines"; tail -n 30 "$out/$name.log"; fi
  done
fi
if [ "$mode" = bench ] || [ "$mode" = all ]; then
  for b in "$here"/bench/*; do
    [ -x "$b" ] || continue
    name=$(basename "$b")
    [ -z "$filter" ] || [[ $name == *$filter* ]] || continue
    echo "=== $name"
    if ! timeout 240 "$b" 2>&1 | tee "$out/$name.txt"; then fails=$((fails + 1)); summary+=("$name FAIL"); fi
  done
fi
echo "=== summary"
for s in "${summary[@]}"; do echo "$s"; done
echo "gpu: $fails failure(s)"
[ $fails -eq 0 ]
