"""The peer of `python -m benchmarks compare`: the same order workflow on DBOS Transact (PyPI `dbos`), one process.

Per order, one DBOS workflow (workflow id = orderId): for each of the three steps a DBOS step that POSTs to the
simulator exactly what our Agent sends (retried on a transient answer, 3 attempts), then a DBOS transaction that
writes the order's state record; then a fenced final update (else the workflow ends `superseded`). Storage:
`dbos-system.sqlite` and `orders.sqlite`, both WAL, `synchronous` NORMAL by default as our stores (--synchronous;
`default` leaves DBOS's, SQLite's FULL); the settings each connection really has are read back and announced.
Start modes (--mode): `start` (default: `DBOS.start_workflow` when one of --concurrency slots is free, no queue
polling) or `queue` (a DBOS queue, `worker_concurrency` = --concurrency, polled every --polling-interval s). An order
is terminal when its fenced final update has run. Speaks benchmarks/compare_proto.py; in full: docs/modules-host.md.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from . import compare_proto as proto

APP_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS order_state (id TEXT PRIMARY KEY, doc TEXT NOT NULL, process_state TEXT "
    "NOT NULL, locked_by TEXT)"
)
TRANSIENT = frozenset({408, 425, 429, 500, 502, 503, 504})
MODES = ("start", "queue")  # the first is the default
DEFAULT_MODE = "start"
DEFAULT_CONCURRENCY = 50
DEFAULT_POLLING_INTERVAL = 0.05
SYNCHRONOUS = ("NORMAL", "FULL", "default")  # "default": DBOS's own, i.e. SQLite's FULL
DEFAULT_SYNCHRONOUS = "NORMAL"  # as our three stores (broker, state store, devhost's Durable store)
SYNCHRONOUS_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


class Transient(Exception):
    """A remote answer worth retrying (DBOS retries the step)."""


def prepare(path: Path, schema: str | None = None) -> None:
    """Create the file in WAL mode (persistent in the file), with `schema`."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        if schema:
            conn.execute(schema)
        conn.commit()
    finally:
        conn.close()


