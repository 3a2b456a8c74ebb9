"""`python -m benchmarks compare [--quick] [--json]`: our pipeline against a peer, DBOS Transact on SQLite, on the same
order workflow (three remote calls to the same simulator over HTTP, a state write after each, a fenced final update).

Rounds alternate ours and the peer (benchmarks/compare_ours.py, benchmarks/compare_peer.py), each a fresh system, a
warm-up, then the workloads `burst`, `sequential` and `rate`, bare; the per-order counts come from one counted round
per system at the end (strace and benchmarks/compare_shim/sitecustomize.py). benchmarks/README.md (section compare)
says how each figure is counted; docs/modules-host.md describes the rounds and workloads. The peer runs at its best by
default: `DBOS.start_workflow` with at most 50 in flight, no queue polling (`--peer-mode queue` is the option), on our
SQLite settings (WAL, synchronous NORMAL); the headline (`headline`) names its mode. Writes results/compare.json
(compare.quick.json with --quick) and the plots compare-*.png; with --json the last line is the result document.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import compare_counts as counts
from . import compare_peer as peer_module
from ._compare_headline import headline, p50, peer_setup, ratio
from ._compare_systems import (
    STRACE_USABLE,
    SYSTEMS,
    Instrument,
    Options,
    OurSystem,
    PeerSystem,
    cpu_seconds,
)
from .common import RESULTS_DIR, ROOT, environment, percentile
from .compare_proto import SEED

DEPENDENCIES = ("dbos", "matplotlib")
INSTALL_HINT = (
    "`make bench-deps` (`make bench` runs it) or `.venv/bin/pip install -r requirements-bench.txt -c constraints.txt`"
)


@dataclass(frozen=True)
class Plan:
    burst_sizes: tuple[int, ...]
    reps: int  # rounds per burst size and per system (alternating)
    sequential: int  # orders for the single-order latency
    rate_fractions: tuple[float, ...]  # offered rates, as fractions of our best burst orders/s
    rate_seconds: float
    warmup: int = 3

    def as_dict(self) -> dict[str, Any]:
        return {
            "burst_sizes": list(self.burst_sizes),
            "reps": self.reps,
            "sequential_orders": self.sequential,
            "rate_fractions_of_our_max": list(self.rate_fractions),
            "rate_seconds": self.rate_seconds,
            "warmup_orders": self.warmup,
        }


QUICK = Plan(burst_sizes=(10, 30), reps=1, sequential=12, rate_fractions=(0.25, 0.5, 0.75), rate_seconds=6.0)
FULL = Plan(
    burst_sizes=(10, 50, 100, 200, 400), reps=2, sequential=60, rate_fractions=(0.25, 0.5, 0.75, 0.9), rate_seconds=30.0
)
HEADLINE_FRACTION = 0.5  # the fixed offered rate of the headline: half our measured maximum


# --- rounds ------------------------------------------------------------------------------------------------------
@dataclass
class Snapshot:
    wall: float
    cpu: dict[str, float]
    dumps: dict[str, dict[str, Any]]


@dataclass
class Phase:
    system: str
    workload: dict[str, Any]
    answer: dict[str, Any]
    before: Snapshot
    after: Snapshot
    fsyncs: Counter[str] | None = None
    fsync_seconds: float = 0.0
    stores: dict[str, Any] = field(default_factory=dict)
    counted: bool = False
    sqlite: dict[str, dict[str, str]] = field(default_factory=dict)  # per database: journal mode, synchronous


def snapshot(system: OurSystem | PeerSystem) -> Snapshot:
    return Snapshot(
        time.time(), {role: cpu_seconds(pid) for role, pid in system.pids.items()}, system.instrument.dumps(system.pids)
    )


def settle(system: OurSystem | PeerSystem, prefix: str, timeout: float = 60.0) -> None:
    """Wait until the orders' workflows have finished in the store (the client saw their terminal status a little
    before: the rest of the work of those orders belongs to them too), then a short quiet moment."""
    deadline = time.monotonic() + timeout
    while system.unfinished(prefix) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)


def run_round(
    kind: str,
    work: Path,
    index: int,
    workloads: list[dict[str, Any]],
    plan: Plan,
    options: Options,
    log: Any,
    counted: bool = False,
) -> list[Phase]:
    """One round: a fresh system of `kind`, the warm-up, then each workload between two snapshots. A `counted`
    round runs its processes under strace and with the counting shim; the others run bare."""
    round_dir = work / f"{index:02d}-{kind}{'-counted' if counted else ''}"
    round_dir.mkdir(parents=True)
    instrument = Instrument(round_dir, counted)
    system = SYSTEMS[kind](round_dir, instrument, options)
    phases: list[Phase] = []
    started = time.monotonic()
    try:
        system.start()
        assert system.driver is not None
        system.driver.call({"cmd": "sequential", "prefix": f"r{index}w", "n": plan.warmup}, 300)
        settle(system, f"r{index}w")
        for workload in workloads:
            before = snapshot(system)
            answer = system.driver.call(workload, 900 + 2 * int(workload.get("n", 0)))
            settle(system, workload["prefix"])
            phases.append(Phase(kind, workload, answer, before, snapshot(system), counted=counted))
    finally:
        system.stop()
    for phase in phases:  # after the stop: strace has written everything, the stores are closed
        if instrument.enabled:
            phase.fsyncs, phase.fsync_seconds = counts.fsyncs(
                instrument.strace_logs(), phase.before.wall, phase.after.wall
            )
        phase.stores = system.store_counts(phase.workload["prefix"])
        phase.sqlite = system.sqlite_settings
    took = time.monotonic() - started
    label = f"{kind} (counted)" if counted else kind
    log(f"   round {index:2d} {label:15s}: {', '.join(_describe(p) for p in phases)} ({took:.0f} s)")
    return phases


def _describe(phase: Phase) -> str:
    w, a = phase.workload, phase.answer
    lat = sorted(a["latencies_s"])
    p50 = f"p50 {percentile(lat, 0.5) * 1000:.0f} ms"
    if a["terminal"] < a["submitted"]:
        p50 += f" (ONLY {a['terminal']} OF {a['submitted']} TERMINAL)"
    if w["cmd"] == "burst":
        return f"burst {w['n']}: {orders_per_s(phase):.1f} orders/s, {p50}"
    if w["cmd"] == "rate":
        return f"rate {w['rate']:.1f}/s: {p50}"
    return f"sequential {w['n']}: {p50}"


# --- figures -----------------------------------------------------------------------------------------------------
def orders_per_s(phase: Phase) -> float:
    span = phase.answer["first_submit_to_last_terminal_s"]
    return phase.answer["terminal"] / span if span > 0 else 0.0


def latency_ms(latencies_s: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in latencies_s]
    return {
        "n": len(ms),
        "p50": round(percentile(ms, 0.5), 1),
        "p99": round(percentile(ms, 0.99), 1),
        "max": round(max(ms), 1) if ms else 0.0,
    }


def per_order(phase: Phase) -> dict[str, Any]:
    """What one order cost in `phase`: CPU per process, and the counts (None where not counted or not applicable)."""
    n = max(1, phase.answer["terminal"])
    cpu = {role: (phase.after.cpu[role] - phase.before.cpu[role]) * 1000 / n for role in phase.after.cpu}
    out: dict[str, Any] = {
        "cpu_ms": round(sum(cpu.values()), 2),
        "cpu_ms_by_process": {k: round(v, 2) for k, v in sorted(cpu.items())},
    }
    sql: dict[str, dict[str, Any]] = {}
    bus: Counter[str] = Counter()
    for role, after in phase.after.dumps.items():
        for cls, entry in counts.sqlite_delta(phase.before.dumps[role], after).items():
            total = sql.setdefault(
                cls, {"commits": 0, "empty_commits": 0, "rollbacks": 0, "statements": 0, "writes_by_table": Counter()}
            )
            for key in ("commits", "empty_commits", "rollbacks", "statements"):
                total[key] += entry[key]
            total["writes_by_table"].update(entry["writes_by_table"])
        bus.update(counts.bus_delta(phase.before.dumps[role], after))
    own = {cls: e for cls, e in sql.items() if cls != "simulator"}
    counted = bool(phase.after.dumps)

    def each(value: float) -> float:
        return round(value / n, 2)

    out["sqlite_commits"] = each(sum(e["commits"] for e in own.values())) if counted else None
    out["sqlite_commits_by_db"] = {c: each(e["commits"]) for c, e in sorted(sql.items())} if counted else None
    out["sqlite_empty_commits"] = each(sum(e["empty_commits"] for e in own.values())) if counted else None
    out["sqlite_statements"] = each(sum(e["statements"] for e in own.values())) if counted else None
    if phase.fsyncs is not None:
        out["fsyncs"] = each(sum(v for c, v in phase.fsyncs.items() if c != "simulator"))
        out["fsyncs_by_db"] = {c: each(v) for c, v in sorted(phase.fsyncs.items())}
        out["fsync_wait_ms"] = each(phase.fsync_seconds * 1000)  # all processes, the simulator's included
    else:
        out["fsyncs"] = out["fsyncs_by_db"] = out["fsync_wait_ms"] = None
    writes = {c: {t: each(v) for t, v in sorted(e["writes_by_table"].items()) if v} for c, e in sorted(sql.items())}
    out["sqlite_writes_by_table"] = writes if counted else None
    if phase.system == "ours":
        durable = phase.stores["durable"]
        out["durable_instances"] = each(durable["instances"])  # attempts: one instance each
        out["durable_activities"] = each(durable["activities"])
        out["durable_episodes"] = each(durable["episodes"])
        out["durable_history_events"] = each(durable["history_events"])
        out["durable_history_events_by_type"] = {k: each(v) for k, v in durable["history_events_by_type"].items()}
        out["servicebus_operations"] = each(counts.bus_operations(bus)) if counted else None
        out["servicebus_by_operation"] = {k: each(v) for k, v in sorted(bus.items())} if counted else None
        store = sql.get("store", {}).get("writes_by_table", {})
        for table, key in counts.STORE_TABLES.items():
            out[f"{key}_writes"] = each(store.get(table, 0)) if counted else None
    else:
        dbos = phase.stores["dbos"]
        # DBOS's checkpointed units of work stand where the Durable activities do: its steps and transactions, each
        # one row of operation_outputs.
        out["durable_activities"] = each(dbos["checkpoints"])
        out["durable_episodes"] = None  # DBOS runs the workflow function once: no replay, no episodes
        out["durable_history_events"] = None
        out["dbos_checkpoints_by_function"] = {k: each(v) for k, v in dbos["checkpoints_by_function"].items()}
        out["servicebus_operations"] = None
        app = sql.get("dbos_app", {}).get("writes_by_table", {})
        out["state_store_writes"] = each(app.get("order_state", 0)) if counted else None
        out["orders_db_writes"] = None
    return out


def _attempts(phase: Phase) -> float:
    stores = phase.stores.get("durable") or phase.stores.get("dbos") or {}
    return (stores.get("instances") or stores.get("workflows") or 0) / max(1, phase.answer["terminal"])


def summarize(phases: list[Phase], plan: Plan, rates: dict[float, float]) -> dict[str, Any]:
    """Figures of each system: medians over the reps of each burst size, the headline at the largest size."""
    out: dict[str, Any] = {}
    for kind in SYSTEMS:
        mine = [p for p in phases if p.system == kind and not p.counted]
        counted = next((p for p in phases if p.system == kind and p.counted), None)
        bursts = []
        for size in plan.burst_sizes:
            runs = [p for p in mine if p.workload["cmd"] == "burst" and p.workload["n"] == size]
            if not runs:
                continue
            costs = [per_order(p) for p in runs]
            bursts.append(
                {
                    "orders": size,
                    "reps": len(runs),
                    "orders_per_s": round(statistics.median(orders_per_s(p) for p in runs), 2),
                    "orders_per_s_each": [round(orders_per_s(p), 2) for p in runs],
                    "cpu_ms_per_order": round(statistics.median(c["cpu_ms"] for c in costs), 2),
                    "latency_ms": latency_ms([x for p in runs for x in p.answer["latencies_s"]]),
                    "incomplete": sum(p.answer["submitted"] - p.answer["terminal"] for p in runs),
                    "outcomes": dict(sum((Counter(p.answer["outcomes"]) for p in runs), Counter())),
                    # Durable instances (ours) or DBOS workflows per order: above 1 when orders needed another attempt.
                    "attempts_per_order": round(statistics.median(_attempts(p) for p in runs), 3),
                    "cpu_ms_by_process": {
                        role: round(statistics.median(c["cpu_ms_by_process"][role] for c in costs), 2)
                        for role in costs[0]["cpu_ms_by_process"]
                    },
                }
            )
        sequential = [p for p in mine if p.workload["cmd"] == "sequential"]
        rate_runs = []
        for fraction, rate in sorted(rates.items()):
            runs = [p for p in mine if p.workload["cmd"] == "rate" and p.workload["fraction"] == fraction]
            if runs:
                rate_runs.append(
                    {
                        "fraction_of_our_max": fraction,
                        "offered_per_s": round(rate, 2),
                        "latency_ms": latency_ms([x for p in runs for x in p.answer["latencies_s"]]),
                        "cpu_ms_per_order": round(statistics.median(per_order(p)["cpu_ms"] for p in runs), 2),
                        "max_submit_lag_s": max(p.answer["submit_lag_s"] for p in runs),
                        "incomplete": sum(p.answer["submitted"] - p.answer["terminal"] for p in runs),
                    }
                )
        top = bursts[-1] if bursts else {}
        headline_rate = next((r for r in rate_runs if r["fraction_of_our_max"] == HEADLINE_FRACTION), None)
        out[kind] = {
            "orders_per_s": top.get("orders_per_s"),
            "orders_per_s_at": top.get("orders"),
            "max_orders_per_s": max((b["orders_per_s"] for b in bursts), default=None),
            "cpu_ms_per_order": top.get("cpu_ms_per_order"),
            "single_order_latency_ms": latency_ms([x for p in sequential for x in p.answer["latencies_s"]])
            if sequential
            else None,
            "latency_at_half_our_max_ms": headline_rate,
            "cpu_ms_per_order_by_process": top.get("cpu_ms_by_process"),
            # Counts from the counted round (the largest burst again, under strace and the shim); its own speed shows
            # what the instrumentation costs.
            "per_order": {k: v for k, v in per_order(counted).items() if not k.startswith("cpu_ms")}
            if counted
            else None,
            "counted_round": {
                "orders": counted.workload["n"],
                "orders_per_s": round(orders_per_s(counted), 2),
                "cpu_ms_per_order": per_order(counted)["cpu_ms"],
            }
            if counted
            else None,
            "bursts": bursts,
            "rates": rate_runs,
        }
    ours, peer = out["ours"], out["peer"]
    out["ratio_orders_per_s_ours_over_peer"] = ratio(ours["orders_per_s"], peer["orders_per_s"])
    out["ratio_cpu_ms_per_order_ours_over_peer"] = ratio(ours["cpu_ms_per_order"], peer["cpu_ms_per_order"])
    out["ratio_single_order_p50_ours_over_peer"] = ratio(p50(ours), p50(peer))
    return out


def sqlite_settings(phases: list[Phase]) -> dict[str, Any]:
    """The SQLite settings each system ran with (ours as our code sets them, the peer's read back from its
    connections), and whether every database of the peer had ours."""
    out: dict[str, Any] = {}
    for kind in SYSTEMS:
        seen: dict[str, dict[str, str]] = {}
        for phase in phases:
            if phase.system == kind:
                seen.update(phase.sqlite)
        out[kind] = seen
    wanted = {tuple(sorted(v.items())) for v in out["ours"].values()}
    found = {tuple(sorted(v.items())) for v in out["peer"].values()}
    out["same"] = bool(found) and found == wanted
    return out


# --- the run -----------------------------------------------------------------------------------------------------
def missing_dependencies() -> list[str]:
    return [name for name in DEPENDENCIES if importlib.util.find_spec(name) is None]


# What a run measures: everything tracked or new in the work tree but the tests, the docs and the results.
_MEASURED = ["--", ".", ":(exclude)tests", ":(exclude)docs", ":(exclude)*.md", ":(exclude)benchmarks/results"]


def _git(*args: str) -> bytes:
    import subprocess

    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, timeout=60, check=False).stdout


def tree_fingerprint(base: str) -> str:
    """A hash of the measured code as it is in the work tree (its difference from commit `base`, and the new files):
    other people edit this work tree while a run goes on, and a run that straddles a change measures two versions.
    Commits that only move HEAD (the working files unchanged) and changes to tests or docs leave it alone."""
    import hashlib

    digest = hashlib.sha256(_git("diff", base, *_MEASURED))
    for name in sorted(_git("ls-files", "--others", "--exclude-standard", *_MEASURED).decode().splitlines()):
        digest.update(name.encode())
        try:
            digest.update((ROOT / name).read_bytes())
        except OSError:
            continue
    return f"{base}+{digest.hexdigest()[:12]}"


def run(plan: Plan, options: Options, quick: bool, log: Any) -> dict[str, Any]:
    base = _git("rev-parse", "--short", "HEAD").decode().strip()
    tree_at_start = tree_fingerprint(base)
    work = Path(tempfile.mkdtemp(prefix="bench-compare-")) if options.keep is None else options.keep
    work.mkdir(parents=True, exist_ok=True)
    phases: list[Phase] = []
    index = 0
    started = time.monotonic()
    failed = True
    try:
        for size in plan.burst_sizes:
            for rep in range(plan.reps):
                for kind in SYSTEMS:  # ours, peer, ours, peer …
                    index += 1
                    workload = {"cmd": "burst", "n": size, "prefix": f"r{index}b{size}x{rep}"}
                    phases += run_round(kind, work, index, [workload], plan, options, log)
        # Our maximum: the best burst size's median (as `max_orders_per_s`), not one lucky round.
        ours_best = max(
            statistics.median(orders_per_s(p) for p in phases if p.system == "ours" and p.workload["n"] == size)
            for size in plan.burst_sizes
        )
        rates = {f: f * ours_best for f in plan.rate_fractions}
        if HEADLINE_FRACTION not in rates:
            rates[HEADLINE_FRACTION] = HEADLINE_FRACTION * ours_best
        offered = ", ".join(f"{r:.2f}" for r in sorted(rates.values()))
        log(f"   our best burst: {ours_best:.2f} orders/s; offered rates (orders/s): {offered}")
        for _rep in range(plan.reps):
            for kind in SYSTEMS:
                index += 1
                workloads: list[dict[str, Any]] = [{"cmd": "sequential", "n": plan.sequential, "prefix": f"r{index}s"}]
                workloads += [
                    {
                        "cmd": "rate",
                        "rate": rate,
                        "duration_s": plan.rate_seconds,
                        "fraction": fraction,
                        "prefix": f"r{index}q{k}",
                    }
                    for k, (fraction, rate) in enumerate(sorted(rates.items()))
                ]
                phases += run_round(kind, work, index, workloads, plan, options, log)
        if options.count:  # the per-order counts: the largest burst again, under strace and the shim
            for kind in SYSTEMS:
                index += 1
                size = max(plan.burst_sizes)
                workload = {"cmd": "burst", "n": size, "prefix": f"r{index}c{size}"}
                phases += run_round(kind, work, index, [workload], plan, options, log, counted=True)
        failed = False
    finally:
        if failed:
            log(f"   compare stopped; the rounds' folders (logs, databases) are kept in {work}")
        elif options.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    settings = sqlite_settings(phases)
    if not settings["same"]:
        log(f"   WARNING: the SQLite settings differ: ours {settings['ours']}, the peer's {settings['peer']}")
    env = environment()
    tree_at_end = tree_fingerprint(base)
    if tree_at_end != tree_at_start:
        log(
            f"   WARNING: the measured code changed during the run ({tree_at_start} -> {tree_at_end}): rounds "
            "measured different versions"
        )
    document: dict[str, Any] = {
        "benchmark": "compare",
        "quick": quick,
        "environment": env,
        "commit": env["git_commit"][:7],
        "dirty": env["git_dirty"],
        "tree_at_start": tree_at_start,
        "tree_at_end": tree_at_end,
        "tree_changed": tree_at_end != tree_at_start,
        "parameters": {
            **plan.as_dict(),
            **options.as_dict(),
            "seed": SEED,
            "peer": f"dbos {_version('dbos')}, {options.peer_mode_label()}, {options.sqlite_label()}",
        },
        "peer_setup": peer_setup(options, settings),
        "sqlite_settings": settings,
        "run_seconds": round(time.monotonic() - started, 1),
        **summarize(phases, plan, rates),
    }
    document["headline"] = headline(document)
    return document


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks compare",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="small plan (under 5 minutes on 2 cores); compare.quick.json")
    p.add_argument("--json", action="store_true", help="print the result document as the last line")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="results folder (default benchmarks/results)")
    p.add_argument("--latency-ms", type=float, default=0.0, help="the simulator's mean remote latency (default 0)")
    defaults = Options()
    p.add_argument(
        "--peer-mode",
        choices=peer_module.MODES,
        default=defaults.peer_mode,
        help=f"start: DBOS.start_workflow with at most --peer-concurrency in flight, no queue polling (default "
        f"{defaults.peer_mode}); queue: a DBOS queue with worker_concurrency = --peer-concurrency, polled",
    )
    p.add_argument(
        "--peer-concurrency",
        type=int,
        default=defaults.peer_concurrency,
        help=f"DBOS workflows in flight at most (default {defaults.peer_concurrency})",
    )
    p.add_argument(
        "--peer-polling-interval",
        type=float,
        default=defaults.peer_polling_interval,
        help=f"queue mode: DBOS queue polling interval, seconds (default {defaults.peer_polling_interval:g}; "
        "DBOS's own default is 1)",
    )
    p.add_argument(
        "--peer-synchronous",
        choices=peer_module.SYNCHRONOUS,
        default=defaults.peer_synchronous,
        help=f"PRAGMA synchronous of the peer's databases (default {defaults.peer_synchronous}, as ours; "
        "default: DBOS's, i.e. SQLite's FULL); journal mode WAL either way",
    )
    p.add_argument("--no-count", action="store_true", help="no counting shim, no strace: timing only")
    p.add_argument(
        "--hosts",
        type=int,
        default=1,
        help="our devhost hosts on one task hub (default 1; 2 spreads the Durable work over both cores)",
    )
    p.add_argument("--keep", type=Path, default=None, help="keep the rounds' folders (logs, databases) here")
    p.add_argument("--bursts", default=None, help="burst sizes, comma-separated (overrides the plan's)")
    p.add_argument("--reps", type=int, default=None, help="rounds per burst size and system (overrides the plan's)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    missing = missing_dependencies()
    if missing:
        print(f"benchmarks compare needs {', '.join(missing)}: run {INSTALL_HINT}", file=sys.stderr)
        return 2
    plan = QUICK if args.quick else FULL
    if args.bursts:
        plan = Plan(
            tuple(int(x) for x in args.bursts.split(",")),
            plan.reps,
            plan.sequential,
            plan.rate_fractions,
            plan.rate_seconds,
            plan.warmup,
        )
    if args.reps:
        plan = Plan(plan.burst_sizes, args.reps, plan.sequential, plan.rate_fractions, plan.rate_seconds, plan.warmup)
    options = Options(
        latency_ms=args.latency_ms,
        peer_mode=args.peer_mode,
        peer_concurrency=args.peer_concurrency,
        peer_polling_interval=args.peer_polling_interval,
        peer_synchronous=args.peer_synchronous,
        count=not args.no_count,
        keep=args.keep,
        hosts=args.hosts,
    )
    if options.count:
        STRACE_USABLE[0] = counts.strace_usable()
        if not STRACE_USABLE[0]:
            print(
                "compare: strace is missing or may not trace here: fsyncs are not counted (apt-get install strace)",
                file=sys.stderr,
            )

    def log(message: str) -> None:
        print(message, file=sys.stderr if args.json else sys.stdout, flush=True)

    log(
        f"== compare{' (quick)' if args.quick else ''}: ours vs DBOS {_version('dbos')} "
        f"({options.peer_mode_label()}); {options.sqlite_label()}"
    )
    try:
        document = run(plan, options, args.quick, log)
    except (RuntimeError, OSError) as exc:
        print(f"compare failed: {exc}", file=sys.stderr)
        return 1
    from . import compare_plots

    document["plots"] = [
        str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)
        for p in compare_plots.plot(document, args.out, args.quick)
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"compare{'.quick' if args.quick else ''}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    log(f"   compare took {document['run_seconds']:.0f} s; wrote {path}")
    from . import report

    log(report.compare_table(document))
    log(f"\nHeadline: {document['headline']['text']}")
    if args.json:
        print(json.dumps(document), flush=True)
    return 0
