#!/usr/bin/env bash
# pipelines/train.sh — train a DFlash drafter for your own target on one GPU (or the CPU):
#
#   dflash-pack -[batches]-> dflash-target -[hidden]-> dflash-hspack -[features]-> dflash-train
#        (dflash-shm owns the rings; every stage reports to dflash-metrics)
#
#   pipelines/train.sh MODEL_DIR DATA [--run DIR] [--fresh] [dflash-plan flags] [-- dflash-train flags]
#
# --target-replicas R (a dflash-plan flag): R dflash-target processes share the rings (one per GPU
# of a device list, or several on the CPU); the run ends bit-identical to one replica.
# --ranks W: dflash-train runs as W data-parallel ranks under `mpirun -np W` (Open MPI; CPU path;
# $MPIRUN_FLAGS are added, e.g. --hostfile). --grad-accum stays the step's total over all ranks and
# must divide by W; 2 ranks with --grad-accum 2 end bit-identical to 1 rank with --grad-accum 2. A
# rank that dies stops every rank (mpirun names it); the same command resumes from rank 0's checkpoint.
#
# MODEL_DIR is a Hugging Face checkpoint directory (config.json + safetensors; Qwen3, Llama,
# Qwen3.5); DATA is JSONL with {"input_ids": [...], "loss_mask": [...]} per line (README "Preparing
# data") or its index. The script validates and indexes DATA, writes the run plan RUN/plan.json with
# dflash-plan (every other flag before -- goes to it: the budget, --device, --steps, --epochs,
# --layers, --seed, ...; see dflash-plan --help), then starts the stages the plan names, each with
# --run RUN alone. Flags after -- go to dflash-train unchanged (e.g. --lr 3e-4 --ckpt-every 500);
# dflash-plan also reads the drafter's geometry among them (--layer-types, --block-size,
# --grad-accum), so a 2-layer drafter captures 2 layers and --grad-accum 4 makes the packer emit 4
# batches per optimizer step.
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
FRESH=0
RANKS=1
PLAN_ARGS=()
EXTRA_TRAIN=()
ARGS=()
while [ $# -gt 0 ]; do
  case $1 in
    --run) RUN=$2; shift 2 ;;
    --fresh) FRESH=1; shift ;;
    --ranks) [ $# -ge 2 ] || { echo "train.sh: --ranks needs a value" >&2; exit 2; }
             RANKS=$2; shift 2 ;;
    --) shift; EXTRA_TRAIN=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --*) [ $# -ge 2 ] || { echo "train.sh: $1 needs a value (see --help)" >&2; exit 2; }
         PLAN_ARGS+=("$1" "$2"); shift 2 ;;   # dflash-plan's flags; it refuses unknown ones
    -*) echo "train.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
[ ${#ARGS[@]} -eq 2 ] || { echo "usage: train.sh MODEL_DIR DATA [--run DIR] [dflash-plan flags] [-- dflash-train flags] (see --help)" >&2; exit 2; }
MODEL=${ARGS[0]}
DATA_IN=${ARGS[1]}
RUN=${RUN:-runs/train}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=pipelines/lib.sh
. "$here/lib.sh"
need_bins dflash-plan dflash-shm dflash-metrics dflash-pack dflash-target dflash-hspack dflash-train dflash-export
# bad inputs stop here, each with one line, before anything is started
[ -d "$MODEL" ] || pdie "model directory $MODEL does not exist"
[ -f "$MODEL/config.json" ] || pdie "$MODEL/config.json: missing (not a Hugging Face model directory)"
[ -f "$DATA_IN" ] || pdie "dataset $DATA_IN does not exist"
MODEL=$(cd "$MODEL" && pwd)
DATA_IN=$(cd "$(dirname "$DATA_IN")" && pwd)/$(basename "$DATA_IN")

prepare_run_dir train
if [ -e "$RUN/DONE" ]; then
  plog "$RUN is complete (DONE); --fresh starts over. Summary:"
  cat "$RUN/summary.txt" >&2 2>/dev/null || true
  exit 0
fi
stop_leftover_stages
set -m
install_traps train.sh

# ---------------------------------------------------------------- the model's config, then the dataset: validated and indexed once
check_model_config "$MODEL" cpu   # the config parsed as the stages parse it; the device is the plan's
index_dataset "$DATA_IN" "$MODEL"

# ---------------------------------------------------------------- the plan, then the stages it names
# dflash-plan owns the run's geometry (budget, captured layers, hidden size, dtype, device, steps and
# the batches they need, ring specs, the trainer ranks); every stage below reads RUN/plan.json through --run.
case $RANKS in ''|*[!0-9]*|0) pdie "--ranks $RANKS: expected a count >= 1" ;; esac
[ "$RANKS" = 1 ] || PLAN_ARGS+=(--ranks "$RANKS")
"$DFLASH_BIN/dflash-plan" "$MODEL" "$DATA" --run "$RUN" ${PLAN_ARGS[@]+"${PLAN_ARGS[@]}"} \
  -- ${EXTRA_TRAIN[@]+"${EXTRA_TRAIN[@]}"} >"$LOGS/plan.out" 2>&1 || pdie "dflash-plan: $(tail -n 1 "$LOGS/plan.out")"
STEPS=$(plan_get steps)
DEVICE=$(plan_get device)
# The job's device-memory plan (target + trainer + rings) was printed and checked by dflash-plan before anything
# started: a configuration that cannot fit stopped there with one line naming the shortfall (issue 27).
if grep -q '^memory plan: total' "$LOGS/plan.out"; then plog "$(grep -m1 '^memory plan: total' "$LOGS/plan.out") (details: $LOGS/plan.out)"; fi

chain_commands   # CMD_SHM, CMD_METRICS, CMD_PACK, CMD_TARGET, CMD_HSPACK, TARGETS, FEEDERS (lib.sh)
CMD_TRAIN=("$DFLASH_BIN/dflash-train" --run "$RUN" ${EXTRA_TRAIN[@]+"${EXTRA_TRAIN[@]}"})
if [ "$RANKS" -gt 1 ]; then
  # GPU ranks (rank i of a host on cuda:(train_device + i)) sum their gradients with NCCL
  mpirun_launch "$RANKS"
  CMD_TRAIN=("${MPI_LAUNCH[@]}" "${CMD_TRAIN[@]}")
fi
write_run_json train "\"steps\": $STEPS, \"plan\": $(json_str "$RUN/plan.json"), \"model\": $(json_str "$MODEL"), \"data\": $(json_str "$DATA_IN")" \
  dflash-shm CMD_SHM dflash-metrics CMD_METRICS dflash-pack CMD_PACK dflash-target CMD_TARGET dflash-hspack CMD_HSPACK \
  dflash-train CMD_TRAIN

t0=$(date +%s.%N)
plog "run $RUN on $DEVICE (attempt $ATTEMPT): $(tail -n 1 "$LOGS/plan.out")"
run_train_chain || exit 1
train_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
stop_stage dflash-metrics TERM 20
finish_training_run "$MODEL" "" "$train_s"