class Peer:
    def __init__(
        self,
        work_dir: Path,
        simulator_url: str,
        concurrency: int,
        mode: str,
        polling_interval: float,
        synchronous: str,
        timeout_s: float,
    ) -> None:
        import sqlalchemy as sa
        import urllib3
        from dbos import DBOS, DBOSConfig, SQLAlchemyDatasource

        from orderflow.messages import STEPS, idempotency_key

        self.mode, self.timeout_s = mode, timeout_s
        self._cv = threading.Condition()
        self.terminal_at: dict[str, float] = {}
        self.outcome: dict[str, str] = {}
        self.sent_at: dict[str, float] = {}
        self.sqlite: dict[str, dict[str, str]] = {}  # database file -> the settings its connections really have
        work_dir.mkdir(parents=True, exist_ok=True)
        system_db, app_db = work_dir / "dbos-system.sqlite", work_dir / "orders.sqlite"
        prepare(system_db)
        prepare(app_db, APP_SCHEMA)

        @sa.event.listens_for(sa.engine.Engine, "connect")
        def _settings(dbapi_conn: Any, _record: Any) -> None:
            if synchronous != "default":
                dbapi_conn.execute(f"PRAGMA synchronous={synchronous}")
            self._note_settings(dbapi_conn)

        config: DBOSConfig = {
            "name": "orderflow-peer",
            "system_database_url": f"sqlite:///{system_db}",
            "log_level": "WARNING",
        }
        DBOS(config=config)
        ds = SQLAlchemyDatasource.create(f"sqlite:///{app_db}")
        http = urllib3.PoolManager(maxsize=max(4, concurrency), retries=False)
        base = simulator_url.rstrip("/")

        @DBOS.step(retries_allowed=True, max_attempts=3, interval_seconds=0.1, backoff_rate=2.0)
        def remote_call(order_id: str, step: str, payload: dict[str, Any]) -> dict[str, Any]:
            body = {"orderId": order_id, "idempotencyKey": idempotency_key(order_id, step), "payload": payload}
            try:
                resp = http.request(
                    "POST",
                    f"{base}/steps/{step}",
                    body=json.dumps(body).encode(),
                    headers={"Content-Type": "application/json"},
                    timeout=20.0,
                )
            except urllib3.exceptions.HTTPError as exc:
                raise Transient(f"{type(exc).__name__}: {exc}") from exc
            if resp.status in TRANSIENT:
                raise Transient(f"HTTP {resp.status}")
            answer = json.loads(resp.data or b"{}")
            return {"status": resp.status, "ok": resp.status < 300, "body": answer}

        @ds.transaction()
        def record_step(order_id: str, instance_id: str, step: str, result: dict[str, Any]) -> None:
            session = ds.sql_session()
            row = session.execute(sa.text("SELECT doc FROM order_state WHERE id = :id"), {"id": order_id}).first()
            doc = json.loads(row[0]) if row else {"id": order_id, "steps": {}}
            doc.update({"ProcessState": "Processing", "LockedBy": instance_id})
            doc["steps"][step] = "succeeded" if result["ok"] else "failed"
            session.execute(
                sa.text(
                    "INSERT INTO order_state (id, doc, process_state, locked_by) "
                    "VALUES (:id, :doc, 'Processing', :by) ON CONFLICT(id) DO UPDATE SET "
                    "doc = excluded.doc, process_state = excluded.process_state, "
                    "locked_by = excluded.locked_by"
                ),
                {"id": order_id, "doc": json.dumps(doc), "by": instance_id},
            )

        @ds.transaction()
        def finish(order_id: str, instance_id: str, state: str) -> bool:
            session = ds.sql_session()
            row = session.execute(
                sa.text("SELECT doc FROM order_state WHERE id = :id AND locked_by = :by"),
                {"id": order_id, "by": instance_id},
            ).first()
            if row is None:
                return False
            doc = {**json.loads(row[0]), "ProcessState": state, "LockedBy": None}
            done = session.execute(
                sa.text(
                    "UPDATE order_state SET doc = :doc, process_state = :state, "
                    "locked_by = NULL WHERE id = :id AND locked_by = :by"
                ),
                {"doc": json.dumps(doc), "state": state, "id": order_id, "by": instance_id},
            )
            return bool(done.rowcount == 1)

        @DBOS.workflow()
        def order_workflow(order: dict[str, Any]) -> str:
            order_id = order["orderId"]
            instance_id = DBOS.workflow_id or order_id
            state = "Processed"
            try:
                for step in STEPS:
                    result = remote_call(order_id, step.value, order)
                    record_step(order_id, instance_id, step.value, result)
                    if not result["ok"]:
                        state = "Error"
                        break
                outcome = state.lower() if finish(order_id, instance_id, state) else "superseded"
            except BaseException:
                self._release()  # the order never becomes terminal, but its slot frees (`start` mode)
                raise
            self._done(order_id, outcome)
            return outcome

        self.order_workflow = order_workflow
        self.dbos = DBOS
        DBOS.launch()
        with ds.engine.connect():  # the application database's settings are known before the first order
            pass
        self._slots = threading.BoundedSemaphore(concurrency)
        self.queue = (
            DBOS.register_queue("orders", worker_concurrency=concurrency, polling_interval_sec=polling_interval)
            if mode == "queue"
            else None
        )

    def _note_settings(self, dbapi_conn: Any) -> None:
        """Record the journal mode and synchronous level a new connection has, per database file."""
        name = next((Path(row[2]).name for row in dbapi_conn.execute("PRAGMA database_list") if row[1] == "main"), "?")
        journal = str(dbapi_conn.execute("PRAGMA journal_mode").fetchone()[0]).upper()
        level = int(dbapi_conn.execute("PRAGMA synchronous").fetchone()[0])
        with self._cv:
            self.sqlite[name] = {"journal_mode": journal, "synchronous": SYNCHRONOUS_NAMES.get(level, str(level))}

    def _done(self, order_id: str, outcome: str) -> None:
        with self._cv:
            if order_id not in self.terminal_at:
                self.terminal_at[order_id] = time.monotonic()
                self.outcome[order_id] = outcome
                self._release()
            self._cv.notify_all()

    def _release(self) -> None:
        if self.mode == "start":
            self._slots.release()

    def close(self) -> None:
        self.dbos.destroy(workflow_completion_timeout_sec=5)

    # -- submitting ---------------------------------------------------------------------------------------------
    def _submit(self, order: dict[str, Any]) -> None:
        from dbos import SetWorkflowID

        order_id = order["orderId"]
        self.sent_at[order_id] = time.monotonic()
        if self.mode == "start":
            self._slots.acquire()
        with SetWorkflowID(order_id):
            if self.queue is not None:
                self.queue.enqueue(self.order_workflow, order)
            else:
                self.dbos.start_workflow(self.order_workflow, order)

    def _wait(self, ids: list[str], deadline: float) -> None:
        with self._cv:
            self._cv.wait_for(lambda: all(i in self.terminal_at for i in ids), max(0.0, deadline - time.monotonic()))

    def _answer(self, ids: list[str], lag: float = 0.0) -> dict[str, Any]:
        with self._cv:
            sent = {i: self.sent_at[i] for i in ids if i in self.sent_at}
            terminal = {i: self.terminal_at[i] for i in ids if i in self.terminal_at}
            outcomes = Counter(self.outcome[i] for i in terminal)
        return proto.answer_dict(proto.Answer.of(len(ids), sent, terminal, outcomes, lag))

    def handle(self, command: dict[str, Any]) -> dict[str, Any]:
        kind = command["cmd"]
        if kind == "burst":
            orders = _orders(command["prefix"], int(command["n"]))
            ids = [o["orderId"] for o in orders]
            started = time.monotonic()
            if self.mode == "start":  # a feeder hands orders over as slots free; each is "submitted" now
                for o in orders:
                    self.sent_at[o["orderId"]] = started
                threading.Thread(target=lambda: [self._submit_started(o) for o in orders], daemon=True).start()
            else:
                for o in orders:
                    self._submit(o)
            self._wait(ids, started + self.timeout_s)
            return self._answer(ids)
        if kind == "sequential":
            orders = _orders(command["prefix"], int(command["n"]))
            deadline = time.monotonic() + self.timeout_s
            for o in orders:
                self._submit(o)
                self._wait([o["orderId"]], deadline)
            return self._answer([o["orderId"] for o in orders])
        if kind == "rate":
            offsets = proto.rate_schedule(float(command["rate"]), float(command["duration_s"]))
            orders = _orders(command["prefix"], len(offsets))
            started, lag = time.monotonic(), 0.0
            for offset, o in zip(offsets, orders, strict=True):
                proto.sleep_until(started + offset)
                lag = max(lag, time.monotonic() - started - offset)
                if self.mode == "start":
                    self.sent_at[o["orderId"]] = time.monotonic()
                    threading.Thread(target=self._submit_started, args=(o,), daemon=True).start()
                else:
                    self._submit(o)
            ids = [o["orderId"] for o in orders]
            self._wait(ids, time.monotonic() + self.timeout_s)
            return self._answer(ids, lag)
        raise ValueError(f"unknown command {kind!r}")

    def _submit_started(self, order: dict[str, Any]) -> None:
        """`start` mode: wait for a slot, then start (the submit time was noted when the order was handed over)."""
        from dbos import SetWorkflowID

        self._slots.acquire()
        with SetWorkflowID(order["orderId"]):
            self.dbos.start_workflow(self.order_workflow, order)


