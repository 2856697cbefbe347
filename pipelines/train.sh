#!/usr/bin/env bash
# pipelines/train.sh — train a DFlash drafter for your own target on one GPU (or the CPU):
#
#   dflash-pack -[batches]-> dflash-target -[hidden]-> dflash-hspack -[features]-> dflash-train
#        (dflash-shm owns the rings; every stage reports to dflash-metrics)
#
#   pipelines/train.sh MODEL_DIR DATA [--run DIR] [--device D] [--tokens N] [--steps N] [--epochs N]
#                      [--layers IDS] [--fresh] [-- dflash-train flags]
#
# MODEL_DIR is a Hugging Face checkpoint directory (config.json + safetensors; Qwen3, Llama,
# Qwen3.5); DATA is JSONL with {"input_ids": [...], "loss_mask": [...]} per line (README "Preparing
# data") or its index. --steps is the trainer's --max-steps (default: one per packed batch of
# --epochs epochs, counted by indexing the dataset); --layers the captured layer ids (z-lab
# convention; default: the z-lab formula for a 5-layer drafter), passed to dflash-target and as the
# trainer's --target-layer-ids. Flags after -- go to dflash-train unchanged (e.g. --lr 3e-4
# --ckpt-every 500).
#
# Produces runs/train (or --run DIR): run.json, logs/, metrics.jsonl/.csv, plots/,
# checkpoints/step-N.ckpt, export/zlab and export/speculators (both passed through dflash-export
# --check), summary.txt and DONE. Size and time: checkpoints of a Qwen3-8B drafter are ~3 GB each
# (fp32 weights + AdamW/Muon state; --keep 3 by default); on one H200 the target forward runs at
# ~40K tokens/s, so 1 M tokens take about 30 s of target time plus the trainer's. On the CPU, only
# tiny models are practical.
#
# Resume: run the same command again (without --fresh). The trainer continues from its newest
# checkpoint; packer, target and hspack restart on fresh rings at the batch seq it asks for, so the
# run trains on exactly the batches an uninterrupted run would have. While it runs, a producer stage
# that dies is restarted alone (up to $MAX_RESTARTS times); a trainer that dies restarts the chain.
set -euo pipefail

BUILD=${BUILD:-build}
RUN=""
DEVICE=auto
TOKENS=8192
STEPS=""
EPOCHS=1
LAYERS=""
FRESH=0
EXTRA_TRAIN=()
ARGS=()
while [ $# -gt 0 ]; do
  case $1 in
    --run) RUN=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --epochs) EPOCHS=$2; shift 2 ;;
    --layers) LAYERS=$2; shift 2 ;;
    --fresh) FRESH=1; shift ;;
    --) shift; EXTRA_TRAIN=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "train.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
