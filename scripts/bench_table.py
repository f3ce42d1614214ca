#!/usr/bin/env python3
"""Summarises a run of seawall's benchmark suite as one markdown table.

Usage: bench_table.py CRITERION_DIR MEMORY_JSON SINCE_EPOCH [HEADER_LINE...]

Reads every criterion result written since SINCE_EPOCH
(CRITERION_DIR/**/new/benchmark.json + estimates.json, median point
estimate) and the figures of the memory benchmark (MEMORY_JSON, written by
`cargo bench -p seawall-bench --bench memory`), and prints one table:
scenario | threads | seawall | best peer | ratio seawall/best peer | target.

In the peer groups (crates/seawall-bench/benches/peers.rs) the contender
named `seawall` is seawall; every other contender is a peer. Groups of the
core crate's `overhead` bench have no peers.
"""

import json
import os
import sys
from collections import OrderedDict

# Scenario order of the table (groups not listed come after, sorted).
ORDER = [
    "retry, success (sync)",
    "retry, success (async)",
    "breaker closed, count window (sync)",
    "breaker closed, count window (async)",
    "breaker closed, consecutive failures (sync)",
    "breaker closed, consecutive failures (async)",
    "breaker open, rejecting (sync)",
    "breaker open, rejecting (async)",
    "rate limiter, GCRA (sync)",
    "rate limiter, GCRA (async)",
    "rate limiter, GCRA, one key of many (sync)",
    "rate limiter, fixed window (async)",
    "rate limiter, sliding window (async)",
    "bulkhead (sync)",
    "bulkhead (async)",
    "adaptive limit, aimd (sync)",
    "adaptive limit, aimd (async)",
    "adaptive limit, gradient2 (sync)",
    "adaptive limit, gradient2 (async)",
    "timeout (async)",
    "full chain (sync)",
    "full chain (async)",
]

# Groups of the core crate's own `overhead` bench.
OVERHEAD_GROUPS = {"sync", "async"}

# Groups that compare two configurations of seawall rather than seawall and
# its peers: group -> (subject, reference, target). The subject stands in
# the seawall column, the reference in the peer column; a target of
# "within 1 ns" is for configurations that must take the same path.
COMPARISONS = {
    "weighted GCRA admission vs unweighted (sync)": ("weight 4", "unweighted", None),
    "chaos disabled vs no chaos (sync)": ("chaos disabled", "no chaos", "within 1 ns"),
    "breaker in shadow mode vs enforcing, closed (sync)": ("shadow", "enforcing", "within 1 ns"),
    "breaker in shadow mode vs enforcing, open (sync)": (
        "shadow (admitted)",
        "enforcing (refused)",
        None,
    ),
    "GCRA in shadow mode vs enforcing, under the limit (sync)": (
        "shadow",
        "enforcing",
        "within 1 ns",
    ),
    "GCRA in shadow mode vs enforcing, over the limit (sync)": (
        "shadow (admitted)",
        "enforcing (refused)",
        None,
    ),
}


def load_criterion(root, since):
    """{group: {function: {threads: median_ns}}} for results newer than `since`."""
    results = OrderedDict()
    for dirpath, _dirs, files in os.walk(root):
        if os.path.basename(dirpath) != "new" or "benchmark.json" not in files:
            continue
        estimates = os.path.join(dirpath, "estimates.json")
        if not os.path.exists(estimates) or os.path.getmtime(estimates) < since:
            continue
        with open(os.path.join(dirpath, "benchmark.json")) as f:
            bench = json.load(f)
        with open(estimates) as f:
            median = json.load(f)["median"]["point_estimate"]
        group = bench["group_id"]
        function = bench.get("function_id") or ""
        value = bench.get("value_str") or "1"
        results.setdefault(group, {}).setdefault(function, {})[value] = median
    return results


def fmt_ns(ns):
    if ns is None:
        return "—"
    return f"{ns:.1f}" if ns < 100 else f"{ns:.0f}"


def fmt_value(value, unit):
    if value is None:
        return "—"
    if unit == "B":
        return f"{value:.0f} B"
    if 0 < value < 0.01:
        return f"{value:.5f} {unit}"
    return f"{value:.2f} {unit}".rstrip()


def mark(ok):
    return "met" if ok else "**missed**"


def time_target(scenario, threads, seawall, best, single):
    """The target of a timing row, with whether it is met."""
    notes = []
    if seawall is None:
        return ""
    if scenario == "full chain (async)":
        notes.append(f"< 80 ns: {mark(seawall < 80)}")
    elif scenario == "full chain (sync)":
        notes.append(f"< 60 ns: {mark(seawall < 60)}")
    elif scenario.startswith("breaker open"):
        notes.append(f"< 20 ns: {mark(seawall < 20)}")
    elif scenario.startswith("bulkhead") and best is not None:
        notes.append(f"≤ 1.5x tokio Semaphore: {mark(seawall <= 1.5 * best[1])}")
    elif best is not None:
        notes.append(f"≤ fastest peer: {mark(seawall <= best[1])}")
    if threads != "1" and single is not None:
        factor = seawall / single
        notes.append(f"≤ 2x 1 thread ({factor:.2f}x): {mark(factor <= 2.0)}")
    return "; ".join(notes)


