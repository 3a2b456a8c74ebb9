"""The records the Durable store reads and writes: instance rows, work items, timers, inbox messages, and the Commit
that carries everything one episode changes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .history import Event
from .timeline import Bookkeeping, Timeline

# The row's columns as InstanceRow holds them. The `state` column (the bookkeeping base) is not among them: it is
# written when an execution starts and read only to rebuild a timeline (see timeline.py).
INSTANCE_COLUMNS = (
    "instance_id",
    "name",
    "execution_id",
    "status",
    "input",
    "output",
    "custom_status",
    "created_time",
    "last_updated_time",
    "parent_instance_id",
    "parent_execution_id",
    "parent_task_id",
)


@dataclass
class InstanceRow:
    """One orchestration instance; `input`/`output`/`custom_status` are JSON text."""

    instance_id: str
    name: str
    execution_id: str
    status: str
    input: str | None
    output: str | None
    custom_status: str | None
    created_time: str
    last_updated_time: str
    parent_instance_id: str | None = None
    parent_execution_id: str | None = None
    parent_task_id: int | None = None

    def values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, c) for c in INSTANCE_COLUMNS)


@dataclass(frozen=True)
class WorkItem:
    id: int
    instance_id: str
    execution_id: str
    task_id: int
    name: str
    input: str | None


@dataclass(frozen=True)
class TimerItem:
    instance_id: str
    execution_id: str
    timer_id: int
    fire_at: str


@dataclass(frozen=True)
class Message:
    """An event addressed to an instance's inbox (a child's completion for its parent, for instance)."""

    instance_id: str
    execution_id: str
    event: Event


@dataclass(frozen=True)
class Pending:
    """An instance's inbox as read (no write): the current execution's messages, oldest first, with their JSON text
    as stored (it becomes the history row unchanged), and the ids of older executions' messages, which the next
    write for the instance removes."""

    messages: list[tuple[int, Event]]
    texts: dict[int, str]
    stale: list[int]


@dataclass
class Commit:
    """Everything one episode (or a terminate) changes, applied in one transaction.

    `base` is the row as read: the columns in which `row` differs are written, and its execution id must still be
    the instance's. `encoded` holds the JSON text of the first events of `append` (encoded once, for the replay).
    `timeline` is what the episode replayed (its free row numbers are checked); `book` the bookkeeping to journal
    (None: none, the execution ends or starts over).
    """

    row: InstanceRow
    base: InstanceRow
    consumed: list[int] = field(default_factory=list)
    append: list[Event] = field(default_factory=list)
    encoded: list[str] = field(default_factory=list)
    reset_history: bool = False
    timeline: Timeline | None = None
    book: Bookkeeping | None = None
    work: list[tuple[int, str, str | None]] = field(default_factory=list)
    timers: list[tuple[int, str]] = field(default_factory=list)
    children: list[tuple[InstanceRow, Event]] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    drop_pending: bool = False
    ends: bool = False  # the instance reaches a terminal status: its timeline is dropped
    # (partition, owner): the episode commits only while `owner` holds the instance's partition (hub.py); its work
    # items are owned by `owner`. None: a client operation (terminate), from any host.
    fence: tuple[int, str] | None = None


@dataclass(frozen=True)
class Member:
    """A host that joined the task hub (devhost/durable/hub.py): its owner id, process (pid and start, from
    devhost/processes.py, to tell it from a later process with the same pid), its wake-up socket, and what it ran
    (recorded now and then)."""

    owner: str
    pid: int
    started: float
    socket: str
    episodes: int = 0
    activities: int = 0


@dataclass
class Rebalance:
    """What one look at the hub's members decides for one host: the members found dead (they leave and free their
    partitions), the partitions to take and to give back, and the members alive after it. `acquired` is filled in
    by the store: the partitions it could take."""

    live: set[str]
    dead: list[str] = field(default_factory=list)
    acquire: list[int] = field(default_factory=list)
    release: list[int] = field(default_factory=list)
    acquired: list[int] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.dead or self.acquire or self.release)


class Conflict(Exception):
    """The store changed since an episode read it (another writer); nothing of the episode was written."""


class Fenced(Conflict):
    """The episode's host no longer holds the instance's partition (hub.py); nothing was written."""


@dataclass(frozen=True)
class Leases:
    """Partition leases as the Azure Storage provider keeps them (devhost/durable/timing.py), for one look at `now`
    (epoch seconds): the host's own leases are renewed for `renew_s`, a free or expired one is claimed for `claim_s`,
    and only a `periodic` look (the partition manager's pass) takes a lease another host let expire."""

    now: float
    renew_s: float
    claim_s: float
    periodic: bool = True
