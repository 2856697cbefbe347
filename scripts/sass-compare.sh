#!/usr/bin/env bash
# scripts/sass-compare.sh — compare the machine code (SASS) of two sets of CUDA objects, kernel by
# kernel (a developer aid: shows that a refactor left the measured kernels byte-identical).
#
#   scripts/sass-compare.sh BASE_DIR NEW_DIR [FUNC_REGEX]
#
#   BASE_DIR, NEW_DIR: folders of *.cu.o (other files are ignored) (e.g. a copy of build/obj/kernels/*.cu.o taken before the
#   change, and build/obj/kernels after it). Objects are paired by file name; a kernel is paired by
#   its mangled name, whatever object it lives in (so a kernel moved from one .cu to another is
#   still compared).
#   FUNC_REGEX: only kernels whose mangled name matches (grep -E); default: all.
#
# For every kernel of either set it prints one line:
#   identical  NAME            same SASS text (instructions and their encodings) in both sets
#   DIFFERENT  NAME            both have it, the SASS differs (diff with the dumps it names)
#   removed    NAME            only in BASE_DIR (e.g. a retired variant moved out of the library)
#   added      NAME            only in NEW_DIR
# then a count of each. Exit status: 0 when no kernel is DIFFERENT, 1 otherwise, 2 on bad use.
# The per-kernel dumps stay in $SASS_TMP (default: a fresh mktemp folder, printed at the end).
#
# Needs cuobjdump and nvdisasm (PyPI: nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm); found on PATH,
# in $CUDA_HOME/bin, or in the pip packages' nvidia/cu*/bin folder.
set -euo pipefail

[ $# -ge 2 ] || { sed -n '2,20p' "$0" >&2; exit 2; }
base=$1; new=$2; re=${3:-.}
[ -d "$base" ] || { echo "sass-compare: $base: not a folder" >&2; exit 2; }
[ -d "$new" ] || { echo "sass-compare: $new: not a folder" >&2; exit 2; }

if ! command -v cuobjdump >/dev/null || ! command -v nvdisasm >/dev/null; then
  for d in "${CUDA_HOME:-/usr/local/cuda}/bin" $(python3 -c 'import nvidia, glob; [print(p) for q in nvidia.__path__ for p in glob.glob(q + "/cu*/bin")]' 2>/dev/null || true); do
    [ -x "$d/cuobjdump" ] && PATH="$d:$PATH"
  done
fi
command -v cuobjdump >/dev/null || { echo "sass-compare: no cuobjdump (pip install nvidia-cuda-cuobjdump)" >&2; exit 2; }
command -v nvdisasm >/dev/null || { echo "sass-compare: no nvdisasm (pip install nvidia-cuda-nvdisasm)" >&2; exit 2; }

tmp=${SASS_TMP:-$(mktemp -d /tmp/sass-compare-XXXXXX)}
mkdir -p "$tmp/base" "$tmp/new"

# split DIR OUT: one file per kernel, OUT/<mangled name>.sass, holding that kernel's SASS from its
# "Function :" line to the next one (the object's own identifier line is left out).
split() {
  local o
  for o in "$1"/*.cu.o; do
    [ -e "$o" ] || continue
    cuobjdump -sass "$o" > "$tmp/dump.txt" || { echo "sass-compare: cuobjdump -sass $o failed" >&2; exit 2; }
    awk -v out="$2" '
      /^[ \t]*Function : / { if (f) close(f); f = out "/" $3 ".sass"; next }
      /^[ \t]*\.\.\.\.\.\.\.\.\.\.*$/ { if (f) close(f); f = ""; next }
      f { print > f }' "$tmp/dump.txt"
  done
}
split "$base" "$tmp/base"
split "$new" "$tmp/new"

n_same=0; n_diff=0; n_rm=0; n_add=0
while read -r k; do
  grep -qE -- "$re" <<<"$k" || continue
  b="$tmp/base/$k.sass"; n="$tmp/new/$k.sass"
  if [ -f "$b" ] && [ -f "$n" ]; then
    if cmp -s "$b" "$n"; then echo "identical  $k"; n_same=$((n_same+1))
    else echo "DIFFERENT  $k  (diff $b $n)"; n_diff=$((n_diff+1)); fi
  elif [ -f "$b" ]; then echo "removed    $k"; n_rm=$((n_rm+1))
  else echo "added      $k"; n_add=$((n_add+1)); fi
done < <( (ls "$tmp/base"; ls "$tmp/new") | sed 's/\.sass$//' | sort -u)

echo "sass-compare: $n_same identical, $n_diff different, $n_rm removed, $n_add added (dumps in $tmp)"
[ "$n_diff" -eq 0 ]
