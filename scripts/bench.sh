#!/usr/bin/env bash
# Runs seawall's benchmark suite against its peers (crates/seawall-bench)
# and prints one table: scenario | threads | seawall (ns) | best peer
# (name, ns) | ratio seawall/best peer | target. The table is also written
# to $CARGO_TARGET_DIR/bench-table.md (target/bench-table.md by default).
#
# Usage: scripts/bench.sh [--no-overhead] [--quick] [criterion filter...]
#   --no-overhead  skip the core crate's own `overhead` bench
#   --quick        shorter measurements (noisier; for a smoke run)
#
# Times are criterion medians. With 2 threads, the time is per call per
# thread (each thread makes every call of the sample). The whole run takes
# about 6 minutes on 2 cores, plus the first build. Figures are only
# meaningful on an otherwise idle machine: the load average is printed at
# the start and at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

overhead=1
warm_up=0.5
measure=1.5
samples=40
filters=()
for arg in "$@"; do
    case "$arg" in
        --no-overhead) overhead=0 ;;
        --quick) warm_up=0.2; measure=0.5; samples=20 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) filters+=("$arg") ;;
    esac
done

target="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target"
target="$(cd "$target" && pwd)"  # benches run from their own package directory
criterion_args=(--warm-up-time "$warm_up" --measurement-time "$measure" --sample-size "$samples")
load() { cut -d' ' -f1-3 /proc/loadavg; }

load_start="$(load)"
echo "==> load average at start: $load_start"
echo "==> building the benchmarks"
cargo bench -p seawall-bench --no-run
if [ "$overhead" = 1 ]; then
    cargo bench -p seawall --bench overhead --no-run
fi

since="$(date +%s)"
echo "==> peers"
cargo bench -p seawall-bench --bench peers -- "${criterion_args[@]}" "${filters[@]}"
if [ "$overhead" = 1 ]; then
    echo "==> core overhead"
    cargo bench -p seawall --bench overhead -- "${criterion_args[@]}" "${filters[@]}"
fi
echo "==> memory"
memory_json="$target/bench-memory.json"
SEAWALL_BENCH_MEMORY_OUT="$memory_json" cargo bench -p seawall-bench --bench memory
load_end="$(load)"

cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//' || true)"
python3 scripts/bench_table.py "$target/criterion" "$memory_json" "$since" \
    "Benchmarks of $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores (${cpu:-unknown CPU}), $(rustc --version)." \
    "Load average (1, 5, 15 min): $load_start at the start, $load_end at the end. Times are criterion medians; with 2 threads, per call per thread." \
    > "$target/bench-table.md"
echo
cat "$target/bench-table.md"
echo
echo "(written to $target/bench-table.md)"
