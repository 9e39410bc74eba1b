#!/usr/bin/env bash
# Fuzz one target (or all five, splitting the time) for SECONDS:
#
#   bash fuzz/run.sh onnx 300
#   bash fuzz/run.sh all 1200
#
# Builds the fuzzer (release, with overflow checks), then runs it, restarting it whenever it
# dies (allocation over the limit, stack overflow, an input past the timeout): each restart
# saves the input the previous run died on into fuzz/artifacts/TARGET/. Panics are caught in
# process and saved there too. Executions per run are appended to fuzz/artifacts/stats.jsonl.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

target="${1:?usage: fuzz/run.sh onnx|plan|cluster|device|capi|export|all SECONDS}"
seconds="${2:?usage: fuzz/run.sh TARGET SECONDS}"
cargo build --release --quiet

if [ "$target" = all ]; then
    targets=(onnx plan cluster device capi export)
else
    targets=("$target")
fi
per_target=$(( seconds / ${#targets[@]} ))

for t in "${targets[@]}"; do
    end=$(( $(date +%s) + per_target ))
    while true; do
        left=$(( end - $(date +%s) ))
        [ "$left" -gt 0 ] || break
        # A virtual-memory cap, so that a runaway allocation fails instead of swapping.
        ( ulimit -v 8388608; exec ./target/release/pipecut-fuzz run "$t" "$left" ) \
            || echo "fuzz/run.sh: the $t fuzzer exited with $?; restarting (it saves the input)"
    done
    # A zero-second run only collects the input a last crash left behind.
    ./target/release/pipecut-fuzz run "$t" 0 > /dev/null
    ls fuzz/artifacts/"$t" 2>/dev/null | grep -v current.input || true
done
