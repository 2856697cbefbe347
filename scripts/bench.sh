#!/usr/bin/env bash
# scripts/bench.sh — the standard benchmark configuration (design.md §10), with a summary table.
#
#   scripts/bench.sh --cpu-only [--quick]      what `make bench` runs (no GPU): pack_bench,
#                                              ring_bench, and the whole CPU pipeline (the demo:
#                                              pack -> target -> hspack -> train on the tiny model), ~20 s
#   scripts/bench.sh --gpu [--only LIST] [--pkg DIR] [--steps N] [--results FILE|none]
#                                              on the H200, one command of ~9 minutes at most (issue 21):
#     ceiling   bench/ceiling_bench: the bf16 GEMM peak and the device-copy bandwidth of THIS run (every
#               MFU below divides by this peak; no constant)                                  timeout 60 s
#     target    bench/target_bench: the target forward alone, Qwen3-8B shape, 8192-token batches,
#               weights generated on the GPU                                                  timeout 120 s
#     train     bench/train_bench: the trainer alone, design.md §10 drafter, synthetic features, each
#               optimizer x accumulation variant of $TRAIN_VARIANTS (default adamw,muon,muon-ga4) in one
#               process (one drafter init)                                                      timeout 180 s
#     model     dflash-mkmodel --preset qwen3-8b --dtype bf16 --seed 42 (16 GB) + a dataset + a 32000-token
#               draft vocabulary, written once into $BENCH_DIR (default /tmp/dflash-bench) and kept while
#               the machine is held (a timed-out write leaves nothing half-written)            timeout 300 s
#     pipeline  pipelines/train.sh on that model: pack -> target -> hspack -> train, target and trainer
#               sharing cuda:0, once per variant of $PIPE_VARIANTS (default adamw,muon,muon-ga4: dflash-train
#               --optimizer adamw | muon | muon --grad-accum 4), --steps N optimizer steps each (default 30;
#               N/A for -gaA, at least 3); skipped, with the reason, when dflash-train has no GPU path. A variant
#               ending in +mps (e.g. adamw+mps) runs with every stage a client of one MPS server started in a
#               private pipe directory and stopped after it (issue 28 item 5: without MPS the target's and the
#               trainer's kernels time-slice the GPU); skipped when nvidia-cuda-mps-control is missing
#                                            timeout: what is left of 540 s, shared by the variants left
#   --config qwen3.6-27b (issue 27; the default stays qwen3-8b): the same phases for the Qwen3.6-27B
#               target: target_bench --config qwen3.6-27b (64 hybrid layers, random weights on the GPU, the
#               time per layer kind), train_bench --config qwen3.6-27b (SpecForge's 27B drafter: 5 layers,
#               hidden 5120, head dim 256, 24/4 heads, MLP 17408), the model written by dflash-mkmodel
#               --preset qwen3.6-27b (54 GB: run --only model first if the 300 s phase limit cuts it) and the
#               whole pipeline with captured layers [1,16,31,46,61] (PIPE_VARIANTS default adamw here), everything
#               on one H200; the run directory
#               (checkpoint 22 GB + exports) in /dev/shm when it has 40 GB free (the 64 GB disk holds the model)
#   BENCH_RUN_DIR=D: the pipeline's run directory (default $BENCH_DIR/run)
#   LIST: comma-separated phases (default ceiling,target,train,model,pipeline; also `kernels`: every
#   kernel benchmark, not in the default: it does not fit the same 10 minutes).
#   scripts/bench.sh --cpu-smoke               the same phases and the same report on the CPU in a few
#                                              seconds: the tiny model, --device cpu, 5 steps of 512 tokens
#                                              (the GPU benchmarks report "skipped"); tests/test_bench.c
#   BENCH_DEVICE=D overrides the pipeline's device (cuda:0 for --gpu, cpu for --cpu-smoke).
#   --pkg DIR: binaries from a scripts/gpu-run.sh package (DIR/bin, DIR/bench, DIR/lib) instead of
#              $BUILD/bin and $BUILD/bench. On the device tool (the results come back through $OUT):
#              run(command="OUT_DIR=$OUT bash scripts/bench.sh --gpu --pkg build/gpu", carry=["build/gpu"])
#              (or: bash build/gpu/run.sh standard, the same)
#              then, here: cat <files_at>/RESULTS-entry.md >> kernels/bench/RESULTS.md
#   --results FILE: where the report's entry is appended (default for --gpu: kernels/bench/RESULTS.md of
#              this tree; none: only $OUT_DIR/RESULTS-entry.md). The entry has date, commit and shape.
#
# What each figure covers is printed beside it (bench/bench_report.py). In particular the pipeline has two
# rates: "steady" (trainer tokens between its first and last optimizer step / that time: no model load) and
# "launch to last optimizer step" (every trained token / the time from starting train.sh: dataset index,
# rings, the 16 GB target load, the trainer's init and warm-up included). Peak GPU memory is per process
# (nvidia-smi --query-compute-apps, sampled every 0.5 s; the device rings count under dflash-shm).
#
# Output: each phase's output in $OUT_DIR (default $BUILD/bench-out or /tmp/bench-out): ceiling.txt,
# target.txt, train.txt, model.txt, pipeline-VARIANT.txt + pipeline/VARIANT/ (launch, metrics.jsonl, logs),
# pipeline/variants, gpu-mem.csv (the alone phases), gpu-mem-VARIANT.csv, phases.tsv (pipeline.VARIANT per
# run and a summary "pipeline" line), summary.txt (the table) and RESULTS-entry.md. Exit 1 if any phase failed (a skipped phase
# is not a failure).
set -euo pipefail

