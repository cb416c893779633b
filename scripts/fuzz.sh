#!/usr/bin/env bash
# Runs every libFuzzer target of fuzz/ for a bounded time each, starting
# from its committed seed corpus (fuzz/corpus/TARGET), and prints per target
# the runs (executions), their rate, the inputs found that reach new code
# and the peak RSS. Any crash, failed assertion, leak of time (an input
# taking over 10 s) or memory (over 2 GB) fails the run, with the input
# saved under fuzz/artifacts/TARGET/ and shown in hex.
#
#   scripts/fuzz.sh                         # every target, FUZZ_SECONDS each
#   FUZZ_SECONDS=300 scripts/fuzz.sh cursor  # one target, longer
#   cargo fuzz run -s none cursor fuzz/artifacts/cursor/crash-…   # replay
#
# Builds on the stable toolchain: `-s none` (no sanitizer) needs no nightly
# flag; libFuzzer's own coverage instrumentation is stable rustc options.
# New inputs go to a scratch corpus, so the committed seeds stay as they are.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
export PATH="$HOME/.cargo/bin:$PATH"

SECONDS_EACH=${FUZZ_SECONDS:-25}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(ndjson ingest_body cursor envelope query)
# 16 codegen units: a build several times faster than cargo-fuzz's default
# of 1, for a small loss of speed per execution.
flags=(-s none --codegen-units 16)

command -v cargo-fuzz >/dev/null || { echo "cargo-fuzz is missing: scripts/install-tools.sh installs it" >&2; exit 1; }
cargo fuzz build "${flags[@]}"

scratch=$(mktemp -d /tmp/hindsight-fuzz.XXXXXX)
# Where targets keep files (ingest_body's event log): tmpfs when there is one.
shm=/dev/shm
[ -d "$shm" ] && [ -w "$shm" ] || shm=$scratch
HINDSIGHT_FUZZ_SCRATCH=$(mktemp -d "$shm/hindsight-fuzz.XXXXXX")
export HINDSIGHT_FUZZ_SCRATCH
trap 'rm -rf "$scratch" "$HINDSIGHT_FUZZ_SCRATCH"' EXIT
failed=()
for target in "${targets[@]}"; do
    mkdir -p "$scratch/$target" "artifacts/$target"
    log="$scratch/$target.log"
    if cargo fuzz run "${flags[@]}" "$target" "$scratch/$target" "corpus/$target" -- \
        -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$log" 2>&1; then
        status=ok
    else
        status=FAILED
        failed+=("$target")
    fi
    field() { awk -v k="stat::$1:" '$1 == k {print $2}' "$log"; }
    echo "fuzz $target: $status, $(field number_of_executed_units) runs in ${SECONDS_EACH} s" \
        "($(field average_exec_per_sec)/s), $(field new_units_added) new inputs," \
        "seeds $(find "corpus/$target" -type f | wc -l), peak RSS $(field peak_rss_mb) MB"
    if [ "$status" = FAILED ]; then
        # The failure (panic message, allocation failure, timeout) and
        # libFuzzer's summary, without the backtraces.
        sed -n -e '/panicked at/,/^stack backtrace/p' -e '/memory allocation of/p' \
            -e '/ERROR: libFuzzer/p' -e '/^SUMMARY/p' "$log" | grep -v '^stack backtrace' | head -30
        sed -n 's/.*Test unit written to \(\S*\).*/\1/p' "$log" | while read -r artifact; do
            echo "-- input $artifact (replay: cargo fuzz run -s none $target $artifact):"
            head -c 512 "$artifact" | od -An -c | head -20
        done
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzzing found failures in: ${failed[*]}"
    exit 1
fi
