#!/usr/bin/env bash
# pipelines/offline.sh — record the target's features once, then train many epochs from the
# recording without the target (dflash-replay stands where dflash-pack, dflash-target and
# dflash-hspack were; the trainer is unchanged):
#
#   1. record:  dflash-pack -[batches]-> dflash-target -[hidden]-> dflash-hspack -[features]-> dflash-record --out REC
#   2. train:   dflash-replay --dir REC -[features]-> dflash-train
#
#   pipelines/offline.sh MODEL_DIR DATA [--run DIR] [--epochs N] [--shuffle] [--steps N] [--record DIR]
#                        [--fresh] [dflash-plan flags] [-- dflash-train flags]
#
# Arguments as pipelines/train.sh (the run plan, RUN/plan.json, written by dflash-plan from the other
# flags before --: the budget, --device, --layers, ...). --epochs: passes over the recording (default 1; epoch 0 is in
# recorded order, so --epochs 1 without --shuffle trains on exactly the batches of train.sh
# --epochs 1 and gives the same drafter); --shuffle shuffles each epoch's batches (seeded);
# --steps defaults to epochs x recorded batches / --grad-accum (rounded up); --record DIR puts the recording elsewhere (default
# RUN/recording; a recording made before is reused when it is complete).
#
# Produces RUN/recording (item-<seq>.safetensors + index.txt), and as train.sh: checkpoints,
# export/{zlab,speculators} (checked), metrics, plots, summary.txt, DONE. Size and time: the
# recording takes 13 B + (k + 1) · H · bytes(dtype) per token (Qwen3-8B, 5 layers, bf16: 49 GB
# per million tokens; README "Recordings"); recording runs at the target's speed, training at the
# trainer's with no target cost.
#
# Resume: run the same command again. An incomplete recording continues at the first batch it
# lacks (packer and hspack rewound to it on fresh rings); training resumes from the newest
# checkpoint with the replayer rewound to the seq the trainer asks for.
set -euo pipefail

BUILD=${BUILD:-build}
RUN=""
STEPS=""
EPOCHS=1
SHUFFLE=0
REC=""
FRESH=0
PLAN_ARGS=()
EXTRA_TRAIN=()
ARGS=()
while [ $# -gt 0 ]; do
  case $1 in
    --run) RUN=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --epochs) EPOCHS=$2; shift 2 ;;
    --shuffle) SHUFFLE=1; shift ;;
    --record) REC=$2; shift 2 ;;
    --fresh) FRESH=1; shift ;;
    --) shift; EXTRA_TRAIN=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --*) [ $# -ge 2 ] || { echo "offline.sh: $1 needs a value (see --help)" >&2; exit 2; }
         PLAN_ARGS+=("$1" "$2"); shift 2 ;;   # dflash-plan's flags (--device, the budget, --layers, ...)
    -*) echo "offline.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