BUILD=${BUILD:-build}
MODE=""
ONLY=""
QUICK=0
PKG=""
RESULTS=default
CONFIG=qwen3-8b
BENCH_DIR=${BENCH_DIR:-/tmp/dflash-bench}
BUDGET_S=${BUDGET_S:-540}          # the whole --gpu command (the device tool allows 600 s)
PIPE_STEPS=${PIPE_STEPS:-30}
PIPE_VARIANTS_SET=${PIPE_VARIANTS:+1}
PIPE_VARIANTS=${PIPE_VARIANTS:-adamw,muon,muon-ga4}   # optimizer x accumulation variants of the pipeline (issue 28)
TRAIN_VARIANTS=${TRAIN_VARIANTS:-adamw,muon,muon-ga4} # ... and of the trainer alone (train_bench --variants)

while [ $# -gt 0 ]; do
  case $1 in
    --cpu-only) MODE=cpu; shift ;;
    --gpu) MODE=gpu; shift ;;
    --cpu-smoke) MODE=smoke; shift ;;
    --only) ONLY=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --pkg) PKG=$2; shift 2 ;;
    --steps) PIPE_STEPS=$2; shift 2 ;;
    --results) RESULTS=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$MODE" ] || { echo "bench.sh: give --cpu-only, --gpu or --cpu-smoke (see --help)" >&2; exit 2; }
case $CONFIG in qwen3-8b|qwen3.6-27b) ;; *) echo "bench.sh: --config: '$CONFIG' is not qwen3-8b or qwen3.6-27b" >&2; exit 2 ;; esac
[[ $PIPE_STEPS =~ ^[1-9][0-9]*$ ]] || { echo "bench.sh: --steps: '$PIPE_STEPS' is not a positive integer" >&2; exit 2; }
if [ -z "$ONLY" ]; then
  case $MODE in cpu) ONLY=cpu ;; *) ONLY=ceiling,target,train,model,pipeline ;; esac
fi
for p in ${ONLY//,/ }; do
  case $p in cpu|kernels|ceiling|target|train|model|pipeline) ;;
    *) echo "bench.sh: --only: unknown phase '$p' (cpu, kernels, ceiling, target, train, model, pipeline)" >&2; exit 2 ;;
  esac
done
want() { [[ ",$ONLY," == *",$1,"* ]]; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -n "$PKG" ]; then
  BIN=$(cd "$PKG/bin" && pwd); BENCH=$(cd "$PKG/bench" && pwd)
  pkglib=$(cd "$PKG/lib" && pwd)
  export LD_LIBRARY_PATH="$pkglib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
else
  BIN=$(cd "$BUILD/bin" && pwd); BENCH=$(cd "$BUILD/bench" 2>/dev/null && pwd || echo "$BUILD/bench")
fi
export DFLASH_BIN=$BIN
OUT_DIR=${OUT_DIR:-$( [ -w "$BUILD" ] 2>/dev/null && echo "$BUILD/bench-out" || echo /tmp/bench-out)}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
T_START=$SECONDS

