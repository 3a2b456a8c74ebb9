"""The extension's out-of-process shim, replayed as Azure replays it: which of the SDK's actions run, and when.

The extension does not carry out the action list the Python SDK returns: its OutOfProcOrchestrationShim calls the
DurableTask.Core API of each action in order and awaits it, while DurableTask.Core feeds the history, event by event,
into those calls (TaskOrchestrationExecutor). An action behind one that never completes is never scheduled; an
orchestration whose actions are not all replayed, or that still has an open task or timer, does not end; a history
event the replay did not schedule is a non-determinism failure. `replay` returns that verdict for one episode.
Sources and fine print: docs/modules-host.md, "devhost/durable/shim.py".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from azure.durable_functions.models.actions.ActionType import ActionType as A
from azure.durable_functions.models.history import HistoryEventType as T

from . import history as h
from .retry import RetryPolicy

PENDING, DONE, FAULTED, CANCELED = "pending", "done", "faulted", "canceled"
TASK, TIMER, SUB = "ScheduleTaskOrchestratorAction", "CreateTimerOrchestratorAction", "CreateSubOrchestrationAction"
COMPLETIONS = {
    T.TASK_COMPLETED: ("TaskScheduledId", DONE),
    T.TASK_FAILED: ("TaskScheduledId", FAULTED),
    T.SUB_ORCHESTRATION_INSTANCE_COMPLETED: ("TaskScheduledId", DONE),
    T.SUB_ORCHESTRATION_INSTANCE_FAILED: ("TaskScheduledId", FAULTED),
    T.TIMER_FIRED: ("TimerId", DONE),
}
CALLS = frozenset(
    {A.CALL_ACTIVITY, A.CALL_ACTIVITY_WITH_RETRY, A.CALL_SUB_ORCHESTRATOR, A.CALL_SUB_ORCHESTRATOR_WITH_RETRY}
)
SCHEDULING = {T.TASK_SCHEDULED: TASK, T.TIMER_CREATED: TIMER, T.SUB_ORCHESTRATION_INSTANCE_CREATED: SUB}
ASKED = "Was a change made to the orchestrator code after this instance had already started running?"


class Future:
    """A .NET Task as far as the shim needs one: pending until settled once; continuations run inline, as on
    DurableTask.Core's SynchronousTaskScheduler."""

    __slots__ = ("_then", "state")

    def __init__(self, state: str = PENDING) -> None:
        self.state = state
        self._then: list[Callable[[Future], None]] = []

    def settle(self, state: str) -> None:
        if self.state != PENDING:
            return
        self.state = state
        then, self._then = self._then, []
        for step in then:
            step(self)

    def then(self, step: Callable[[Future], None]) -> None:
        if self.state == PENDING:
            self._then.append(step)
        else:
            step(self)


class ShimError(Exception):
    """An exception InvokeAPIFromAction throws itself (not a faulted task): it fails the orchestration."""


class NonDeterminism(Exception):
    """DurableTask.Core NonDeterministicOrchestrationException; its message is the instance's output."""

    def __init__(self, details: str) -> None:
        super().__init__(f"Non-Deterministic workflow detected: {details} {ASKED}")


@dataclass(frozen=True)
class Scheduled:
    """A DurableTask.Core action the replay created that no history event matched yet: this episode's new work."""

    id: int
    kind: str  # TASK, TIMER or SUB
    name: str | None = None
    input: str | None = None
    fire_at: str | None = None
    instance_id: str | None = None
    version: str | None = None


@dataclass
class Verdict:
    """What DurableTask.Core makes of one episode: the new actions; then, at most one of a failure (`failure`, the
    output as it is), a completion (`output`) or a ContinueAsNew (`continue_as_new`, its input; `carried`: the events
    raised after it, for the next execution); else the instance goes on Running, and `waiting` says on what."""

    scheduled: list[Scheduled] = field(default_factory=list)
    failure: str | None = None
    completed: bool = False
    output: Any = None
    continue_as_new: dict[str, Any] | None = None
    carried: list[h.Event] = field(default_factory=list)
    waiting: str | None = None
    missing: list[str] = field(default_factory=list)


