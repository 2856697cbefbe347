#!/usr/bin/env bash
# scripts/restart-stage.sh — start one stage of a run again by hand, with the command line the
# pipeline recorded for it in RUN/run.json (or another program in its place), in its own session,
# output appended to RUN/logs/STAGE.out, pid in RUN/pids/STAGE.pid.
#
#   scripts/restart-stage.sh RUN STAGE [--program PATH]
#
# For a stage that died while its pipeline script was no longer supervising it (the script gave up
# after MAX_RESTARTS, or the stages were started by hand): the stage continues from its own state
# (the packer's cursor, hspack's next seq, the replayer's position), the rings keep their items and
# consumers drop seqs they already have. --program swaps the binary (a modified build) with the
# same arguments. Refuses a stage that still runs, and dflash-train (a trainer resumed alone would
# need seqs the rings no longer hold: run the pipeline's command again instead).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: restart-stage.sh RUN STAGE [--program PATH]" >&2; exit 2; }
RUN=$1 STAGE=$2 PROGRAM=""
shift 2
while [ $# -gt 0 ]; do
  case $1 in
    --program) PROGRAM=$2; shift 2 ;;
    *) echo "restart-stage.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -f "$RUN/run.json" ] || { echo "restart-stage.sh: $RUN/run.json: missing (not a pipeline run directory)" >&2; exit 1; }
[ "$STAGE" != dflash-train ] || { echo "restart-stage.sh: dflash-train is resumed by running the pipeline's command again (it restarts the chain from the trainer's seq)" >&2; exit 1; }
if [ -f "$RUN/pids/$STAGE.pid" ] && kill -0 "$(cat "$RUN/pids/$STAGE.pid")" 2>/dev/null; then
  echo "restart-stage.sh: $STAGE still runs (pid $(cat "$RUN/pids/$STAGE.pid"))" >&2; exit 1
fi
mapfile -d '' CMD < <(python3 - "$RUN/run.json" "$STAGE" <<'PY'
import json, sys
stages = json.load(open(sys.argv[1]))["stages"]
if sys.argv[2] not in stages:
    sys.exit("restart-stage.sh: %s: no stage '%s' (stages: %s)" % (sys.argv[1], sys.argv[2], ", ".join(stages)))
sys.stdout.write("\0".join(stages[sys.argv[2]]) + "\0")
PY
)
[ ${#CMD[@]} -gt 0 ] || exit 1
[ -z "$PROGRAM" ] || CMD[0]=$PROGRAM
mkdir -p "$RUN/logs" "$RUN/pids"
setsid "${CMD[@]}" >>"$RUN/logs/$STAGE.out" 2>&1 </dev/null &
echo $! >"$RUN/pids/$STAGE.pid"
echo "restart-stage.sh: started $STAGE (pid $!): ${CMD[*]}"
