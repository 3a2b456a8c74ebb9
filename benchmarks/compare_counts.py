"""Counting for `python -m benchmarks compare`: the shim's dumps (benchmarks/compare_shim/sitecustomize.py), strace
logs of fsync/fdatasync, and the per-order rows in devhost's Durable store and in the DBOS databases. Nothing here
touches a running process except through the shim's request FIFO."""

from __future__ import annotations

import errno
import json
import os
import re
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

SHIM_DIR = Path(__file__).resolve().parent / "compare_shim"
COUNT_DIR_VARIABLE = "ORDERFLOW_BENCH_COUNT_DIR"

# Database files by name (their -wal/-shm/-journal companions go with them). "simulator" is the remote service both
# systems call: counted, reported, and left out of each system's own totals.
FILE_CLASSES = {
    "durable.db": "durable",  # devhost's Durable task hub (devhost/durable/store.py)
    "servicebus.db": "broker",  # the embedded Service Bus broker (orderflow/embedded/broker/)
    "store.db": "store",  # the embedded Cosmos store: orders DB, state store, recovery index, breakers, checkpoints
    "simulator.db": "simulator",  # lab/simulator.py's ledger
    "dbos-system.sqlite": "dbos_system",  # the DBOS system database
    "orders.sqlite": "dbos_app",  # the peer's application database (its state records and transaction outputs)
}
# Tables of store.db by the Cosmos database and container they stand for (orderflow/embedded/store/).
STORE_TABLES = {
    "orders": "orders_db",
    "order_state": "state_store",
    "recovery_index": "recovery_index",
    "documents": "breaker_documents",
    "checkpoints": "supervisor_checkpoints",
}
# EmbeddedBroker methods the shim counts that are not Service Bus operations: set-up, local bookkeeping, and the
# local wake-up machinery that stands in for a receiver's open AMQP link. Every other public method is one operation
# per call (send, receive/take, complete, abandon, defer, dead_letter, peek, renew and accept/release session, …).
NOT_OPERATIONS = frozenset(
    {
        "close",
        "declare_queue",
        "load_config",
        "queue_properties",
        "queue_names",
        "counts",
        "next_due",
        "wait_seconds",
        "new_waiter",
        "waiter",
        "now_ts",
        "due_at",
        "has_ready",
        "wait_for_activity",
        "wake_key",
        "fault_for",  # the broker asking its fault switches (lab/bus faults), not a Service Bus call
        "messages_sent",
        "messages_received",
    }
)


def bus_operations(calls: Counter[str]) -> int:
    """Service Bus operations among the shim's broker counts (its extra keys, *_empty, *_look and messages_*,
    excluded: a `_look` is the embedded client looking again inside one waiting call, which is counted once)."""
    return sum(n for name, n in calls.items() if name not in NOT_OPERATIONS and not name.endswith(("_empty", "_look")))


def file_class(path: str) -> str:
    """The class of a database file (or of its -wal/-shm/-journal); "directory" for a folder (SQLite syncs the folder
    after it creates a journal or WAL file); "other" for anything else."""
    name = os.path.basename(path)
    for suffix in ("-wal", "-shm", "-journal"):
        name = name.removesuffix(suffix)
    if name in FILE_CLASSES:
        return FILE_CLASSES[name]
    return "directory" if path and os.path.isdir(path) else "other"


# --- the shim's dumps ----------------------------------------------------------------------------------------
def request_dump(count_dir: Path, pid: int, seq: int, timeout: float = 10.0) -> dict[str, Any]:
    """Ask process `pid` for its counts (a byte `seq` on its FIFO) and wait for the dump that echoes it."""
    fifo, dumped = count_dir / f"{pid}.req", count_dir / f"{pid}.json"
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:  # ENXIO: the shim's reader is between two requests; ENOENT: not started yet
            if exc.errno not in (errno.ENXIO, errno.ENOENT) or time.monotonic() > deadline:
                raise RuntimeError(f"process {pid} does not answer count requests ({fifo}): {exc}") from exc
            time.sleep(0.01)
    try:
        os.write(fd, bytes([seq]))
    finally:
        os.close(fd)
    while time.monotonic() < deadline:
        try:
            document = json.loads(dumped.read_text())
        except (OSError, ValueError):
            document = None
        if document is not None and document.get("seq") == seq:
            return document  # type: ignore[no-any-return]
        time.sleep(0.01)
    raise RuntimeError(f"process {pid} did not dump its counts within {timeout:.0f} s")