class Context:
    """DurableTask.Core's TaskOrchestrationContext and the extension's DurableOrchestrationContext, for the calls the
    shim makes: sequence ids, the actions not yet matched by history, the open tasks, external event waiters."""

    def __init__(self, activities: frozenset[str], orchestrators: frozenset[str], execution_id: str) -> None:
        self.now_text = ""  # CurrentUtcDateTime: the last OrchestratorStarted's Timestamp, parsed when needed
        self.execution_id = execution_id
        self.activities, self.orchestrators = activities, orchestrators
        self.next_id = 0
        self.actions: dict[int, Scheduled] = {}  # orchestratorActionsMap
        self.open: dict[int, Future] = {}  # openTasks: tasks and timers, not external events
        self.waiters: dict[str, list[Future]] = {}  # pendingExternalEvents: a stack per name (case-insensitive)
        self.buffered: dict[str, deque[str | None]] = {}  # bufferedExternalEvents: a queue per name
        self.continue_as_new: dict[str, Any] | None = None
        self.missing: list[str] = []

    @property
    def now(self) -> datetime:
        return h.parse_time(self.now_text)

    # ---- the calls -----------------------------------------------------------------------------------------
    def schedule(self, kind: str, **fields: Any) -> tuple[int, Future]:
        task_id, self.next_id = self.next_id, self.next_id + 1
        self.actions[task_id] = Scheduled(task_id, kind, **fields)
        self.open[task_id] = future = Future()
        return task_id, future

    def timer(self, fire_at: str, canceled: bool = False) -> Future:
        task_id, future = self.schedule(TIMER, fire_at=fire_at)
        if canceled:  # cts.Cancel(): the task ends Canceled and leaves openTasks, the TimerCreated stays
            self.open.pop(task_id, None)
            future.settle(CANCELED)
        return future

    def call(self, action: dict[str, Any]) -> Future:
        """CallActivity(WithRetry) / CallSubOrchestrator(WithRetry): one scheduled task, or a RetryInterceptor."""
        sub = action["actionType"] in (A.CALL_SUB_ORCHESTRATOR, A.CALL_SUB_ORCHESTRATOR_WITH_RETRY)
        name = str(action.get("functionName") or "")
        if name.casefold() not in (self.orchestrators if sub else self.activities):
            # ThrowIfFunctionDoesNotExist throws inside the async CallDurableTaskFunctionAsync: a faulted task, no
            # sequence id, and the shim swallows it (azure-functions-durable-python #132: the instance hangs).
            self.missing.append(name)
            return Future(FAULTED)
        fields = {"name": name, "input": action.get("input")}
        if sub:
            fields.update(version=action.get("version"), instance_id=action.get("instanceId") or None)

        def attempt() -> Future:
            task_id, future = self.schedule(SUB if sub else TASK, **fields)
            if sub and fields["instance_id"] is None:  # CreateSubOrchestrationInstanceCore: ExecutionId + ":" + id
                self.actions[task_id] = Scheduled(
                    task_id, SUB, name, action.get("input"), None, f"{self.execution_id}:{task_id}", fields["version"]
                )
            return future

        retry = action.get("retryOptions")
        return Retry(self, RetryPolicy.from_json(retry), attempt).start() if retry else attempt()

    def wait(self, name: str) -> Future:
        key = name.casefold()
        future = Future()
        self.waiters.setdefault(key, []).append(future)
        queue = self.buffered.get(key)
        if queue:  # an event that came before anyone waited: raised again at once, to this (the newest) waiter
            payload = queue.popleft()
            if not queue:
                del self.buffered[key]
            self.raise_event(name, payload)
        return future

    def raise_event(self, name: str, payload: str | None) -> None:
        key = name.casefold()
        stack = self.waiters.get(key)
        if stack:
            stack.pop().settle(DONE)  # the most recent waiter: "to make it easier to abandon external events"
            if not stack:
                del self.waiters[key]
        else:
            self.buffered.setdefault(key, deque()).append(payload)

    # ---- the history ---------------------------------------------------------------------------------------
    def match(self, event: h.Event) -> None:
        """TaskOrchestrationContext.HandleTaskScheduledEvent / HandleTimerCreatedEvent /
        HandleSubOrchestrationCreatedEvent: the recorded action must be the one the replay made with that id."""
        kind, task_id = SCHEDULING[event["EventType"]], int(event["EventId"])
        made = self.actions.pop(task_id, None)
        name = event.get("Name")
        previous = "A previous execution of this orchestration scheduled"
        not_yet = "but the current replay execution hasn't (yet?) scheduled this task."
        if kind == TASK:
            if made is None:
                raise NonDeterminism(
                    f"{previous} an activity task with sequence ID {task_id} and name '{name}' (version "
                    f"'{event.get('Version') or ''}'), {not_yet}"
                )
            recorded = f"{previous} an activity task with sequence number {task_id} named '{name}',"
        elif kind == TIMER:
            if made is None:
                raise NonDeterminism(f"{previous} a timer task with sequence number {task_id} {not_yet}")
            recorded = f"{previous} a timer task with sequence number {task_id} named"
        else:
            recorded = (
                f"{previous} a sub-orchestration task with sequence ID {task_id} and name '{name}' (version "
                f"'{event.get('Version') or ''}', instance ID '{event.get('InstanceId')}'),"
            )
            if made is None:
                raise NonDeterminism(f"{recorded} {not_yet}")
        if made.kind != kind:
            at = "at" if kind == SUB else "with"
            raise NonDeterminism(
                f"{recorded} but the current orchestration replay instead produced a {made.kind} action {at} this "
                "sequence number."
            )
        if kind == TASK and (made.name or "").casefold() != (name or "").casefold():
            raise NonDeterminism(
                f"{recorded} but the current orchestration replay instead scheduled an activity task named "
                f"'{made.name}' with this sequence number. "  # sic: two spaces before "Was a change ..."
            )
        if kind == SUB and (made.name or "").casefold() != (name or "").casefold():
            raise NonDeterminism(
                f"{recorded} but the current orchestration replay instead scheduled a sub-orchestration task with "
                f"name {made.name} at this sequence number."
            )

    def complete(self, event: h.Event) -> None:
        key, state = COMPLETIONS[event["EventType"]]
        future = self.open.pop(int(event[key]), None)
        if future is not None:  # else a duplicate (a cancelled timer firing late): logged and dropped
            future.settle(state)


