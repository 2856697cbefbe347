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
#                               $RUN/pids/NAME.pid; remembered so stop_all stops it
#   supervise NAME...           wait until every named stage ended (exit 0 = its stream ended).
#                               Any stage (services too) killed by a signal (a crash, kill -9) or
#                               stopped before the end of its stream (exit 3, STAGE_EXIT_STOPPED of
#                               stages/core/stage.h: SIGTERM/SIGINT mid-stream) is started again with
#                               the same command, up to $MAX_RESTARTS times per stage (design.md §8:
#                               the same command continues the run); any other non-zero exit, or a
#                               service stage (start_stage --service: dflash-shm, dflash-metrics)
#                               exiting at all, fails the run: supervise returns 1 after naming it.
#                               Deaths are found by polling every 0.1 s and collected with `wait PID`
#                               per stage, so several stages dying at once are each restarted.
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
declare -gA STAGE_PID=() STAGE_CMD=() STAGE_RESTARTS=() STAGE_SERVICE=()
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
  if ! flock -n "$RUN_LOCK_FD"; then
    holder=$(cat "$run/lock.owner" 2>/dev/null || echo "an unknown process")
    pdie "run directory $run is in use by another pipeline: $holder (wait for it, or stop it first)"
  fi
  printf 'pid %s (%s), started %s on %s\n' "$$" "${0##*/}" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(hostname)" >"$run/lock.owner"
}

_launch() {
  local name=$1; shift
  if [ -n "${RUN_LOCK_FD:-}" ]; then
    "$@" >>"$LOGS/$name.out" 2>&1 </dev/null {RUN_LOCK_FD}>&- &
  else
    "$@" >>"$LOGS/$name.out" 2>&1 </dev/null &
  fi
  STAGE_PID[$name]=$!
  mkdir -p "$RUN/pids"
  echo "${STAGE_PID[$name]}" >"$RUN/pids/$name.pid"
}

# start_stage [--service] NAME CMD...
start_stage() {
  local service=0
  if [ "$1" = --service ]; then service=1; shift; fi
  local name=$1; shift
  STAGE_CMD[$name]=$(printf '%q ' "$@")
  STAGE_RESTARTS[$name]=0
  STAGE_SERVICE[$name]=$service
  STAGE_ORDER+=("$name")
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
  local n rc pid name
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
    if { [ "$rc" -gt 128 ] || [ "$rc" -eq "$STAGE_EXIT_STOPPED" ]; } && [ "${STAGE_RESTARTS[$name]}" -lt "$MAX_RESTARTS" ]; then
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
      plog "$name failed (status $rc); last lines of $LOGS/$name.out:"
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
