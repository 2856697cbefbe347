#!/usr/bin/env bash
# pipelines/demo.sh — the main job (`make run`): the whole pipeline that exists today on the
# embedded default, a tiny random Qwen3-shaped target (dflash-mkmodel --preset tiny: 4 layers,
# hidden 64, vocab 512) and a synthetic dataset:
#
#   dflash-pack --[batches]--> dflash-target --[hidden]--> dflash-record --> runs/demo/record/
#        (dflash-shm owns the rings; every stage reports to dflash-metrics)
#
# Produces runs/demo (or $RUN, or --run DIR): run.json, shm.json, logs/<stage>.log and .out,
# metrics.jsonl, every captured hidden item as record/item-<seq>.safetensors (checked: descriptor, batch
# arrays, finite states), state/pack.cursor, and DONE when the stream is complete.
# Size and time: model + dataset ~0.5 MB; 47 batches (22.6 K tokens) recorded as ~18 MB of fp32
# hidden states (x EPOCHS); about 3 s on a 2-core CPU machine (--device cpu), 3 epochs ~6 s. The stages here are replaced by
# dflash-hspack and dflash-train once those exist.
#
# Resume: run the same command again. A complete run (DONE) only prints its summary. After a
# crash the packer starts at the first seq the recorder does not have on disk (what the trainer's
# checkpoint will be; --resume-from-seq), so no batch is lost or recorded twice; --fresh deletes
# the run directory and starts over. A stage that dies of a signal while the pipeline runs
# (a crash, kill -9) is started again with the same command, up to $MAX_RESTARTS (3) times; a
# stage exiting with an error stops every stage and the script exits 1.
#
#   pipelines/demo.sh [--run DIR] [--fresh] [--device auto|cpu|cuda:N] [--epochs N]
#   environment: BUILD (build dir, default build), RUN, DEVICE, EPOCHS, MAX_RESTARTS
set -euo pipefail

# ---------------------------------------------------------------- configuration
BUILD=${BUILD:-build}
RUN=${RUN:-runs/demo}
DEVICE=${DEVICE:-auto}
EPOCHS=${EPOCHS:-1}
FRESH=0
TOKENS=512                    # token budget per batch (dflash-pack --tokens, dflash-target --tokens)
LAYERS=1,3                    # captured target layers (z-lab ids) of the tiny 4-layer model
MKMODEL_FLAGS=(--preset tiny --dtype f32 --seed 42 --threads 1)
DATASET_FLAGS=(--samples 200 --median-len 96 --len-sigma 0.6 --min-len 16 --max-len 400 --prompt-frac 0.3)
PACK_FLAGS=(--tokens "$TOKENS" --window 64 --seed 1 --vocab-size 512)
TARGET_FLAGS=(--tokens "$TOKENS" --layers "$LAYERS" --heartbeat-s 0.2)
RECORD_FLAGS=(--ring hidden --kind hidden --strict --vocab-size 512 --heartbeat-s 0.2)
METRICS_FLAGS=(--progress-s 1 --plot-every-s 0 --stall-s 30 --csv-stage dflash-target)
BATCH_SLOTS=8
HIDDEN_SLOTS=4

while [ $# -gt 0 ]; do
  case $1 in
    --run) RUN=$2; shift 2 ;;
    --fresh) FRESH=1; shift ;;
    --device) DEVICE=$2; shift 2 ;;
    --epochs) EPOCHS=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=pipelines/lib.sh
. "$here/lib.sh"
DFLASH_BIN=${DFLASH_BIN:-$(cd "$BUILD/bin" 2>/dev/null && pwd)} || pdie "no $BUILD/bin: build first (make BUILD=$BUILD)"
export DFLASH_BIN
for b in dflash-mkmodel dflash-shm dflash-metrics dflash-pack dflash-target dflash-record; do
  [ -x "$DFLASH_BIN/$b" ] || pdie "$DFLASH_BIN/$b is missing: build first (make BUILD=$BUILD)"
done

if [ "$DEVICE" = auto ]; then
  if have_gpu; then DEVICE=cuda:0; else DEVICE=cpu; fi
fi

