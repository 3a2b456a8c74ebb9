"""benchmarks/profile_system.py's pure parts: a sample counts for the leaf-most frame that names a component, and
the context switches are every thread's, not the main thread's alone (/proc/PID/status counts only its own)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from benchmarks.profile_system import by_component, component_of, switches


def test_a_sample_counts_for_its_leaf_most_component() -> None:
    activity_writes = [
        "<module> (devhost/__main__.py)",
        "advance_order (activities/state.py)",
        "SqliteStateStore.replace (orderflow/embedded/store/__init__.py)",
        "Connection.execute (<built-in>)",
    ]
    assert component_of(activity_writes) == "embedded store (SQLite)"
    replay = ["handle (azure/durable_functions/orchestrator.py)", "parse (dateutil/parser/_parser.py)"]
    assert component_of(replay) == "Durable SDK: dateutil parsing history timestamps"
    assert component_of(["<module> (devhost/__main__.py)"]) == "devhost: triggers, invoker, host"
    assert component_of(["somewhere (elsewhere.py)"]) == "other"


def test_components_share_the_samples(tmp_path: Path) -> None:
    raw = tmp_path / "devhost.raw"
    raw.write_text(
        "main (devhost/__main__.py);handle (azure/durable_functions/orchestrator.py) 3\n"
        "main (devhost/__main__.py);advance_order (activities/state.py) 1\n"
    )
    shares = by_component(raw)
    assert shares["gil_samples"] == 4
    assert shares["components_pct"] == {
        "Durable SDK (azure-functions-durable): replay, actions": 75.0,
        "product: activities": 25.0,
    }


def test_switches_count_every_thread() -> None:
    """The main thread only waits once here; a worker thread blocks 50 times: the sum must have the worker's."""
    before = switches(os.getpid())[0]
    waited, release = threading.Event(), threading.Event()

    def worker() -> None:
        pause = threading.Event()
        for _ in range(50):
            pause.wait(0.001)  # each blocks: a voluntary switch of this thread
        waited.set()
        release.wait(10)  # alive while the main thread reads (an ended thread leaves /proc/PID/task)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert waited.wait(10)
        after = switches(os.getpid())[0]
    finally:
        release.set()
        thread.join()
    assert after - before >= 50
