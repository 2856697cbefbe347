# shellcheck shell=bash
# pipelines/lib.sh — shell functions shared by the pipeline scripts (sourced, not run).
#
# A pipeline script sets RUN (the run directory) and LOGS (where each stage's stdout/stderr go),
# enables job control (`set -m`, so every stage started in the background gets its own process
# group), installs `trap on_exit EXIT` and `trap on_signal INT TERM`, and then:
#   lock_run RUN                take the run directory's lock ($RUN/lock, flock) for this script's
#                               lifetime, or exit 1 naming the pid and start time of the run holding
#                               it (two pipelines on one run directory would kill each other's stages)
#   start_stage NAME CMD...     start CMD in its own process group; output -> $LOGS/NAME.out; pid in
#                               $RUN/pids/NAME.pid; remembered so stop_all stops it. SWAP_<NAME with
#                               dashes as underscores>=PROGRAM runs PROGRAM instead of CMD's program
#   Everything the scripts create is private to the caller (umask 077 below, as the stages' own
#   umask: 0700 directories, 0600 files, whatever the caller's umask); prepare_run_dir refuses a run
#   directory owned by another user or open to group/other (issue 24).
#   supervise NAME...           wait until every named stage ended (exit 0 = its stream ended).
#                               Any stage (services too) killed by a signal (a crash, kill -9) or
#                               stopped before the end of its stream (exit 3, STAGE_EXIT_STOPPED of
#                               stages/core/stage.h: SIGTERM/SIGINT mid-stream) is started again with
#                               the same command, up to $MAX_RESTARTS times per stage (design.md §8:
#                               the same command continues the run); any other non-zero exit, or a
#                               service stage (start_stage --service: dflash-shm, dflash-metrics)
#                               exiting otherwise (exit 0 included), fails the run: supervise returns 1
#                               after naming it. A service is restarted like any stage: dflash-metrics
#                               SIGTERMed mid-run exits 3 and is started again.
#                               Deaths are found by polling every 0.1 s and collected with `wait PID`
#                               per stage, so several stages dying at once are each restarted.
#                               A chain stage (start_stage --chain: dflash-train) is not restarted
#                               alone: its death (signal or exit 3) makes supervise return 2, and the
#                               script restarts the whole chain from the seq the trainer asks for
#                               (run_train_chain below).
#   stop_stage NAME [SIG] [S]   SIGTERM (or SIG) the stage's process group, wait up to S seconds
#                               (default 10), then SIGKILL it
#   stop_all                    stop every started stage that still runs, newest first
#   wait_for_file PATH S [PAT]  wait up to S seconds for PATH to exist (and contain PAT)
#   wait_ring_drained RUN RING S  wait until dflash-shm --status says RING is drained and empty
#   remove_run_segments RUN     remove RUN's ring segments that nothing uses any more (creator dead,
#                               no live stage attached; dflash-shm --remove-stale --run); stop_all
#                               calls it, so a dflash-shm that died after the last item leaves none
# Invariants: every wait has a timeout; no function kills a process it did not start.

: "${MAX_RESTARTS:=3}"
STAGE_EXIT_STOPPED=3   # stages/core/stage.h STAGE_EXIT_STOPPED: stopped by a signal before end of stream
# Private whatever the caller's umask (issue 24): run directory, logs, state, data files, temporaries. The stages
# set the same umask themselves (stages/core/stage.c; --share-group widens theirs to 027).
umask 077
declare -gA STAGE_PID=() STAGE_CMD=() STAGE_RESTARTS=() STAGE_SERVICE=() STAGE_CHAIN=() STAGE_LOG_SKIP=()
declare -ga STAGE_ORDER=()

plog() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
pdie() { plog "error: $*"; exit 1; }

# 1 GPU or more visible to nvidia-smi?
have_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }

# Quote a string for JSON (backslash, double quote, control characters as spaces).
json_str() {
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/ }
  s=${s//$'\t'/ }
  printf '"%s"' "$s"
}
# A bash array as a JSON array of strings.
json_arr() {
  local out="[" sep="" a
  for a in "$@"; do out+="$sep$(json_str "$a")"; sep=", "; done
  printf '%s]' "$out"
}

# lock_run RUN: see the header. The lock fd is not inherited by the stages (_launch closes it),
# so the lock ends with this script, and the next attempt may stop stages it left behind.
lock_run() {
  local run=$1 holder
  mkdir -p "$run"
  exec {RUN_LOCK_FD}>>"$run/lock" || pdie "cannot open $run/lock"
  # -w 2: a killed script's short-lived children (a sleep, a status query) may hold it for a moment
  # ($LOCK_WAIT_S: a host chain of slurm-train.sh waits for the previous round's chain to finish its clean-up)
  if ! flock -w "${LOCK_WAIT_S:-2}" "$RUN_LOCK_FD"; then
    holder=$(cat "$run/lock.owner" 2>/dev/null || echo "an unknown process")
    pdie "run directory $run is in use by another pipeline: $holder (wait for it, or stop it first)"
  fi
  printf 'pid %s (%s), started %s on %s\n' "$$" "${0##*/}" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(hostname)" >"$run/lock.owner"
}