ROWS=()
FAILS=0
row() { local w=$2; [ ${#w} -le 58 ] || w="${w:0:55}..."; ROWS+=("$(printf '%-9s|%-58s|%14s|%-10s|%s' "$1" "$w" "$3" "$4" "${5:-}")"); }
note() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
# phase NAME STATUS SECONDS [REASON]: one line of $OUT_DIR/phases.tsv (bench_report.py reads it)
phase() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >>"$OUT_DIR/phases.tsv"; [ "$2" != FAILED ] || FAILS=$((FAILS + 1)); }
first_line() { grep -v '^[[:space:]]*$' "$1" 2>/dev/null | grep -iE 'error|fail|fatal|refus|skipped|no ' | head -n 1 | cut -c1-160; }

# run_bench NAME SECONDS CMD... : output to $OUT_DIR/NAME.txt (and the terminal); a failure is
# counted and named in the table, never fatal.
run_bench() {
  local name=$1 secs=$2; shift 2
  note "=== $name: $*"
  local t0=$SECONDS rc=0
  timeout "$secs" "$@" >"$OUT_DIR/$name.txt" 2>&1 || rc=$?
  cat "$OUT_DIR/$name.txt" >&2
  if [ $rc -ne 0 ]; then
    FAILS=$((FAILS + 1))
    row "$name" "FAILED (exit $rc after $((SECONDS - t0)) s)" "-" "-" "$OUT_DIR/$name.txt"
    return 1
  fi
  return 0
}

# gpu_phase NAME SECONDS PROGRAM ARGS... : one benchmark binary of the --gpu / --cpu-smoke phases, output in
# $OUT_DIR/NAME.txt; ok, FAILED (exit status or timeout) or skipped (not built, or it says "skipped").
gpu_phase() {
  local name=$1 secs=$2 prog=$3; shift 3
  : >"$OUT_DIR/$name.txt"
  if [ ! -x "$prog" ]; then phase "$name" skipped 0 "$prog not built (make gpu-build)"; return 0; fi
  note "=== $name: $prog $*"
  local t0=$SECONDS rc=0
  timeout -k 10 "$secs" "$prog" "$@" >"$OUT_DIR/$name.txt" 2>&1 || rc=$?
  tail -n 40 "$OUT_DIR/$name.txt" >&2
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then phase "$name" FAILED $((SECONDS - t0)) "timed out after $secs s"
  elif [ $rc -ne 0 ]; then phase "$name" FAILED $((SECONDS - t0)) "exit $rc: $(first_line "$OUT_DIR/$name.txt")"
  elif grep -q 'skipped' "$OUT_DIR/$name.txt"; then phase "$name" skipped $((SECONDS - t0)) "$(grep -m1 skipped "$OUT_DIR/$name.txt")"
  else phase "$name" ok $((SECONDS - t0)); fi
}

# ---------------------------------------------------------------- CPU benchmarks (--cpu-only)
if want cpu; then
  q=(); [ "$QUICK" = 0 ] || q=(--quick)
  if [ -x "$BENCH/pack_bench" ] && run_bench pack_bench 300 "$BENCH/pack_bench" "${q[@]}"; then
    v=$(grep -E '^variant 2 pack' "$OUT_DIR/pack_bench.txt" | grep -oE '[0-9.]+ M tokens/s' | head -n 1 | cut -d' ' -f1 || true)
    row cpu "dflash-pack core: packer_next + encode (pack_bench 2)" "${v:-?}" "M tok/s" ">= 2 M tokens/s (issue 4)"
  fi
  if [ -x "$BENCH/ring_bench" ] && run_bench ring_bench 300 "$BENCH/ring_bench" "${q[@]}"; then
    # "slot variant slots items items/s GB/s" rows, e.g. "1 MB   2 copy  8  200  12645  13.26"
    while read -r size unit var vname _slots _items ips gbs; do
      row cpu "host ring, $size $unit slots, variant $var ($vname)" "$ips" "items/s" "$gbs GB/s payload"
    done < <(grep -E '^[0-9]+ (KB|MB) +[12] ' "$OUT_DIR/ring_bench.txt")
  fi
  # The whole CPU pipeline: the demo (pack -> target -> hspack -> train, tiny model, --device cpu, no tau
  # evaluation); the trainer's summary record (tokens, tokens/s over its life in the run).
  drun=$(mktemp -d /tmp/dflash-bench-demo-XXXXXX)/run
  if run_bench demo_pipeline 300 env RUN="$drun" DEVICE=cpu DEMO_EVAL=0 DFLASH_BIN="$BIN" bash "$here/pipelines/demo.sh"; then
    sumrec=$(grep '"kind":"summary","stage":"dflash-train"' "$drun/metrics.jsonl" | tail -n 1 || true)
    tps=$(grep -oE '"tokens_per_s":[0-9.]+' <<<"$sumrec" | grep -oE '[0-9.]+$' || echo "?")
    tok=$(grep -oE '"tokens":[0-9.]+' <<<"$sumrec" | grep -oE '[0-9]+' | head -n 1 || echo "?")
    row cpu "whole CPU pipeline: demo, tiny model, $tok tokens" "${tps%.*}" "tok/s" "pack -> target -> hspack -> train, fp32; trainer summary"
    rm -rf "$(dirname "$drun")"
  fi
fi

# ---------------------------------------------------------------- GPU kernels (--gpu --only kernels)
if want kernels; then
  for b in "$BENCH"/*_bench; do
    [ -x "$b" ] || continue
    name=$(basename "$b")
    case $name in pack_bench|ring_bench|target_bench|train_bench|ceiling_bench) continue ;; esac
    run_bench "$name" 300 "$b" || continue
    # kernel benches print "<name> <shape> <ms> ms <rate> TFLOP/s|GB/s <pct>% of <peak>"
    while IFS= read -r line; do
      rate=$(grep -oE '[0-9.]+ (TFLOP/s|GB/s)' <<<"$line" | tail -1)
      pct=$(grep -oE '[0-9.]+% of [0-9.]+' <<<"$line" | tail -1 || true)
      what=$(sed -E 's/ +[0-9.]+ ms .*//; s/  +/ /g' <<<"$line")
      row "$name" "${what:0:58}" "${rate% *}" "${rate#* }" "$pct"
    done < <(grep -E ' ms +[0-9.]+ (TFLOP/s|GB/s)' "$OUT_DIR/$name.txt" || true)
    if [ "$name" = ring_gpu_bench ]; then
      while read -r var bytes _iters med p99 _ips gbs; do
        row ring_gpu "GPU ring hand-off, variant $var, $bytes bytes" "$med" "us median" "$gbs GB/s, p99 $p99 us"
      done < <(grep -E '^[0-9]+ +[0-9]+ +[0-9]+ ' "$OUT_DIR/$name.txt" || true)
    fi
  done
fi

# ---------------------------------------------------------------- issue 21: ceilings, alone, whole pipeline
if [ "$MODE" != cpu ] && { want ceiling || want target || want train || want model || want pipeline; }; then
  : >"$OUT_DIR/phases.tsv"
  rm -rf "$OUT_DIR/pipeline" "$OUT_DIR/gpu-mem.csv" "$OUT_DIR/RESULTS-entry.md"
  mkdir -p "$OUT_DIR/pipeline"
  if [ "$MODE" = smoke ]; then
    PRESET=tiny DEV=${BENCH_DEVICE:-cpu} T=512 LAYERS=1,3 PIPE_STEPS=5 SAMPLES=200 MEDIAN=200 MAXLEN=512
    MK_FLAGS=(--preset tiny --dtype f32 --seed 42 --threads 1 --embed-std 1 --std 0.06 --lm-head-std 0.45)
    TRAIN_EXTRA=(--block-size 4 --max-anchors 32 --layer-types full,full --mask-token-id 511 --heartbeat-s 0.2)
    VOCAB_SIZE=0
    BENCH_DIR=$(mktemp -d /tmp/dflash-bench-smoke-XXXXXX)
    CEIL_ARGS=(--n 256 --reps 2 --copy-mib 16) TARGET_ARGS=(--iters 2 --warmup 1) TRAIN_ARGS=(--steps 2 --warmup 1 --variants "$TRAIN_VARIANTS")
  else
    PRESET=qwen3-8b DEV=${BENCH_DEVICE:-cuda:0} T=8192 LAYERS=1,9,17,25,33 SAMPLES=1000 MEDIAN=1200 MAXLEN=16384
    MK_FLAGS=(--preset qwen3-8b --dtype bf16 --shards 4 --seed 42)
    # design.md §10: KL + exp-decay, a 32000-token draft vocabulary; the rest are dflash-train's defaults
    # (4 sliding 2048 + 1 full layers, block 16, 512 anchors, Muon + AdamW), as bench/train_bench.c
    TRAIN_EXTRA=(--loss kl --weighting exp-decay --mask-token-id 151669)
    VOCAB_SIZE=32000
    CEIL_ARGS=() TARGET_ARGS=(--iters 6 --warmup 2) TRAIN_ARGS=(--steps 6 --warmup 2 --variants "$TRAIN_VARIANTS")
    if [ "$CONFIG" = qwen3.6-27b ]; then
      PRESET=qwen3.6-27b LAYERS=1,16,31,46,61
      MK_FLAGS=(--preset qwen3.6-27b --dtype bf16 --shards 12 --seed 42)
      TRAIN_EXTRA=(--loss kl --weighting exp-decay --mask-token-id 248077)
      TARGET_ARGS+=(--config qwen3.6-27b) TRAIN_ARGS+=(--config qwen3.6-27b)
      # one variant by default: a 27B variant takes ~150 s with its 22 GB checkpoint and exports (run 55)
      [ -n "$PIPE_VARIANTS_SET" ] || PIPE_VARIANTS=adamw
    fi
  fi
  MODEL=$BENCH_DIR/$PRESET
  DATA=$BENCH_DIR/$PRESET-data.jsonl
  VOCAB=$BENCH_DIR/$PRESET-vocab$VOCAB_SIZE
  mkdir -p "$BENCH_DIR"
  printf '%s\n' "$PRESET random model ($MODEL), $T-token packed batches of log-normal documents (median $MEDIAN), layers [$LAYERS], $DEV, pipeline variants $PIPE_VARIANTS of $PIPE_STEPS optimizer steps (N/A with -gaA), trainer flags: ${TRAIN_EXTRA[*]}$( [ "$VOCAB_SIZE" = 0 ] || echo " --draft-vocab ($VOCAB_SIZE tokens)")" \
    >"$OUT_DIR/pipeline/shape"

  MEM_PID=""
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits -lms 500 \
      >"$OUT_DIR/gpu-mem.csv" 2>/dev/null &
    MEM_PID=$!
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2 || true
  fi
  stop_sampler() { [ -z "$MEM_PID" ] || { kill "$MEM_PID" 2>/dev/null || true; wait "$MEM_PID" 2>/dev/null || true; MEM_PID=""; }; }
  trap stop_sampler EXIT

  want ceiling && gpu_phase ceiling 60 "$BENCH/ceiling_bench" ${CEIL_ARGS[@]+"${CEIL_ARGS[@]}"}
  PEAK=$(grep -soE '^RESULT ceiling gemm_bf16 n [0-9]+ TFLOP/s best [0-9.]+' "$OUT_DIR/ceiling.txt" | awk '{print $NF}' || true)
  [ -z "$PEAK" ] || TARGET_ARGS+=(--gemm-peak "$PEAK")   # target_bench's own MFU line: this run's peak, no constant
  want target && gpu_phase target 120 "$BENCH/target_bench" "${TARGET_ARGS[@]}"
  want train && gpu_phase train 180 "$BENCH/train_bench" "${TRAIN_ARGS[@]}"

  # ---- the model, the dataset and the draft vocabulary: written once, complete or not at all
  if want model || want pipeline; then
    t0=$SECONDS
    : >"$OUT_DIR/model.txt"
    if [ -e "$MODEL/config.json" ] && [ -e "$MODEL/.bench-complete" ]; then
      phase model ok 0 "reused $MODEL"
    elif want model; then
      note "=== model: writing the $PRESET random model into $MODEL"
      rm -rf "$MODEL" "$MODEL.tmp"
      rc=0
      timeout -k 10 300 "$BIN/dflash-mkmodel" --out "$MODEL.tmp" "${MK_FLAGS[@]}" >>"$OUT_DIR/model.txt" 2>&1 || rc=$?
      if [ $rc -eq 0 ]; then
        touch "$MODEL.tmp/.bench-complete" && mv "$MODEL.tmp" "$MODEL"
        phase model ok $((SECONDS - t0)) "wrote $(du -sh "$MODEL" | cut -f1) in $((SECONDS - t0)) s"
      else
        rm -rf "$MODEL.tmp"
        phase model FAILED $((SECONDS - t0)) "dflash-mkmodel exit $rc$( [ $rc != 124 ] || echo ' (timed out after 300 s: run --only model first)')"
      fi
    fi
    if [ -e "$MODEL/.bench-complete" ] && [ ! -s "$DATA" ]; then
      "$BIN/dflash-mkmodel" --preset "$PRESET" --dataset "$DATA.tmp" --samples $SAMPLES --median-len $MEDIAN --len-sigma 0.6 \
        --min-len 64 --max-len $MAXLEN --prompt-frac 0.3 --seed 7 >>"$OUT_DIR/model.txt" 2>&1 && mv "$DATA.tmp" "$DATA" ||
        phase dataset FAILED 0 "dflash-mkmodel --dataset: $(first_line "$OUT_DIR/model.txt")"
    fi
    if [ "$VOCAB_SIZE" -gt 0 ] && [ -s "$DATA" ] && [ ! -e "$VOCAB/d2t.npy" ]; then
      V=$(grep -o '"vocab_size": *[0-9]*' "$MODEL/config.json" | head -n 1 | grep -o '[0-9]*$' || echo 0)
      "$BIN/dflash-vocab" --data "$DATA" --vocab-size "$V" --draft-vocab-size "$VOCAB_SIZE" --out "$VOCAB" >>"$OUT_DIR/model.txt" 2>&1 ||
        phase vocab FAILED 0 "dflash-vocab: $(first_line "$OUT_DIR/model.txt")"
    fi
  fi

  # ---- the whole pipeline: pipelines/train.sh, target and trainer sharing the device, once per optimizer x
  # accumulation variant (issue 28 item 6); each run in $OUT_DIR/pipeline/VARIANT/, its phase "pipeline.VARIANT",
  # and one "pipeline" phase summing them up (ok when every variant ran)
  if want pipeline; then
    probe=$(mktemp -d /tmp/dflash-bench-probe-XXXXXX)
    # Does dflash-train have a GPU path? --help lists --device cuda:N for every stage, so ask the binary:
    # main before issue 20's wiring refuses cuda with "not built yet", a CUDA=0 build with "no CUDA support".
    "$BIN/dflash-train" --help >"$probe/help" 2>&1 || true
    "$BIN/dflash-train" --run "$probe/run" --target-model "$probe/none" --max-steps 1 --device "$DEV" >"$probe/out" 2>&1 || true
    skip=""
    if ! grep -q 'cuda' "$probe/help"; then skip="dflash-train --help lists no cuda device"
    elif [ "$DEV" != cpu ] && grep -qE 'not built yet|no CUDA support|only 0 CUDA' "$probe/out"; then
      skip="dflash-train has no GPU path: $(grep -m1 -oE '(the trainer.s GPU path is not built yet|--device [^ ]+: this build has no CUDA support|only 0 CUDA device.*)' "$probe/out" || true)"
    fi
    rm -rf "$probe"
    if [ -n "$skip" ]; then
      phase pipeline skipped 0 "$skip"
      note "pipeline skipped: $skip"
    elif [ ! -e "$MODEL/.bench-complete" ] || [ ! -s "$DATA" ] || { [ "$VOCAB_SIZE" -gt 0 ] && [ ! -e "$VOCAB/d2t.npy" ]; }; then
      phase pipeline skipped 0 "no complete model/dataset/vocabulary in $BENCH_DIR (the model phase failed or was not run)"
    else
      VARS=(${PIPE_VARIANTS//,/ })
      printf '%s\n' "${VARS[@]}" >"$OUT_DIR/pipeline/variants"
      p_ok=0 p_bad=() p_skip=() t_all=$SECONDS
      for vi in "${!VARS[@]}"; do
        v=${VARS[$vi]} mps=0
        case $v in *+mps) mps=1 ;; esac   # the same variant with the stages as clients of one MPS server
        mkdir -p "$OUT_DIR/pipeline/$v"
        # the budget left, shared by the variants still to run
        left=$(( (BUDGET_S - (SECONDS - T_START) - 15) / (${#VARS[@]} - vi) ))
        [ "$MODE" = gpu ] || left=120
        [ $left -le 300 ] || left=300
        A=1
        case ${v%+mps} in
          adamw) VF=(--optimizer adamw); VSTEPS=$PIPE_STEPS ;;
          muon) VF=(--optimizer muon); VSTEPS=$PIPE_STEPS ;;
          muon-ga[1-9]*|adamw-ga[1-9]*)
            A=${v%+mps}; A=${A##*-ga}; VF=(--optimizer "${v%%-ga*}" --grad-accum "$A")   # dflash-plan reads it: steps x A batches
            VSTEPS=$(( PIPE_STEPS / A )); [ $VSTEPS -ge 3 ] || VSTEPS=3 ;;
          *) phase "pipeline.$v" FAILED 0 "unknown variant '$v' (adamw, muon, muon-gaA, adamw-gaA)"; p_bad+=("$v"); continue ;;
        esac
        if [ $left -lt 60 ]; then
          phase "pipeline.$v" skipped 0 "only $left s of the $BUDGET_S s budget left for it (run --only pipeline)"
          p_skip+=("$v"); continue
        fi
        RUN=${BENCH_RUN_DIR:-$BENCH_DIR/run}
        if [ -z "${BENCH_RUN_DIR:-}" ] && [ "$CONFIG" = qwen3.6-27b ] &&
           [ "$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print int($4 / 1048576)}')" -ge 40 ] 2>/dev/null; then
          RUN=/dev/shm/dflash-bench-run   # the 27B drafter's checkpoint (22 GB) + exports beside a 51 GB model
        fi                                # do not fit the GPU machine's 64 GB disk (run 54)
        VFLAGS=(); [ "$VOCAB_SIZE" = 0 ] || VFLAGS=(--draft-vocab "$VOCAB")
        note "=== pipeline.$v: train.sh $PRESET on $DEV, $VSTEPS steps of $A batch(es), ${VF[*]} (timeout $left s)"
        MEMV_PID=""
        if [ -n "$MEM_PID" ]; then   # per-variant samples: the trainer's memory differs by optimizer
          nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits -lms 500 \
            >"$OUT_DIR/gpu-mem-$v.csv" 2>/dev/null &
          MEMV_PID=$!
        fi
        if [ $mps = 1 ]; then   # issue 28 item 5: kernels of target and trainer may then run at once (time-sliced without)
          if ! command -v nvidia-cuda-mps-control >/dev/null; then
            phase "pipeline.$v" skipped 0 "no nvidia-cuda-mps-control on this machine"; p_skip+=("$v"); continue
          fi
          MPSD=$(mktemp -d /tmp/dflash-mps-XXXXXX)
          mkdir -p "$MPSD/pipe" "$MPSD/log"
          export CUDA_MPS_PIPE_DIRECTORY=$MPSD/pipe CUDA_MPS_LOG_DIRECTORY=$MPSD/log
          if ! nvidia-cuda-mps-control -d >"$OUT_DIR/pipeline/$v/mps.txt" 2>&1; then
            unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
            phase "pipeline.$v" skipped 0 "nvidia-cuda-mps-control -d: $(first_line "$OUT_DIR/pipeline/$v/mps.txt")"
            p_skip+=("$v"); rm -rf "$MPSD"; continue
          fi
          note "pipeline.$v: MPS server control in $MPSD"
        fi
        date +%s.%N >"$OUT_DIR/pipeline/$v/launch"
        t0=$SECONDS rc=0
        timeout -k 30 "$left" bash "$here/pipelines/train.sh" "$MODEL" "$DATA" --run "$RUN" --fresh --device "$DEV" \
          --tokens "$T" --steps "$VSTEPS" --layers "$LAYERS" -- "${TRAIN_EXTRA[@]}" ${VFLAGS[@]+"${VFLAGS[@]}"} "${VF[@]}" \
          --ckpt-every 0 --keep 1 >"$OUT_DIR/pipeline-$v.txt" 2>&1 || rc=$?
        [ -z "$MEMV_PID" ] || { kill "$MEMV_PID" 2>/dev/null || true; wait "$MEMV_PID" 2>/dev/null || true; }
        if [ $mps = 1 ]; then   # stop the server; later phases run without it
          echo quit | timeout 20 nvidia-cuda-mps-control >>"$OUT_DIR/pipeline/$v/mps.txt" 2>&1 || true
          cp -r "$MPSD/log" "$OUT_DIR/pipeline/$v/mps-log" 2>/dev/null || true
          unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
          rm -rf "$MPSD"
        fi
        tail -n 25 "$OUT_DIR/pipeline-$v.txt" >&2
        cp "$RUN/metrics.jsonl" "$OUT_DIR/pipeline/$v/" 2>/dev/null || true
        cp -r "$RUN/logs" "$OUT_DIR/pipeline/$v/logs" 2>/dev/null || true
        cp "$RUN/summary.txt" "$OUT_DIR/pipeline/$v/" 2>/dev/null || true
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then phase "pipeline.$v" FAILED $((SECONDS - t0)) "timed out after $left s"; p_bad+=("$v")
        elif [ $rc -ne 0 ]; then phase "pipeline.$v" FAILED $((SECONDS - t0)) "train.sh exit $rc: $(grep -m1 -iE 'error|fatal|failed' "$OUT_DIR/pipeline-$v.txt" | cut -c1-160)"; p_bad+=("$v")
        else phase "pipeline.$v" ok $((SECONDS - t0)); p_ok=$((p_ok + 1)); fi
        rm -rf "$RUN"   # checkpoints and exports: GBs, not needed
      done
      # the summary phase (not counted again as a failure: each variant's phase already is)
      if [ ${#p_bad[@]} -gt 0 ]; then
        printf 'pipeline\tFAILED\t%s\t%s\n' $((SECONDS - t_all)) "variants failed: ${p_bad[*]}" >>"$OUT_DIR/phases.tsv"
      elif [ $p_ok -eq 0 ]; then
        printf 'pipeline\tskipped\t%s\t%s\n' $((SECONDS - t_all)) "no variant ran (${p_skip[*]})" >>"$OUT_DIR/phases.tsv"
      else
        printf 'pipeline\tok\t%s\t%s\n' $((SECONDS - t_all)) "$p_ok of ${#VARS[@]} variants$( [ ${#p_skip[@]} = 0 ] || echo ", skipped: ${p_skip[*]}")" >>"$OUT_DIR/phases.tsv"
      fi
    fi
  fi
  stop_sampler
  trap - EXIT
  [ "$MODE" = gpu ] || rm -rf "$BENCH_DIR"
fi

# ---------------------------------------------------------------- tables
if [ -s "$OUT_DIR/phases.tsv" ] && [ "$MODE" != cpu ]; then
  commit=$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')
  [ -z "$(git -C "$here" status --porcelain --untracked-files=no 2>/dev/null)" ] || commit="$commit+dirty"
  python3 "$here/bench/bench_report.py" "$OUT_DIR" --append "$OUT_DIR/RESULTS-entry.md" --commit "$commit" \
    --title "scripts/bench.sh --$MODE (issue 21)" >"$OUT_DIR/report.txt" || { cat "$OUT_DIR/report.txt" >&2; FAILS=$((FAILS + 1)); }
  { printf '\n### phases\n```\n'; cat "$OUT_DIR/phases.tsv"; printf '```\n'; } >>"$OUT_DIR/RESULTS-entry.md"
  [ "$RESULTS" != default ] || { [ "$MODE" = gpu ] && RESULTS=$here/kernels/bench/RESULTS.md || RESULTS=none; }
  [ "$RESULTS" = none ] || { cat "$OUT_DIR/RESULTS-entry.md" >>"$RESULTS"; note "appended the entry to $RESULTS"; }
  {
    echo
    echo "=== dflash-pipe benchmarks ($MODE, $(date -u +%Y-%m-%dT%H:%M:%SZ), $commit)"
    grep -v '^appended to' "$OUT_DIR/report.txt"
    echo "phases:"
    awk -F'\t' '{ printf "  %-9s %-8s %5s s  %s\n", $1, $2, $3, $4 }' "$OUT_DIR/phases.tsv"
    echo "full outputs in $OUT_DIR; $FAILS failure(s)"
  } | tee "$OUT_DIR/summary.txt"
fi
if [ ${#ROWS[@]} -gt 0 ]; then
  {
    echo
    echo "=== dflash-pipe benchmarks ($MODE, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?'))"
    printf '%-9s|%-58s|%14s|%-10s|%s\n' part what number unit note
    printf '%s\n' "---------+----------------------------------------------------------+--------------+----------+-----"
    for r in "${ROWS[@]}"; do echo "$r"; done
    echo "full outputs in $OUT_DIR; $FAILS failure(s)"
  } | tee -a "$OUT_DIR/summary.txt"
fi
[ "$FAILS" -eq 0 ]
