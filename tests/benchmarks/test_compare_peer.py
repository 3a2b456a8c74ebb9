"""`python -m benchmarks compare`: the peer's defaults (DBOS `start_workflow`, at most 50 in flight, our SQLite
settings), the queue mode as an option, and the result fields that name the peer's mode. No DBOS here: nothing below
starts a system or imports dbos (compare_peer imports it inside `Peer.__init__` only)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from benchmarks import compare, compare_peer
from benchmarks._compare_systems import OUR_SQLITE, Options

PEER_ARGS = ["--work-dir", "w", "--simulator-url", "http://127.0.0.1:1"]


def test_compare_defaults_to_start_workflow_bounded_with_our_sqlite_settings() -> None:
    args = compare._parser().parse_args([])
    assert (args.peer_mode, args.peer_concurrency, args.peer_synchronous) == ("start", 50, "NORMAL")
    assert args.peer_synchronous == OUR_SQLITE["synchronous"]
    queue = compare._parser().parse_args(["--peer-mode", "queue", "--peer-concurrency", "16"])
    assert (queue.peer_mode, queue.peer_concurrency, queue.peer_polling_interval) == ("queue", 16, 0.05)
    with pytest.raises(SystemExit):
        compare._parser().parse_args(["--peer-mode", "poll"])


def test_the_peer_process_has_the_same_defaults() -> None:
    args = compare_peer.parser().parse_args(PEER_ARGS)
    options = Options()
    assert (args.mode, args.concurrency, args.synchronous) == ("start", 50, "NORMAL")
    assert (args.mode, args.concurrency, args.synchronous, args.polling_interval) == (
        options.peer_mode,
        options.peer_concurrency,
        options.peer_synchronous,
        options.peer_polling_interval,
    )
    assert compare_peer.parser().parse_args([*PEER_ARGS, "--mode", "queue"]).mode == "queue"


def test_options_record_the_peer_mode_and_concurrency() -> None:
    start = Options().as_dict()
    assert (start["peer_mode"], start["peer_concurrency"], start["peer_synchronous"]) == ("start", 50, "NORMAL")
    assert start["peer_polling_interval_s"] is None  # no queue, no polling
    queue = Options(peer_mode="queue", peer_concurrency=16).as_dict()
    assert (queue["peer_mode"], queue["peer_concurrency"], queue["peer_polling_interval_s"]) == ("queue", 16, 0.05)


def test_peer_setup_names_the_mode_and_the_sqlite_settings() -> None:
    setup = compare.peer_setup(Options(), {"same": True})
    assert setup["mode"] == "start" and setup["concurrency"] == 50 and setup["polling_interval_s"] is None
    assert setup["label"] == "DBOS start_workflow, at most 50 in flight"
    assert setup["sqlite"] == "SQLite WAL, synchronous=NORMAL on both"
    assert (setup["journal_mode"], setup["synchronous"], setup["sqlite_same_as_ours"]) == ("WAL", "NORMAL", True)
    queue = compare.peer_setup(Options(peer_mode="queue", peer_concurrency=16, peer_synchronous="default"))
    assert queue["label"] == "DBOS queue, 16 workers, polled every 50 ms"
    assert queue["polling_interval_s"] == 0.05
    assert queue["sqlite"] == "SQLite: ours WAL, synchronous=NORMAL, DBOS WAL, synchronous=FULL (DBOS's default)"


def test_the_peer_reads_back_its_connections_settings(tmp_path: Path) -> None:
    """What `Peer` announces comes from the connection itself (here a plain sqlite3 one, as SQLAlchemy hands it)."""
    db = tmp_path / "dbos-system.sqlite"
    compare_peer.prepare(db)
    peer = object.__new__(compare_peer.Peer)
    peer._cv, peer.sqlite = threading.Condition(), {}
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA synchronous=NORMAL")
        peer._note_settings(conn)
    finally:
        conn.close()
    assert peer.sqlite == {"dbos-system.sqlite": {"journal_mode": "WAL", "synchronous": "NORMAL"}}


# --- the result document -----------------------------------------------------------------------------------------
def _phase(system: str, workload: dict[str, Any], latencies: list[float], span: float, cpu: float) -> compare.Phase:
    n = len(latencies)
    stores: dict[str, Any] = (
        {"durable": {"instances": n, "activities": 4 * n, "episodes": 8 * n, "history_events": 32 * n}}
        if system == "ours"
        else {"dbos": {"workflows": n, "checkpoints": 7 * n, "checkpoints_by_function": {"finish": n}}}
    )
    if system == "ours":
        stores["durable"]["history_events_by_type"] = {}
    sqlite = (
        {name: dict(OUR_SQLITE) for name in ("broker", "store", "durable")}
        if system == "ours"
        else {"dbos-system.sqlite": dict(OUR_SQLITE), "orders.sqlite": dict(OUR_SQLITE)}
    )
    return compare.Phase(
        system,
        workload,
        {
            "submitted": n,
            "terminal": n,
            "first_submit_to_last_terminal_s": span,
            "latencies_s": latencies,
            "outcomes": {"processed": n},
            "submit_lag_s": 0.0,
        },
        compare.Snapshot(0.0, {system: 0.0}, {}),
        compare.Snapshot(1.0, {system: cpu}, {}),
        stores=stores,
        sqlite=sqlite,
    )


def _document_phases() -> list[compare.Phase]:
    return [
        _phase("ours", {"cmd": "burst", "n": 10, "prefix": "a"}, [0.2] * 10, 0.5, 1.0),  # 20 orders/s, 100 ms
        _phase("peer", {"cmd": "burst", "n": 10, "prefix": "b"}, [0.1] * 10, 0.25, 0.5),  # 40 orders/s, 50 ms
        _phase("ours", {"cmd": "sequential", "n": 2, "prefix": "c"}, [0.06, 0.06], 0.12, 0.1),
        _phase("peer", {"cmd": "sequential", "n": 2, "prefix": "d"}, [0.02, 0.02], 0.04, 0.05),
    ]


def _document(options: Options) -> dict[str, Any]:
    plan = compare.Plan(burst_sizes=(10,), reps=1, sequential=2, rate_fractions=(0.5,), rate_seconds=1.0)
    phases = _document_phases()
    settings = compare.sqlite_settings(phases)
    document = {"peer_setup": compare.peer_setup(options, settings), **compare.summarize(phases, plan, {0.5: 10.0})}
    document["headline"] = compare.headline(document)
    return document


def test_the_headline_names_the_peer_mode_and_records_it() -> None:
    document = _document(Options())
    assert document["peer_setup"]["sqlite_same_as_ours"] is True
    head = document["headline"]
    assert (head["peer_mode"], head["peer_concurrency"]) == ("start", 50)
    assert (head["orders_per_s"], head["cpu_ms_per_order"], head["single_order_p50"]) == (0.5, 2.0, 3.0)
    assert document["ratio_single_order_p50_ours_over_peer"] == 3.0
    assert head["text"].startswith("ours/DBOS start_workflow, at most 50 in flight (SQLite WAL, synchronous=NORMAL")
    assert "orders/s 20 vs 40 (ratio 0.5)" in head["text"]
    assert "single-order p50 60 vs 20 ms (ratio 3)" in head["text"]


def test_different_sqlite_settings_are_flagged() -> None:
    phases = [
        _phase("ours", {"cmd": "burst", "n": 1, "prefix": "a"}, [0.1], 0.1, 0.1),
        _phase("peer", {"cmd": "burst", "n": 1, "prefix": "b"}, [0.1], 0.1, 0.1),
    ]
    phases[1].sqlite = {"dbos-system.sqlite": {"journal_mode": "WAL", "synchronous": "FULL"}}
    assert compare.sqlite_settings(phases)["same"] is False


def test_both_systems_report_every_figure_of_issue_27() -> None:
    """orders/s, CPU per order (by process), one order alone p50 / p99, and p50 / p99 at half our best rate."""
    phases = [
        *_document_phases(),
        _phase("ours", {"cmd": "rate", "fraction": 0.5, "n": 4, "prefix": "e"}, [0.07, 0.07, 0.07, 0.09], 1.0, 0.4),
        _phase("peer", {"cmd": "rate", "fraction": 0.5, "n": 4, "prefix": "f"}, [0.03, 0.03, 0.03, 0.04], 1.0, 0.1),
    ]
    plan = compare.Plan(burst_sizes=(10,), reps=1, sequential=2, rate_fractions=(0.5,), rate_seconds=1.0)
    document = compare.summarize(phases, plan, {0.5: 10.0})
    for side, (rate, cpu, alone, half) in {"ours": (20, 100, 60, 70), "peer": (40, 50, 20, 30)}.items():
        figures = document[side]
        assert figures["orders_per_s"] == rate
        assert figures["cpu_ms_per_order"] == cpu and set(figures["cpu_ms_per_order_by_process"]) == {side}
        assert figures["single_order_latency_ms"]["p50"] == alone and "p99" in figures["single_order_latency_ms"]
        at_half = figures["latency_at_half_our_max_ms"]
        assert (at_half["offered_per_s"], at_half["latency_ms"]["p50"]) == (10.0, half)
        assert at_half["latency_ms"]["p99"] > half