[ ${#ARGS[@]} -eq 2 ] || { echo "usage: offline.sh MODEL_DIR DATA [--run DIR] [--epochs N] [-- dflash-train flags] (see --help)" >&2; exit 2; }
MODEL=${ARGS[0]}
DATA_IN=${ARGS[1]}
RUN=${RUN:-runs/offline}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=pipelines/lib.sh
. "$here/lib.sh"
need_bins dflash-plan dflash-shm dflash-metrics dflash-pack dflash-target dflash-hspack dflash-record dflash-replay dflash-train dflash-export
[ -d "$MODEL" ] || pdie "model directory $MODEL does not exist"
[ -f "$MODEL/config.json" ] || pdie "$MODEL/config.json: missing (not a Hugging Face model directory)"
[ -f "$DATA_IN" ] || pdie "dataset $DATA_IN does not exist"
[ -z "$STEPS" ] || [[ $STEPS =~ ^[1-9][0-9]*$ ]] || pdie "--steps: '$STEPS' is not a positive integer"
[[ $EPOCHS =~ ^[1-9][0-9]*$ ]] || pdie "--epochs: '$EPOCHS' is not a positive integer"
MODEL=$(cd "$MODEL" && pwd)
DATA_IN=$(cd "$(dirname "$DATA_IN")" && pwd)/$(basename "$DATA_IN")

prepare_run_dir offline
REC=${REC:-$RUN/recording}
if [ -e "$RUN/DONE" ]; then
  plog "$RUN is complete (DONE); --fresh starts over. Summary:"
  cat "$RUN/summary.txt" >&2 2>/dev/null || true
  exit 0
fi
stop_leftover_stages
set -m
install_traps offline.sh

check_model_config "$MODEL" cpu   # the config parsed as the stages parse it; the device is the plan's
VOCAB=$(grep -o '"vocab_size": *[0-9]*' "$MODEL/config.json" | head -n 1 | grep -o '[0-9]*$' || true)
DATA=$RUN/data.idx
if [ ! -e "$DATA" ] || [ "$DATA_IN" -nt "$DATA" ]; then
  plog "validating and indexing $DATA_IN${VOCAB:+ (token ids below vocab_size $VOCAB)}"
  "$DFLASH_BIN/dflash-pack" --data "$DATA_IN" --index "$DATA.tmp" ${VOCAB:+--vocab-size "$VOCAB"} >"$LOGS/index.out" 2>&1 ||
    { rm -f "$DATA.tmp"; pdie "$(first_error "$LOGS/index.out")"; }
  mv "$DATA.tmp" "$DATA"
fi

# the run plan (RUN/plan.json): phase 1 records one epoch of the dataset; phase 2 re-plans the steps
# of --epochs passes over the recording. Every stage reads the plan through --run.
make_plan() {   # make_plan [--steps N]
  "$DFLASH_BIN/dflash-plan" "$MODEL" "$DATA" --run "$RUN" --epochs 1 ${PLAN_ARGS[@]+"${PLAN_ARGS[@]}"} "$@" \
    -- ${EXTRA_TRAIN[@]+"${EXTRA_TRAIN[@]}"} >"$LOGS/plan.out" 2>&1 || pdie "dflash-plan: $(tail -n 1 "$LOGS/plan.out")"
}
plan_get() { "$DFLASH_BIN/dflash-plan" --run "$RUN" --get "$1" || pdie "dflash-plan --get $1 failed"; }
make_plan
DEVICE=$(plan_get device)
D=$DFLASH_BIN

# ---------------------------------------------------------------- 1. the recording (once)
if [ ! -e "$REC/index.txt" ]; then
  mkdir -p "$REC"
  next=0
  while [ -e "$(printf '%s/item-%012d.safetensors' "$REC" "$next")" ]; do next=$((next + 1)); done
  CMD_SHM=("$D/dflash-shm" --run "$RUN")
  CMD_METRICS=("$D/dflash-metrics" --run "$RUN" --plot-every-s 60 --csv-stage dflash-train)
  CMD_PACK=("$D/dflash-pack" --run "$RUN" --epochs 1 --resume-from-seq "$next")
  CMD_TARGET=("$D/dflash-target" --run "$RUN")
  CMD_HSPACK=("$D/dflash-hspack" --run "$RUN")
  CMD_RECORD=("$D/dflash-record" --run "$RUN" --device "$DEVICE" --ring features --kind features --strict --out "$REC")
  write_run_json offline-record "\"plan\": $(json_str "$RUN/plan.json"), \"model\": $(json_str "$MODEL"), \"data\": $(json_str "$DATA_IN"), \"record\": $(json_str "$REC")" \
    dflash-shm CMD_SHM dflash-metrics CMD_METRICS dflash-pack CMD_PACK dflash-target CMD_TARGET dflash-hspack CMD_HSPACK \
    dflash-record CMD_RECORD
  [ "$next" = 0 ] || plog "resuming the recording: $next batches already in $REC; packer and hspack start at seq $next"
  rewind_online_feeders "$next"
  rm -f "$RUN/shm.json" "$RUN/bus/metrics.sock"
  start_stage --service dflash-shm "${CMD_SHM[@]}"
  wait_for_file "$RUN/shm.json" 20 '"running"' || pdie "dflash-shm did not come up; see $LOGS/dflash-shm.out"
  start_stage --service dflash-metrics "${CMD_METRICS[@]}"
  wait_for_file "$RUN/bus/metrics.sock" 20 || pdie "dflash-metrics did not bind its socket; see $LOGS/dflash-metrics.out"
  start_stage dflash-record "${CMD_RECORD[@]}"
  start_stage dflash-hspack "${CMD_HSPACK[@]}"
  start_stage dflash-target "${CMD_TARGET[@]}"
  start_stage dflash-pack "${CMD_PACK[@]}"
  supervise dflash-pack dflash-target dflash-hspack dflash-record || exit 1
  shutdown_rings
  [ -e "$REC/index.txt" ] || pdie "dflash-record exited 0 but $REC/index.txt is missing"
  plog "recording complete: $(grep -c '^item ' "$REC/index.txt") batches in $REC"
fi

# ---------------------------------------------------------------- 2. training from the recording
N_ITEMS=$(grep -c '^item ' "$REC/index.txt") || pdie "$REC/index.txt lists no item"
A=$(plan_get grad_accum)   # batches per optimizer step
if [ -z "$STEPS" ]; then
  STEPS=$((EPOCHS * N_ITEMS / A))   # never a partial accumulation (issue 24)
  [ "$STEPS" -gt 0 ] || pdie "$REC holds $N_ITEMS batches: $EPOCHS epoch(s) are fewer than one step of --grad-accum $A"
  [ $((EPOCHS * N_ITEMS % A)) = 0 ] || plog "$EPOCHS epoch(s) of $N_ITEMS batches make $STEPS steps of --grad-accum $A; the last $((EPOCHS * N_ITEMS % A)) are not used"
fi
# the replayer ends after --epochs: a run that needs more batches would fail at its end, so it fails here
[ $((STEPS * A)) -le $((EPOCHS * N_ITEMS)) ] ||
  pdie "--steps $STEPS x --grad-accum $A needs $((STEPS * A)) batches; $EPOCHS epoch(s) of $REC give $((EPOCHS * N_ITEMS)) (raise --epochs)"
make_plan --steps "$STEPS"
REPLAY_FLAGS=(--dir "$REC" --epochs "$EPOCHS")
[ "$SHUFFLE" = 0 ] || REPLAY_FLAGS+=(--shuffle --seed 1)
FEATURE_SPEC=$("$D/dflash-replay" "${REPLAY_FLAGS[@]}" --device "$DEVICE" --print-ring-spec) || pdie "dflash-replay --print-ring-spec failed"
CMD_SHM=("$D/dflash-shm" --run "$RUN" --ring "$FEATURE_SPEC")   # stamped with the plan's hash
CMD_METRICS=("$D/dflash-metrics" --run "$RUN" --plot-every-s 60 --csv-stage dflash-train)
CMD_REPLAY=("$D/dflash-replay" --run "$RUN" --device "$DEVICE" "${REPLAY_FLAGS[@]}")
CMD_TRAIN=("$D/dflash-train" --run "$RUN" ${EXTRA_TRAIN[@]+"${EXTRA_TRAIN[@]}"})
FEEDERS="dflash-replay"
# seq s of the replayed stream is position s (the recording's seqs start at 0 and later epochs continue them)
start_feeders() {
  write_state "$RUN/state/replay.features.pos" "$(printf '%020d %020d' "$1" "$1")"
  start_stage dflash-replay "${CMD_REPLAY[@]}"
}
write_run_json offline "\"steps\": $STEPS, \"epochs\": $EPOCHS, \"shuffle\": $SHUFFLE, \"plan\": $(json_str "$RUN/plan.json"), \"model\": $(json_str "$MODEL"), \"record\": $(json_str "$REC")" \
  dflash-shm CMD_SHM dflash-metrics CMD_METRICS dflash-replay CMD_REPLAY dflash-train CMD_TRAIN
t0=$(date +%s.%N)
plog "training from $REC ($N_ITEMS batches, $EPOCHS epoch(s)) on $DEVICE: $STEPS steps"
run_train_chain || exit 1
train_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
stop_stage dflash-metrics TERM 20
finish_training_run "$MODEL" "" "$train_s"