def sqlite_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per file class: commits, empty commits, rollbacks, statements, writes per table, between two dumps of one
    process."""
    out: dict[str, dict[str, Any]] = {}
    for path, now in after.get("sqlite", {}).items():
        was = before.get("sqlite", {}).get(path, {})
        entry = out.setdefault(
            file_class(path),
            {"commits": 0, "empty_commits": 0, "rollbacks": 0, "statements": 0, "writes_by_table": Counter()},
        )
        for key in ("commits", "empty_commits", "rollbacks", "statements"):
            entry[key] += now.get(key, 0) - was.get(key, 0)
        for table, n in now.get("writes_by_table", {}).items():
            entry["writes_by_table"][table] += n - was.get("writes_by_table", {}).get(table, 0)
    return out


def bus_delta(before: dict[str, Any], after: dict[str, Any]) -> Counter[str]:
    now, was = after.get("bus", {}), before.get("bus", {})
    return Counter({k: v - was.get(k, 0) for k, v in now.items() if v - was.get(k, 0)})


# --- strace ------------------------------------------------------------------------------------------------------
STRACE_ARGS = ("-f", "--seccomp-bpf", "-qq", "-ttt", "-T", "-y", "-e", "trace=fsync,fdatasync")
_SYNC = re.compile(r"^(?:\d+\s+)?(\d+\.\d+)\s+(fsync|fdatasync)\(\d+(?:<([^>]*)>)?")
# A call's duration (-T) ends its line, or the line of its resumption when another thread's call split it.
_DURATION = re.compile(r"^(?:\d+\s+)?(\d+\.\d+)\s+.*(?:fsync|fdatasync).*<(\d+\.\d+)>\s*$")


def strace_usable() -> bool:
    """Whether strace is installed and may trace here (a container without ptrace rights refuses it)."""
    import shutil
    import subprocess

    if shutil.which("strace") is None:
        return False
    try:
        done = subprocess.run(
            ["strace", *STRACE_ARGS, "-o", os.devnull, "true"], capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def strace_prefix(log: Path) -> list[str]:
    """`strace … -o LOG` to start a process under: only fsync and fdatasync stop it (seccomp-bpf filter), each
    logged with its wall-clock time, the file's path and its duration."""
    return ["strace", *STRACE_ARGS, "-o", str(log)]


def fsyncs(logs: list[Path], since: float, until: float) -> tuple[Counter[str], float]:
    """fsync + fdatasync calls per file class that started within [since, until] (wall-clock seconds), and the
    seconds spent in them (summed over threads: time a thread waited for the disk, not CPU)."""
    found: Counter[str] = Counter()
    waited = 0.0
    for log in logs:
        if not log.exists():
            continue
        with open(log, errors="replace") as lines:
            for line in lines:
                match = _SYNC.match(line)
                if match and since <= float(match.group(1)) <= until:
                    found[file_class(match.group(3) or "")] += 1
                timed = _DURATION.match(line)
                if timed and since <= float(timed.group(1)) <= until:
                    waited += float(timed.group(2))
    return found, waited


# --- rows in the stores ------------------------------------------------------------------------------------------
def _read(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)


def _like(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "-%"


def durable_unfinished(db: Path, prefix: str) -> int:
    """Instances of the orders `<prefix>-…` still Pending or Running in devhost's Durable store."""
    conn = _read(db)
    try:
        return int(
            conn.execute(
                "SELECT COUNT(*) FROM instances WHERE instance_id LIKE ? ESCAPE '\\' "
                "AND status IN ('Pending', 'Running')",
                (_like(prefix),),
            ).fetchone()[0]
        )
    finally:
        conn.close()


def durable_counts(db: Path, prefix: str) -> dict[str, Any]:
    """Instances, activities (TaskScheduled), episodes (OrchestratorStarted: one per replay of the orchestrator) and
    history events by type, over the instances of the orders `<prefix>-…` (instance id `<orderId>:<attempt>`)."""
    from azure.durable_functions.models.history import HistoryEventType

    conn = _read(db)
    try:
        instances = int(
            conn.execute(
                "SELECT COUNT(*) FROM instances WHERE instance_id LIKE ? ESCAPE '\\'", (_like(prefix),)
            ).fetchone()[0]
        )
        by_type: Counter[str] = Counter()
        for (event,) in conn.execute(
            "SELECT event FROM history WHERE instance_id LIKE ? ESCAPE '\\'", (_like(prefix),)
        ):
            by_type[HistoryEventType(json.loads(event)["EventType"]).name] += 1
    finally:
        conn.close()
    return {
        "instances": instances,
        "activities": by_type["TASK_SCHEDULED"],
        "episodes": by_type["ORCHESTRATOR_STARTED"],
        "history_events": sum(by_type.values()),
        "history_events_by_type": dict(sorted(by_type.items())),
    }


def dbos_unfinished(system_db: Path, prefix: str) -> int:
    conn = _read(system_db)
    try:
        return int(
            conn.execute(
                "SELECT COUNT(*) FROM workflow_status WHERE workflow_uuid LIKE ? ESCAPE '\\' "
                "AND status IN ('PENDING', 'ENQUEUED')",
                (_like(prefix),),
            ).fetchone()[0]
        )
    finally:
        conn.close()


def dbos_counts(system_db: Path, prefix: str) -> dict[str, Any]:
    """The DBOS workflows of the orders `<prefix>-…` and their checkpoints in the system database: one
    operation_outputs row per step and per transaction, by function. (A transaction's output is also written to the
    application database's datasource_outputs, and DBOS deletes those rows once the workflow has ended: the shim's
    write counts show them.)"""
    conn = _read(system_db)
    try:
        workflows = int(
            conn.execute(
                "SELECT COUNT(*) FROM workflow_status WHERE workflow_uuid LIKE ? ESCAPE '\\'", (_like(prefix),)
            ).fetchone()[0]
        )
        steps = Counter(
            dict(
                conn.execute(
                    "SELECT function_name, COUNT(*) FROM operation_outputs WHERE workflow_uuid LIKE ? ESCAPE '\\' "
                    "GROUP BY function_name",
                    (_like(prefix),),
                ).fetchall()
            )
        )
    finally:
        conn.close()
    return {
        "workflows": workflows,
        "checkpoints": sum(steps.values()),
        "checkpoints_by_function": {k.rsplit(".", 1)[-1]: v for k, v in sorted(steps.items())},
    }