_launch() {
  local name=$1; shift
  # a symlink at the log's name is refused, not written through (bash's >> follows it)
  [ ! -L "$LOGS/$name.out" ] || pdie "$LOGS/$name.out is a symbolic link; refusing to write through it"
  # this launch's lines start after these: first_error reports this attempt's error, not an earlier one's
  STAGE_LOG_SKIP[$name]=0
  [ ! -e "$LOGS/$name.out" ] || STAGE_LOG_SKIP[$name]=$(wc -l <"$LOGS/$name.out")
  if [ -n "${RUN_LOCK_FD:-}" ]; then
    "$@" >>"$LOGS/$name.out" 2>&1 </dev/null {RUN_LOCK_FD}>&- &
  else
    "$@" >>"$LOGS/$name.out" 2>&1 </dev/null &
  fi
  STAGE_PID[$name]=$!
  mkdir -p "$RUN/pids"
  echo "${STAGE_PID[$name]}" >"$RUN/pids/$name.pid"
}

# start_stage [--service|--chain] NAME CMD...
start_stage() {
  local service=0 chain=0
  if [ "$1" = --service ]; then service=1; shift; fi
  if [ "$1" = --chain ]; then chain=1; shift; fi
  local name=$1; shift
  # SWAP_<stage, dashes as underscores>=PROGRAM runs PROGRAM in the stage's place with the same
  # arguments (a modified build, an instrumented binary): SWAP_dflash_target=build-exp/bin/dflash-target
  local base=${name%%.*}   # a replica dflash-target.I is swapped as dflash-target
  local swap="SWAP_${base//-/_}"
  if [ -n "${!swap:-}" ]; then
    [ -x "${!swap}" ] || pdie "$swap=${!swap}: not an executable"
    plog "$name: running ${!swap} in place of $1 ($swap)"
    set -- "${!swap}" "${@:2}"
  fi
  STAGE_CMD[$name]=$(printf '%q ' "$@")
  STAGE_RESTARTS[$name]=0
  STAGE_SERVICE[$name]=$service
  STAGE_CHAIN[$name]=$chain
  local n known=0
  for n in "${STAGE_ORDER[@]}"; do [ "$n" != "$name" ] || known=1; done
  [ "$known" = 1 ] || STAGE_ORDER+=("$name")   # a chain restart starts a stage again under its name
  _launch "$name" "$@"
  plog "started $name (pid ${STAGE_PID[$name]}): $*"
}

_alive() { local p=${STAGE_PID[$1]:-}; [ -n "$p" ] && kill -0 "$p" 2>/dev/null; }

