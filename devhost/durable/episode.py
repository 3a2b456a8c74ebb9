"""One orchestration episode: new events in, replay through the SDK, the resulting history and work out.

The SDK's answer is not carried out as it is: the extension's out-of-process shim replays it against the history
(shim.py), and only what that replay schedules, ends or fails happens, with the sequence ids DurableTask.Core hands
out. An episode takes every message waiting in the instance's inbox, as a DurableTask.Core work item does.
"""

from __future__ import annotations

import json
import logging
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from azure.durable_functions.models.actions.ActionType import ActionType as A
from azure.durable_functions.models.history import HistoryEventType as T

from . import history as h
from . import shim
from .actions import ENTITY_ACTIONS, flatten
from .errors import ENTITIES_NOT_SUPPORTED
from .records import Commit, InstanceRow, Message
from .timeline import Timeline
from .versioning import MISMATCH_OUTPUT

log = logging.getLogger("devhost.durable")
OUT_OF_PROC_MARKER = "$OutOfProcData$:"
UPPER_SCHEMA_VERSION = 2  # ReplaySchema.V3, the newest this SDK speaks
TERMINAL = frozenset({"Completed", "Failed", "Terminated", "Canceled"})


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
    activities: frozenset[str] = frozenset()
    texts: dict[int, str] = field(default_factory=dict)
    stale: list[int] = field(default_factory=list)
    _commit: Commit = field(init=False)
    # The instance's version: its ExecutionStarted's, as the SDK reads `context.version` (None without one; instances
    # recorded before devhost had versions carry "", as the pre-3.1 extension gave them).
    version: str | None = field(init=False)

    def __post_init__(self) -> None:
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
        state = outcome.state
        if state is not None:
            custom = state.get("customStatus")
            row.custom_status = json.dumps(custom) if custom is not None else None
            unsupported = _unsupported(state.get("actions") or [])
            if unsupported:
                return self._fail(unsupported)
        verdict = shim.replay(
            self._history(),
            state,
            outcome.error,
            name=row.name,
            execution_id=row.execution_id,
            activities=self.activities,
            orchestrators=self.orchestrators,
        )
        for name in verdict.missing:
            log.warning(
                "orchestration %s calls '%s', which is not a registered function of that kind: the extension drops "
                "the call without a history event, and the instance waits for it forever "
                "(azure-functions-durable-python #132)",
                row.instance_id,
                name,
            )
        if verdict.failure is not None:
            return self._end_failed(verdict.failure)
        if verdict.continue_as_new is not None:
            return self._continue_as_new(verdict.continue_as_new.get("input"), verdict.carried)
        if verdict.completed:
            return self._complete(verdict.output)
        if state is None or state.get("isDone") or outcome.error is not None:
            log.warning(
                "orchestration %s returned (%s), but the extension's replay of its actions waits for %s: on Azure the "
                "instance stays Running until that completes (devhost/durable/shim.py)",
                row.instance_id,
                "failed" if outcome.error is not None else "done",
                verdict.waiting,
            )
        for scheduled in verdict.scheduled:
            self._schedule(scheduled)
        return self._close()

    def _history(self) -> list[h.Event]:
        """The whole history the replay runs over: the recorded events, then this episode's."""
        past: list[h.Event] = json.loads(f"[{self.timeline.played}]")
        return past + self._new

    # ---- scheduling ----------------------------------------------------------------------------------------
    def _schedule(self, action: shim.Scheduled) -> None:
        if action.kind == shim.TIMER:
            self._create_timer(action.id, str(action.fire_at))
        elif action.kind == shim.TASK:
            self._commit.append.append(
                h.event(T.TASK_SCHEDULED, self.now, action.id, Name=action.name, Input=action.input)
            )
            self._commit.work.append((action.id, str(action.name), action.input))
        else:
            self._start_child(action)

    def _start_child(self, action: shim.Scheduled) -> None:
        name, child_id, task_id = str(action.name), str(action.instance_id), action.id
        # The version asked for (call_sub_orchestrator(version=...), extension PR #3213), else the parent's own: a
        # sub-orchestration inherits its parent's version, even when the host's defaultVersion has moved on
        # (extension test/Common/OrchestrationVersionTests.cs ExistingOrchestrationVersionIsImmutable, PR #3072).
        version = self.version if action.version is None else action.version
        self._commit.append.append(
            h.event(
                T.SUB_ORCHESTRATION_INSTANCE_CREATED,
                self.now,
                task_id,
                Name=name,
                Version=version,
                InstanceId=child_id,
                Input=action.input,
            )
        )
        if self.is_busy(child_id):
            problem = f"An orchestration with instance ID '{child_id}' is already running."
            failed = h.sub_orchestration_failed(self.now, task_id, problem, json.dumps({"Message": problem}))
            self._commit.messages.append(Message(self.row.instance_id, self.row.execution_id, failed))
            return
        child = new_row(child_id, name, action.input, self.now, parent=(self.row, task_id))
        first = h.execution_started(
            self.now, name, action.input, version=version, parent_instance_id=self.row.instance_id
        )
        self._commit.children.append((child, first))

    def _create_timer(self, timer_id: int, fire_at: str) -> None:
        self._commit.append.append(h.event(T.TIMER_CREATED, self.now, timer_id, FireAt=fire_at))
        self._commit.timers.append((timer_id, fire_at))

    # ---- endings -------------------------------------------------------------------------------------------
    def _close(self) -> Commit:
        self._commit.append.append(h.event(T.ORCHESTRATOR_COMPLETED, self.now))
        self._commit.book = self.timeline.book  # unchanged: the replay derives everything from the history
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
        return self._end_failed(f"Orchestrator function '{self.row.name}' failed: {message}")

    def _end_failed(self, text: str) -> Commit:
        """Failed with `text` as the output: FailOrchestration's reason, the exception's message as it is."""
        details = json.dumps({"Message": text, "ClassName": "OrchestrationFailureException"})
        task_id = int(self.row.parent_task_id or 0)
        return self._end("Failed", text, h.sub_orchestration_failed(self.now, task_id, text, details))

    def version_mismatch(self) -> Commit:
        """versionFailureStrategy Fail: the instance ends Failed without running the orchestrator, as
        TaskOrchestrationDispatcher's OrchestrationCompleteOrchestratorAction with FailureDetails("VersionMismatch",
        ...) does; a parent gets SubOrchestrationInstanceFailed with that action's (null) Result and Details."""
        self._commit.append = list(self._new)
        self._commit.row.last_updated_time = h.format_time(self.now)
        task_id = int(self.row.parent_task_id or 0)
        return self._end("Failed", MISMATCH_OUTPUT, h.sub_orchestration_failed(self.now, task_id, None, None))

    def _continue_as_new(self, new_input: Any, carried: list[h.Event]) -> Commit:
        """The next execution, with the events raised after ContinueAsNew in this episode carried over to it
        (TaskOrchestrationContext.AddEventToNextIteration; Azure Storage's EventBehaviourForContinueAsNew is
        Carryover)."""
        commit = self._close()
        row = commit.row
        row.execution_id, row.input = uuid.uuid4().hex, json.dumps(new_input)
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
                    new_input,
                    version=self.version,
                    parent_instance_id=row.parent_instance_id,
                ),
            )
        ] + [Message(row.instance_id, row.execution_id, event) for event in carried]
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


def _unsupported(raw_actions: list[Any]) -> str | None:
    """What devhost refuses to run, before any replay: entities and durable HTTP."""
    kinds = {a.kind for a in flatten(raw_actions)}
    if kinds & ENTITY_ACTIONS:
        return ENTITIES_NOT_SUPPORTED
    if A.CALL_HTTP in kinds:
        return "call_http (durable HTTP) is not supported by devhost; call the service from an activity."
    return None


def failure_details(exc: BaseException) -> str:
    """TaskFailed Details: the serialized cause, as the extension's Utils.SerializeCause provides it."""
    return json.dumps(
        {
            "Message": str(exc),
            "ClassName": type(exc).__name__,
            "StackTraceString": "".join(traceback.format_exception(exc)),
        }
    )
