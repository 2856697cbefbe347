#!/usr/bin/env bash
# scripts/run-tests.sh — run Check suites one after another, keep their summary lines, and fail
# if any failed. Each suite is a standalone binary; its full output goes to <build>/test-logs/.
#
#   scripts/run-tests.sh build/tests/test_a build/tests/test_b ...
set -uo pipefail
[ $# -gt 0 ] || { echo "run-tests: no test binaries given" >&2; exit 2; }
logdir="$(dirname "$1")/../test-logs"
mkdir -p "$logdir"
failed=()
passed=0
checks_ok=0
checks_bad=0
start=$(date +%s)
for t in "$@"; do
  name=$(basename "$t")
  t0=$(date +%s)
  "$t" >"$logdir/$name.log" 2>&1
  rc=$?
  t1=$(date +%s)
  # Check prints "NN%: Checks: X, Failures: Y, Errors: Z" per suite.
  summary=$(grep -E '^[0-9]+%: Checks:' "$logdir/$name.log" | tail -n 1)
  if [[ $summary =~ Checks:\ ([0-9]+),\ Failures:\ ([0-9]+),\ Errors:\ ([0-9]+) ]]; then
    bad=$((BASH_REMATCH[2] + BASH_REMATCH[3]))
    checks_ok=$((checks_ok + BASH_REMATCH[1] - bad))
    checks_bad=$((checks_bad + bad))
  elif [ $rc -ne 0 ]; then
    checks_bad=$((checks_bad + 1))   # a suite that died before its summary counts as one failure
  fi
  if [ $rc -eq 0 ]; then
    passed=$((passed + 1))
    printf '%-28s ok   %4ss  %s\n' "$name" $((t1 - t0)) "$summary"
  else
    failed+=("$name")
    printf '%-28s FAIL %4ss  %s (exit %d)\n' "$name" $((t1 - t0)) "$summary" $rc
    grep -E ':[EF]:|error|FAIL' "$logdir/$name.log" | head -n 20 | sed 's/^/    /'
  fi
done
echo "suites: ${passed} ok, ${#failed[@]} failing ($(( $(date +%s) - start ))s); logs in $logdir"
[ ${#failed[@]} -eq 0 ] || echo "failing suites: ${failed[*]}"
echo "checks: ${checks_ok} passed, ${checks_bad} failed"
[ ${#failed[@]} -eq 0 ]
