"""`python -m devhost drills [--quick]` (`make drills`, `make drills-quick`): every drill, one after another, each as
`python -m devhost drill NAME --json` in a process of its own on a fresh local system, then the report:
`<out>/reliability.json` (every verdict as the drill printed it, normalised) and `<out>/reliability.md` (a table:
drill, orders, lost, duplicates, stuck, the key figures, pass or fail). Generated, never edited by hand.

`--quick` runs the subset CI runs after the tests (QUICK: smaller runs, under 5 minutes together on 2 cores);
the full run uses each drill's defaults (FULL). `--only NAME --update` re-runs some drills and puts their verdicts into
the existing report in place, the others' kept; the header then names each such re-run (`merge`). The exit code is 1
when any drill failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .system import ROOT


@dataclass(frozen=True)
class Run:
    drill: str
    args: tuple[str, ...] = ()
    figures: tuple[str, ...] = ()  # the figures the report's table shows (dotted paths into the verdict's figures)
    label: str = ""  # the report's name for a second run of one drill (e.g. with --timing azure-storage)

    @property
    def name(self) -> str:
        return self.label or self.drill


BUS_OUTAGE_FIGURES = ("outage_s", "injected", "sdk_retries_by_kind", "time_to_drain_s", "attempts", "elapsed_s")
TENANT_FIGURES = ("claims", "flood_admitted", "flood_rejected", "hostile", "p50_vs_baseline", "elapsed_s")
RETENTION_FIGURES = ("expired", "purged", "kept", "unfinished", "index_stale", "alarms_fired", "elapsed_s")
# Every drill with its defaults (`make drills`); the figures each one's row shows.
FULL: tuple[Run, ...] = (
    Run("host-crash", ("--orders", "200", "--kills", "20"), ("kills_done", "settle_s", "max_attempt", "total_s")),
    Run("agent-crash", ("--orders", "400", "--kills", "20"), ("kills_done", "settle_s", "max_attempt", "total_s")),
    Run("retry-budget", (), ("most_calls_per_step", "budget", "elapsed_s")),
    Run(
        "remote-outage", (), ("time_to_open_s", "calls_while_open", "half_open_rounds", "time_to_drain_s", "elapsed_s")
    ),
    Run("backlog-flood", (), ("admitted", "rejected", "max_processing_seen", "max_pending_seen", "elapsed_s")),
    Run("compensation", (), ("elapsed_s",)),
    Run("cancel-in-flight", (), ("elapsed_s",)),
    Run("poison-in-session", (), ("elapsed_s",)),
    Run("upgrade-in-flight", (), ("elapsed_s",)),
    Run("remote-hang", (), ("elapsed_s",)),
    Run("late-replies", (), ("elapsed_s",)),
    Run("reply-reordering", (), ("elapsed_s",)),
    Run("clock-skew", (), ("elapsed_s",)),
    Run("duplicate-delivery", (), ("elapsed_s",)),
    Run("poison-input", (), ("elapsed_s",)),
    Run("state-store-conflicts", (), ("injected_412", "injected_429", "elapsed_s")),
    Run("store-outage", (), ("outage_s", "operations_refused", "time_to_drain_s", "elapsed_s")),
    Run("starter-race", (), ("won_by_racers", "lost_races", "attempts", "elapsed_s")),
    Run("supervisor-race", (), ("won_by_racers", "attempts", "failure_counts", "elapsed_s")),
    Run("scale-out", (), ("kills", "host_processes", "episodes_per_host_process", "attempts", "elapsed_s")),
    Run(
        "durable-api-outage",
        (),
        ("outage_s", "status_refused", "expired_at_outage_end", "time_to_drain_s", "elapsed_s"),
    ),
    Run("bus-outage", (), BUS_OUTAGE_FIGURES),
    Run("tenant-isolation", (), TENANT_FIGURES),
    Run("retention", (), RETENTION_FIGURES),
    # The azure-storage timing profile (devhost/durable/timing.py), with the deployed settings: minutes each.
    Run(
        "idle-then-burst",
        (),
        ("quiet_s", "first_order_latency_s", "burst_latency_s", "time_to_drain_s", "attempts", "elapsed_s"),
    ),
    Run(
        "host-crash",
        ("--timing", "azure-storage"),
        ("kills_done", "takeover_s", "attempts", "max_attempt", "settle_s", "total_s"),
        label="host-crash --timing azure-storage",
    ),
)
# What CI runs after the tests: the invariants under a crash of each process, a remote that fails, and a fault of
# the bus (a duplicate delivery, an outage), of the store and of the Durable HTTP API, two apps, one hostile, and
# data that ends with the alarms forced, each small.
QUICK: tuple[Run, ...] = (
    Run("host-crash", ("--orders", "20", "--kills", "3"), ("kills_done", "settle_s", "max_attempt", "total_s")),
    Run("agent-crash", ("--orders", "20", "--kills", "3"), ("kills_done", "settle_s", "max_attempt", "total_s")),
    Run("compensation", (), ("elapsed_s",)),
    Run("starter-race", ("--orders", "30"), ("won_by_racers", "attempts", "elapsed_s")),
    Run("supervisor-race", ("--orders", "6"), ("won_by_racers", "attempts", "failure_counts", "elapsed_s")),
    Run("duplicate-delivery", ("--orders", "6"), ("elapsed_s",)),
    Run("poison-input", ("--orders", "5"), ("elapsed_s",)),
    Run("remote-hang", ("--orders", "6"), ("elapsed_s",)),
    Run("late-replies", ("--orders", "6"), ("elapsed_s",)),
    Run("reply-reordering", ("--orders", "6"), ("elapsed_s",)),
    Run("clock-skew", ("--orders", "6"), ("elapsed_s",)),
    Run("state-store-conflicts", ("--orders", "10"), ("injected_412", "injected_429", "elapsed_s")),
    Run(
        "store-outage",
        ("--orders", "10", "--outage-for", "6"),
        ("outage_s", "operations_refused", "time_to_drain_s", "elapsed_s"),
    ),
    # Kills 0.5-1.5 s apart, so the first falls while the orders run however fast the machine drains them (80 orders
    # took 3.5 s: a first gap drawn from the default 1-4 s could miss them all).
    Run(
        "scale-out",
        ("--orders", "120", "--kills", "3", "--min-gap", "0.5", "--max-gap", "1.5"),
        ("kills", "host_processes", "episodes_per_host_process", "attempts", "elapsed_s"),
    ),
    Run(
        "durable-api-outage",
        ("--orders", "6", "--outage-for", "8"),
        ("outage_s", "status_refused", "expired_at_outage_end", "time_to_drain_s", "elapsed_s"),
    ),
    # 14 s: a send begun as the bus goes down outlasts the SDK's four attempts (1.6 + 3.2 + 6.4 s of backoff, then a
    # 1 s timeout), so the product's own waiting is exercised; about 25 s in all.
    Run("bus-outage", ("--orders", "6", "--outage-for", "14"), BUS_OUTAGE_FIGURES),
    # Two apps, one hostile: every trick, small (18 s on 2 cores).
    Run("tenant-isolation", ("--orders", "6", "--set", "flood=50"), TENANT_FIGURES),
    # Retention of seconds, then each alarm forced (devhost stopped for 14 s: the oldest-processing threshold).
    Run("retention", ("--orders", "6"), RETENTION_FIGURES),
)
COMMON = ("invariants.transitions_audited", "invariants.most_calls_per_key")


def normalise(drill: str, line: Mapping[str, Any], exit_code: int) -> dict[str, Any]:
    """One verdict in the report's shape. The crash drills print their summary (issue 5's format); the others a
    Verdict (`drill`, `passed`, `orders`, `lost`, `duplicate_side_effects`, `stuck`, `checks`, `figures`)."""
    if "figures" in line:
        return {**line, "passed": bool(line["passed"]) and exit_code == 0}
    figures = {k: v for k, v in line.items() if k not in ("checks", "lost", "duplicate_side_effects")}
    stuck = int(line.get("pending", 0)) + int(line.get("processing", 0))
    return {
        "drill": drill,
        "passed": exit_code == 0,
        "orders": line.get("submitted"),
        "lost": line.get("lost"),
        "duplicate_side_effects": line.get("duplicate_side_effects"),
        "stuck": stuck,
        "checks": line.get("checks", {}),
        "figures": figures,
    }


def _pick(figures: Mapping[str, Any], path: str) -> Any:
    value: Any = figures
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def failed(verdict: Mapping[str, Any]) -> list[str]:
    return [name for name, ok in verdict.get("checks", {}).items() if not ok]


def run_one(run: Run, work: Path, timeout: float) -> dict[str, Any]:
    started = time.monotonic()
    argv = [
        sys.executable,
        "-m",
        "devhost",
        "drill",
        run.drill,
        "--json",
        "--work-dir",
        str(work / run.name.replace(" ", "_")),
        *run.args,
    ]
    try:
        done = subprocess.run(
            argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, "COLUMNS": "200"}
        )
    except subprocess.TimeoutExpired:
        return {
            "drill": run.name,
            "passed": False,
            "error": f"no verdict within {timeout:g} s",
            "command": " ".join(argv[1:]),
            "wall_s": round(time.monotonic() - started, 1),
        }
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or [""])[-1]
        return {
            "drill": run.name,
            "passed": False,
            "error": f"exit {done.returncode}, no verdict: {tail}",
            "command": " ".join(argv[1:]),
            "wall_s": round(time.monotonic() - started, 1),
        }
    verdict = normalise(run.name, json.loads(lines[-1]), done.returncode)
    return {
        **verdict,
        "command": f"python -m devhost drill {run.drill} --json {' '.join(run.args)}".strip(),
        "wall_s": round(time.monotonic() - started, 1),
    }


def markdown(verdicts: Sequence[Mapping[str, Any]], runs: Sequence[Run], header: Mapping[str, Any]) -> str:
    shown = {r.name: r.figures for r in runs}
    rerun = "".join(
        f" Since re-run by `{u['command']}` at {u['commit']} on {u['date']}: "
        + ", ".join(f"`{d}`" for d in u["drills"])
        + "."
        for u in header.get("updated", ())
    )
    lines = [
        f"# Reliability drills ({header['kind']})",
        "",
        f"Generated by `{header['command']}` at {header['commit']} on {header['date']}, on {header['machine']}.{rerun} "
        "Do not edit: run the command again.",
        "",
        "Each drill runs on a fresh local system in real processes (devhost, the Agent, the remote-service "
        "simulator, a client app) and checks its own promises plus the invariants every drill checks "
        "(lab/invariants.py): no order lost, none stuck, at most one side effect per order step, remote calls "
        "per step within the retry budget, no transition outside the state machine (an audit of every "
        "ProcessState change), every dead letter with a reason.",
        "",
        "| drill | orders | lost | duplicates | stuck | key figures | result |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        if "error" in v:
            lines.append(f"| `{v['drill']}` | | | | | {v['error']} | **FAIL** |")
            continue
        figures = v.get("figures", {})
        picked = [(p.split(".")[-1], _pick(figures, p)) for p in (*shown.get(str(v["drill"]), ()), *COMMON)]
        text = ", ".join(f"{name} {value}" for name, value in picked if value is not None)
        result = "pass" if v["passed"] else "**FAIL**: " + ", ".join(failed(v))
        lines.append(
            f"| `{v['drill']}` | {v.get('orders')} | {v.get('lost')} | {v.get('duplicate_side_effects')} "
            f"| {v.get('stuck')} | {text} | {result} |"
        )
    lines += ["", "The commands (each also takes `--seed`, `--set NAME=VALUE` and `--timeout`):", ""]
    lines += [f"- `{v.get('command')}`: {v.get('wall_s')} s" for v in verdicts]
    return "\n".join(lines) + "\n"


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "an unknown commit"


def add_command(sub: Any) -> None:
    d = sub.add_parser(
        "drills",
        help="run every drill and write the reliability report (make drills)",
        description="Run every drill (or --quick: the subset CI runs), each on a fresh local system, "
        "and write OUT/reliability.json and OUT/reliability.md. Exit 1 if any failed.",
    )
    d.add_argument("--quick", action="store_true", help="the CI subset (smaller runs)")
    d.add_argument("--only", action="append", default=None, metavar="NAME", help="only this drill (repeatable)")
    d.add_argument(
        "--update",
        action="store_true",
        help="with --only: put the verdicts into the report already in OUT, in place, keeping the other drills' "
        "(the header names the re-run, its commit and date)",
    )
    d.add_argument(
        "--out", type=Path, default=None, help="report folder (default: reports/, or reports/quick/ with --quick)"
    )
    d.add_argument("--timeout", type=float, default=600.0, help="most seconds one drill may take (default 600)")


def merge(
    previous: Mapping[str, Any], verdicts: Sequence[Mapping[str, Any]], every: Sequence[Run], update: Mapping[str, Any]
) -> dict[str, Any]:
    """The report `previous` with `verdicts` in place of (or beside, in the order of `every`) its verdicts of the same
    drills, and `update` (the re-run's command, commit, date, drills) added to its header's `updated`; an earlier
    re-run keeps only the drills whose rows are still its own."""
    fresh = {str(v["drill"]): v for v in verdicts}
    kept = {str(v["drill"]): v for v in previous.get("drills", [])}
    drills = [fresh.get(r.name) or kept[r.name] for r in every if r.name in fresh or r.name in kept]
    header = {k: v for k, v in previous.items() if k != "drills"}
    earlier = [{**u, "drills": [d for d in u["drills"] if d not in fresh]} for u in previous.get("updated", [])]
    return {**header, "updated": [*(u for u in earlier if u["drills"]), dict(update)], "drills": drills}


def run_drills_command(args: argparse.Namespace) -> int:
    if getattr(args, "update", False) and not args.only:
        print("devhost drills: --update needs --only NAME (the drills to re-run)", file=sys.stderr)
        return 2
    runs = [r for r in (QUICK if args.quick else FULL) if not args.only or {r.drill, r.name} & set(args.only)]
    if args.only and not set(args.only) <= {n for r in runs for n in (r.drill, r.name)}:
        known = {n for r in (QUICK if args.quick else FULL) for n in (r.drill, r.name)}
        print(f"devhost drills: unknown drill(s): {', '.join(sorted(set(args.only) - known))}", file=sys.stderr)
        return 2
    out = args.out or (ROOT / "reports" / ("quick" if args.quick else ""))
    out.mkdir(parents=True, exist_ok=True)
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="drills-") as tmp:
        for run in runs:
            verdict = run_one(run, Path(tmp), args.timeout)
            verdicts.append(verdict)
            mark = "pass" if verdict["passed"] else "FAIL " + (verdict.get("error") or ", ".join(failed(verdict)))
            print(f"{run.name}: {mark} ({verdict['wall_s']} s)", flush=True)
    header = {
        "kind": "quick subset" if args.quick else "every drill",
        "command": "make drills-quick" if args.quick else "make drills",
        "commit": _commit(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores",
    }
    report: dict[str, Any] = {**header, "drills": verdicts}
    shown = runs
    if getattr(args, "update", False):
        every = QUICK if args.quick else FULL
        only = " ".join(f"--only {name}" for name in args.only)
        update = {
            "command": f"python -m devhost drills{' --quick' if args.quick else ''} {only} --update",
            "commit": header["commit"],
            "date": header["date"],
            "drills": [r.name for r in runs],
        }
        report = merge(json.loads((out / "reliability.json").read_text()), verdicts, every, update)
        shown = list(every)
    (out / "reliability.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "reliability.md").write_text(markdown(report["drills"], shown, report))
    print(f"wrote {out / 'reliability.md'} and {out / 'reliability.json'}")
    return 0 if all(v["passed"] for v in verdicts) else 1
