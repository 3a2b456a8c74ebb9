"""One orchestration episode: new events in, replay through the SDK, the resulting history and work out.

The engine side of what DTFx and the extension's out-of-process shim do. The SDK hands out sequence numbers
(EventId / TaskScheduledId / TimerId) in the order it opens tasks, including the timer and re-scheduled task a
`*_with_retry` call opens after a failure (azure/durable_functions/models/Task.py RetryAbleTask). The engine
must
hand out the same numbers. It does so by putting at most one retry-related event in an episode, always first:
the
SDK then opens the retry task (if any) before user code resumes and schedules new actions, in that order.
"""

from __future__ import annotations

import json
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from azure.durable_functions.models.actions.ActionType import ActionType as A
from azure.durable_functions.models.history import HistoryEventType as T

from . import history as h
from .actions import ENTITY_ACTIONS, Action, flatten, nondeterminism
from .errors import ENTITIES_NOT_SUPPORTED
from .records import Commit, InstanceRow, Message
from .retry import RetryPolicy
from .timeline import Bookkeeping, Timeline
from .versioning import MISMATCH_OUTPUT

OUT_OF_PROC_MARKER = "$OutOfProcData$:"
UPPER_SCHEMA_VERSION = 2  # ReplaySchema.V3, the newest this SDK speaks
TERMINAL = frozenset({"Completed", "Failed", "Terminated", "Canceled"})
ACTIVITY_KINDS = frozenset({A.CALL_ACTIVITY, A.CALL_ACTIVITY_WITH_RETRY})
SUB_ORCHESTRATION_KINDS = frozenset({A.CALL_SUB_ORCHESTRATOR, A.CALL_SUB_ORCHESTRATOR_WITH_RETRY})


def is_retry_event(event: h.Event, state: Bookkeeping) -> bool:
    """A failure of a with-retry call, or the firing of its retry timer: both make the SDK open a new task."""
    kind = event["EventType"]
    if kind in (T.TASK_FAILED, T.SUB_ORCHESTRATION_INSTANCE_FAILED):
        return _task(state, event.get("TaskScheduledId")).get("role") == "call"
    if kind == T.TIMER_FIRED:
        return _task(state, event.get("TimerId")).get("role") == "timer"
    return False


def select_batch(inbox: list[tuple[int, h.Event]], state: Bookkeeping) -> list[tuple[int, h.Event]]:
    """The first message plus the following ones up to (not including) the next retry-related event."""
    batch = inbox[:1]
    for item in inbox[1:]:
        if is_retry_event(item[1], state):
            break
        batch.append(item)
    return batch


def _task(state: Bookkeeping, task_id: Any) -> dict[str, Any]:
    return dict(state.tasks.get(str(task_id), {}))


@dataclass
class Outcome:
    """What the orchestrator returned: the decoded state, or the error it raised."""

    state: dict[str, Any] | None
    error: str | None = None

    @classmethod
    def from_result(cls, result: Any) -> Outcome:
        return cls(state=json.loads(result) if isinstance(result, str) else dict(result))

    @classmethod
    def from_exception(cls, exc: BaseException) -> Outcome:
        text = str(exc)
        if OUT_OF_PROC_MARKER not in text:
            return cls(state=None, error=f"{type(exc).__name__}: {text}")
        message, _, payload = text.partition(OUT_OF_PROC_MARKER)
        return cls(state=json.loads(payload), error=message.strip())


