"""What the timing drills read, never logs but for one figure: the message audit (SQLite triggers in the broker's file
copy every message enqueued on the audited queues), each reply's trail, devhost's durable history (the replies raised
to each instance) and the late replies the reply trigger logged."""

from __future__ import annotations

import json
import re
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from azure.durable_functions.models.history import HistoryEventType

from orderflow.messages import AgentReply

# --- the message audit ------------------------------------------------------------------------------------------

_QUEUE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
_AUDIT_DDL = """
CREATE TABLE IF NOT EXISTS drill_message_audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, queue TEXT NOT NULL, message_id TEXT NOT NULL,
    session_id TEXT, delivery_count INTEGER, body BLOB,
    at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0));
CREATE TRIGGER IF NOT EXISTS drill_message_audit_sent AFTER INSERT ON messages
WHEN new.sub = '' AND new.queue IN ({queues})
BEGIN
    INSERT INTO drill_message_audit (kind, queue, message_id, session_id, body)
    VALUES ('sent', new.queue, new.message_id, new.session_id, new.body);
END;
CREATE TRIGGER IF NOT EXISTS drill_message_audit_redelivered AFTER UPDATE OF delivery_count ON messages
WHEN new.delivery_count > old.delivery_count AND new.queue IN ({queues})
BEGIN
    INSERT INTO drill_message_audit (kind, queue, message_id, session_id, delivery_count)
    VALUES ('redelivered', new.queue, new.message_id, new.session_id, new.delivery_count);
END;
"""


def bus_path(connection: str) -> Path:
    """The embedded broker's SQLite file of `Endpoint=embedded://PATH;...`."""
    endpoint = connection.split(";")[0].removeprefix("Endpoint=")
    assert endpoint.startswith("embedded://"), "the message audit needs the embedded broker"
    return Path(endpoint.removeprefix("embedded://"))


def install_message_audit(path: Path, queues: tuple[str, ...]) -> None:
    """Create the broker's tables (as the broker would) and the audit's triggers on `queues`; idempotent. Install it
    before the first message of the drill: an earlier one is not audited."""
    from orderflow.embedded.broker._schema import _SCHEMA  # the broker's own schema, not a copy

    assert all(_QUEUE_NAME.match(q) for q in queues), queues
    listed = ", ".join(f"'{q}'" for q in queues)
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path, timeout=30) as conn:
        conn.executescript(_SCHEMA)
        conn.executescript(_AUDIT_DDL.format(queues=listed))


@dataclass(frozen=True)
class Sent:
    """One audited message: sent (enqueued), or `redelivered` (a delivery ended unsettled, the broker counted it: lock
    lost, abandoned, receiver closed), in audit order, with the broker's wall time (Unix s)."""

    seq: int
    kind: str
    queue: str
    message_id: str
    session_id: str | None
    body: dict[str, Any]
    at: float


def read_audit(path: Path) -> list[Sent]:
    with sqlite3.connect(path, timeout=30) as conn:
        rows = conn.execute(
            "SELECT seq, kind, queue, message_id, session_id, body, at FROM drill_message_audit ORDER BY seq"
        ).fetchall()
    out = []
    for seq, kind, queue, message_id, session_id, body, at in rows:
        try:
            parsed = json.loads(body) if body else {}
        except ValueError:
            parsed = {}
        out.append(
            Sent(
                int(seq),
                str(kind),
                str(queue),
                str(message_id),
                session_id,
                parsed if isinstance(parsed, dict) else {},
                float(at),
            )
        )
    return out


@dataclass(frozen=True)
class Reply:
    """An audited AgentReply, with its request's deadline (CompleteBy) and when it was enqueued."""

    seq: int
    at: float
    instance_id: str
    order_id: str
    attempt: int
    step: str
    outcome: str
    error_code: str | None
    error: str | None
    completed_at: datetime
    deadline: float | None  # Unix s; None: its request was not audited
    request_seq: int | None

    @property
    def message_id(self) -> str:
        return f"{self.instance_id}:{self.step}:reply"

    def late_by(self) -> float | None:
        return None if self.deadline is None else self.at - self.deadline


