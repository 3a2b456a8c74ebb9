"""The README's results table, rendered from benchmarks/results/*.json (full runs only)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .common import RESULTS_DIR

README = Path(__file__).resolve().parent / "README.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"


def _load(name: str, quick: bool = False, results_dir: Path = RESULTS_DIR) -> dict[str, Any] | None:
    path = results_dir / f"{name}{'.quick' if quick else ''}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _bus(doc: dict[str, Any]) -> list[tuple[str, str]]:
    r = doc["results"]
    sq = r["session_queue"]
    rows = [
        ("bus: send, 1 message per call (sync)", f"{r['send_single']['msgs_per_s']:,.0f} msg/s"),
        ("bus: send, 1 message per call (aio)", f"{r['send_single_aio']['msgs_per_s']:,.0f} msg/s"),
        (
            f"bus: send, batches of {r['send_batched']['batch']}",
            f"{r['send_batched']['msgs_per_s']:,.0f} msg/s",
        ),
        ("bus: receive + complete, 1 per receive", f"{r['receive_complete_1']['msgs_per_s']:,.0f} msg/s"),
        ("bus: receive + complete, 50 per receive", f"{r['receive_complete_50']['msgs_per_s']:,.0f} msg/s"),
        (
            f"bus: session queue, {sq['sessions']} sessions × {sq['per_session']} (drain)",
            f"{sq['drain_msgs_per_s']:,.0f} msg/s, {sq['sessions_per_s']:,.0f} sessions/s",
        ),
    ]
    for key, label in (("wake_sync", "sync"), ("wake_async", "aio")):
        w = r[key]["send_start_to_receive"]
        rows.append(
            (
                f"bus: cross-process wake-up, {label} receiver (send start → received)",
                f"p50 {w['p50_ms']:.2f} ms, p99 {w['p99_ms']:.2f} ms",
            )
        )
    for h in r["hold"]:
        rows.append(
            (
                f"bus: process holding {h['receivers']} blocked aio receivers",
                f"{h['rss_mib']} MiB RSS (+{h['rss_per_receiver_kib']} KiB each), "
                f"{h['holder_cpu_ms_per_send']} ms CPU per send",
            )
        )
    return rows


def _durable(doc: dict[str, Any]) -> list[tuple[str, str]]:
    r = doc["results"]
    rows = []
    for t in r["throughput"]:
        lat = t["instance_latency"]
        rows.append(
            (
                f"durable: {t['instances']} × 4-activity chain",
                f"{t['orchestrations_per_s']:,.0f} orch/s ({t['activities_per_s']:,.0f} activities/s), "
                f"instance p50 {lat['p50_ms']:.0f} ms, p99 {lat['p99_ms']:.0f} ms",
            )
        )
    d = r["dispatch"]
    rows.append(
        (
            "durable: activity dispatch, idle engine (TaskScheduled → activity starts)",
            f"p50 {d['scheduled_to_activity_start']['p50_ms']:.2f} ms, "
            f"p99 {d['scheduled_to_activity_start']['p99_ms']:.2f} ms",
        )
    )
    for p in r["replay"]:
        rows.append(
            (
                f"durable: chain of {p['activities']} activities ({p['history_events']} history events)",
                f"{p['total_s']:.2f} s total, episode first {p['episode_ms_first']:.1f} → last "
                f"{p['episode_ms_last']:.1f} ms, {p['per_activity_ms']:.1f} ms/activity",
            )
        )
    rows.append(("durable: peak RSS of the benchmark process", f"{r['peak_rss_mib']} MiB"))
    return rows


def _pipeline(doc: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for run in doc["results"]["runs"]:
        lat = run["latency_ms"] or {}
        label = (
            "0/0 failures"
            if run["scenario"] == "clean"
            else f"{run['transient_failure_rate']}/{run['permanent_failure_rate']} failures"
        )
        rows.append(
            (
                f"pipeline: demo {run['orders']} orders, {label}",
                f"{run['orders_per_s']} orders/s, p50 {lat.get('p50', 0) / 1000:.1f} s, "
                f"p99 {lat.get('p99', 0) / 1000:.1f} s, devhost peak RSS "
                f"{run['peak_rss_mib'].get('devhost', 0)} MiB",
            )
        )
    return rows


def _idle(doc: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    window = doc["parameters"]["window_s"]
    for key, label in (("demo_settings", "demo schedules"), ("registry_schedules", "registry schedules")):
        figures = doc["results"][key]
        parts = ", ".join(f"{name} {f['cpu_pct_of_one_core']}%" for name, f in figures.items())
        rows.append((f"idle CPU over {window:.0f} s, {label}", parts))
    return rows


def _supervisor_scan(doc: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for backend, label in (("embedded", "embedded"), ("cosmos_protocol_server", "Cosmos protocol server")):
        for n, modes in doc["results"].get(backend, {}).items():
            if not isinstance(modes, dict):
                continue
            for mode, figures in modes.items():
                p = figures["pass"]
                ru = f", {p['request_charge']:,.0f} RU" if backend != "embedded" else ""
                rows.append(
                    (
                        f"supervisor pass over 24 h, {int(n):,} records (1% expired), {label}, {mode}",
                        f"{p['queries']:,} queries, {p['documents']:,} documents, {p['point_reads']:,} point reads"
                        f"{ru}, {p['wall_ms'] / 1000:.2f} s",
                    )
                )
    return rows


def _compare(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """`python -m benchmarks compare`: ours against DBOS, per system and the ratios."""
    rows = []
    for kind, label in (("ours", "orderflow"), ("peer", "DBOS")):
        r = doc[kind]
        single = r.get("single_order_latency_ms") or {}
        half = r.get("latency_at_half_our_max_ms") or {}
        half_lat = half.get("latency_ms", {})
        per = r.get("per_order") or {}
        rows.append(
            (
                f"compare: {label}, {r['orders_per_s_at']} orders at once",
                f"{r['orders_per_s']} orders/s, {r['cpu_ms_per_order']} CPU ms/order; single order p50 "
                f"{single.get('p50', 0):.0f} ms, p99 {single.get('p99', 0):.0f} ms; "
                f"at {half.get('offered_per_s', 0)}/s "
                f"p50 {half_lat.get('p50', 0):.0f} ms, p99 {half_lat.get('p99', 0):.0f} ms",
            )
        )
        rows.append(
            (
                f"compare: {label}, per order",
                ", ".join(
                    f"{name} {_figure(per.get(key))}"
                    for key, name in (
                        ("sqlite_commits", "SQLite commits"),
                        ("fsyncs", "fsyncs"),
                        ("durable_activities", "activities" if kind == "ours" else "steps + transactions"),
                        ("durable_episodes", "episodes"),
                        ("durable_history_events", "history events"),
                        ("servicebus_operations", "Service Bus operations"),
                        ("state_store_writes", "state-store writes"),
                    )
                    if per.get(key) is not None
                ),
            )
        )
    rows.append(
        (
            "compare: ratio ours/DBOS",
            f"orders/s {_figure(doc.get('ratio_orders_per_s_ours_over_peer'))}, "
            f"CPU per order {_figure(doc.get('ratio_cpu_ms_per_order_ours_over_peer'))}",
        )
    )
    return rows


def _figure(value: Any) -> str:
    return "n/a" if value is None else f"{value:g}"


def compare_table(doc: dict[str, Any]) -> str:
    """The compare rows of one result document, as a table under a heading naming its run."""
    run = "QUICK run (small plan)" if doc.get("quick") else "Full run"
    changed = " — THE CODE CHANGED DURING THE RUN" if doc.get("tree_changed") else ""
    lines = [
        f"{run}, commit {doc['commit']}{' (dirty tree)' if doc.get('dirty') else ''}{changed}",
        "",
        "| benchmark | result |",
        "|---|---|",
    ]
    lines.extend(f"| {label} | {value} |" for label, value in _compare(doc))
    return "\n".join(lines)


RENDERERS = {
    "bus": _bus,
    "durable": _durable,
    "pipeline": _pipeline,
    "idle": _idle,
    "supervisor_scan": _supervisor_scan,
    "compare": _compare,
}


def table(names: Sequence[str] | None = None, *, quick: bool = False, results_dir: Path = RESULTS_DIR) -> str:
    """The results table of `names` (default all) from `<name>.json`, or `<name>.quick.json` with `quick`."""
    lines = ["| benchmark | result |", "|---|---|"]
    commits = set()
    docs = {n: _load(n, quick, results_dir) for n in RENDERERS if names is None or n in names}
    for name, doc in docs.items():
        if doc is None:
            continue
        commits.add(doc["environment"]["git_commit"][:7])
        lines.extend(f"| {label} | {value} |" for label, value in RENDERERS[name](doc))
    env = next((d["environment"] for d in docs.values() if d), None)
    if env:
        lines.append("")
        lines.append(
            f"Measured on {env['cpu_count']} × {env['cpu_model']}, {env['memory_total_mib']} MiB RAM, "
            f"Python {env['python']}, SQLite {env['sqlite']}, commit(s) {', '.join(sorted(commits))}."
        )
    return "\n".join(lines)


def labelled_table(names: Sequence[str] | None = None, *, quick: bool = False, results_dir: Path = RESULTS_DIR) -> str:
    """`table` under a heading that says which run and which files it shows (a quick run's figures come from small
    sizes and are not comparable with the full run's)."""
    files = ", ".join(f"{n}{'.quick' if quick else ''}.json" for n in RENDERERS if names is None or n in names)
    where = f"{results_dir}: {files}"
    if quick:
        heading = f"QUICK run (small sizes; not comparable with the full-run table in benchmarks/README.md), {where}"
    else:
        heading = f"Full run, {where}"
    return f"{heading}\n\n{table(names, quick=quick, results_dir=results_dir)}"


def update_readme() -> None:
    """Replace the table between the README's result markers."""
    if not README.exists():
        return
    text = README.read_text()
    if START not in text or END not in text:
        return
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{START}\n{table()}\n{END}{tail}")
