"""`python -m benchmarks transports [--orders N] [--rounds R] [--json]`: the demo on both Service Bus transports, side
by side in one run: the embedded client, and the real azure-servicebus SDK over the AMQP endpoint.

Each round runs `python -m devhost demo --transport T --orders N --json` once per transport, alternating (a ratio holds
on a noisy machine), and keeps the demo's own figures (orders/s, p50/p99 latency, lost, duplicates) and the CPU of the
whole run (the demo and every process it started, start-up included: `RUSAGE_CHILDREN` after it exits). Writes
benchmarks/results/transports.json; prints a table of the medians; with --json the last line is the result document.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
from typing import Any

from .common import RESULTS_DIR, ROOT, python, write_result

TRANSPORTS = ("embedded", "amqp")
FIGURES = ("orders_per_s", "p50_ms", "p99_ms", "cpu_s", "cpu_ms_per_order")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def demo_once(transport: str, orders: int, seed: int, timeout: float) -> dict[str, Any]:
    """One demo run on `transport`: its summary figures and the CPU seconds of its whole process tree."""
    before = _children_cpu_s()
    argv = [python(), "-m", "devhost", "demo", "--transport", transport, "--orders", str(orders)]
    argv += ["--seed", str(seed), "--timeout", str(timeout), "--json"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout + 120, check=False)
    cpu_s = _children_cpu_s() - before
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"demo --transport {transport} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads(lines[-1])
    return {
        "orders_per_s": summary["orders_per_s"],
        "p50_ms": summary["latency_ms"]["p50"],
        "p99_ms": summary["latency_ms"]["p99"],
        "lost": summary["lost"],
        "duplicate_side_effects": summary["duplicate_side_effects"],
        "finished": summary["processed"] + summary["error"] + summary["compensated"] + summary["compensation_failed"],
        "submitted": summary["submitted"],
        "cpu_s": round(cpu_s, 2),
        "cpu_ms_per_order": round(cpu_s * 1000 / orders, 1),
    }


def run(orders: int, rounds: int, seed: int, timeout: float) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in TRANSPORTS}
    for index in range(rounds):
        for transport in TRANSPORTS if index % 2 == 0 else tuple(reversed(TRANSPORTS)):
            print(f"round {index + 1}/{rounds}: demo --transport {transport}", file=sys.stderr, flush=True)
            runs[transport].append(demo_once(transport, orders, seed, timeout))
    medians = {t: {f: round(statistics.median(r[f] for r in runs[t]), 2) for f in FIGURES} for t in TRANSPORTS}
    ratio = {
        f: round(medians["amqp"][f] / medians["embedded"][f], 2) if medians["embedded"][f] else None for f in FIGURES
    }
    return {"runs": runs, "median": medians, "amqp_over_embedded": ratio}


def table(results: dict[str, Any]) -> str:
    rows = ["| figure (median) | embedded client | azure-servicebus over AMQP | AMQP / embedded |", "|---|---|---|---|"]
    for figure in FIGURES:
        m = results["median"]
        rows.append(
            f"| {figure} | {m['embedded'][figure]} | {m['amqp'][figure]} | {results['amqp_over_embedded'][figure]} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks transports", description=__doc__.splitlines()[0])
    p.add_argument("--orders", type=int, default=50, help="orders per demo run (default 50)")
    p.add_argument("--rounds", type=int, default=2, help="runs per transport, alternating (default 2)")
    p.add_argument("--seed", type=int, default=1, help="the demo's seed (default 1)")
    p.add_argument("--timeout", type=float, default=300.0, help="each demo run's --timeout (default 300)")
    p.add_argument("--json", action="store_true", help="print the result document as the last line")
    args = p.parse_args(argv)
    results = run(args.orders, args.rounds, args.seed, args.timeout)
    params = {"orders": args.orders, "rounds": args.rounds, "seed": args.seed}
    path = write_result("transports", results, quick=False, params=params, out_dir=RESULTS_DIR)
    print(table(results))
    print(f"wrote {path}")
    if args.json:
        print(json.dumps(results))
    failed = [r for t in TRANSPORTS for r in results["runs"][t] if r["lost"] or r["finished"] != r["submitted"]]
    return 1 if failed else 0