@dataclass
class Episode:
    """Plans one episode of one instance. `context_json()` gives the orchestrator's input, `finish()` the Commit.

    `timeline` is the history so far (read only: the store advances it once the commit is in); `texts` the stored
    JSON of the batch's inbox messages, which become history rows as they are; `stale` the ids of older executions'
    messages, removed by the same commit.
    """

    row: InstanceRow
    timeline: Timeline
    batch: list[tuple[int, h.Event]]
    now: datetime
    orchestrators: frozenset[str]
    is_busy: Callable[[str], bool]
    texts: dict[int, str] = field(default_factory=dict)
    stale: list[int] = field(default_factory=list)
    _commit: Commit = field(init=False)
    _state: Bookkeeping = field(init=False)
    # The instance's version: its ExecutionStarted's, as the SDK reads `context.version` (None without one; instances
    # recorded before devhost had versions carry "", as the pre-3.1 extension gave them).
    version: str | None = field(init=False)

    def __post_init__(self) -> None:
        self._state = self.timeline.book.fork()
        started = h.event(T.ORCHESTRATOR_STARTED, self.now)
        self._new = [started] + [e for _, e in self.batch]
        self._new_texts = [json.dumps(started)] + [self.texts.get(i) or json.dumps(e) for i, e in self.batch]
        self._started = self.timeline.started or next(
            (e for e in self._new if e["EventType"] == T.EXECUTION_STARTED), None
        )
        self.version = self._started.get("Version") if self._started is not None else None
        self._commit = Commit(
            row=replace(self.row),
            base=self.row,
            consumed=[i for i, _ in self.batch] + list(self.stale),
            append=list(self._new),
            encoded=list(self._new_texts),
            timeline=self.timeline,
        )
        self._expand_retry(self._new[1])

    # ---- phase 1 -------------------------------------------------------------------------------------------
    def context_json(self) -> str:
        """The orchestrationTrigger payload (DurableOrchestrationContext.from_json): the recorded events as
        replayed (IsPlayed true), then this episode's new ones, joined from their JSON texts."""
        if self._started is None:
            raise LookupError(f"instance {self.row.instance_id} has no ExecutionStarted event")
        past = self.timeline.played
        new = ", ".join(self._new_texts)
        rest = json.dumps(
            {
                "instanceId": self.row.instance_id,
                "isReplaying": bool(past),
                "parentInstanceId": self.row.parent_instance_id,
                "input": self._started.get("Input"),
                "upperSchemaVersion": UPPER_SCHEMA_VERSION,
                "upperSchemaVersionNew": UPPER_SCHEMA_VERSION,
            }
        )
        return f'{{"history": [{past}{", " if past else ""}{new}], {rest[1:]}'

    # ---- phase 2 -------------------------------------------------------------------------------------------
    def finish(self, outcome: Outcome) -> Commit:
        row = self._commit.row
        row.last_updated_time = h.format_time(self.now)
        row.status = "Running"
        actions = flatten((outcome.state or {}).get("actions") or [])
        if outcome.state is not None:
            custom = outcome.state.get("customStatus")
            row.custom_status = json.dumps(custom) if custom is not None else None
        mismatch = nondeterminism(self._state.recorded, actions, finished=outcome.error is None)
        if mismatch:
            return self._fail(mismatch)
        if outcome.error is not None:
            return self._fail(outcome.error)
        unsupported = self._schedule(actions[len(self._state.recorded) :])
        if unsupported:
            return self._fail(unsupported)
        assert outcome.state is not None
        if outcome.state.get("isDone"):
            continue_as_new = next((a for a in actions if a.kind == A.CONTINUE_AS_NEW), None)
            if continue_as_new is not None:
                return self._continue_as_new(continue_as_new)
            return self._complete(outcome.state.get("output"))
        return self._close()

    # ---- scheduling ----------------------------------------------------------------------------------------
    def _take_id(self) -> int:
        task_id = self._state.next_seq
        self._state.next_seq = task_id + 1
        return task_id

    def _schedule(self, new_actions: list[Action]) -> str | None:
        for action in new_actions:
            position = len(self._state.recorded)
            if action.kind in ENTITY_ACTIONS:
                return ENTITIES_NOT_SUPPORTED
            if action.kind == A.CALL_HTTP:
                return "call_http (durable HTTP) is not supported by devhost; call the service from an activity."
            self._state.recorded.append(action.signature)
            if action.kind == A.CREATE_TIMER:
                self._create_timer(self._take_id(), str(action.fire_at))
            elif action.kind in ACTIVITY_KINDS or action.kind in SUB_ORCHESTRATION_KINDS:
                self._call(action, position)
        return None

    def _call(self, action: Action, position: int) -> None:
        task_id = self._take_id()
        target: dict[str, Any] = {
            "kind": int(action.kind),
            "name": action.name,
            "input": action.input,
            "instance_id": action.instance_id or f"{self.row.instance_id}:{task_id:04d}",
            "version": action.version,
        }
        if action.retry is not None:
            # What the history does not hold: the call itself is its first attempt's event (`_target`).
            self._state.groups[str(position)] = {
                "kind": int(action.kind),
                "first": task_id,
                "retry": action.retry.to_json(),
            }
            self._state.tasks[str(task_id)] = {"group": str(position), "role": "call"}
        self._dispatch(target, task_id)

    def _target(self, group: dict[str, Any]) -> dict[str, Any]:
        """A retried call, from its first attempt's TaskScheduled or SubOrchestrationInstanceCreated (whose Version
        is the one the child got). A group recorded by an older devhost holds the call itself."""
        if "name" in group:
            return group
        first = self.timeline.scheduled[int(group["first"])]
        return {
            "kind": group["kind"],
            "name": first["Name"],
            "input": first.get("Input"),
            "instance_id": first.get("InstanceId"),
            "version": first.get("Version"),
        }

    def _dispatch(self, target: dict[str, Any], task_id: int) -> None:
        if target["kind"] in ACTIVITY_KINDS:
            self._commit.append.append(
                h.event(T.TASK_SCHEDULED, self.now, task_id, Name=target["name"], Input=target["input"])
            )
            self._commit.work.append((task_id, target["name"], target["input"]))
        else:
            self._start_child(target, task_id)

    def _start_child(self, target: dict[str, Any], task_id: int) -> None:
        name, child_id = target["name"], target["instance_id"]
        # The version asked for (call_sub_orchestrator(version=...), extension PR #3213), else the parent's own: a
        # sub-orchestration inherits its parent's version, even when the host's defaultVersion has moved on
        # (extension test/Common/OrchestrationVersionTests.cs ExistingOrchestrationVersionIsImmutable, PR #3072).
        requested = target.get("version")
        version = self.version if requested is None else requested
        self._commit.append.append(
            h.event(
                T.SUB_ORCHESTRATION_INSTANCE_CREATED,
                self.now,
                task_id,
                Name=name,
                Version=version,
                InstanceId=child_id,
                Input=target["input"],
            )
        )
        problem = None
        if name not in self.orchestrators:
            problem = f"The function '{name}' doesn't exist, is disabled, or is not an orchestrator function."
        elif self.is_busy(child_id):
            problem = f"An orchestration with instance ID '{child_id}' is already running."
        if problem:
            failed = h.sub_orchestration_failed(self.now, task_id, problem, json.dumps({"Message": problem}))
            self._commit.messages.append(Message(self.row.instance_id, self.row.execution_id, failed))
            return
        child = new_row(child_id, name, target["input"], self.now, parent=(self.row, task_id))
        first = h.execution_started(
            self.now, name, target["input"], version=version, parent_instance_id=self.row.instance_id
        )
        self._commit.children.append((child, first))

    def _create_timer(self, timer_id: int, fire_at: str) -> None:
        self._commit.append.append(h.event(T.TIMER_CREATED, self.now, timer_id, FireAt=fire_at))
        self._commit.timers.append((timer_id, fire_at))

    def _expand_retry(self, first: h.Event) -> None:
        """Open the retry timer after a failed attempt, or the next attempt after that timer."""
        if not is_retry_event(first, self._state):
            return
        key = first["TimerId"] if first["EventType"] == T.TIMER_FIRED else first["TaskScheduledId"]
        task = _task(self._state, key)
        position = task["group"]
        group = self._state.groups[position]
        attempt = self._state.attempts.get(position, group.get("attempt", 1))
        policy = RetryPolicy.from_json(group["retry"])
        if task["role"] == "call":
            timer_id = self._take_id()
            self._state.tasks[str(timer_id)] = {"group": position, "role": "timer"}
            self._create_timer(timer_id, h.format_time(self.now + policy.delay_after_attempt(attempt)))
        elif policy.may_retry_after(attempt):
            self._state.attempts[position] = attempt + 1
            task_id = self._take_id()
            self._state.tasks[str(task_id)] = {"group": position, "role": "call"}
            self._dispatch(self._target(group), task_id)

    # ---- endings -------------------------------------------------------------------------------------------
    def _close(self) -> Commit:
        self._commit.append.append(h.event(T.ORCHESTRATOR_COMPLETED, self.now))
        self._commit.book = self._state
        return self._commit

    def _end(self, status: str, output: Any, parent_event: h.Event | None) -> Commit:
        commit = self._close()
        commit.row.status = status
        commit.row.output = json.dumps(output)
        commit.work, commit.timers, commit.children = [], [], []
        commit.messages = [m for m in commit.messages if m.instance_id != self.row.instance_id]
        commit.drop_pending, commit.ends, commit.book = True, True, None
        commit.append.append(
            h.event(T.EXECUTION_COMPLETED, self.now, OrchestrationStatus=status, Result=commit.row.output)
        )
        row = self.row
        if row.parent_instance_id and row.parent_execution_id and parent_event is not None:
            commit.messages.append(Message(row.parent_instance_id, row.parent_execution_id, parent_event))
        return commit

    def _complete(self, output: Any) -> Commit:
        task_id = int(self.row.parent_task_id or 0)
        return self._end("Completed", output, h.sub_orchestration_completed(self.now, task_id, json.dumps(output)))

    def _fail(self, message: str) -> Commit:
        text = f"Orchestrator function '{self.row.name}' failed: {message}"
        details = json.dumps({"Message": message, "ClassName": "OrchestrationFailureException"})
        task_id = int(self.row.parent_task_id or 0)
        return self._end("Failed", text, h.sub_orchestration_failed(self.now, task_id, text, details))

    def version_mismatch(self) -> Commit:
        """versionFailureStrategy Fail: the instance ends Failed without running the orchestrator, as
        TaskOrchestrationDispatcher's OrchestrationCompleteOrchestratorAction with FailureDetails("VersionMismatch",
        ...) does; a parent gets SubOrchestrationInstanceFailed with that action's (null) Result and Details."""
        self._commit.append = list(self._new)  # none of this episode's retry planning
        self._commit.row.last_updated_time = h.format_time(self.now)
        task_id = int(self.row.parent_task_id or 0)
        return self._end("Failed", MISMATCH_OUTPUT, h.sub_orchestration_failed(self.now, task_id, None, None))

    def _continue_as_new(self, action: Action) -> Commit:
        commit = self._close()
        row = commit.row
        row.execution_id, row.input = uuid.uuid4().hex, json.dumps(action.input)
        commit.reset_history, commit.book = True, None
        commit.append, commit.encoded, commit.work, commit.timers = [], [], [], []
        commit.messages = [
            Message(
                row.instance_id,
                row.execution_id,
                # The next generation keeps the instance's version: the Python SDK's ContinueAsNewAction has none,
                # and DurableTask.Core sets `Version = NewVersion ?? runtimeState.Version`
                # (TaskOrchestrationDispatcher.ProcessWorkflowCompletedTaskDecision).
                h.execution_started(
                    self.now,
                    row.name,
                    action.input,
                    version=self.version,
                    parent_instance_id=row.parent_instance_id,
                ),
            )
        ]
        return commit


def new_row(
    instance_id: str,
    name: str,
    orchestration_input: str | None,
    now: datetime,
    *,
    parent: tuple[InstanceRow, int] | None = None,
) -> InstanceRow:
    """A Pending instance; `orchestration_input` is the serialized input the orchestrator will read."""
    moment = h.format_time(now)
    parent_row, task_id = parent if parent else (None, None)
    return InstanceRow(
        instance_id=instance_id,
        name=name,
        execution_id=uuid.uuid4().hex,
        status="Pending",
        input=json.dumps(orchestration_input) if orchestration_input is not None else None,
        output=None,
        custom_status=None,
        created_time=moment,
        last_updated_time=moment,
        parent_instance_id=parent_row.instance_id if parent_row else None,
        parent_execution_id=parent_row.execution_id if parent_row else None,
        parent_task_id=task_id,
    )


def failure_details(exc: BaseException) -> str:
    """TaskFailed Details: the serialized cause, as the extension's Utils.SerializeCause provides it."""
    return json.dumps(
        {
            "Message": str(exc),
            "ClassName": type(exc).__name__,
            "StackTraceString": "".join(traceback.format_exception(exc)),
        }
    )
