#!/usr/bin/env bash
# pipelines/demo.sh — the main job (`make run`): trains a DFlash drafter end to end on the embedded
# default, a tiny learnable Qwen3-shaped target (dflash-mkmodel --preset tiny: 4 layers, hidden 64,
# vocab 512, embedding std 1, layers 0.06, LM head 0.45) and a dataset sampled from that target
# (dflash-sample: 8 random prompt tokens + 24 sampled tokens per row; 160 rows train, 12 held out):
#
#   dflash-pack -[batches]-> dflash-target -[hidden]-> dflash-hspack -[features]-> dflash-train
#        (dflash-shm owns the rings; every stage reports to dflash-metrics)
#
# Produces runs/demo (or --run DIR): run.json, logs/<stage>.log and .out, metrics.jsonl/.csv,
# checkpoints/step-N.ckpt, export/zlab and export/speculators (both checked by dflash-export
# --check), eval/tau-step-N.json (τ on the held-out prompts by speculative decoding),
# plots/{loss,eal,tokens_per_s,tau,stages}.png (gnuplot), summary.txt (the table printed at the end)
# and DONE. Size and time: ~8 MB in all (6 checkpoints); STEPS (300) AdamW steps of 256-token
# batches: about 25 s on a 2-core CPU (--device cpu; 12 s of it training, ~4 s the τ evaluation);
# τ rises from 1.03 (step 50) to 1.94 (step 300).
#
# Resume: run the same command again. After any crash (of a stage or of this script) the trainer
# resumes from its newest checkpoint, and the packer, target and hspack restart on fresh rings from
# the batch seq the trainer asks for, so the run trains on the same batches as an uninterrupted one
# (bit-identical drafter). A producer stage that dies while the pipeline runs is started again alone
# with the same command, up to $MAX_RESTARTS (3) times; a trainer death restarts the chain (also at
# most $MAX_RESTARTS times). A complete run (DONE) only prints its summary; --fresh starts over.
#
#   pipelines/demo.sh [--run DIR] [--fresh] [--device auto|cpu|cuda:N] [--steps N]
#   environment: BUILD (build dir, default build), RUN, DEVICE, STEPS, MAX_RESTARTS, DEMO_EVAL
#   (0: skip the τ evaluation, for tests), TRAIN_DEVICE (the trainer's device, default DEVICE: the
#   other stages stay on DEVICE, so DEVICE=cpu TRAIN_DEVICE=cuda:0 trains on the GPU from the CPU
#   target's fp32 features on host rings), MODEL_SHAPE (extra dflash-mkmodel flags, e.g. "--heads 1
#   --kv-heads 1 --head-dim 64": one head of 64, a tiny target whose head dim the GPU kernels take)
set -euo pipefail

# ---------------------------------------------------------------- configuration
BUILD=${BUILD:-build}
RUN=${RUN:-runs/demo}
DEVICE=${DEVICE:-auto}
TRAIN_DEVICE=${TRAIN_DEVICE:-}
MODEL_SHAPE=${MODEL_SHAPE:-}
STEPS=${STEPS:-300}
FRESH=0
DEMO_EVAL=${DEMO_EVAL:-1}
TOKENS=256
LAYERS=1,3           # captured target layers (zlab ids) of the tiny 4-layer model
TRAIN_ROWS=160
HELD_ROWS=12
MKMODEL_FLAGS=(--preset tiny --dtype f32 --seed 42 --threads 1 --embed-std 1 --std 0.06 --lm-head-std 0.45)
# shellcheck disable=SC2206
[ -z "${MODEL_SHAPE:-}" ] || MKMODEL_FLAGS+=($MODEL_SHAPE)
SAMPLE_FLAGS=(--samples $((TRAIN_ROWS + HELD_ROWS)) --prompt-len 8 --gen-len 24 --temperature 0.3 --max-token 500 --seed 1)
PACK_FLAGS=(--tokens "$TOKENS" --window 64 --seed 1 --vocab-size 512)
TARGET_FLAGS=(--tokens "$TOKENS" --layers "$LAYERS" --heartbeat-s 0.2)
HSPACK_FLAGS=(--tokens "$TOKENS" --heartbeat-s 0.2)
TRAIN_FLAGS=(--tokens "$TOKENS" --block-size 4 --max-anchors 64 --layer-types full,full --target-layer-ids "$LAYERS"
             --mask-token-id 511 --optimizer adamw --lr 5e-3 --weight-decay 0 --noise 0 --schedule none
             --warmup-steps 0 --ckpt-every 50 --keep 0 --heartbeat-s 0.2)
METRICS_FLAGS=(--progress-s 2 --plot-every-s 0 --stall-s 30 --csv-stage dflash-train)
BATCH_SLOTS=8
HIDDEN_SLOTS=4
FEATURE_SLOTS=4
EXTRA_TRAIN=()

while [ $# -gt 0 ]; do
  case $1 in
    --run) RUN=$2; shift 2 ;;
    --fresh) FRESH=1; shift ;;
    --device) DEVICE=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --) shift; EXTRA_TRAIN=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=pipelines/lib.sh
. "$here/lib.sh"
need_bins dflash-mkmodel dflash-sample dflash-shm dflash-metrics dflash-pack dflash-target dflash-hspack dflash-train dflash-export dflash-eval
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || pdie "--steps: '$STEPS' is not a positive integer"
if [ "$DEVICE" = auto ]; then
  if have_gpu; then DEVICE=cuda:0; else DEVICE=cpu; fi
fi
TRAIN_DEVICE=${TRAIN_DEVICE:-$DEVICE}

prepare_run_dir demo
MODEL=$RUN/model
DATA=$RUN/data.jsonl
HELD=$RUN/held-out.jsonl

