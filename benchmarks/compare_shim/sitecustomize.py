"""Counting shim of `python -m benchmarks compare` (a test harness, not product code).

`compare` puts this folder first on PYTHONPATH of every process it measures and sets ORDERFLOW_BENCH_COUNT_DIR; Python
then imports this module at start-up (the `site` module's sitecustomize hook). Without that variable it does nothing.
It counts, per process, SQLite commits, empty commits and write statements per database file and table (a
`set_trace_callback` on every `sqlite3.connect`), and the embedded broker's outermost public calls with their messages
(`orderflow.embedded.broker.EmbeddedBroker`; a waiting receive or accept once). At a request (a byte written to the
FIFO `<dir>/<pid>.req`, echoed as `seq`) and at exit it writes the counts to `<dir>/<pid>.json` (by rename). What
counts as what: docs/modules-host.md.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import inspect
import json
import os
import re
import sys
import threading
from typing import Any

_DIR = os.environ.get("ORDERFLOW_BENCH_COUNT_DIR")
_LOCK = threading.Lock()
_FILES: dict[str, dict[str, Any]] = {}
_BUS: dict[str, int] = {}
_SEQ = [0]
_WRITE = re.compile(r"^\s*(?:WITH\b.*?\)\s*)?(INSERT|UPDATE|DELETE|REPLACE)\b", re.IGNORECASE | re.DOTALL)
_TABLE = re.compile(
    r"^\s*(?:INSERT\s+(?:OR\s+\w+\s+)?INTO|REPLACE\s+INTO|UPDATE(?:\s+OR\s+\w+)?|DELETE\s+FROM)\s+"
    r"(?:\"?(\w+)\"?\.)?\"?(\w+)\"?",
    re.IGNORECASE,
)


def _file_counts(path: str) -> dict[str, Any]:
    with _LOCK:
        found = _FILES.get(path)
        if found is None:
            found = _FILES[path] = {
                "connections": 0,
                "statements": 0,
                "commits": 0,
                "empty_commits": 0,
                "autocommit_writes": 0,
                "rollbacks": 0,
                "writes_by_table": {},
            }
        return found


class _Tracer:
    """The trace callback of one connection: its transaction state, and counts into its file's entry."""

    def __init__(self, path: str) -> None:
        self.counts = _file_counts(path)
        self.in_tx = False
        self.wrote = False
        self.savepoints = 0

    def __call__(self, sql: str) -> None:
        if sql.startswith("--"):  # a trigger's sub-statement, reported apart: its statement is already counted
            return
        head = sql.lstrip()[:16].upper()
        counts = self.counts
        with _LOCK:
            counts["statements"] += 1
            if head.startswith("BEGIN"):
                self.in_tx, self.wrote = True, False
            elif head.startswith(("COMMIT", "END")):
                counts["commits" if self.wrote else "empty_commits"] += 1
                self.in_tx, self.wrote, self.savepoints = False, False, 0
            elif head.startswith("ROLLBACK") and " TO " not in sql.upper():
                counts["rollbacks"] += 1
                self.in_tx, self.wrote, self.savepoints = False, False, 0
            elif head.startswith("SAVEPOINT"):
                if not self.in_tx:
                    self.in_tx, self.wrote = True, False
                self.savepoints += 1
            elif head.startswith("RELEASE"):
                self.savepoints = max(0, self.savepoints - 1)
                if self.savepoints == 0 and self.in_tx:  # releasing the outermost savepoint commits
                    counts["commits" if self.wrote else "empty_commits"] += 1
                    self.in_tx, self.wrote = False, False
            elif _WRITE.match(sql):
                match = _TABLE.match(sql)
                table = match.group(2).lower() if match else "?"
                by_table = counts["writes_by_table"]
                by_table[table] = by_table.get(table, 0) + 1
                if self.in_tx:
                    self.wrote = True
                else:
                    counts["autocommit_writes"] += 1
                    counts["commits"] += 1


