"""What the engine keeps of an instance between episodes: its history as the SDK replays it, and its bookkeeping.

Each history event is JSON-encoded once, when it is recorded; the replayed form (`IsPlayed` true) is spliced from
that text, and an episode's context is built by joining texts, so an episode encodes only its own new events.
The bookkeeping (sequence numbers, recorded actions, retry groups) is what an older devhost persisted (the row's
`state` column and the journal); episodes no longer change it: the replay derives it all from the history (shim.py).

The cache is owned by the Store, the only writer of history: every write updates or drops the entry of each
instance it touches, a failed transaction drops it, and a new process starts empty and reloads from SQLite.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from azure.durable_functions.models.history import HistoryEventType as T

from .history import Event

# h.event() writes EventType, EventId and IsPlayed first, so the flag of a recorded event is at a known place.
_RECORDED_PREFIX = re.compile(r'\{"EventType": -?\d+, "EventId": -?\d+, "IsPlayed": false')


def played_text(text: str) -> str:
    """The replayed form of a recorded event's JSON text: the same event with `IsPlayed` true (`as_replayed`)."""
    match = _RECORDED_PREFIX.match(text)
    if match is None:  # not written by h.event(): decode and encode it once
        return json.dumps({**json.loads(text), "IsPlayed": True})
    end = match.end()
    return f"{text[: end - 5]}true{text[end:]}"


@dataclass
class Bookkeeping:
    """Per-execution engine state: next sequence number, recorded action signatures, retry groups (a with-retry
    call: its kind, first task and policy; never changed once written), their attempt counts, and which group each
    retry-related task belongs to.

    An episode works on a `fork()` and its commit persists `delta(base)`; the cached copy changes only after the
    commit succeeded.
    """

    next_seq: int = 0
    recorded: list[dict[str, Any]] = field(default_factory=list)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Bookkeeping:
        """The base (the `state` column; a devhost before the journal kept the whole state there)."""
        return cls(
            next_seq=int(data.get("next_seq", 0)),
            recorded=list(data.get("recorded", [])),
            groups=dict(data.get("groups", {})),
            tasks=dict(data.get("tasks", {})),
            attempts=dict(data.get("attempts", {})),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "next_seq": self.next_seq,
            "recorded": self.recorded,
            "groups": self.groups,
            "tasks": self.tasks,
            "attempts": self.attempts,
        }

    def fork(self) -> Bookkeeping:
        """A copy an episode may change (entries are replaced or added, never changed in place)."""
        return Bookkeeping(self.next_seq, list(self.recorded), dict(self.groups), dict(self.tasks), dict(self.attempts))

    def delta(self, base: Bookkeeping) -> dict[str, Any] | None:
        """The journal entry that turns `base` into this (None when nothing changed); `recorded` only grows."""
        entry: dict[str, Any] = {}
        if self.next_seq != base.next_seq:
            entry["n"] = self.next_seq
        if len(self.recorded) > len(base.recorded):
            entry["r"] = self.recorded[len(base.recorded) :]
        for key, mine, theirs in (
            ("g", self.groups, base.groups),
            ("t", self.tasks, base.tasks),
            ("a", self.attempts, base.attempts),
        ):
            changed = {k: v for k, v in mine.items() if theirs.get(k) != v}
            if changed:
                entry[key] = changed
        return entry or None

    def fold(self, entry: dict[str, Any]) -> None:
        """Apply a journal entry."""
        self.next_seq = int(entry.get("n", self.next_seq))
        self.recorded.extend(entry.get("r", []))
        self.groups.update(entry.get("g", {}))
        self.tasks.update(entry.get("t", {}))
        self.attempts.update(entry.get("a", {}))


FRESH_BASE = json.dumps(Bookkeeping().to_json())
RETRIED_EVENTS = frozenset({T.TASK_SCHEDULED, T.SUB_ORCHESTRATION_INSTANCE_CREATED})


@dataclass
class Timeline:
    """One execution's history as the next episode replays it.

    `played` is the joined JSON of every recorded event with IsPlayed true; `next_seq` and `next_journal` are the
    next free row numbers, which the commit uses as its primary keys (a stale timeline cannot overwrite a row).
    """

    execution_id: str
    played: str = ""
    next_seq: int = 0
    next_journal: int = 0
    started: Event | None = None  # the ExecutionStarted event: input and version
    book: Bookkeeping = field(default_factory=Bookkeeping)
    scheduled: dict[int, Event] = field(default_factory=dict)  # with-retry calls' attempts: what a retry repeats

    def advance(
        self, texts: list[str], events: list[Event], started: Event | None, book: Bookkeeping, journaled: bool
    ) -> None:
        """Take in a committed episode: its events (decoded, and their texts as recorded) and the bookkeeping it
        persisted."""
        for event in events:
            if event["EventType"] in RETRIED_EVENTS and str(event["EventId"]) in book.tasks:
                self.scheduled[int(event["EventId"])] = event
        if texts:
            joined = ", ".join(played_text(t) for t in texts)
            self.played = f"{self.played}, {joined}" if self.played else joined
            self.next_seq += len(texts)
        if self.started is None:
            self.started = started
        self.book = book
        self.next_journal += int(journaled)


class TimelineCache:
    """Timelines of recently run instances, least recently used dropped first (they reload from SQLite)."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, Timeline] = OrderedDict()

    def get(self, instance_id: str, execution_id: str) -> Timeline | None:
        entry = self._entries.get(instance_id)
        if entry is None or entry.execution_id != execution_id:
            return None
        self._entries.move_to_end(instance_id)
        return entry

    def put(self, instance_id: str, timeline: Timeline) -> None:
        self._entries[instance_id] = timeline
        self._entries.move_to_end(instance_id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def drop(self, instance_id: str) -> None:
        self._entries.pop(instance_id, None)

    def clear(self) -> None:
        self._entries.clear()

    def __contains__(self, instance_id: str) -> bool:
        return instance_id in self._entries