if [ -e "$RUN/DONE" ]; then
  plog "$RUN is complete (DONE); --fresh starts over. Summary:"
  cat "$RUN/summary.txt" >&2 2>/dev/null || true
  exit 0
fi
stop_leftover_stages

set -m   # every background stage in its own process group
install_traps demo

# ---------------------------------------------------------------- model and data (once)
if [ ! -e "$MODEL/config.json" ] || [ ! -e "$DATA" ] || [ ! -e "$HELD" ]; then
  plog "writing the tiny learnable model and a dataset sampled from it into $RUN"
  rm -f "$DATA" "$HELD"
  "$DFLASH_BIN/dflash-mkmodel" --out "$MODEL" "${MKMODEL_FLAGS[@]}" >>"$LOGS/dflash-mkmodel.out" 2>&1 ||
    pdie "dflash-mkmodel failed; see $LOGS/dflash-mkmodel.out"
  "$DFLASH_BIN/dflash-sample" --target-model "$MODEL" --out "$RUN/sampled.jsonl" "${SAMPLE_FLAGS[@]}" \
    >>"$LOGS/dflash-sample.out" 2>&1 || pdie "dflash-sample failed; see $LOGS/dflash-sample.out"
  tail -n "$HELD_ROWS" "$RUN/sampled.jsonl" >"$HELD.tmp" && mv "$HELD.tmp" "$HELD"
  head -n "$TRAIN_ROWS" "$RUN/sampled.jsonl" >"$DATA.tmp" && mv "$DATA.tmp" "$DATA"
fi

# ---------------------------------------------------------------- rings and commands
DTYPE=f32; [ "$DEVICE" = cpu ] || DTYPE=bf16
HIDDEN=$(grep -o '"hidden_size": *[0-9]*' "$MODEL/config.json" | head -n 1 | grep -o '[0-9]*$') ||
  pdie "no hidden_size in $MODEL/config.json"
BATCH_SPEC=$("$DFLASH_BIN/dflash-pack" "${PACK_FLAGS[@]}" --ring-slots "$BATCH_SLOTS" --print-ring-spec) ||
  pdie "dflash-pack --print-ring-spec failed"
HIDDEN_SPEC=$("$DFLASH_BIN/dflash-target" --model "$MODEL" "${TARGET_FLAGS[@]}" --device "$DEVICE" \
                --ring-slots "$HIDDEN_SLOTS" --print-ring-spec) || pdie "dflash-target --print-ring-spec failed"
FEATURE_SPEC=$("$DFLASH_BIN/dflash-hspack" "${HSPACK_FLAGS[@]}" --n-layers 2 --hidden-size "$HIDDEN" --dtype "$DTYPE" \
                 --device "$DEVICE" --ring-slots "$FEATURE_SLOTS" --print-ring-spec) || pdie "dflash-hspack --print-ring-spec failed"
SHM_FLAGS=(--ring "$BATCH_SPEC" --ring "$HIDDEN_SPEC" --ring "$FEATURE_SPEC")
[ "$DEVICE" != cpu ] || SHM_FLAGS+=(--host-only)

D=$DFLASH_BIN
CMD_SHM=("$D/dflash-shm" --run "$RUN" "${SHM_FLAGS[@]}")
CMD_METRICS=("$D/dflash-metrics" --run "$RUN" "${METRICS_FLAGS[@]}")
CMD_PACK=("$D/dflash-pack" --run "$RUN" --data "$DATA" --epochs 0 --max-batches "$STEPS" "${PACK_FLAGS[@]}")
CMD_TARGET=("$D/dflash-target" --run "$RUN" --model "$MODEL" --device "$DEVICE" "${TARGET_FLAGS[@]}")
CMD_HSPACK=("$D/dflash-hspack" --run "$RUN" --device "$DEVICE" "${HSPACK_FLAGS[@]}")
CMD_TRAIN=("$D/dflash-train" --run "$RUN" --target-model "$MODEL" --device "$TRAIN_DEVICE" --max-steps "$STEPS"
           "${TRAIN_FLAGS[@]}" ${EXTRA_TRAIN[@]+"${EXTRA_TRAIN[@]}"})
FEEDERS="dflash-pack dflash-target dflash-hspack"
# the producers of one chain, rewound to seq $1: the packer's cursor, hspack's next (its state file)
start_feeders() {
  write_state "$RUN/state/hspack.features.next" "$(printf '%020d' "$1")"
  start_stage dflash-hspack "${CMD_HSPACK[@]}"
  start_stage dflash-target "${CMD_TARGET[@]}"
  start_stage dflash-pack "${CMD_PACK[@]}" --resume-from-seq "$1"
}
write_run_json demo "\"steps\": $STEPS, \"tokens\": $TOKENS, \"layers\": $(json_str "$LAYERS"), \"model\": $(json_str "$MODEL"), \"data\": $(json_str "$DATA"), \"held_out\": $(json_str "$HELD")" \
  dflash-shm CMD_SHM dflash-metrics CMD_METRICS dflash-pack CMD_PACK dflash-target CMD_TARGET dflash-hspack CMD_HSPACK \
  dflash-train CMD_TRAIN

# ---------------------------------------------------------------- train
t0=$(date +%s.%N)
plog "run $RUN on $DEVICE (trainer on $TRAIN_DEVICE; attempt $ATTEMPT): $STEPS steps"
run_train_chain || exit 1
train_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
stop_stage dflash-metrics TERM 20       # drains what is queued, draws the plots, logs its summary table

# ---------------------------------------------------------------- exports, τ, plots, summary
finish_training_run "$MODEL" "$HELD" "$train_s"
