"""The worker side of the durable engine: dispatches episodes, runs activities and timers, shares the task hub.

Event-driven on the host's loop: an instance is replayed when a message lands in its inbox; activities run as
tasks bounded by a semaphore; one timer task sleeps exactly until the next due timer. An idle engine waits on
nothing but asyncio events. `start()` resumes whatever the SQLite store holds (crash recovery).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import logging
import sqlite3
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from . import history as h
from .binding import WEBHOOK_PREFIX, client_binding_json
from .episode import TERMINAL, Episode, Outcome, failure_details
from .hub import DEFAULT_PARTITIONS, HubMembership, process_alive
from .records import Commit, Conflict, Fenced, InstanceRow, Member, Message, TimerItem, WorkItem
from .store import Store
from .timing import LocalTiming
from .versioning import VersioningPolicy

log = logging.getLogger("devhost.durable")
MAX_CONFLICTS = 3


def utcnow() -> datetime:
    return datetime.now(UTC)


class Dispatcher:
    """The worker side of DurableEngine for one task hub in one SQLite file: episodes, activities, timers."""

    def __init__(
        self,
        *,
        db_path: Path,
        functions: Iterable[Any],
        invoke: Any,
        max_concurrent_activities: int = 8,
        clock: Callable[[], datetime] = utcnow,
        task_hub: str = "devhost",
        versioning: VersioningPolicy | None = None,
        partition_count: int = DEFAULT_PARTITIONS,
        alive: Callable[[Member], bool] = process_alive,
        timing: LocalTiming | None = None,
    ) -> None:
        self.db_path = Path(db_path)
        self.task_hub = task_hub
        # host.json defaultVersion / versionMatchStrategy / versionFailureStrategy (see versioning.py).
        self.versioning = versioning or VersioningPolicy()
        self._invoke = invoke
        self._clock = clock
        self._max_activities = max_concurrent_activities
        self._orchestrators: dict[str, Any] = {}
        self._activities: dict[str, Any] = {}
        self._entities: dict[str, Any] = {}
        for fn in functions:
            kind = getattr(fn.get_trigger(), "type", None)
            table = {
                "orchestrationTrigger": self._orchestrators,
                "activityTrigger": self._activities,
                "entityTrigger": self._entities,
            }.get(str(kind))
            if table is not None:
                table[fn.get_function_name()] = fn
        self._base_url = "http://127.0.0.1:7071"
        self._store: Store | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._running: set[str] = set()
        self._again: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        self._timers: list[tuple[datetime, int, TimerItem]] = []
        self._timer_seq = itertools.count()
        self._timer_wakeup = asyncio.Event()
        self._changed = asyncio.Condition()
        self._slots: asyncio.Semaphore | None = None
        self._stopping = False
        self._rejected: set[tuple[str, str]] = set()  # (instance, execution) already logged as rejected
        self._conflicts: dict[str, int] = {}  # instance -> episodes refused in a row (see _conflict)
        # Membership of the task hub, shared with other devhost processes (hub.py).
        self._partition_count = partition_count
        self._alive = alive
        self.timing = timing or LocalTiming()  # `--timing` (timing.py): local, or the Azure Storage provider's
        self.hub: HubMembership | None = None
        self._look_lock = asyncio.Lock()
        self._looks_wanted = False
        self._inbox_owed = False
        self._unread: set[int] = set()  # partitions taken whose inbox and timers are not read yet
        if hasattr(invoke, "set_client_binding"):
            invoke.set_client_binding(self.client_binding_json)

    # ---- lifecycle -----------------------------------------------------------------------------------------
    def set_base_url(self, base_url: str) -> None:
        self._base_url = base_url.rstrip("/")

    @property
    def rpc_base_url(self) -> str:
        return f"{self._base_url}{WEBHOOK_PREFIX}/"

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError("DurableEngine.start() has not been called")
        return self._store

    async def start(self) -> None:
        """Open the store on the running loop and resume persisted work, timers and pending messages."""
        self._store = Store(self.db_path)
        self._stopping = False
        self._slots = asyncio.Semaphore(self._max_activities)
        self._timer_wakeup = asyncio.Event()
        self._changed = asyncio.Condition()
        self._spawn(self._timer_loop(), "durable-timers")
        self.hub = HubMembership(self.store, self._partition_count, self._alive)
        sock = self.hub.join()
        self._look_lock = asyncio.Lock()
        asyncio.get_running_loop().add_reader(sock.fileno(), self._woken)
        await self._look(periodic=True)  # takes the partitions (all of them when alone), adopts what dead ones left
        self.hub.wake_all()  # the others make room now
        self._spawn(self._look_loop(), "durable-hub")

    async def stop(self, *, leave: bool = True) -> None:
        """Stop dispatching; unfinished activities stay persisted and run again at the next start, or on another
        host of the hub. `leave=False` stops as a crash would: the partitions stay held until a look finds this
        member dead (tests)."""
        self._stopping = True
        if self.hub is not None:
            hub, self.hub = self.hub, None
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(hub.fileno())
            try:
                if leave:
                    hub.leave()
            except (sqlite3.Error, OSError) as exc:  # the others find it dead at their next look instead
                log.warning("could not leave the task hub in order: %s", exc)
            finally:
                hub.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._running.clear()
        self._again.clear()
        self._timers.clear()
        if self._store is not None:
            self._store.close()
            self._store = None

    def poke(self) -> None:
        """Re-evaluate due timers now (for an injected clock that was moved forward)."""
        self._timer_wakeup.set()

    # ---- the client binding --------------------------------------------------------------------------------
    def client_binding_json(self) -> str:
        """What a durableClient parameter receives (DurableOrchestrationBindings JSON)."""
        return client_binding_json(self._base_url, self.task_hub)

    def management_payload(self, instance_id: str) -> dict[str, str]:
        urls = json.loads(self.client_binding_json())["managementUrls"]
        return {k: v.replace("INSTANCEID", instance_id) for k, v in urls.items()}

    # ---- dispatch ------------------------------------------------------------------------------------------
    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._reap)

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("durable task %s crashed", task.get_name(), exc_info=task.exception())

    def _lock(self, instance_id: str) -> asyncio.Lock:
        return self._locks.setdefault(instance_id, asyncio.Lock())

    def _mark(self, instance_id: str) -> None:
        """Schedule the replay of an instance whose inbox has messages (at most one drain per instance); an instance
        of a partition another host holds is that host's: wake it."""
        if self._stopping:
            return
        if self.hub is not None and not self.hub.owns(instance_id):
            if not self.timing.polls:  # on Azure Storage the holder finds it at its next poll of the control queue
                self.hub.wake_owner_of(instance_id)
            return
        if self.hub is not None:
            self.timing.enqueued(self.hub.partition(instance_id))
        if instance_id in self._running:
            self._again.add(instance_id)
            return
        self._running.add(instance_id)
        self._spawn(self._drain(instance_id), f"durable-instance:{instance_id}")

    async def _drain(self, instance_id: str) -> None:
        try:
            while True:
                self._again.discard(instance_id)
                progressed = await self._step(instance_id)
                if not progressed and instance_id not in self._again:
                    return
        finally:
            self._running.discard(instance_id)

    async def _step(self, instance_id: str) -> bool:
        """Run one episode of the instance if its inbox holds messages for it. Reads first: an instance with
        nothing to do costs no write transaction."""
        async with self._lock(instance_id):
            hub = self.hub
            if hub is None or not hub.owns(instance_id):
                return False  # the partition went to another host, which reads its inbox
            row = self.store.instance(instance_id)
            if row is None:
                return False
            pending = self.timing.dequeue(self.store, hub.owner, instance_id, row.execution_id, self._clock())
            if not pending.messages or row.status in TERMINAL:  # late messages of a finished instance are dropped
                dropped = pending.stale + [i for i, _ in pending.messages]
                if dropped:
                    self.store.drop_messages(dropped)
                return False
            try:
                timeline = self.store.timeline(instance_id, row.execution_id)
                episode = Episode(
                    row=row,
                    timeline=timeline,
                    batch=pending.messages,
                    texts=pending.texts,
                    stale=pending.stale,
                    now=self._clock(),
                    orchestrators=frozenset(self._orchestrators),
                    activities=frozenset(self._activities),
                    is_busy=self._busy,
                )
                if self.versioning.complies(episode.version):
                    commit = episode.finish(await self._replay(row, episode))
                elif self.versioning.rejects:
                    self._reject(row, episode.version)
                    return False  # the messages stay in the inbox, as an abandoned work item stays in its queue
                else:
                    commit = episode.version_mismatch()
                commit.fence = (hub.partition(instance_id), hub.owner)
                work, timers = self.store.commit(commit)
            except Fenced as exc:  # another host holds the partition now, and runs the episode
                log.info("episode of %s not committed: %s", instance_id, exc)
                self.timing.abandon(self.store, pending)
                self._request_look()
                return False
            except Conflict as exc:
                return self._conflict(instance_id, exc)
            self._conflicts.pop(instance_id, None)
            hub.episodes += 1
        self._after_commit(commit, work, timers)
        await self._notify()
        return True

    def _conflict(self, instance_id: str, exc: Conflict) -> bool:
        """Another writer changed the instance after this step read it: nothing was written and the cached
        timeline is gone, so the step runs again on what the store holds now. A conflict that repeats is a bug,
        not a race: the drain stops and the messages wait for the next one."""
        count = self._conflicts[instance_id] = self._conflicts.get(instance_id, 0) + 1
        if count >= MAX_CONFLICTS:
            self._conflicts.pop(instance_id, None)
            log.error("episode of %s not committed %d times in a row, giving up for now: %s", instance_id, count, exc)
            return False
        log.warning("episode of %s not committed, running it again: %s", instance_id, exc)
        return True

    async def _replay(self, row: InstanceRow, episode: Episode) -> Outcome:
        fn = self._orchestrators.get(row.name)
        if fn is None:
            return Outcome(state=None, error=f"The orchestrator function '{row.name}' is not registered.")
        try:
            result = await self._invoke.call(fn, {fn.get_trigger().name: episode.context_json()})
        except Exception as exc:  # noqa: BLE001  (an orchestrator failure is data: it fails the instance)
            return Outcome.from_exception(exc)
        return Outcome.from_result(result)

    def _reject(self, row: InstanceRow, version: str | None) -> None:
        """versionFailureStrategy Reject: DurableTask.Core abandons the work item and the instance stays as it is
        until a worker whose version complies takes it; here, until devhost starts with such a host.json."""
        key = (row.instance_id, row.execution_id)
        if key in self._rejected:
            return
        self._rejected.add(key)
        log.warning(
            "orchestration %s (%s) has version %r, which this host does not run (%s); it stays %s until devhost "
            "starts with a host.json whose defaultVersion accepts it",
            row.instance_id,
            row.name,
            version,
            self.versioning.describe(),
            row.status,
        )

    def _busy(self, instance_id: str) -> bool:
        row = self.store.instance(instance_id)
        return row is not None and row.status not in TERMINAL

    def _after_commit(self, commit: Commit, work: list[WorkItem], timers: list[TimerItem]) -> None:
        for item in work:
            self._spawn_work(item)
        if work:
            self.timing.work_enqueued()
        for timer in timers:
            self._add_timer(timer)
        targets = {m.instance_id for m in commit.messages} | {c.instance_id for c, _ in commit.children}
        for instance_id in targets:
            self._mark(instance_id)
        if commit.ends and self.hub is not None:
            self.hub.wake_all()  # status waits on the other hosts (see hub.py)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # ---- the task hub's members (hub.py) ---------------------------------------------------------------------
    def _woken(self) -> None:
        """A wake-up datagram arrived: another host committed something for one of our partitions, or the members
        changed. Look again (coalesced: one look runs at a time, and one more follows if woken meanwhile)."""
        assert self.hub is not None
        self.hub.drain()
        if self.timing.polls:  # a status wait may be waiting on another host; messages wait for a poll
            self._spawn(self._notify(), "durable-hub-notify")
        self._request_look()

    def _request_look(self) -> None:
        self._looks_wanted = True
        if not self._look_lock.locked() and not self._stopping:
            self._spawn(self._look(read_inbox=not self.timing.polls), "durable-hub-look")

    async def _look_loop(self) -> None:
        while True:
            await asyncio.sleep(self.timing.look_seconds)
            try:
                await self._look(periodic=True)
            except (sqlite3.Error, OSError) as exc:  # the hub file busy past its timeout, a socket error: next look
                log.warning("task hub look failed, trying again in %.0f s: %s", self.timing.look_seconds, exc)

    async def _look(self, *, read_inbox: bool = False, periodic: bool = False) -> None:
        """Find dead members, rebalance the partitions and adopt orphaned work (hub.py); read the inbox and timers
        of every partition taken, and, after a wake-up, the inbox of every partition held.

        What a look owes stays owed until a look completes it: the partitions taken but not read yet, and the inbox
        read a wake-up asked for. A look that fails part-way (the hub file busy past its timeout) leaves them to the
        next one, so no partition and no wake-up is lost."""
        async with self._look_lock:
            while True:
                self._looks_wanted = False
                hub = self.hub
                if hub is None or self._stopping:
                    return
                read_inbox = self._inbox_owed = read_inbox or self._inbox_owed
                change, adopted = hub.look(self.timing.leases(self._clock(), periodic))
                periodic = False
                if change.dead and not self.timing.polls:  # a member that died between a COMMIT and its datagram
                    read_inbox = self._inbox_owed = True  # to us: read our inboxes
                for item in adopted:
                    self._spawn_work(item)
                self._unread.update(change.acquired)
                self._unread &= hub.mine
                taken = set(self._unread)
                if taken:
                    for timer in self.store.pending_timers():  # a timer loaded twice fires once (fire_timer)
                        if hub.partition(timer.instance_id) in taken:
                            self._add_timer(timer)
                if taken or read_inbox:
                    scope = hub.mine if read_inbox else taken
                    for instance_id in self.store.instances_with_inbox():
                        if hub.partition(instance_id) in scope:
                            self._mark(instance_id)
                    self._unread -= taken
                    self._inbox_owed = False
                    await self._notify()
                self.timing.sync(self)
                if not self._looks_wanted:
                    return
                read_inbox = not self.timing.polls

    # ---- activities ----------------------------------------------------------------------------------------
    def _spawn_work(self, item: WorkItem) -> None:
        self._spawn(self._run_work(item), f"durable-activity:{item.name}:{item.instance_id}:{item.task_id}")

    async def _run_work(self, item: WorkItem) -> None:
        assert self._slots is not None
        async with self._slots:
            if not self._stopping:
                self.timing.work_started(self.store, item, self._clock())
            event = await self._execute(item)
        if self._stopping:
            return
        if self.hub is not None:
            self.hub.activities += 1
        while not self._stopping:
            try:
                completed = self.store.complete_work(item.id, Message(item.instance_id, item.execution_id, event))
                break
            except sqlite3.Error as exc:  # the hub file busy past its timeout: the result is kept and tried again
                log.warning("activity result of %s not recorded yet, trying again: %s", item.instance_id, exc)
                await asyncio.sleep(1.0)
        else:
            return
        if completed:
            self._mark(item.instance_id)

    async def _execute(self, item: WorkItem) -> h.Event:
        fn = self._activities.get(item.name)
        try:
            if fn is None:
                raise LookupError(f"Activity function '{item.name}' does not exist.")
            result = await self._invoke.call(fn, {fn.get_trigger().name: item.input})
        except Exception as exc:  # noqa: BLE001  (an activity failure is data: TaskFailed)
            reason = f"Activity function '{item.name}' failed: {type(exc).__name__}: {exc}"
            return h.task_failed(self._clock(), item.task_id, reason, failure_details(exc))
        return h.task_completed(self._clock(), item.task_id, result)

    # ---- timers --------------------------------------------------------------------------------------------
    def _add_timer(self, timer: TimerItem) -> None:
        heapq.heappush(self._timers, (h.parse_time(timer.fire_at), next(self._timer_seq), timer))
        self._timer_wakeup.set()

    async def _timer_loop(self) -> None:
        while True:
            self._timer_wakeup.clear()
            now = self._clock()
            while self._timers and self._timers[0][0] <= now:
                timer = heapq.heappop(self._timers)[2]
                try:
                    self._fire(timer)
                except sqlite3.Error as exc:  # the hub file busy past its timeout: fire it again in a second
                    log.warning("timer of %s not fired yet, trying again: %s", timer.instance_id, exc)
                    heapq.heappush(self._timers, (now + timedelta(seconds=1), next(self._timer_seq), timer))
                    break
            delay = (self._timers[0][0] - now).total_seconds() if self._timers else None
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancel that arrives as the wake-up
            # does (cpython gh-86296), and `stop()` would then wait for this loop forever.
            try:
                async with asyncio.timeout(delay):
                    await self._timer_wakeup.wait()
            except TimeoutError:
                pass

    def _fire(self, timer: TimerItem) -> None:
        if self.hub is not None and not self.hub.owns(timer.instance_id):
            return  # the partition went to another host, which loaded its timers when it took it
        event = h.timer_fired(self._clock(), timer.timer_id, timer.fire_at)
        fired = self.store.fire_timer(timer, Message(timer.instance_id, timer.execution_id, event))
        if fired and not self.timing.polls:  # on Azure Storage a timer message is visible at fire_at, and read then
            self._mark(timer.instance_id)  # at the next poll of its control queue
