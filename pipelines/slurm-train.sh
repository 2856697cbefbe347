#!/usr/bin/env bash
#SBATCH --job-name=dflash-train
#SBATCH --nodes=2                # H hosts; each runs its own dflash-pack -> dflash-target -> dflash-hspack chain
#SBATCH --ntasks-per-node=1      # one host chain per node (the trainer ranks are started by mpirun)
#SBATCH --gpus-per-node=1        # each node's GPUs: the target's (--device) and its L ranks' (--train-device + i)
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --output=dflash-train-%j.out
#
# pipelines/slurm-train.sh — train a DFlash drafter on several hosts (issue 29, topology (c); design.md §8):
#
#   node h of H:  dflash-pack -[batches]-> dflash-target(s) -[hidden]-> dflash-hspack -[features]-> L trainer ranks
#                 (its own dflash-shm and rings in RUN/hosts/h: /dev/shm is per node)
#   all nodes:    the W = H x L trainer ranks form one job (mpirun; MPI on the CPU path, NCCL on GPUs)
#
#   cd dflash-pipe && sbatch [--nodes H] pipelines/slurm-train.sh MODEL_DIR DATA --run /shared/runs/NAME \
#       [--ranks-per-node L] [dflash-plan flags] [-- dflash-train flags]
#
# --ranks-per-node L (default 1): trainer ranks on each node (rank i of a node on cuda:(train_device + i) on GPUs).
#
# Submit from the repository root: sbatch runs a copy of this script, so lib.sh and build/bin are found
# through $SLURM_SUBMIT_DIR (or $DFLASH_HOME). RUN must be on a filesystem every node mounts (the plan, the
# trainer's checkpoints, state and exports, and the NCCL id live there); the binaries too.
#
# What it does: indexes DATA and writes the run's plan once (RUN/plan.json with hosts H = $SLURM_NNODES and ranks
# W = H x L; dflash-plan flags as train.sh takes them, e.g. --tokens, --steps, --device, --train-device,
# --target-replicas; --grad-accum, the step's batches over all ranks, must divide by W), then host h's plan
# RUN/hosts/h/plan.json (dflash-plan --from RUN --host h). Then, each round: one srun step starts this script's
# host chain on every node (`srun --nodes=H --ntasks-per-node=1`): in RUN/hosts/h it starts dflash-shm and
# dflash-metrics, writes its node name (RUN/hosts/h/node: a trainer rank placed on another node refuses to start)
# and says it is ready; the trainer ranks start as one job, `mpirun -np W --map-by ppr:L:node` inside the
# allocation (Debian's Open MPI 4.1 is built with Slurm support: mpirun reads the allocation and starts its
# daemons on the nodes with srun; this needs no PMIx plugin in Slurm, which `srun --mpi=pmix` would). Rank r
# lives on node r / L, takes the batch seqs s with s % W == r and reads them from its node's features ring; rank
# 0 (on the first node, where this script runs) sends the metrics to RUN's dflash-metrics and writes the
# checkpoints. Once rank 0 says which batch seq it needs, every host chain starts its producers there: the packer
# packs every batch of the one stream and publishes only its node's ranks' seqs, hspack expects exactly those.
# The end is bit-identical to one host running one rank with --grad-accum W over the same batches.
#
# Produces in RUN: plan.json, run.json, logs/ (this script's, the trainer ranks', metrics), hosts/h/ (each host's
# plan, logs, state, metrics), metrics.jsonl/.csv (the trainer's), checkpoints/, export/zlab and
# export/speculators (checked), summary.txt and DONE. Size and time: as pipelines/train.sh, with the target
# and trainer work divided over the hosts.
#
# Failure and resume: a producer (pack, a target replica, hspack) that dies is restarted alone by its host
# chain. A trainer rank that dies makes mpirun stop every rank and name it; the script then stops every host
# chain (their rings go), and starts the next round: the ranks resume from rank 0's newest checkpoint and every
# host's producers are rewound to the seq it asks for (up to $MAX_RESTARTS rounds). A host chain that fails
# fails the job. Resume after the job ended (time limit, node failure): submit the same command again (without
# --fresh); a run with DONE prints its summary and exits.
#
# Tested (tests/test_slurm.c) under a fake srun that starts each "node"'s task as a local process (with
# SLURM_PROCID, SLURM_NODEID, SLURM_NNODES, SLURM_JOB_NODELIST set) on the tiny CPU model: Open MPI's own Slurm
# launch path runs through it. Not tested: a real Slurm controller, real separate nodes and their network.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ ! -f "$here/lib.sh" ]; then   # sbatch runs a copy from its spool directory
  here=${DFLASH_HOME:-${SLURM_SUBMIT_DIR:-.}}/pipelines
  [ -f "$here/lib.sh" ] || { echo "slurm-train.sh: no pipelines/lib.sh under ${DFLASH_HOME:-${SLURM_SUBMIT_DIR:-.}}: submit from the repository root or set DFLASH_HOME" >&2; exit 2; }
