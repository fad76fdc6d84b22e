#!/usr/bin/env bash
# Run the chaos suite against real Redis containers and print the combined
# results table (scenario | protocol | fault | expected by the model | observed).
#
# Meant to be called from .ci/run on the Docker machine:  bash chaos/ci.sh
# With CI set, a missing Docker or image fails the tests instead of skipping
# them. The suite must finish within 15 minutes (it takes about 2).
set -euo pipefail
cd "$(dirname "$0")/.."

START=$(date +%s)
bash .ci/build-redis-image.sh
# The scenarios start a few containers each; one test binary at a time keeps
# the two cores of the machine for the containers and the model checker.
timeout 900 cargo test -p lockwright-chaos -- --test-threads=1
timeout 60 cargo test -p lockwright-chaos --test results -- --nocapture 2>&1 \
    | sed -n '/^Chaos results/,/^test /p'
echo "chaos suite: $(( $(date +%s) - START )) s"