class Retry:
    """DurableTask.Core RetryInterceptor.Invoke: attempt, and after each failure a durable timer of
    ComputeNextDelay; after the last failure a timer due at once ("Dummy timer for back-compat"), then the failure."""

    def __init__(self, context: Context, policy: RetryPolicy, attempt: Callable[[], Future]) -> None:
        self.context, self.policy, self.attempt = context, policy, attempt
        self.result = Future()
        self.count = 0

    def start(self) -> Future:
        if self.policy.max_number_of_attempts <= 0:
            self.result.settle(DONE)  # the loop never runs: `return default`
        else:
            self.attempt().then(self._after)
        return self.result

    def _after(self, attempt: Future) -> None:
        if attempt.state == DONE:
            self.result.settle(DONE)
            return
        now = self.context.now
        if self.count + 1 == self.policy.max_number_of_attempts:
            self.context.timer(h.format_time(now)).then(lambda _: self.result.settle(FAULTED))
            return
        delay = self.policy.delay_after_attempt(self.count + 1)
        self.context.timer(h.format_time(now + delay)).then(self._next)

    def _next(self, _: Future) -> None:
        self.count += 1
        self.attempt().then(self._after)


class Shim:
    """OutOfProcOrchestrationShim.ScheduleDurableTaskEvents for one returned state: replay the actions, then fail
    with the SDK's error, or complete when the SDK is done, or wait forever (`Task.Delay(Timeout.Infinite)`)."""

    def __init__(self, context: Context, name: str, state: dict[str, Any] | None, error: str | None) -> None:
        self.context, self.name = context, name
        self.state, self.error = state, error
        self.result = Future()
        self.failure: str | None = None
        self.waiting: str | None = None
        self._steps: list[Any] = []
        self._position = 0

    def start(self) -> None:
        if self.state is None:  # the function failed without the SDK's state: no replay at all
            self._fail(f"Orchestrator function '{self.name}' failed: {self.error}")
            return
        actions = self.state.get("actions") or []
        schema = int(self.state.get("schemaVersion") or 0)
        if schema in (1, 2):  # V2, V3: one flat list, wrapped in one outer list
            if len(actions) != 1:
                self._fail(
                    f"Orchestrator function '{self.name}' failed: "
                    f"With OOProc schema {('V2', 'V3')[schema - 1]}, expected actions array to be of length 1 in "
                    f"outer layer but got size: {len(actions)}"
                )
                return
            self._steps = [(False, a) for a in actions[0]]
        else:  # V1: one set per yield, each awaited with WhenAny
            self._steps = [(True, group) for group in actions]
        self._advance()

    def _advance(self, _: Future | None = None) -> None:
        while self._position < len(self._steps):
            is_set, step = self._steps[self._position]
            self._position += 1
            try:
                if is_set:
                    tasks = [self._invoke(a) for a in step]
                    awaited = [t for t in tasks if t is not _COMPLETED]
                    future = _when_any(awaited) if awaited else _COMPLETED
                else:
                    future = self._invoke(step)
            except ShimError as exc:
                self._fail(f"Orchestrator function '{self.name}' failed: {exc}")
                return
            if future.state == PENDING:
                self.waiting = _describe(step)
                future.then(self._advance)  # a faulted or cancelled task is awaited and ignored alike
                return
        self.waiting = None
        assert self.state is not None
        error = self.state.get("error") or self.error
        if error:
            self._fail(f"Orchestrator function '{self.name}' failed: {error}")
        elif self.state.get("isDone"):
            self.result.settle(DONE)

    def _fail(self, message: str) -> None:
        self.failure = message
        self.result.settle(FAULTED)

    def _invoke(self, action: dict[str, Any]) -> Future:
        """InvokeAPIFromAction."""
        kind = action.get("actionType")
        context = self.context
        if kind in CALLS:
            return context.call(action)
        if kind == A.CREATE_TIMER:
            return context.timer(str(action.get("fireAt")), bool(action.get("isCanceled")))
        if kind == A.WAIT_FOR_EXTERNAL_EVENT:
            return context.wait(str(action.get("externalEventName")))
        if kind == A.CONTINUE_AS_NEW:
            context.continue_as_new = {"input": action.get("input")}
            return _COMPLETED
        if kind == A.WHEN_ALL:
            return _when_all([self._invoke(a) for a in action.get("compoundActions") or []])
        if kind == A.WHEN_ANY:
            children = [self._invoke(a) for a in action.get("compoundActions") or []]
            if not children:
                raise ShimError("The tasks argument contains no tasks. (Parameter 'tasks')")
            return _when_any(children)
        raise ShimError(f"Received an unexpected action type from the out-of-proc function: '${kind}'.")