fi
SELF=$here/slurm-train.sh
# shellcheck source=pipelines/lib.sh
. "$here/lib.sh"
if [ -n "${SLURM_SUBMIT_DIR:-}" ] && [ -z "${DFLASH_BIN:-}" ] && [ -z "${BUILD:-}" ]; then BUILD=$here/../build; fi
BUILD=${BUILD:-build}
: "${HOST_WAIT_S:=300}"   # how long the hosts' chains may take to come up, and a host chain waits for the seq

# forget_other_node_pids DIR: DIR/pids of a process on another node (an earlier job ran there) are not ours to stop
# here (a pid on this node may be anything); then DIR/node names this node.
forget_other_node_pids() {
  local dir=$1 node
  node=$(hostname)
  if [ -e "$dir/node" ] && [ "$(cat "$dir/node")" != "$node" ]; then rm -rf "$dir/pids"; fi
  printf '%s\n' "$node" >"$dir/node.tmp" && mv -f "$dir/node.tmp" "$dir/node"
}

# ================================================================ a host's chain (srun runs this on every node)
# slurm-train.sh --host-chain RUN ROUND: this node's chain in RUN/hosts/$SLURM_NODEID for round ROUND of the job.
# Files under RUN carry the round: hosts/h/ready ("ROUND node"), state/hosts.feed ("ROUND SEQ": start the
# producers at SEQ), state/hosts.stop ("ROUND": end this round's chains).
host_chain() {
  local shared=$1 round=$2 h=${SLURM_NODEID:-} node i seq="" line
  [ -n "$h" ] || pdie "--host-chain runs under srun (SLURM_NODEID is not set)"
  node=$(hostname)
  RUN=$shared/hosts/$h
  [ -e "$RUN/plan.json" ] || pdie "$RUN/plan.json is missing (the batch script writes every host's plan first)"
  # a chain of the round before may still be cleaning up on this node: wait for its lock
  LOCK_WAIT_S=60 prepare_run_dir
  rm -f "$RUN/ready"
  forget_other_node_pids "$RUN"   # RUN/node: the trainer ranks of this host check they run here
  stop_leftover_stages
  set -m
  install_traps "host $h chain"
  chain_commands
  chain_start_services || exit 1
  write_state "$RUN/ready" "$round $node"
  plog "host $h of ${SLURM_NNODES:-?} on $node: rings up in $RUN (round $round); waiting for the seq the trainer needs"
  for ((i = 0; i < HOST_WAIT_S * 10; i++)); do
    line=$(cat "$shared/state/hosts.feed" 2>/dev/null || true)
    if [ "${line%% *}" = "$round" ]; then seq=${line##* }; break; fi
    if [ "$(cat "$shared/state/hosts.stop" 2>/dev/null || true)" = "$round" ]; then chain_stop; exit 0; fi
    sleep 0.1
  done
  [ -n "$seq" ] || pdie "host $h: no batch seq from the trainer within ${HOST_WAIT_S}s ($shared/state/hosts.feed)"
  plog "host $h: the trainer needs batch seq $seq next: the producers start there"
  start_feeders "$seq"
  supervise $FEEDERS || exit 1
  # the features ring lives as long as this chain: the ranks may still be reading it
  plog "host $h: the producers finished; keeping the rings until the trainer is done"
  while [ "$(cat "$shared/state/hosts.stop" 2>/dev/null || true)" != "$round" ]; do
    _alive dflash-shm || pdie "host $h: dflash-shm exited while the trainer may still read the rings"
    sleep 0.2
  done
  chain_stop
  exit 0
}

if [ "${1:-}" = --host-chain ]; then
  [ $# -eq 3 ] || { echo "usage: slurm-train.sh --host-chain RUN ROUND (started by the batch script through srun)" >&2; exit 2; }
  need_bins dflash-plan dflash-shm dflash-metrics dflash-pack dflash-target dflash-hspack
  host_chain "$2" "$3"
fi

# ================================================================ the batch script (the allocation's first node)
RUN=""
FRESH=0
PER_NODE=1
PLAN_ARGS=()
EXTRA_TRAIN=()
ARGS=()
while [ $# -gt 0 ]; do
  case $1 in
    --run) RUN=$2; shift 2 ;;
    --fresh) FRESH=1; shift ;;
    --ranks-per-node) [ $# -ge 2 ] || { echo "slurm-train.sh: --ranks-per-node needs a value" >&2; exit 2; }
                      PER_NODE=$2; shift 2 ;;
    --ranks|--hosts) echo "slurm-train.sh: $1 is set by the allocation (--nodes) and --ranks-per-node" >&2; exit 2 ;;
    --) shift; EXTRA_TRAIN=("$@"); break ;;
    -h|--help) sed -n '9,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --*) [ $# -ge 2 ] || { echo "slurm-train.sh: $1 needs a value (see --help)" >&2; exit 2; }
         PLAN_ARGS+=("$1" "$2"); shift 2 ;;   # dflash-plan's flags; it refuses unknown ones
    -*) echo "slurm-train.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