def _orders(prefix: str, count: int) -> list[dict[str, Any]]:
    """The same orders as our client sends, as plain JSON (DBOS serialises workflow inputs)."""
    return [json.loads(o.to_json()) for o in proto.orders_for(prefix, count, "app-status")]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.compare_peer", description=__doc__.splitlines()[0])
    p.add_argument("--work-dir", type=Path, required=True)
    p.add_argument("--simulator-url", required=True)
    p.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="workflows in flight at most")
    p.add_argument("--mode", choices=MODES, default=DEFAULT_MODE)
    p.add_argument(
        "--polling-interval",
        type=float,
        default=DEFAULT_POLLING_INTERVAL,
        help="queue mode: seconds between queue polls",
    )
    p.add_argument("--synchronous", default=DEFAULT_SYNCHRONOUS, choices=SYNCHRONOUS)
    p.add_argument("--timeout", type=float, default=600.0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    peer = Peer(
        args.work_dir,
        args.simulator_url,
        args.concurrency,
        args.mode,
        args.polling_interval,
        args.synchronous,
        args.timeout,
    )
    try:
        with peer._cv:
            sqlite = dict(peer.sqlite)
        proto.serve(peer.handle, {"mode": args.mode, "concurrency": args.concurrency, "sqlite": sqlite})
    finally:
        peer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