stop_stage() {
  local name=$1 sig=${2:-TERM} secs=${3:-10} pid=${STAGE_PID[$1]:-} i
  [ -n "$pid" ] || return 0
  if kill -0 "$pid" 2>/dev/null; then
    kill -s "$sig" -- "-$pid" 2>/dev/null || kill -s "$sig" "$pid" 2>/dev/null || true
    for ((i = 0; i < secs * 10; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      plog "$name (pid $pid) did not stop within ${secs}s; SIGKILL"
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  wait "$pid" 2>/dev/null || true
  STAGE_PID[$name]=""
  rm -f "$RUN/pids/$name.pid"
}

stop_all() {
  local i name
  for ((i = ${#STAGE_ORDER[@]} - 1; i >= 0; i--)); do
    name=${STAGE_ORDER[$i]}
    if _alive "$name"; then plog "stopping $name"; stop_stage "$name"; fi
  done
  if [ -n "${DFLASH_BIN:-}" ] && [ -n "${RUN:-}" ] && [ -d "$RUN" ]; then remove_run_segments "$RUN"; fi
}

remove_run_segments() {
  local out
  out=$("$DFLASH_BIN/dflash-shm" --remove-stale --run "$1" 2>&1) || plog "dflash-shm --remove-stale --run $1: $out"
  if printf '%s\n' "$out" | grep -q '^removed'; then plog "$(printf '%s\n' "$out" | grep -c '^removed') leftover segment(s) of $1 removed"; fi
  return 0
}

# supervise NAME... : see the header.
supervise() {
  local -A want=()
  local n rc pid name why
  for n in "$@"; do want[$n]=1; done
  while ((${#want[@]})); do
    name=""
    for n in "${STAGE_ORDER[@]}"; do
      pid=${STAGE_PID[$n]:-}
      if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then name=$n; break; fi
    done
    if [ -z "$name" ]; then
      for n in "${STAGE_ORDER[@]}"; do [ -n "${STAGE_PID[$n]:-}" ] && break; n=""; done
      [ -n "$n" ] || pdie "supervise: no stage is running"
      sleep 0.1
      continue
    fi
    rc=0
    wait "$pid" 2>/dev/null || rc=$?
    STAGE_PID[$name]=""
    rm -f "$RUN/pids/$name.pid"
    if { [ "$rc" -gt 128 ] || [ "$rc" -eq "$STAGE_EXIT_STOPPED" ]; } && [ "${STAGE_CHAIN[$name]:-0}" = 1 ]; then
      plog "$name stopped (status $rc); the chain restarts from the seq it asks for"
      # trainer ranks under mpirun: its one line naming the rank that died (issue 29)
      why=$(tail -n +"$((${STAGE_LOG_SKIP[$name]:-0} + 1))" "$LOGS/$name.out" 2>/dev/null | grep -m1 -o 'process rank [0-9]* .*' || true)
      [ -z "$why" ] || plog "$name: mpirun: $why"
      return 2
    elif { [ "$rc" -gt 128 ] || [ "$rc" -eq "$STAGE_EXIT_STOPPED" ]; } && [ "${STAGE_RESTARTS[$name]}" -lt "$MAX_RESTARTS" ]; then
      STAGE_RESTARTS[$name]=$((STAGE_RESTARTS[$name] + 1))
      if [ "$rc" -gt 128 ]; then
        plog "$name died of signal $((rc - 128)); starting it again (restart ${STAGE_RESTARTS[$name]} of at most $MAX_RESTARTS)"
      else
        plog "$name stopped before the end of its stream (status $rc); starting it again (restart ${STAGE_RESTARTS[$name]} of at most $MAX_RESTARTS)"
      fi
      eval "_launch $(printf '%q' "$name") ${STAGE_CMD[$name]}"
    elif [ "${STAGE_SERVICE[$name]}" = 1 ]; then
      plog "$name exited (status $rc) while the pipeline still needs it; see $LOGS/$name.out"
      return 1
    elif [ "$rc" -eq 0 ]; then
      plog "$name finished (its stream ended)"
      unset "want[$name]"
    elif [ "$rc" -eq "$STAGE_EXIT_STOPPED" ]; then
      plog "$name stopped before the end of its stream (status $rc) and has been restarted $MAX_RESTARTS times; giving up"
      return 1
    else
      plog "$name failed (status $rc): $(first_error "$LOGS/$name.out" "${STAGE_LOG_SKIP[$name]:-0}")"
      plog "last lines of $LOGS/$name.out:"
      tail -n 5 "$LOGS/$name.out" | sed 's/^/    /' >&2
      return 1
    fi
  done
  return 0
}

wait_for_file() {
  local path=$1 secs=$2 pat=${3:-} i
  for ((i = 0; i < secs * 20; i++)); do
    if [ -e "$path" ] && { [ -z "$pat" ] || grep -q -- "$pat" "$path" 2>/dev/null; }; then return 0; fi
    sleep 0.05
  done
  return 1
}

# wait_stage_file NAME PATH SECS [PAT]: as wait_for_file, for a file the stage NAME writes once it is up. A stage
# stopped during its start-up (a signal, exit 3) is started again as supervise would (up to $MAX_RESTARTS); one that
# fails otherwise makes it return 1 at once, naming the stage's error (a refusal is said when it happens, not after
# SECS); after SECS it returns 1 with "did not come up".
wait_stage_file() {
  local name=$1 path=$2 secs=$3 pat=${4:-} i rc
  for ((i = 0; i < secs * 20; i++)); do
    if [ -e "$path" ] && { [ -z "$pat" ] || grep -q -- "$pat" "$path" 2>/dev/null; }; then return 0; fi
    if ! _alive "$name"; then
      rc=0; wait "${STAGE_PID[$name]}" 2>/dev/null || rc=$?
      if { [ "$rc" -gt 128 ] || [ "$rc" -eq "$STAGE_EXIT_STOPPED" ]; } && [ "${STAGE_RESTARTS[$name]}" -lt "$MAX_RESTARTS" ]; then
        STAGE_RESTARTS[$name]=$((STAGE_RESTARTS[$name] + 1))
        plog "$name stopped during its start-up (status $rc); starting it again (restart ${STAGE_RESTARTS[$name]} of at most $MAX_RESTARTS)"
        eval "_launch $(printf '%q' "$name") ${STAGE_CMD[$name]}"
        continue
      fi
      STAGE_PID[$name]=""
      plog "$name exited during start-up (status $rc): $(first_error "$LOGS/$name.out" "${STAGE_LOG_SKIP[$name]:-0}")"
      return 1
    fi
    sleep 0.05
  done
  plog "$name did not come up within ${secs}s (no $path); see $LOGS/$name.out"
  return 1
}

# wait_ring_drained RUN RING SECS (needs DFLASH_BIN): the ring's producers have all drained and
# nothing is left in it.
wait_ring_drained() {
  local run=$1 ring=$2 secs=$3 i
  for ((i = 0; i < secs * 5; i++)); do
    # one snapshot: writing ready reading drained
    if [ "$("$DFLASH_BIN/dflash-shm" --run "$run" --status --timeout-ms 500 \
          --field "$ring.writing,$ring.ready,$ring.reading,$ring.drained" 2>/dev/null)" = "0 0 0 yes" ]; then return 0; fi
    sleep 0.2
  done
  return 1
}

# ---------------------------------------------------------------- the training chain
# run_train_chain: start the chain's services (chain_start_services: dflash-shm ($CMD_SHM) and
# dflash-metrics ($CMD_METRICS, once)), the trainer ($CMD_TRAIN, always with --resume) and then the
# producers through `start_feeders SEQ` (names in $FEEDERS), rewound to the seq the trainer asks for;
# supervise until the trainer exits 0. When the trainer dies (signal, exit 3), the items already in
# the rings are past its checkpoint, so the whole chain restarts (chain_stop: producers stopped,
# `dflash-shm --shutdown`, so the next round has fresh, empty rings), trainer resumed from its newest
# checkpoint, producers rewound to its seq. At most $MAX_RESTARTS such restarts. Returns 0 when the
# trainer finished (the chain is then stopped), 1 on failure.
# The three hooks (chain_start_services, start_feeders, chain_stop) are this host's chain by default;
# pipelines/slurm-train.sh redefines them to drive one chain per host (issue 29, topology (c)).
TRAIN_NEXT_SEQ=""
# train_next_seq SECS: the seq the starting trainer needs, from state/train.json. The trainer decides it at start-up
# (newest VALID checkpoint) and writes the file before it takes an item; run_train_chain removes the previous run's
# file before starting it, so the file's existence is the handshake, and dflash-train --print-next-seq reads it.
train_next_seq() {
  local secs=$1 i dead
  for ((i = 0; i < secs * 10; i++)); do
    dead=0; _alive dflash-train || dead=1   # before looking: a trainer that wrote the file and exited at once is read
    if [ -e "$RUN/state/train.json" ]; then
      TRAIN_NEXT_SEQ=$("$DFLASH_BIN/dflash-train" --run "$RUN" --print-next-seq 2>>"$LOGS/dflash-train.out") && return 0
      return 1
    fi
    [ "$dead" = 0 ] || return 1
    sleep 0.1
  done
  return 1
}

shutdown_rings() {
  "$DFLASH_BIN/dflash-shm" --run "$RUN" --shutdown >>"$LOGS/dflash-shm.out" 2>&1 || true
  stop_stage dflash-shm TERM 20
  # A dflash-shm that was signalled while the chain stopped (or that a restart had just replaced) leaves its
  # segments for a restart to adopt, items included; the next chain must start on empty rings (issue 24: it
  # adopted seqs past the trainer's and hspack waited for a seq stuck behind them), so what is left goes now.
  remove_run_segments "$RUN"
}

# chain_start_services: this host's dflash-shm (fresh rings) and, once, dflash-metrics. 0, or 1 (said why).
chain_start_services() {
  rm -f "$RUN/shm.json"
  start_stage --service dflash-shm "${CMD_SHM[@]}"
  wait_stage_file dflash-shm "$RUN/shm.json" 20 '"running"' || return 1
  start_metrics_once
}
start_metrics_once() {
  if [ -n "${CMD_METRICS+x}" ] && ! _alive dflash-metrics; then
    rm -f "$RUN/bus/metrics.sock"
    start_stage --service dflash-metrics "${CMD_METRICS[@]}"
    wait_stage_file dflash-metrics "$RUN/bus/metrics.sock" 20 || return 1
  fi
  return 0
}
# chain_stop: the producers stopped, the rings shut down and removed.
chain_stop() {
  local f
  for f in $FEEDERS; do stop_stage "$f" TERM 20; done
  shutdown_rings
}

run_train_chain() {
  local round=0 rc skip
  while :; do
    chain_start_services || return 1
    rm -f "$RUN/state/train.json"   # re-derived from the checkpoints by every start: the handshake (train_next_seq)
    start_stage --chain dflash-train "${CMD_TRAIN[@]}" --resume
    skip=${STAGE_LOG_SKIP[dflash-train]}
    rc=0
    if ! train_next_seq 120; then
      [ -z "${STAGE_PID[dflash-train]}" ] || wait "${STAGE_PID[dflash-train]}" 2>/dev/null || rc=$?
      STAGE_PID[dflash-train]=""
      if [ "$rc" -gt 128 ] || [ "$rc" -eq "$STAGE_EXIT_STOPPED" ]; then   # stopped while starting: as a death later
        plog "dflash-train stopped during its start-up (status $rc); the chain restarts"
        rc=2
      else
        plog "dflash-train did not start (status $rc): $(first_error "$LOGS/dflash-train.out" "$skip")"
        plog "last lines of $LOGS/dflash-train.out:"
        tail -n +"$((skip + 1))" "$LOGS/dflash-train.out" | tail -n 5 | sed 's/^/    /' >&2
        return 1
      fi
    else
      plog "dflash-train needs batch seq $TRAIN_NEXT_SEQ next: the producers start there"
      start_feeders "$TRAIN_NEXT_SEQ"
      supervise dflash-train || rc=$?
    fi
    if [ "$rc" = 0 ]; then break; fi
    if [ "$rc" != 2 ]; then return 1; fi
    round=$((round + 1))
    if [ "$round" -gt "$MAX_RESTARTS" ]; then plog "dflash-train stopped $round times; giving up"; return 1; fi
    plog "restarting the chain (restart $round of at most $MAX_RESTARTS): the rings are emptied, the trainer resumes from its checkpoint"
    chain_stop
  done
  chain_stop
  return 0
}

# plan_get KEY: one value of $RUN/plan.json (dflash-plan --get), or exit 1.
plan_get() { "$DFLASH_BIN/dflash-plan" --run "$RUN" --get "$1" || pdie "dflash-plan --get $1 of $RUN failed"; }

# chain_commands: the commands of the chain in $RUN from its plan (each stage started with --run $RUN alone):
# CMD_SHM, CMD_METRICS, CMD_PACK, CMD_TARGET, CMD_HSPACK; TARGETS (dflash-target, or with the plan's
# target_replicas R > 1 dflash-target.0 .. dflash-target.R-1: R processes sharing the batches ring, each
# supervised and restarted alone) and FEEDERS (the producers start_feeders starts).
chain_commands() {
  local D=$DFLASH_BIN replicas
  CMD_SHM=("$D/dflash-shm" --run "$RUN")
  CMD_METRICS=("$D/dflash-metrics" --run "$RUN" --plot-every-s 60 --csv-stage dflash-train)
  CMD_PACK=("$D/dflash-pack" --run "$RUN")
  CMD_TARGET=("$D/dflash-target" --run "$RUN")
  CMD_HSPACK=("$D/dflash-hspack" --run "$RUN")
  replicas=$(plan_get target_replicas)
  TARGETS=dflash-target
  if [ "$replicas" -gt 1 ]; then
    TARGETS=$(seq -f 'dflash-target.%g' 0 $((replicas - 1)) | tr '\n' ' ')
    [ "$replicas" -lt 4 ] || CMD_HSPACK+=(--window $((replicas + 1)))   # the reorder window holds what replicas run ahead
  fi
  FEEDERS="dflash-pack $TARGETS dflash-hspack"
}

# start_feeders SEQ: the producers of chain_commands (hspack, the target replicas, pack), rewound to batch SEQ.
start_feeders() {
  local t
  rewind_online_feeders "$1"
  start_stage dflash-hspack "${CMD_HSPACK[@]}"
  for t in $TARGETS; do start_stage "$t" "${CMD_TARGET[@]}"; done
  start_stage dflash-pack "${CMD_PACK[@]}" --resume-from-seq "$1"
}

# index_dataset DATA_IN MODEL: $RUN/data.idx, validated (token ids below the model's vocab_size) and indexed once
# (again when DATA_IN is newer); sets DATA.
index_dataset() {
  local in=$1 model=$2 vocab
  vocab=$(grep -o '"vocab_size": *[0-9]*' "$model/config.json" | head -n 1 | grep -o '[0-9]*$' || true)
  DATA=$RUN/data.idx
  if [ ! -e "$DATA" ] || [ "$in" -nt "$DATA" ]; then
    plog "validating and indexing $in${vocab:+ (token ids below vocab_size $vocab)}"
    # --vocab-size: an id outside the target's vocabulary is refused here, naming its dataset line
    "$DFLASH_BIN/dflash-pack" --data "$in" --index "$DATA.tmp" ${vocab:+--vocab-size "$vocab"} >"$LOGS/index.out" 2>&1 ||
      { rm -f "$DATA.tmp"; pdie "$(first_error "$LOGS/index.out")"; }
    mv "$DATA.tmp" "$DATA"
  fi
}

# mpirun_launch RANKS [MPIRUN FLAGS...]: MPI_LAUNCH=(mpirun -np RANKS ...) for dflash-train ranks (Open MPI: over-
# subscription allowed, no binding, root allowed, $MPIRUN_FLAGS added); NCCL_NVLS_ENABLE=0 for GPU ranks
# (gpu-machine.md: NVLink multicast stays off) is exported and forwarded.
mpirun_launch() {
  local n=$1; shift
  command -v mpirun >/dev/null 2>&1 || pdie "$n trainer ranks need mpirun (Open MPI; scripts/install-deps.sh installs it)"
  export NCCL_NVLS_ENABLE=0
  MPI_LAUNCH=(mpirun -np "$n" --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE "$@")
  [ "$(id -u)" != 0 ] || MPI_LAUNCH+=(--allow-run-as-root)
  # shellcheck disable=SC2206
  MPI_LAUNCH+=(${MPIRUN_FLAGS:-})
}

# write_state FILE TEXT: a stage's state file, atomically (the producers' rewind points): a fresh temporary of
# mktemp (O_EXCL, 0600; never a planted name), then rename.
write_state() {
  local tmp
  tmp=$(mktemp "$1.XXXXXX") || pdie "cannot create a temporary file beside $1"
  printf '%s\n' "$2" >"$tmp" && mv -f -T "$tmp" "$1"
}

# rewind_online_feeders SEQ: where a chain of dflash-pack -> dflash-target -> dflash-hspack starts: at batch SEQ,
# whatever an earlier chain left (issue 24). The packer's saved cursor is removed, so --resume-from-seq SEQ seeks
# there (a cursor that was rewound to the same SEQ by an earlier chain would make it continue past SEQ, and
# hspack would wait for SEQ forever); hspack's next seq is set to SEQ by dflash-hspack --set-next, the one writer of
# its state file's format. Within the chain, a packer restarted alone continues from the cursor it writes from then on.
rewind_online_feeders() {
  rm -f "$RUN/state/pack.cursor"
  "$DFLASH_BIN/dflash-hspack" --run "$RUN" --set-next "$1" >>"$LOGS/dflash-hspack.out" 2>&1 ||
    pdie "dflash-hspack --set-next $1 failed: $(tail -n 1 "$LOGS/dflash-hspack.out")"
}

# ---------------------------------------------------------------- what every pipeline script does
# prepare_run_dir NAME: --fresh (FRESH=1) removal of a run directory this script made, the run
# directory, its lock, LOGS. Sets RUN to an absolute path.
prepare_run_dir() {
  local f p
  if [ "${FRESH:-0}" = 1 ] && [ -e "$RUN" ]; then
    [ -e "$RUN/run.json" ] || [ -z "$(ls -A "$RUN")" ] || pdie "--fresh: $RUN has no run.json; not deleting a directory this script did not make"
    if [ -d "$RUN/pids" ]; then
      for f in "$RUN"/pids/*.pid; do
        [ -e "$f" ] || continue
        p=$(cat "$f"); if kill -0 "$p" 2>/dev/null; then pdie "--fresh: a stage of $RUN still runs (pid $p, $f)"; fi
      done
    fi
    plog "--fresh: removing $RUN"
    rm -rf "$RUN"
  fi
  check_run_dir_private "$RUN"
  mkdir -p "$RUN/logs" "$RUN/state"
  RUN=$(cd "$RUN" && pwd)
  lock_run "$RUN"   # a second pipeline on this run directory stops here, naming the holder
  LOGS=$RUN/logs
}

# check_run_dir_private RUN: a run directory that exists must be the caller's and closed to group and other, and so
# must everything directly in it (another user could otherwise plant a symlink or append to a state file); an
# empty one of ours is closed (chmod 700) instead. One line and exit 1 otherwise. A new one is made 0700.
check_run_dir_private() {
  local run=$1 me bad mode
  me=$(id -u)
  if [ ! -e "$run" ]; then mkdir -p -m 700 "$run" || pdie "cannot create the run directory $run"; return 0; fi
  [ -d "$run" ] && [ ! -L "$run" ] || pdie "run directory $run is not a directory (or is a symbolic link); refusing it"
  [ "$(stat -c %u "$run")" = "$me" ] || pdie "run directory $run belongs to uid $(stat -c %u "$run"), not to this user (uid $me); refusing to use it"
  mode=$(stat -c %a "$run")
  if [ $((8#$mode & 8#077)) -ne 0 ]; then
    [ -z "$(ls -A "$run")" ] || pdie "run directory $run has mode $mode (open to group/other); refusing it: use a new --run, or chmod -R go-rwx it if nobody else wrote into it"
    chmod 700 "$run" || pdie "chmod 700 $run failed"
  fi
  bad=$(find "$run" -mindepth 1 -maxdepth 2 \( ! -user "$me" -o \( ! -type l -perm /022 \) \) -print -quit 2>/dev/null)
  [ -z "$bad" ] || pdie "run directory $run holds $bad, which belongs to another user or is writable by group/other; refusing it"
}

# A stage of an earlier attempt that still runs (its script was killed) would race with ours.
stop_leftover_stages() {
  local f p
  [ -d "$RUN/pids" ] || return 0
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
  remove_run_segments "$RUN"
}

# install_traps NAME: stop every stage (and remove the run's segments) on any exit of the script.
install_traps() {
  PIPELINE_NAME=$1
  on_signal() { plog "interrupted; stopping the pipeline"; exit 130; }
  on_exit() {
    local rc=$?
    trap - EXIT INT TERM
    stop_all
    if [ "$rc" -ne 0 ]; then plog "$PIPELINE_NAME failed (status $rc); logs in $LOGS; run the same command again to resume"; fi
    exit "$rc"
  }
  trap on_exit EXIT
  trap on_signal INT TERM
}

# write_run_json NAME EXTRA_JSON (STAGE ARRAY_NAME)...: what the pipeline was started with; sets ATTEMPT.
write_run_json() {
  local name=$1 extra=$2 stages="" sep="" st arr
  shift 2
  ATTEMPT=1
  [ ! -e "$RUN/run.json" ] || ATTEMPT=$(( $(grep -o '"attempt": [0-9]*' "$RUN/run.json" | grep -o '[0-9]*$' || echo 0) + 1 ))
  while [ $# -ge 2 ]; do
    st=$1; arr="$2[@]"; shift 2
    stages+="$sep    $(json_str "$st"): $(json_arr "${!arr}")"; sep=$',\n'
  done
  cat >"$RUN/run.json.tmp" <<EOT
{
  "kind": "run", "version": 1, "pipeline": $(json_str "$name"), "attempt": $ATTEMPT,
  "started": $(json_str "$(date -u +%Y-%m-%dT%H:%M:%SZ)"), "host": $(json_str "$(hostname)"),
  "device": $(json_str "$DEVICE"), $extra,
  "stages": {
$stages
  }
}
EOT
  mv "$RUN/run.json.tmp" "$RUN/run.json"
}

# finish_training_run MODEL PROMPTS TRAIN_SECONDS: after the trainer finished: the checker's verdict on
# both exports, τ on the held-out PROMPTS for every checkpoint and the z-lab export (DEMO_EVAL=0
# skips τ), the τ and per-stage plots, summary.txt (printed), DONE.
finish_training_run() {
  local model=$1 prompts=$2 train_s=$3 fmt verdict c step tau ztau="-" first last steps
  local -A V=()
  mkdir -p "$RUN/eval" "$RUN/plots"
  for fmt in zlab speculators; do
    if [ ! -d "$RUN/export/$fmt" ]; then V[$fmt]="missing"; continue; fi
    if "$DFLASH_BIN/dflash-export" --check "$RUN/export/$fmt" --target-model "$model" >"$LOGS/check-$fmt.out" 2>&1; then
      V[$fmt]="ok"
    else
      V[$fmt]="refused: $(grep -v '^$' "$LOGS/check-$fmt.out" | tail -n 1 | cut -c1-100)"
    fi
  done
  : >"$RUN/eval/tau.dat"
  if [ "${DEMO_EVAL:-1}" != 0 ] && [ -n "$prompts" ]; then
    # in step order: sort on the number after the last "step-" (the run path may hold '-' itself)
    for c in $(ls "$RUN"/checkpoints/step-*.ckpt 2>/dev/null | sed 's/.*step-\([0-9]*\)\.ckpt$/\1 &/' | sort -n | cut -d' ' -f2-); do
      step=${c##*/step-}; step=${step%.ckpt}
      "$DFLASH_BIN/dflash-eval" --target-model "$model" --ckpt "$c" --prompts "$prompts" --max-new 24 \
        --out "$RUN/eval/tau-step-$step.json" >>"$LOGS/dflash-eval.out" 2>&1 || pdie "dflash-eval of $c failed; see $LOGS/dflash-eval.out"
      tau=$(grep -o '"tau": *[0-9.eE+-]*' "$RUN/eval/tau-step-$step.json" | head -n 1 | grep -o '[0-9.eE+-]*$')
      printf '%s %.3f\n' "$step" "$tau" >>"$RUN/eval/tau.dat"
    done
    if [ -d "$RUN/export/zlab" ]; then
      "$DFLASH_BIN/dflash-eval" --target-model "$model" --drafter "$RUN/export/zlab" --prompts "$prompts" --max-new 24 \
        $( [ -s "$RUN/metrics.jsonl" ] && grep -q eal_marginal "$RUN/metrics.jsonl" && echo --train-metrics "$RUN/metrics.jsonl" ) --out "$RUN/eval/tau-export-zlab.json" >>"$LOGS/dflash-eval.out" 2>&1 ||
        pdie "dflash-eval of $RUN/export/zlab failed; see $LOGS/dflash-eval.out"
      ztau=$(grep -o '"tau": *[0-9.eE+-]*' "$RUN/eval/tau-export-zlab.json" | head -n 1 | grep -o '[0-9.eE+-]*$')
    fi
  fi
  plot_extra "$RUN"
  steps=$(grep -o '"step": *[0-9]*' "$RUN/state/train.json" 2>/dev/null | grep -o '[0-9]*$' || echo "?")
  first=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "loss") c = i; next } c && $c != "" { print $c; exit }' "$RUN/metrics.csv" 2>/dev/null || true)
  last=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "loss") c = i; next } c && $c != "" { v = $c } END { print v }' "$RUN/metrics.csv" 2>/dev/null || true)
  {
    printf '%-28s %s\n' "run" "$RUN"
    printf '%-28s %s\n' "device" "$DEVICE"
    printf '%-28s %s\n' "optimizer steps" "$steps"
    printf '%-28s %s s\n' "training wall time" "$train_s"
    printf '%-28s %s -> %s\n' "loss (first -> last step)" "${first:--}" "${last:--}"
    if [ -s "$RUN/eval/tau.dat" ]; then
      printf '%-28s %s\n' "tau by checkpoint (step tau)" "$(tr '\n' ' ' <"$RUN/eval/tau.dat")"
    fi
    printf '%-28s %s\n' "tau of export/zlab (bf16)" "$(if [ "$ztau" = - ]; then echo "- (not measured)"; else printf '%.3f' "$ztau"; fi)"
    printf '%-28s %s\n' "export/zlab --check" "${V[zlab]}"
    printf '%-28s %s\n' "export/speculators --check" "${V[speculators]}"
    printf '%-28s %s\n' "checkpoints" "$RUN/checkpoints"
    printf '%-28s %s\n' "exports" "$RUN/export/{zlab,speculators}"
    printf '%-28s %s\n' "plots" "$(cd "$RUN" && ls plots/*.png 2>/dev/null | tr '\n' ' ')"
    printf '%-28s %s\n' "metrics" "$RUN/metrics.jsonl, $RUN/metrics.csv"
  } >"$RUN/summary.txt.tmp"
  grep -h 'summary:' "$LOGS/dflash-metrics.log" 2>/dev/null | tail -n 12 | sed 's/^[^ ]* . /    /' >>"$RUN/summary.txt.tmp" || true
  mv "$RUN/summary.txt.tmp" "$RUN/summary.txt"
  printf '{"kind": "done", "version": 1, "steps": %s, "train_seconds": %s, "finished": %s}\n' "$steps" "$train_s" \
    "$(json_str "$(date -u +%Y-%m-%dT%H:%M:%SZ)")" >"$RUN/DONE.tmp"
  mv "$RUN/DONE.tmp" "$RUN/DONE"
  plog "done; summary ($RUN/summary.txt):"
  cat "$RUN/summary.txt" >&2
}

# plot_extra RUN: plots/tau.png (τ by checkpoint step) and plots/stages.png (each stage's busy share
# of its wall time from metrics.jsonl), with gnuplot when present (dflash-metrics draws loss, EAL and
# tokens/s itself).
plot_extra() {
  local run=$1 term
  command -v gnuplot >/dev/null 2>&1 || { plog "gnuplot not found: no τ/stage plots (scripts/install-deps.sh installs it)"; return 0; }
  term="if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 1000,540 } else { set terminal png size 1000,540 }"
  if [ -s "$run/eval/tau.dat" ]; then
    gnuplot -e "$term; set output '$run/plots/tau.png.tmp'; set title 'tau on held-out prompts'; set xlabel 'step'; set ylabel 'tau'; set grid; plot '$run/eval/tau.dat' using 1:2 with linespoints title 'tau'" \
      2>>"$LOGS/gnuplot.out" && mv "$run/plots/tau.png.tmp" "$run/plots/tau.png" || plog "gnuplot failed on tau.png; see $LOGS/gnuplot.out"
  fi
  stage_busy "$run" >"$run/plots/stages.dat" 2>/dev/null || true
  if [ -s "$run/plots/stages.dat" ]; then
    gnuplot -e "$term; set output '$run/plots/stages.png.tmp'; set title 'per-stage busy / wait share of wall time'; set style data histograms; set style histogram rowstacked; set style fill solid 0.8; set yrange [0:1]; set ylabel 'share'; set key outside; set boxwidth 0.6; plot '$run/plots/stages.dat' using 2:xtic(1) title 'busy', '' using 3 title 'wait'" \
      2>>"$LOGS/gnuplot.out" && mv "$run/plots/stages.png.tmp" "$run/plots/stages.png" || plog "gnuplot failed on stages.png; see $LOGS/gnuplot.out"
  fi
}

# stage_busy RUN: "stage busy_share wait_share" per stage, from each stage's last summary (or
# heartbeat) record in RUN/metrics.jsonl.
stage_busy() {
  awk '
    /"kind":"(summary|heartbeat)"/ {
      st = $0; sub(/.*"stage":"/, "", st); sub(/".*/, "", st)
      b = $0; if (!sub(/.*"busy_s":/, "", b)) next; sub(/[,}].*/, "", b)
      w = $0; if (!sub(/.*"wait_s":/, "", w)) next; sub(/[,}].*/, "", w)
      if (!(st in busy)) order[n++] = st
      busy[st] = b; wait[st] = w
    }
    END { for (i = 0; i < n; i++) { s = order[i]; t = busy[s] + wait[s]; if (t > 0) printf "%s %.4f %.4f\n", s, busy[s] / t, wait[s] / t } }
  ' "$1/metrics.jsonl"
}

# first_error FILE [SKIP]: a stage log's first error line after its first SKIP lines (this attempt's) without its
# timestamp/level/pid prefix (or its last line).
first_error() {
  local l skip=${2:-0}
  l=$(tail -n +"$((skip + 1))" "$1" 2>/dev/null | grep -m1 ' [EF] dflash-[a-z]*\[[0-9]*\] ' | sed 's/^.* [EF] dflash-[a-z]*\[[0-9]*\] //') || true
  [ -n "$l" ] || l=$(tail -n +"$((skip + 1))" "$1" 2>/dev/null | tail -n 1)
  printf '%s' "$l"
}

# need_bins BIN...: set DFLASH_BIN (default $BUILD/bin, exported) and die with one line when a binary is missing.
need_bins() {
  DFLASH_BIN=${DFLASH_BIN:-$(cd "${BUILD:-build}/bin" 2>/dev/null && pwd)} || pdie "no ${BUILD:-build}/bin: build first (make BUILD=${BUILD:-build})"
  export DFLASH_BIN
  local b
  for b in "$@"; do
    [ -x "$DFLASH_BIN/$b" ] || pdie "$DFLASH_BIN/$b is missing: build first (make BUILD=${BUILD:-build})"
  done
}

# check_model_config MODEL DEVICE: the target's config.json parsed as the stages parse it (dflash-target
# --print-ring-spec), or exit 1 with its sentence (issue 24: a config.json that is not JSON showed as "no
# hidden_size").
check_model_config() {
  local out
  out=$("$DFLASH_BIN/dflash-target" --model "$1" --tokens 16 --device "$2" --print-ring-spec 2>&1 >/dev/null) ||
    pdie "$(printf '%s\n' "$out" | grep -m1 ' [EF] dflash-[a-z]*\[[0-9]*\] ' | sed 's/^.* [EF] dflash-[a-z]*\[[0-9]*\] //' || echo "$1: dflash-target cannot read this model")"
}