def comparison_rows(group, functions):
    """Rows of a group of COMPARISONS: the subject against the reference."""
    subject, reference, target = COMPARISONS[group]
    ours, theirs = functions.get(subject, {}), functions.get(reference, {})
    rows = []
    for threads in sorted(set(ours) | set(theirs), key=int):
        a, b = ours.get(threads), theirs.get(threads)
        ratio = f"{a / b:.2f}" if a and b else "—"
        note = ""
        if target == "within 1 ns" and a is not None and b is not None:
            note = f"within 1 ns: {mark(a - b <= 1.0)} ({a - b:+.1f} ns)"
        rows.append(
            (f"{group}: {subject}", threads, fmt_ns(a), f"{reference}, {fmt_ns(b)}", ratio, note)
        )
    return rows


def timing_rows(results):
    rows = []
    groups = [g for g in ORDER if g in results]
    groups += sorted(g for g in results if g not in ORDER and g not in OVERHEAD_GROUPS)
    for group in groups:
        if group in COMPARISONS:
            rows += comparison_rows(group, results[group])
            continue
        functions = results[group]
        seawall = functions.get("seawall", {})
        thread_counts = sorted(
            {t for f in functions.values() for t in f}, key=lambda t: int(t)
        )
        for threads in thread_counts:
            ours = seawall.get(threads)
            peers = [
                (name, by_threads[threads])
                for name, by_threads in functions.items()
                if name != "seawall" and threads in by_threads
            ]
            if group.startswith("bulkhead"):
                # The bulkhead target is relative to the semaphore floor.
                floor = [p for p in peers if p[0] == "tokio Semaphore"]
                best = floor[0] if floor else None
                fastest = min(peers, key=lambda p: p[1]) if peers else None
            else:
                best = min(peers, key=lambda p: p[1]) if peers else None
                fastest = best
            ratio = f"{ours / fastest[1]:.2f}" if ours and fastest else "—"
            peer_cell = f"{fastest[0]}, {fmt_ns(fastest[1])}" if fastest else "—"
            target = time_target(group, threads, ours, best, seawall.get("1"))
            rows.append((group, threads, fmt_ns(ours), peer_cell, ratio, target))
    return rows


def overhead_rows(results):
    rows = []
    for group in ("sync", "async"):
        for function, by_threads in results.get(group, {}).items():
            for threads, ns in by_threads.items():
                rows.append(
                    (f"core overhead bench: {group}, {function}", threads, fmt_ns(ns), "—", "—", "")
                )
    return rows


def memory_rows(path):
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        figures = json.load(f)
    by_scenario = OrderedDict()
    for fig in figures:
        by_scenario.setdefault(fig["scenario"], []).append(fig)
    rows = []
    for scenario, figs in by_scenario.items():
        ours = next((f for f in figs if f["contender"] == "seawall"), None)
        peers = [f for f in figs if f["contender"] != "seawall"]
        best = min(peers, key=lambda f: f["value"]) if peers else None
        unit = ours["unit"] if ours else (best["unit"] if best else "")
        value = ours["value"] if ours else None
        if value is not None and best is not None and best["value"] > 0:
            ratio = f"{value / best['value']:.2f}"
        else:
            ratio = "—"
        peer_cell = (
            f"{best['contender']}, {fmt_value(best['value'], unit)}" if best else "—"
        )
        target = ""
        if value is not None:
            if scenario.startswith("allocations per call") and "open" not in scenario:
                target = f"0 on the success path: {mark(value == 0)}"
            elif "partition key" in scenario:
                target = f"< 200 B: {mark(value < 200)}"
        rows.append((scenario, "1", fmt_value(value, unit), peer_cell, ratio, target))
    return rows


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    root, memory, since = sys.argv[1], sys.argv[2], float(sys.argv[3])
    header = sys.argv[4:]
    results = load_criterion(root, since) if os.path.isdir(root) else {}
    rows = timing_rows(results) + overhead_rows(results) + memory_rows(memory)
    out = []
    for line in header:
        out.append(line)
        out.append("")
    out.append(
        "| scenario | threads | seawall (ns) | best peer (name, ns) "
        "| ratio seawall/best peer | target |"
    )
    out.append("| --- | ---: | ---: | --- | ---: | --- |")
    for row in rows:
        out.append("| " + " | ".join(row) + " |")
    print("\n".join(out))


if __name__ == "__main__":
    main()