def _install_sqlite() -> None:
    import sqlite3
    import sqlite3.dbapi2  # SQLAlchemy's pysqlite driver calls `sqlite3.dbapi2.connect`: a binding of its own

    original = sqlite3.connect

    def connect(database: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = original(database, *args, **kwargs)
        name = os.fsdecode(database) if isinstance(database, str | bytes | os.PathLike) else str(database)
        if name.startswith("file:"):
            name = name[5:].split("?", 1)[0]
        path = os.path.abspath(name) if name and name != ":memory:" else name
        tracer = _Tracer(path)
        with _LOCK:
            tracer.counts["connections"] += 1
        conn.set_trace_callback(tracer)
        return conn

    connect.__wrapped__ = original  # type: ignore[attr-defined]
    sqlite3.connect = sqlite3.dbapi2.connect = connect  # type: ignore[assignment]


# --- the embedded broker -----------------------------------------------------------------------------------------
RECEIVES = ("receive", "take", "receive_deferred")  # calls that hand out messages (a list, or `.messages`)
_DEPTH = threading.local()


def _bump(key: str, by: int = 1) -> None:
    with _LOCK:
        _BUS[key] = _BUS.get(key, 0) + by


def _wrap(name: str, method: Any) -> Any:
    # ROOT is on every measured process's PYTHONPATH (compare's Instrument); imported once the broker is.
    from benchmarks._waits import IN_WAIT, WAITED

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        depth = getattr(_DEPTH, "n", 0)
        _DEPTH.n = depth + 1
        try:
            result = method(self, *args, **kwargs)
        finally:
            _DEPTH.n = depth
        if depth == 0 and name in WAITED and IN_WAIT.get():
            _bump(f"{name}_look")
            if name == "take":
                messages = getattr(result, "messages", None)
                _bump("messages_received", len(messages) if isinstance(messages, list) else 0)
        elif depth == 0:
            _bump(name)
            if name == "send" and len(args) > 1:
                _bump("messages_sent", len(args[1]))
            elif name in RECEIVES:
                messages = result if isinstance(result, list) else getattr(result, "messages", None)
                if isinstance(messages, list):
                    _bump("messages_received", len(messages))
                    if not messages:
                        _bump(f"{name}_empty")
            elif name == "accept_session" and result is None:
                _bump("accept_session_empty")
        return result

    wrapper.__wrapped__ = method  # type: ignore[attr-defined]
    return wrapper


def _patch_broker(module: Any) -> None:
    """Wrap every public method of EmbeddedBroker (whatever it is called, so a new or renamed one is not missed; the
    benchmark decides which of them are Service Bus operations)."""
    cls = getattr(module, "EmbeddedBroker", None)
    if cls is None:
        return
    seen: set[str] = set()
    for owner in cls.__mro__[:-1]:  # the broker's seams are base classes: patch each method where it is defined
        for name, member in list(vars(owner).items()):
            if not name.startswith("_") and name not in seen and inspect.isfunction(member):
                seen.add(name)
                setattr(owner, name, _wrap(name, member))


def _count_wait(queue: str, name: str, found: bool) -> None:
    _bump(name)
    if not found:
        _bump(f"{name}_empty")


def _patch_receivers(module: Any) -> None:
    """Count each waiting call of the embedded client's receiver (sync or aio) once (benchmarks/_waits.py)."""
    from benchmarks._waits import waiting_wrapper

    cls = module.ServiceBusReceiver
    cls._wait_for = waiting_wrapper(vars(cls)["_wait_for"], _count_wait)


class _BrokerFinder(importlib.abc.MetaPathFinder):
    """Patches the embedded broker and clients right after each is first imported (only in processes that do)."""

    TARGETS = {
        "orderflow.embedded.broker": _patch_broker,
        "orderflow.embedded.client": _patch_receivers,
        "orderflow.embedded.client_aio": _patch_receivers,
    }

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        patch = self.TARGETS.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            patch(module)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


# --- dumps -----------------------------------------------------------------------------------------------------
def dump(seq: int | None = None) -> None:
    if seq is not None:
        _SEQ[0] = seq
    assert _DIR is not None
    with _LOCK:
        document = {
            "pid": os.getpid(),
            "argv": sys.argv,
            "seq": _SEQ[0],
            "sqlite": json.loads(json.dumps(_FILES)),
            "bus": dict(_BUS),
        }
    final = os.path.join(_DIR, f"{os.getpid()}.json")
    temporary = f"{final}.tmp"
    with open(temporary, "w") as out:
        json.dump(document, out)
    os.replace(temporary, final)


def _serve_requests(fifo: str) -> None:
    while True:
        try:
            with open(fifo, "rb", buffering=0) as requests:  # blocks until the benchmark opens it to write
                while data := requests.read(64):
                    dump(data[-1])
        except OSError:
            return


def _activate() -> None:
    assert _DIR is not None
    os.makedirs(_DIR, exist_ok=True)
    _install_sqlite()
    sys.meta_path.insert(0, _BrokerFinder())
    fifo = os.path.join(_DIR, f"{os.getpid()}.req")
    try:
        os.mkfifo(fifo)
    except FileExistsError:
        pass
    threading.Thread(target=_serve_requests, args=(fifo,), name="bench-count-dump", daemon=True).start()
    atexit.register(dump)
    dump()  # an empty first dump says "this process is counted" before it does anything


if _DIR:
    _activate()