[ ${#ARGS[@]} -eq 2 ] || { echo "usage: train.sh MODEL_DIR DATA [--run DIR] [--device D] [-- dflash-train flags] (see --help)" >&2; exit 2; }
MODEL=${ARGS[0]}
DATA_IN=${ARGS[1]}
RUN=${RUN:-runs/train}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=pipelines/lib.sh
. "$here/lib.sh"
need_bins dflash-shm dflash-metrics dflash-pack dflash-target dflash-hspack dflash-train dflash-export
# bad inputs stop here, each with one line, before anything is started
[ -d "$MODEL" ] || pdie "model directory $MODEL does not exist"
[ -f "$MODEL/config.json" ] || pdie "$MODEL/config.json: missing (not a Hugging Face model directory)"
[ -f "$DATA_IN" ] || pdie "dataset $DATA_IN does not exist"
[[ $TOKENS =~ ^[1-9][0-9]*$ ]] || pdie "--tokens: '$TOKENS' is not a positive integer"
[ -z "$STEPS" ] || [[ $STEPS =~ ^[1-9][0-9]*$ ]] || pdie "--steps: '$STEPS' is not a positive integer"
[[ $EPOCHS =~ ^[1-9][0-9]*$ ]] || pdie "--epochs: '$EPOCHS' is not a positive integer"
MODEL=$(cd "$MODEL" && pwd)
DATA_IN=$(cd "$(dirname "$DATA_IN")" && pwd)/$(basename "$DATA_IN")
if [ "$DEVICE" = auto ]; then
  if have_gpu; then DEVICE=cuda:0; else DEVICE=cpu; fi
fi

prepare_run_dir train
if [ -e "$RUN/DONE" ]; then
  plog "$RUN is complete (DONE); --fresh starts over. Summary:"
  cat "$RUN/summary.txt" >&2 2>/dev/null || true
  exit 0
fi
stop_leftover_stages
set -m
install_traps train.sh

# ---------------------------------------------------------------- dataset: validated and indexed once
DATA=$RUN/data.idx
if [ ! -e "$DATA" ] || [ "$DATA_IN" -nt "$DATA" ]; then
  plog "validating and indexing $DATA_IN"
  "$DFLASH_BIN/dflash-pack" --data "$DATA_IN" --index "$DATA.tmp" >"$LOGS/index.out" 2>&1 ||
    { rm -f "$DATA.tmp"; pdie "$(first_error "$LOGS/index.out")"; }
  mv "$DATA.tmp" "$DATA"
fi

# ---------------------------------------------------------------- rings and commands
H=$(grep -o '"hidden_size": *[0-9]*' "$MODEL/config.json" | head -n 1 | grep -o '[0-9]*$') ||
  pdie "$MODEL/config.json: no hidden_size"
K=5; [ -z "$LAYERS" ] || K=$(awk -F, '{print NF}' <<<"$LAYERS")
DTYPE=f32; [ "$DEVICE" = cpu ] || DTYPE=bf16
LAYER_FLAGS=(); TRAIN_LAYER_FLAGS=()
[ -z "$LAYERS" ] || { LAYER_FLAGS=(--layers "$LAYERS"); TRAIN_LAYER_FLAGS=(--target-layer-ids "$LAYERS"); }
PACK_FLAGS=(--tokens "$TOKENS" --seed 1)
if [ -z "$STEPS" ]; then
  STEPS=$("$DFLASH_BIN/dflash-pack" --data "$DATA" --run "$RUN/count" --out-dir "$RUN/count/batches" --epochs "$EPOCHS" \
            "${PACK_FLAGS[@]}" >/dev/null 2>&1 && find "$RUN/count/batches" -name 'batch-*' | wc -l) || pdie "counting batches failed"
  rm -rf "$RUN/count"
  [ "$STEPS" -gt 0 ] || pdie "$DATA_IN gives no batch"
fi
online_ring_specs
# The job's device-memory plan on one GPU (target + trainer + rings), printed and checked before any stage
# starts: a configuration that cannot fit stops here with one line naming the shortfall (issue 27).
if [ "$DEVICE" != cpu ] && [ -x "$DFLASH_BIN/dflash-memplan" ]; then
  MP=(--model "$MODEL" --tokens "$TOKENS" --layers "$K" --device "$DEVICE")
  for ((i = 0; i + 1 < ${#EXTRA_TRAIN[@]}; i++)); do
    case ${EXTRA_TRAIN[$i]} in --max-anchors|--block-size|--grad-accum) MP+=("${EXTRA_TRAIN[$i]}" "${EXTRA_TRAIN[$((i + 1))]}") ;; esac
  done
  "$DFLASH_BIN/dflash-memplan" "${MP[@]}" >"$LOGS/memplan.txt" 2>&1 || pdie "$(tail -n 1 "$LOGS/memplan.txt")"
  plog "$(grep -m1 'memory plan: total' "$LOGS/memplan.txt" || true) (details: $LOGS/memplan.txt)"
fi
SHM_FLAGS=(--ring "$BATCH_SPEC" --ring "$HIDDEN_SPEC" --ring "$FEATURE_SPEC")
[ "$DEVICE" != cpu ] || SHM_FLAGS+=(--host-only)

D=$DFLASH_BIN
CMD_SHM=("$D/dflash-shm" --run "$RUN" "${SHM_FLAGS[@]}")
CMD_METRICS=("$D/dflash-metrics" --run "$RUN" --plot-every-s 60 --csv-stage dflash-train)
CMD_PACK=("$D/dflash-pack" --run "$RUN" --data "$DATA" --epochs 0 --max-batches "$STEPS" "${PACK_FLAGS[@]}")
CMD_TARGET=("$D/dflash-target" --run "$RUN" --model "$MODEL" --device "$DEVICE" --tokens "$TOKENS" ${LAYER_FLAGS[@]+"${LAYER_FLAGS[@]}"})
CMD_HSPACK=("$D/dflash-hspack" --run "$RUN" --device "$DEVICE" --tokens "$TOKENS")
CMD_TRAIN=("$D/dflash-train" --run "$RUN" --target-model "$MODEL" --device "$DEVICE" --tokens "$TOKENS" --max-steps "$STEPS"
           ${TRAIN_LAYER_FLAGS[@]+"${TRAIN_LAYER_FLAGS[@]}"} ${EXTRA_TRAIN[@]+"${EXTRA_TRAIN[@]}"})
FEEDERS="dflash-pack dflash-target dflash-hspack"
start_feeders() {
  write_state "$RUN/state/hspack.features.next" "$(printf '%020d' "$1")"
  start_stage dflash-hspack "${CMD_HSPACK[@]}"
  start_stage dflash-target "${CMD_TARGET[@]}"
  start_stage dflash-pack "${CMD_PACK[@]}" --resume-from-seq "$1"
}
write_run_json train "\"steps\": $STEPS, \"tokens\": $TOKENS, \"model\": $(json_str "$MODEL"), \"data\": $(json_str "$DATA_IN")" \
  dflash-shm CMD_SHM dflash-metrics CMD_METRICS dflash-pack CMD_PACK dflash-target CMD_TARGET dflash-hspack CMD_HSPACK \
  dflash-train CMD_TRAIN

t0=$(date +%s.%N)
plog "run $RUN on $DEVICE (attempt $ATTEMPT): $STEPS steps of $TOKENS-token batches"
run_train_chain || exit 1
train_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
stop_stage dflash-metrics TERM 20
finish_training_run "$MODEL" "" "$train_s"