[ ${#ARGS[@]} -eq 2 ] && [ -n "$RUN" ] || { echo "usage: sbatch slurm-train.sh MODEL_DIR DATA --run SHARED_DIR [--ranks-per-node L] [dflash-plan flags] [-- dflash-train flags] (see --help)" >&2; exit 2; }
[ -n "${SLURM_JOB_ID:-}" ] && [ -n "${SLURM_NNODES:-}" ] || { echo "slurm-train.sh: not inside a Slurm allocation (submit it with sbatch, or run it in salloc)" >&2; exit 2; }
MODEL=${ARGS[0]}
DATA_IN=${ARGS[1]}
HOSTS=$SLURM_NNODES
case $PER_NODE in ''|*[!0-9]*|0) echo "slurm-train.sh: --ranks-per-node $PER_NODE: expected a count >= 1" >&2; exit 2 ;; esac
RANKS=$((HOSTS * PER_NODE))

need_bins dflash-plan dflash-shm dflash-metrics dflash-pack dflash-target dflash-hspack dflash-train dflash-export
command -v srun >/dev/null 2>&1 || pdie "srun not found (this script runs inside a Slurm allocation)"
[ -d "$MODEL" ] || pdie "model directory $MODEL does not exist"
[ -f "$MODEL/config.json" ] || pdie "$MODEL/config.json: missing (not a Hugging Face model directory)"
[ -f "$DATA_IN" ] || pdie "dataset $DATA_IN does not exist"
MODEL=$(cd "$MODEL" && pwd)
DATA_IN=$(cd "$(dirname "$DATA_IN")" && pwd)/$(basename "$DATA_IN")

prepare_run_dir
if [ -e "$RUN/DONE" ]; then
  plog "$RUN is complete (DONE); --fresh starts over. Summary:"
  cat "$RUN/summary.txt" >&2 2>/dev/null || true
  exit 0
fi
forget_other_node_pids "$RUN"
stop_leftover_stages
set -m
install_traps slurm-train.sh

check_model_config "$MODEL" cpu
index_dataset "$DATA_IN" "$MODEL"
# the run's plan (hosts and ranks in it), then each host's
"$DFLASH_BIN/dflash-plan" "$MODEL" "$DATA" --run "$RUN" --hosts "$HOSTS" --ranks "$RANKS" ${PLAN_ARGS[@]+"${PLAN_ARGS[@]}"} \
  -- ${EXTRA_TRAIN[@]+"${EXTRA_TRAIN[@]}"} >"$LOGS/plan.out" 2>&1 || pdie "dflash-plan: $(tail -n 1 "$LOGS/plan.out")"
for ((h = 0; h < HOSTS; h++)); do
  "$DFLASH_BIN/dflash-plan" --run "$RUN/hosts/$h" --from "$RUN" --host "$h" >>"$LOGS/plan.out" 2>&1 ||
    pdie "dflash-plan --host $h: $(tail -n 1 "$LOGS/plan.out")"
done
STEPS=$(plan_get steps)
DEVICE=$(plan_get device)
# dflash-plan checked the device-memory plan of one host's GPUs (issue 27) before anything started
if grep -q '^memory plan: total' "$LOGS/plan.out"; then plog "$(grep -m1 '^memory plan: total' "$LOGS/plan.out") (details: $LOGS/plan.out)"; fi

CMD_METRICS=("$DFLASH_BIN/dflash-metrics" --run "$RUN" --plot-every-s 60 --csv-stage dflash-train)
mpirun_launch "$RANKS" --map-by "ppr:$PER_NODE:node"
CMD_TRAIN=("${MPI_LAUNCH[@]}" "$DFLASH_BIN/dflash-train" --run "$RUN" ${EXTRA_TRAIN[@]+"${EXTRA_TRAIN[@]}"})
# --overlap (Slurm >= 20.11; SRUN_FLAGS= drops it for older ones): the host chains' step runs for the whole round,
# and the step mpirun starts for its daemons must share the nodes' CPUs and GPUs with it (SLURM_OVERLAP asks the same
# of mpirun's own srun call). Not yet run on a real Slurm cluster (tests/test_slurm.c fakes srun).
SRUN_FLAGS=${SRUN_FLAGS---overlap}
case " $SRUN_FLAGS " in *" --overlap "*) export SLURM_OVERLAP=1 ;; esac
# shellcheck disable=SC2206
SRUN_EXTRA=($SRUN_FLAGS)
CMD_HOSTS=(srun --nodes="$HOSTS" --ntasks="$HOSTS" --ntasks-per-node=1 --kill-on-bad-exit=1 ${SRUN_EXTRA[@]+"${SRUN_EXTRA[@]}"}
           bash "$SELF" --host-chain "$RUN")