@dataclass
class Trail:
    """What went through agent-requests and agent-replies, from the audit."""

    requests: dict[str, Sent]  # by MessageId (`<instanceId>:<step>`)
    replies: list[Reply]  # in the order they were enqueued
    redelivered: list[Sent]  # deliveries of agent-requests messages that ended unsettled (lock lost, abandoned)

    @classmethod
    def read(cls, path: Path, requests_queue: str, replies_queue: str) -> Trail:
        audit = read_audit(path)
        requests = {s.message_id: s for s in audit if s.kind == "sent" and s.queue == requests_queue}
        replies: list[Reply] = []
        for s in audit:
            if s.kind != "sent" or s.queue != replies_queue:
                continue
            try:
                reply = AgentReply.model_validate(s.body)
            except ValueError:
                continue
            request = requests.get(reply.message_id().removesuffix(":reply"))
            deadline = None
            if request is not None and request.body.get("deadline"):
                deadline = datetime.fromisoformat(str(request.body["deadline"])).timestamp()
            replies.append(
                Reply(
                    s.seq,
                    s.at,
                    reply.instance_id,
                    reply.order_id,
                    reply.attempt,
                    reply.step.value,
                    reply.outcome.value,
                    reply.error_code,
                    reply.error,
                    reply.completed_at,
                    deadline,
                    None if request is None else request.seq,
                )
            )
        redelivered = [s for s in audit if s.kind == "redelivered" and s.queue == requests_queue]
        return cls(requests, replies, redelivered)

    def of(self, order_ids: set[str]) -> Trail:
        return Trail(
            {k: v for k, v in self.requests.items() if v.session_id in order_ids},
            [r for r in self.replies if r.order_id in order_ids],
            [s for s in self.redelivered if s.session_id in order_ids],
        )

    def late(self, margin: float = 0.0) -> list[Reply]:
        """Replies enqueued more than `margin` seconds after their request's deadline."""
        return [r for r in self.replies if (late := r.late_by()) is not None and late > margin]

    def unanswered(self) -> list[str]:
        answered = {r.message_id.removesuffix(":reply") for r in self.replies}
        return sorted(set(self.requests) - answered)

    def overtaken_across_orders(self) -> list[Reply]:
        """Replies that arrived after a reply of another order whose request was sent later."""
        ordered = sorted((r for r in self.replies if r.request_seq is not None), key=lambda r: r.seq)
        out = []
        for i, r in enumerate(ordered):
            assert r.request_seq is not None
            if any(o.order_id != r.order_id and (o.request_seq or 0) > r.request_seq for o in ordered[:i]):
                out.append(r)
        return out

    def overtaken_across_attempts(self) -> list[tuple[Reply, Reply]]:
        """(earlier attempt's reply, newer attempt's reply that arrived before it), within one order."""
        by_order: dict[str, list[Reply]] = defaultdict(list)
        for r in self.replies:
            by_order[r.order_id].append(r)
        pairs: list[tuple[Reply, Reply]] = []
        for replies in by_order.values():
            for i, newer in enumerate(replies):
                pairs.extend((older, newer) for older in replies[i + 1 :] if older.attempt < newer.attempt)
        return pairs


# --- devhost's durable history ----------------------------------------------------------------------------------


@dataclass
class Instance:
    status: str | None = None
    output: dict[str, Any] | None = None
    raised: list[tuple[str, AgentReply | None]] = field(default_factory=list)  # (event name, its reply) in order


def read_instances(db: Path, order_ids: set[str]) -> dict[str, Instance]:
    """The drill's orchestration instances (`<orderId>:<attempt>`): status, output and the replies raised to each."""
    out: dict[str, Instance] = {}
    if not db.exists():
        return out

    def ours(instance_id: str) -> bool:
        return instance_id.rpartition(":")[0] in order_ids

    with sqlite3.connect(db, timeout=30) as conn:
        for instance_id, status, output in conn.execute("SELECT instance_id, status, output FROM instances"):
            if ours(instance_id):
                out[instance_id] = Instance(status, json.loads(output) if output else None)
        for instance_id, text in conn.execute("SELECT instance_id, event FROM history ORDER BY instance_id, seq"):
            if not ours(instance_id):
                continue
            event = json.loads(text)
            if event.get("EventType") != HistoryEventType.EVENT_RAISED:
                continue
            name = str(event.get("Name"))
            reply = None
            if name.startswith("AgentReply:"):
                try:
                    reply = AgentReply.from_event(json.loads(event.get("Input") or "null"))
                except ValueError:
                    reply = None
            out.setdefault(instance_id, Instance()).raised.append((name, reply))
    return out


_LATE_LOG = re.compile(r"late reply for '([^']+)' \(AgentReply:([^)]+)\) ignored")


def logged_late(log: Path) -> set[str]:
    """Reply MessageIds the reply trigger logged as late (404/410 from raise_event): a figure, not evidence."""
    if not log.exists():
        return set()
    return {f"{m.group(1)}:{m.group(2)}:reply" for m in _LATE_LOG.finditer(log.read_text(errors="replace"))}