_COMPLETED = Future(DONE)  # Task.CompletedTask: what fire-and-forget actions return


def _when_any(tasks: Iterable[Future]) -> Future:
    out = Future()
    for task in tasks:
        task.then(lambda _: out.settle(DONE))
    return out


def _when_all(tasks: list[Future]) -> Future:
    out = Future(DONE if not tasks else PENDING)
    left = [len(tasks)]

    def one(_: Future) -> None:
        left[0] -= 1
        if left[0] == 0:
            out.settle(DONE if all(t.state == DONE for t in tasks) else FAULTED)

    for task in tasks:
        task.then(one)
    return out


def _describe(step: Any) -> str:
    if isinstance(step, list):
        return "one of " + ", ".join(_describe(a) for a in step)
    kind = A(step["actionType"])
    if kind in (A.WHEN_ANY, A.WHEN_ALL):
        parts = ", ".join(_describe(a) for a in step.get("compoundActions") or [])
        return f"{'WhenAny' if kind == A.WHEN_ANY else 'WhenAll'}({parts})"
    label = "".join(p.capitalize() for p in kind.name.split("_"))
    target = step.get("functionName") or step.get("externalEventName") or step.get("fireAt")
    return f"{label} '{target}'" if target else label


def replay(
    history: list[h.Event],
    state: dict[str, Any] | None,
    error: str | None,
    *,
    name: str,
    execution_id: str,
    activities: Iterable[str],
    orchestrators: Iterable[str],
) -> Verdict:
    """TaskOrchestrationExecutor.ExecuteCore over the whole history (recorded events, then this episode's), with the
    shim as the orchestration and `state` (or `error`, when the SDK left no state) as what the SDK returned."""
    context = Context(
        frozenset(a.casefold() for a in activities), frozenset(o.casefold() for o in orchestrators), execution_id
    )
    shim = Shim(context, name, state, error)
    carried: list[h.Event] = []
    try:
        for event in history:
            kind = event["EventType"]
            if kind == T.ORCHESTRATOR_STARTED:
                context.now_text = event["Timestamp"]
            elif kind == T.EXECUTION_STARTED:
                shim.start()
            elif kind in SCHEDULING:
                context.match(event)
            elif kind in COMPLETIONS:
                context.complete(event)
            elif kind == T.EVENT_RAISED:
                if context.continue_as_new is not None:  # HandleEventRaisedEvent: AddEventToNextIteration
                    carried.append(event)
                else:
                    context.raise_event(str(event.get("Name")), event.get("Input"))
    except NonDeterminism as exc:
        return Verdict(failure=str(exc), missing=context.missing)
    verdict = Verdict(scheduled=sorted(context.actions.values(), key=lambda s: s.id), missing=context.missing)
    if context.open or shim.result.state == PENDING:  # "if (!this.context.HasOpenTasks)": else nothing ends
        verdict.waiting = shim.waiting or (f"{len(context.open)} open task(s) or timer(s)" if context.open else None)
        return verdict
    if shim.result.state == FAULTED:
        verdict.failure = shim.failure
    elif context.continue_as_new is not None:
        verdict.continue_as_new, verdict.carried = context.continue_as_new, carried
    else:
        verdict.completed, verdict.output = True, (state or {}).get("output")
    return verdict