FEEDERS=""   # the producers run in the host chains
write_run_json slurm-train "\"steps\": $STEPS, \"hosts\": $HOSTS, \"ranks\": $RANKS, \"job\": $(json_str "$SLURM_JOB_ID"), \"nodes\": $(json_str "${SLURM_JOB_NODELIST:-}"), \"plan\": $(json_str "$RUN/plan.json"), \"model\": $(json_str "$MODEL"), \"data\": $(json_str "$DATA_IN")" \
  hosts CMD_HOSTS dflash-metrics CMD_METRICS dflash-train CMD_TRAIN

# run_train_chain's hooks (lib.sh), for one chain per host: the services are the srun step of the host chains,
# the producers start when the round's seq is written, a chain stop ends the round's step.
ROUND=0
chain_start_services() {
  local h i ready
  ROUND=$((ROUND + 1))
  ROUND_ID=$SLURM_JOB_ID.$ATTEMPT.$ROUND
  for ((h = 0; h < HOSTS; h++)); do rm -f "$RUN/hosts/$h/ready"; done
  start_stage --service hosts "${CMD_HOSTS[@]}" "$ROUND_ID"
  for ((i = 0; i < HOST_WAIT_S * 10; i++)); do
    ready=0
    for ((h = 0; h < HOSTS; h++)); do
      [ "$(cut -d' ' -f1 "$RUN/hosts/$h/ready" 2>/dev/null || true)" != "$ROUND_ID" ] || ready=$((ready + 1))
    done
    [ "$ready" -lt "$HOSTS" ] || break
    _alive hosts || { plog "the host chains' step ended while starting: $(first_error "$LOGS/hosts.out" "${STAGE_LOG_SKIP[hosts]}")"; return 1; }
    sleep 0.1
  done
  [ "$ready" -eq "$HOSTS" ] || { plog "$ready of $HOSTS host chains came up within ${HOST_WAIT_S}s; see $LOGS/hosts.out and $RUN/hosts/*/logs"; return 1; }
  plog "round $ROUND_ID: the $HOSTS host chains are up ($(for ((h = 0; h < HOSTS; h++)); do cut -d' ' -f2 "$RUN/hosts/$h/ready"; done | tr '\n' ' '))"
  start_metrics_once
}
start_feeders() { write_state "$RUN/state/hosts.feed" "$ROUND_ID $1"; }
chain_stop() {
  local i
  # the host chains end on the stop file once their producers are done (the run's end); a round cut short (a rank
  # died) has producers still running: after 5 s the step is signalled (srun forwards it; each chain's trap stops
  # its stages and removes its rings)
  write_state "$RUN/state/hosts.stop" "$ROUND_ID"
  for ((i = 0; i < 50; i++)); do _alive hosts || break; sleep 0.1; done
  stop_stage hosts TERM 30
}

t0=$(date +%s.%N)
plog "run $RUN on $HOSTS hosts ($SLURM_JOB_NODELIST), $RANKS trainer ranks ($PER_NODE per node), $DEVICE (attempt $ATTEMPT): $(grep -m1 'plan.json: ' "$LOGS/plan.out")"
run_train_chain || exit 1
train_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
stop_stage dflash-metrics TERM 20
finish_training_run "$MODEL" "" "$train_s"