# ---------------------------------------------------------------- run directory
if [ "$FRESH" = 1 ] && [ -e "$RUN" ]; then
  [ -e "$RUN/run.json" ] || [ -z "$(ls -A "$RUN")" ] || pdie "--fresh: $RUN has no run.json; not deleting a directory this script did not make"
  [ ! -e "$RUN/pids" ] || [ -z "$(ls -A "$RUN/pids")" ] || {
    for f in "$RUN"/pids/*.pid; do
      p=$(cat "$f"); if kill -0 "$p" 2>/dev/null; then pdie "--fresh: a stage of $RUN still runs (pid $p, $f)"; fi
    done
  }
  plog "--fresh: removing $RUN"
  rm -rf "$RUN"
fi
mkdir -p "$RUN/logs" "$RUN/state"
RUN=$(cd "$RUN" && pwd)
lock_run "$RUN"   # a second pipeline on this run directory stops here, naming the holder (lib.sh)
LOGS=$RUN/logs
MODEL=$RUN/model
DATA=$RUN/data.jsonl
OUT=$RUN/record

if [ -e "$RUN/DONE" ]; then
  plog "$RUN is complete (DONE); --fresh starts over. Summary:"
  grep -h 'summary:' "$LOGS/dflash-record.log" "$LOGS/dflash-metrics.log" 2>/dev/null | tail -n 12 | sed 's/^[^ ]* . //' || true
  exit 0
fi

# A stage of an earlier attempt that still runs (the script was killed) would race with ours.
if [ -d "$RUN/pids" ]; then
  for f in "$RUN"/pids/*.pid; do
    [ -e "$f" ] || continue
    p=$(cat "$f")
    if kill -0 "$p" 2>/dev/null && tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q dflash-; then
      plog "stopping $(basename "$f" .pid) (pid $p) left by an earlier attempt"
      kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
      kill -KILL -- "-$p" 2>/dev/null || true
    fi
    rm -f "$f"
  done
fi

set -m   # every background stage in its own process group
on_signal() { plog "interrupted; stopping the pipeline"; exit 130; }
on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  stop_all
  if [ "$rc" -ne 0 ]; then plog "demo failed (status $rc); logs in $LOGS; run the same command again to resume"; fi
  exit "$rc"
}
trap on_exit EXIT
trap on_signal INT TERM

# ---------------------------------------------------------------- model and data (once)
if [ ! -e "$MODEL/config.json" ] || [ ! -e "$DATA" ]; then
  plog "writing the tiny model and dataset into $RUN"
  rm -f "$DATA"
  "$DFLASH_BIN/dflash-mkmodel" --out "$MODEL" --dataset "$DATA.tmp" "${MKMODEL_FLAGS[@]}" "${DATASET_FLAGS[@]}" \
    >>"$LOGS/dflash-mkmodel.out" 2>&1 || pdie "dflash-mkmodel failed; see $LOGS/dflash-mkmodel.out"
  mv "$DATA.tmp" "$DATA"
fi

# ---------------------------------------------------------------- resume point
# The recorder plays the trainer here: what it has on disk is done. Seqs are dense from 0 and the
# recorder is strict, so the first missing seq is the number of contiguous items from 0.
# The packer's own cursor may be ahead of that (batches that were still in the rings when the
# run died), so it is rewound to the recorder's position whenever it exists.
RESUME=()
next=0
while [ -e "$(printf '%s/item-%012d.safetensors' "$OUT" "$next")" ]; do next=$((next + 1)); done
if [ "$next" -gt 0 ] || [ -e "$RUN/state/pack.cursor" ]; then
  RESUME=(--resume-from-seq "$next")
  plog "resuming: $next batches already recorded in $OUT; the packer's cursor is rewound to seq $next"
fi

# ---------------------------------------------------------------- rings
# Each ring is sized by the stage that writes it (stages/core/rings.h): --print-ring-spec prints
# the dflash-shm --ring spec for the same flags the stage runs with.
BATCH_SPEC=$("$DFLASH_BIN/dflash-pack" "${PACK_FLAGS[@]}" --ring-slots "$BATCH_SLOTS" --print-ring-spec) ||
  pdie "dflash-pack --print-ring-spec failed"
HIDDEN_SPEC=$("$DFLASH_BIN/dflash-target" --model "$MODEL" "${TARGET_FLAGS[@]}" --device "$DEVICE" \
                --ring-slots "$HIDDEN_SLOTS" --print-ring-spec) || pdie "dflash-target --print-ring-spec failed"
SHM_FLAGS=(--ring "$BATCH_SPEC" --ring "$HIDDEN_SPEC")
[ "$DEVICE" != cpu ] || SHM_FLAGS+=(--host-only)
RECORD_DEV_FLAGS=()
[ "$DEVICE" = cpu ] || RECORD_DEV_FLAGS=(--verify all)

# ---------------------------------------------------------------- run.json
D=$DFLASH_BIN
CMD_SHM=("$D/dflash-shm" --run "$RUN" "${SHM_FLAGS[@]}")
CMD_METRICS=("$D/dflash-metrics" --run "$RUN" "${METRICS_FLAGS[@]}")
CMD_PACK=("$D/dflash-pack" --run "$RUN" --data "$DATA" --epochs "$EPOCHS" "${PACK_FLAGS[@]}" ${RESUME[@]+"${RESUME[@]}"})
CMD_TARGET=("$D/dflash-target" --run "$RUN" --model "$MODEL" --device "$DEVICE" "${TARGET_FLAGS[@]}")
CMD_RECORD=("$D/dflash-record" --run "$RUN" --device "$DEVICE" --out "$OUT" "${RECORD_FLAGS[@]}" ${RECORD_DEV_FLAGS[@]+"${RECORD_DEV_FLAGS[@]}"})
attempt=1
[ ! -e "$RUN/run.json" ] || attempt=$(( $(grep -o '"attempt": [0-9]*' "$RUN/run.json" | grep -o '[0-9]*$' || echo 0) + 1 ))
cat >"$RUN/run.json.tmp" <<EOF
{
  "kind": "run", "version": 1, "pipeline": "demo", "attempt": $attempt,
  "started": $(json_str "$(date -u +%Y-%m-%dT%H:%M:%SZ)"), "host": $(json_str "$(hostname)"),
  "device": $(json_str "$DEVICE"), "epochs": $EPOCHS, "tokens": $TOKENS, "layers": $(json_str "$LAYERS"),
  "model": $(json_str "$MODEL"), "data": $(json_str "$DATA"), "record": $(json_str "$OUT"),
  "rings": $(json_arr "${SHM_FLAGS[@]}"),
  "stages": {
    "dflash-shm": $(json_arr "${CMD_SHM[@]}"),
    "dflash-metrics": $(json_arr "${CMD_METRICS[@]}"),
    "dflash-pack": $(json_arr "${CMD_PACK[@]}"),
    "dflash-target": $(json_arr "${CMD_TARGET[@]}"),
    "dflash-record": $(json_arr "${CMD_RECORD[@]}")
  },
  "mkmodel": $(json_arr "${MKMODEL_FLAGS[@]}" "${DATASET_FLAGS[@]}")
}
EOF
mv "$RUN/run.json.tmp" "$RUN/run.json"

# ---------------------------------------------------------------- stages
t0=$(date +%s.%N)
plog "run $RUN on $DEVICE (attempt $attempt)"
rm -f "$RUN/shm.json"
start_stage --service dflash-shm "${CMD_SHM[@]}"
wait_for_file "$RUN/shm.json" 20 '"running"' || pdie "dflash-shm did not come up; see $LOGS/dflash-shm.out"
start_stage --service dflash-metrics "${CMD_METRICS[@]}"
wait_for_file "$RUN/bus/metrics.sock" 20 || pdie "dflash-metrics did not bind its socket; see $LOGS/dflash-metrics.out"
start_stage dflash-record "${CMD_RECORD[@]}"
start_stage dflash-target "${CMD_TARGET[@]}"
start_stage dflash-pack "${CMD_PACK[@]}"

# End of stream: the packer drains `batches`, the target then drains `hidden`, the recorder
# exits 0 once `hidden` is drained and empty.
supervise dflash-pack dflash-target dflash-record || exit 1
stop_stage dflash-metrics TERM 20       # drains what is queued, then logs its summary table
stop_stage dflash-shm TERM 20           # unlinks the rings

# ---------------------------------------------------------------- done
[ -e "$OUT/DONE" ] || pdie "dflash-record exited 0 but $OUT/DONE is missing"
n_items=$(find "$OUT" -name 'item-*.safetensors' | wc -l)
printf '{"kind": "done", "version": 1, "items": %d, "seconds": %.1f, "finished": %s}\n' "$n_items" \
  "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')" "$(json_str "$(date -u +%Y-%m-%dT%H:%M:%SZ)")" >"$RUN/DONE.tmp"
mv "$RUN/DONE.tmp" "$RUN/DONE"
plog "done: $n_items hidden items recorded in $OUT; metrics summary:"
grep -h 'summary:' "$LOGS/dflash-metrics.log" 2>/dev/null | tail -n 8 | sed 's/^[^ ]* . //' >&2 || true
grep -h 'summary:' "$LOGS/dflash-record.log" 2>/dev/null | tail -n 1 | sed 's/^[^ ]* . //' >&2 || true
