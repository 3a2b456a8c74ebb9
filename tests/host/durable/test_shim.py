"""The extension's replay of the SDK's actions (devhost/durable/shim.py), rule by rule, on hand-made histories.

Each rule cites where it comes from. The extension: azure-functions-durable-extension
src/WebJobs.Extensions.DurableTask/Listener/OutOfProcOrchestrationShim.cs (`ScheduleDurableTaskEvents`,
`ReplayOOProcOrchestration`, `ProcessAsyncActionsV1/V2`, `InvokeAPIFromAction`) and
ContextImplementations/DurableOrchestrationContext.cs (`WaitForExternalEvent`, `RaiseEvent`,
`CallDurableTaskFunctionAsync`). DurableTask.Core (Azure/durabletask src/DurableTask.Core):
TaskOrchestrationExecutor.ExecuteCore (events in order, `if (!this.context.HasOpenTasks)`), TaskOrchestrationContext
(`CreateTimer` with a cancelled token, the `Handle*Event` non-determinism checks, `AddEventToNextIteration`),
RetryInterceptor.Invoke. Action JSON as the SDK writes it: azure/durable_functions/models/actions/*.py.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.durable_functions.models.actions.ActionType import ActionType as A
from azure.durable_functions.models.history.HistoryEventType import HistoryEventType as H

from devhost.durable import history as h
from devhost.durable import shim

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FIRE = "2026-01-01T00:10:00.000000Z"


def activity(name: str, retry: dict[str, int] | None = None) -> dict[str, Any]:
    action: dict[str, Any] = {"actionType": A.CALL_ACTIVITY, "functionName": name, "input": json.dumps(name)}
    if retry is not None:
        action.update(actionType=A.CALL_ACTIVITY_WITH_RETRY, retryOptions=retry)
    return action


def sub(name: str, instance_id: str | None = None) -> dict[str, Any]:
    return {"actionType": A.CALL_SUB_ORCHESTRATOR, "functionName": name, "input": None, "instanceId": instance_id}


def timer(canceled: bool = False) -> dict[str, Any]:
    return {"actionType": A.CREATE_TIMER, "fireAt": FIRE, "isCanceled": canceled}


def wait(name: str) -> dict[str, Any]:
    return {"actionType": A.WAIT_FOR_EXTERNAL_EVENT, "externalEventName": name, "reason": "ExternalEvent"}


def any_of(*children: dict[str, Any]) -> dict[str, Any]:
    return {"actionType": A.WHEN_ANY, "compoundActions": list(children)}


def all_of(*children: dict[str, Any]) -> dict[str, Any]:
    return {"actionType": A.WHEN_ALL, "compoundActions": list(children)}


def v3(*actions: dict[str, Any], done: bool = False, output: Any = None, error: str | None = None) -> dict[str, Any]:
    """OrchestratorState.to_json under ReplaySchema V3: one flat list inside one outer list."""
    return {"isDone": done, "actions": [list(actions)], "output": output, "error": error, "schemaVersion": 2}


def started(*events: h.Event) -> list[h.Event]:
    return [h.event(H.ORCHESTRATOR_STARTED, T0), h.execution_started(T0, "orch", None, version=None), *events]


def scheduled(task_id: int, name: str) -> h.Event:
    return h.event(H.TASK_SCHEDULED, T0, task_id, Name=name)


def timer_created(task_id: int) -> h.Event:
    return h.event(H.TIMER_CREATED, T0, task_id, FireAt=FIRE)


def raised(name: str, payload: Any = 1) -> h.Event:
    return h.event_raised(T0, name, json.dumps(payload))


def run(history: list[h.Event], state: dict[str, Any] | None, error: str | None = None) -> shim.Verdict:
    return shim.replay(
        history,
        state,
        error,
        name="orch",
        execution_id="e1",
        activities=["a", "b", "c", "flaky"],
        orchestrators=["child"],
    )


def ids(verdict: shim.Verdict) -> list[tuple[int, str, str | None]]:
    return [(s.id, s.kind, s.name) for s in verdict.scheduled]


# ---- actions run in order, each awaited ----------------------------------------------------------------------------


def test_an_action_behind_one_that_has_not_completed_is_not_scheduled() -> None:
    # ProcessAsyncActionsV2: `await durableTask` before the next InvokeAPIFromAction.
    state = v3(wait("Go"), activity("a"))
    assert ids(run(started(), state)) == []
    assert ids(run(started(raised("Go")), state)) == [(0, shim.TASK, "a")]


def test_a_when_all_waits_for_every_child_even_after_one_failed() -> None:
    # Task.WhenAll completes when all its tasks have, faulted or not (the SDK's task_all fails at the first failure).
    state = v3(all_of(activity("a"), activity("b")), activity("c"))
    history = started(scheduled(0, "a"), scheduled(1, "b"), h.task_failed(T0, 0, "boom", "{}"))
    assert ids(run(history, state)) == []
    assert ids(run([*history, h.task_completed(T0, 1, "1")], state)) == [(2, shim.TASK, "c")]


def test_version_1_action_sets_are_each_awaited_with_when_any() -> None:
    # ProcessAsyncActionsV1: every action of a set is invoked, then `await Task.WhenAny(tasks)`.
    state = {"isDone": False, "actions": [[activity("a"), activity("b")], [activity("c")]]}
    history = started(scheduled(0, "a"), scheduled(1, "b"), h.task_completed(T0, 1, "1"))
    assert ids(run(history, state)) == [(2, shim.TASK, "c")]


def test_a_v3_action_list_must_be_one_list() -> None:
    verdict = run(started(), {"isDone": False, "actions": [[], []], "schemaVersion": 2})
    assert verdict.failure == (
        "Orchestrator function 'orch' failed: With OOProc schema V3, expected actions array to be of length 1 in "
        "outer layer but got size: 2"
    )


def test_a_when_any_without_children_fails_the_orchestration() -> None:
    # Task.WhenAny of no tasks throws ArgumentException in InvokeAPIFromAction, outside the shim's try/catch.
    verdict = run(started(), v3(any_of()))
    assert (
        verdict.failure
        == "Orchestrator function 'orch' failed: The tasks argument contains no tasks. (Parameter 'tasks')"
    )


# ---- when an orchestration ends -----------------------------------------------------------------------------------


def test_done_ends_the_instance_only_once_every_action_was_replayed() -> None:
    # The SDK is done, but the replay still awaits the wait: Task.Delay(Timeout.Infinite) is never reached either.
    state = v3(any_of(wait("E"), timer()), wait("E"), done=True, output="timeout")
    history = started(timer_created(0), raised("E"), h.timer_fired(T0, 0, FIRE))
    verdict = run(history, state)
    assert not verdict.completed and verdict.failure is None
    assert verdict.waiting == "WaitForExternalEvent 'E'"
    finished = run([*history, raised("E")], state)
    assert finished.completed and finished.output == "timeout"


def test_an_open_timer_keeps_a_done_instance_running_and_a_cancelled_one_does_not() -> None:
    # TaskOrchestrationExecutor: nothing completes while HasOpenTasks; a cancelled timer leaves openTasks.
    history = started(timer_created(0), raised("E"))
    left_open = run(history, v3(any_of(wait("E"), timer()), done=True, output="ok"))
    assert not left_open.completed and left_open.waiting == "1 open task(s) or timer(s)"
    assert run([*history, h.timer_fired(T0, 0, FIRE)], v3(any_of(wait("E"), timer()), done=True)).completed
    assert run(history, v3(any_of(wait("E"), timer(canceled=True)), done=True, output="ok")).completed


def test_a_cancelled_timer_ends_its_when_any_at_once() -> None:
    # InvokeAPIFromAction: CreateTimer, then `if (action.IsCanceled) cts.Cancel()`: the TimerCreated is still made.
    verdict = run(started(), v3(any_of(wait("E"), timer(canceled=True)), activity("a")))
    assert ids(verdict) == [(0, shim.TIMER, None), (1, shim.TASK, "a")]


def test_an_orchestrator_error_fails_the_instance_only_after_the_replay() -> None:
    # ScheduleDurableTaskEvents replays the actions first and throws the SDK's error afterwards.
    # (What the engine passes when the SDK raised: the state after `$OutOfProcData$:`, and the message before it.)
    assert run(started(), v3(wait("E"), error="boom"), "boom").failure is None
    failed = run(started(raised("E")), v3(wait("E"), error="boom"), "boom")
    assert failed.failure == "Orchestrator function 'orch' failed: boom"
    assert run(started(), None, "ValueError: bad").failure == "Orchestrator function 'orch' failed: ValueError: bad"


def test_continue_as_new_carries_the_events_raised_after_it() -> None:
    # TaskOrchestrationContext.HandleEventRaisedEvent: AddEventToNextIteration once ContinueAsNew was called
    # (Azure Storage: EventBehaviourForContinueAsNew = Carryover).
    state = v3(wait("add"), {"actionType": A.CONTINUE_AS_NEW, "input": "2"}, done=True)
    second = raised("add", 10)
    verdict = run(started(raised("add"), second), state)
    assert verdict.continue_as_new == {"input": "2"} and verdict.carried == [second]


# ---- external events -----------------------------------------------------------------------------------------------


def test_an_event_goes_to_the_newest_waiter_of_its_name() -> None:
    # DurableOrchestrationContext.WaitForExternalEvent keeps "a stack ... to make it easier for users to abandon
    # external events"; RaiseEvent completes the top one.
    state = v3(any_of(wait("E"), timer(canceled=True)), wait("E"), activity("a"))
    assert ids(run(started(timer_created(0), raised("E")), state)) == [(1, shim.TASK, "a")]
    context = shim.Context(frozenset(), frozenset(), "e1")
    older, newer = context.wait("E"), context.wait("e")  # names are case-insensitive (OrdinalIgnoreCase)
    context.raise_event("E", "1")
    assert (older.state, newer.state) == (shim.PENDING, shim.DONE)


def test_events_raised_before_any_wait_are_kept_in_order_and_each_taken_once() -> None:
    # bufferedExternalEvents: a Queue per name; WaitForExternalEvent dequeues one and raises it at once.
    context = shim.Context(frozenset(), frozenset(), "e1")
    context.raise_event("E", "first")
    context.raise_event("E", "second")
    first, second, third = context.wait("E"), context.wait("E"), context.wait("E")
    assert [f.state for f in (first, second, third)] == [shim.DONE, shim.DONE, shim.PENDING]
    assert "e" not in context.buffered


# ---- sequence ids and calls ----------------------------------------------------------------------------------------


def test_a_call_to_an_unknown_function_takes_no_id_and_never_completes() -> None:
    # CallDurableTaskFunctionAsync is async: ThrowIfFunctionDoesNotExist faults its task before ScheduleTask, and the
    # shim swallows the fault (azure-functions-durable-python #132, open: the orchestration hangs).
    verdict = run(started(), v3(all_of(activity("nope"), activity("a"))))
    assert ids(verdict) == [(0, shim.TASK, "a")] and verdict.missing == ["nope"]


def test_a_sub_orchestration_without_an_id_gets_the_execution_id_and_its_sequence_id() -> None:
    # TaskOrchestrationContext.CreateSubOrchestrationInstanceCore: ExecutionId + ":" + id.
    verdict = run(started(), v3(all_of(activity("a"), sub("child"), sub("child", "mine"))))
    assert [(s.id, s.instance_id) for s in verdict.scheduled] == [(0, None), (1, "e1:1"), (2, "mine")]


def test_retries_take_a_timer_and_an_attempt_id_each_and_the_last_timer_is_due_at_once() -> None:
    # RetryInterceptor.Invoke: a timer after each failure; after the last, "Dummy timer for back-compat" at now.
    retry = {"firstRetryIntervalInMilliseconds": 1000, "maxNumberOfAttempts": 2}
    state = v3(activity("flaky", retry))
    later = T0 + timedelta(seconds=5)
    history = started(scheduled(0, "flaky"), h.task_failed(T0, 0, "x", "{}"))
    assert [(s.id, s.kind, s.fire_at) for s in run(history, state).scheduled] == [
        (1, shim.TIMER, h.format_time(T0 + timedelta(seconds=1)))
    ]
    history += [timer_created(1), h.timer_fired(T0, 1, FIRE), scheduled(2, "flaky")]
    history += [h.event(H.ORCHESTRATOR_STARTED, later), h.task_failed(later, 2, "x", "{}")]
    assert [(s.id, s.kind, s.fire_at) for s in run(history, state).scheduled] == [(3, shim.TIMER, h.format_time(later))]


def test_no_attempts_means_no_call() -> None:
    # RetryInterceptor.Invoke: `for (retryCount = 0; retryCount < MaxNumberOfAttempts ...)` never runs: default.
    retry = {"firstRetryIntervalInMilliseconds": 1000, "maxNumberOfAttempts": 0}
    assert ids(run(started(), v3(activity("flaky", retry), activity("a")))) == [(0, shim.TASK, "a")]


# ---- non-determinism -----------------------------------------------------------------------------------------------

ASKED = "Was a change made to the orchestrator code after this instance had already started running?"


def test_a_recorded_activity_the_replay_did_not_schedule_is_non_deterministic() -> None:
    verdict = run(started(scheduled(0, "a")), v3(wait("Go")))
    assert verdict.failure == (
        "Non-Deterministic workflow detected: A previous execution of this orchestration scheduled an activity task "
        "with sequence ID 0 and name 'a' (version ''), but the current replay execution hasn't (yet?) scheduled this "
        f"task. {ASKED}"
    )


def test_a_recorded_timer_where_the_replay_calls_an_activity_is_non_deterministic() -> None:
    verdict = run(started(timer_created(0)), v3(activity("a")))
    assert verdict.failure == (
        "Non-Deterministic workflow detected: A previous execution of this orchestration scheduled a timer task with "
        "sequence number 0 named but the current orchestration replay instead produced a "
        f"ScheduleTaskOrchestratorAction action with this sequence number. {ASKED}"
    )


def test_a_recorded_sub_orchestration_of_another_name_is_non_deterministic() -> None:
    created = h.event(H.SUB_ORCHESTRATION_INSTANCE_CREATED, T0, 0, Name="other", Version=None, InstanceId="x")
    verdict = run(started(created), v3(sub("child", "x")))
    assert verdict.failure == (
        "Non-Deterministic workflow detected: A previous execution of this orchestration scheduled a sub-orchestration "
        "task with sequence ID 0 and name 'other' (version '', instance ID 'x'), but the current orchestration replay "
        f"instead scheduled a sub-orchestration task with name child at this sequence number. {ASKED}"
    )


def test_names_compare_ignoring_case_and_waits_are_not_recorded() -> None:
    # HandleTaskScheduledEvent compares names with OrdinalIgnoreCase; no history event records a wait, so renaming one
    # changes nothing DurableTask.Core checks.
    history = started(scheduled(0, "A"), raised("Go"))
    assert run(history, v3(activity("a"), wait("Renamed"))).failure is None
