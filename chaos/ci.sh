#!/usr/bin/env bash
# Run the chaos suite against real Redis containers: the replay of every
# model counterexample (and of random paths of the runs that hold) and the
# failover scenario, then print their summary lines.
#
# `.ci/run` runs the same tests as part of `cargo test --workspace`; this
# script runs the chaos crate alone. With CI set, a missing Docker or image
# fails the tests instead of skipping them.
set -euo pipefail
cd "$(dirname "$0")/.."

START=$(date +%s)
bash .ci/build-redis-image.sh
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
status=0
timeout 1800 cargo test -p lockwright-chaos -- --test-threads=1 --nocapture >"$LOG" 2>&1 || status=$?
grep -E '^(replay:|test result|failover)' "$LOG" || true
if [[ $status -ne 0 ]]; then
    tail -40 "$LOG"
fi
echo "chaos suite: $(( $(date +%s) - START )) s"
exit "$status"
