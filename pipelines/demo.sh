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
# τ rises from 1.03 (step 50) to 1.85 (step 300).
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
#   (0: skip the τ evaluation, for tests), STALL_S (dflash-metrics --stall-s, default 30), TRAIN_DEVICE (the
#   trainer's device, default DEVICE: dflash-plan --train-device; DEVICE=cpu TRAIN_DEVICE=cuda:0 trains on the
#   GPU from the CPU target's fp32 features on host rings), MODEL_SHAPE (extra dflash-mkmodel flags, e.g.
#   "--heads 1 --kv-heads 1 --head-dim 64": one head of 64, a tiny target whose head dim the GPU kernels take)
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
LAYERS=1,2           # captured target layers (zlab ids) of the tiny 4-layer model; never its last (3): SGLang cannot capture it
TRAIN_ROWS=160
HELD_ROWS=12
MKMODEL_FLAGS=(--preset tiny --dtype f32 --seed 42 --threads 1 --embed-std 1 --std 0.06 --lm-head-std 0.45)
# shellcheck disable=SC2206
[ -z "${MODEL_SHAPE:-}" ] || MKMODEL_FLAGS+=($MODEL_SHAPE)
SAMPLE_FLAGS=(--samples $((TRAIN_ROWS + HELD_ROWS)) --prompt-len 8 --gen-len 24 --temperature 0.3 --max-token 500 --seed 1)
# the run's geometry goes into the run plan (dflash-plan, RUN/plan.json); the stages read it through --run
PLAN_FLAGS=(--tokens "$TOKENS" --layers "$LAYERS" --window 64 --seed 1 --ring-slots 4)
PACK_FLAGS=(--vocab-size 512)
TARGET_FLAGS=(--heartbeat-s 0.2)
HSPACK_FLAGS=(--heartbeat-s 0.2)
TRAIN_FLAGS=(--block-size 4 --max-anchors 64 --layer-types full,full
             --mask-token-id 511 --optimizer adamw --lr 5e-3 --weight-decay 0 --noise 0 --schedule none
             --warmup-steps 0 --ckpt-every 50 --keep 0 --heartbeat-s 0.2)
STALL_S=${STALL_S:-30}   # dflash-metrics' stall warning (the kill campaign lowers it to SIGSTOP a stage past it)
METRICS_FLAGS=(--progress-s 2 --plot-every-s 0 --stall-s "$STALL_S" --csv-stage dflash-train)
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
need_bins dflash-plan dflash-mkmodel dflash-sample dflash-shm dflash-metrics dflash-pack dflash-target dflash-hspack dflash-train dflash-export dflash-eval
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

# ---------------------------------------------------------------- the plan, then the stages it names
"$DFLASH_BIN/dflash-plan" "$MODEL" "$DATA" --run "$RUN" --device "$DEVICE" --train-device "$TRAIN_DEVICE" --steps "$STEPS" "${PLAN_FLAGS[@]}" \
  -- "${TRAIN_FLAGS[@]}" ${EXTRA_TRAIN[@]+"${EXTRA_TRAIN[@]}"} >"$LOGS/plan.out" 2>&1 ||
  pdie "dflash-plan: $(tail -n 1 "$LOGS/plan.out")"

D=$DFLASH_BIN
CMD_SHM=("$D/dflash-shm" --run "$RUN")
CMD_METRICS=("$D/dflash-metrics" --run "$RUN" "${METRICS_FLAGS[@]}")
CMD_PACK=("$D/dflash-pack" --run "$RUN" "${PACK_FLAGS[@]}")
CMD_TARGET=("$D/dflash-target" --run "$RUN" "${TARGET_FLAGS[@]}")
CMD_HSPACK=("$D/dflash-hspack" --run "$RUN" "${HSPACK_FLAGS[@]}")
CMD_TRAIN=("$D/dflash-train" --run "$RUN" "${TRAIN_FLAGS[@]}" ${EXTRA_TRAIN[@]+"${EXTRA_TRAIN[@]}"})
FEEDERS="dflash-pack dflash-target dflash-hspack"
# the producers of one chain, rewound to seq $1: the packer's cursor, hspack's next (its state file)
start_feeders() {
  rewind_online_feeders "$1"
  start_stage dflash-hspack "${CMD_HSPACK[@]}"
  start_stage dflash-target "${CMD_TARGET[@]}"
  start_stage dflash-pack "${CMD_PACK[@]}" --resume-from-seq "$1"
}
write_run_json demo "\"steps\": $STEPS, \"plan\": $(json_str "$RUN/plan.json"), \"model\": $(json_str "$MODEL"), \"data\": $(json_str "$DATA"), \"held_out\": $(json_str "$HELD")" \
  dflash-shm CMD_SHM dflash-metrics CMD_METRICS dflash-pack CMD_PACK dflash-target CMD_TARGET dflash-hspack CMD_HSPACK \
  dflash-train CMD_TRAIN

# ---------------------------------------------------------------- train
t0=$(date +%s.%N)
plog "run $RUN on $DEVICE (attempt $ATTEMPT): $STEPS steps"
run_train_chain || exit 1
train_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
stop_stage dflash-metrics TERM 20       # drains what is queued, draws the plots, logs its summary table

# ---------------------------------------------------------------- exports, τ, plots, summary
finish_training_run "$MODEL" "$HELD" "$train_s"
