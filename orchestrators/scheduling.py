"""The Scheduler's Durable primitives, shared by the live version and the frozen ones: the activity call with its
retries, the race between the CompleteBy timer, the Agent's reply and a cancel, and "not now" (the breaker).

Durable rules (seed 004): time from `context.current_utc_datetime`, no I/O, log only when not replaying.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Mapping
from datetime import datetime, timedelta
from typing import Any, cast

import azure.durable_functions as df
from azure.durable_functions.models.Task import TaskBase, TimerTask

from orderflow import function_names as fn
from orderflow.activity_models import ActivityModel, DeferOrderInput, WorkflowResult
from orderflow.breaker import CIRCUIT_OPEN
from orderflow.messages import Action, AgentReply, reply_event_name
from orderflow.workflow import Outcome, WorkflowInput

log = logging.getLogger("orderflow.scheduler")


def log_live(context: df.DurableOrchestrationContext, message: str, *args: Any) -> None:
    if not context.is_replaying:
        log.info(message, *args)


# Every activity is idempotent, so a failure (store or bus briefly unavailable) is retried here, in the Scheduler,
# before it can cost an attempt: 3 tries, 1 s apart (the Python SDK's RetryOptions has no backoff coefficient) —
# well inside a step's CompleteBy. A remote-service failure never surfaces as an activity failure (the Agent reports
# it in its reply), so this does not multiply the Agent's retries.
ACTIVITY_RETRY = df.RetryOptions(first_retry_interval_in_milliseconds=1000, max_number_of_attempts=3)


def call(context: df.DurableOrchestrationContext, name: str, payload: Mapping[str, Any] | ActivityModel) -> TaskBase:
    """Call an activity with ACTIVITY_RETRY; a model goes as its plain JSON (the activities' boundary)."""
    data = payload.to_dict() if isinstance(payload, ActivityModel) else dict(payload)
    return context.call_activity_with_retry(name, ACTIVITY_RETRY, data)


def failure_cause(action: Action, reply: AgentReply) -> str:
    """A permanent failure as the record, the status and the alert name it: `<action>: <code>: <error>`."""
    return f"{action.value}: {reply.error_code or 'PermanentFailure'}: {reply.error or ''}".strip()


def forget_buffered_event(context: df.DurableOrchestrationContext, name: str) -> None:
    """Drop the SDK's buffered copy of an event the Scheduler has just received, so that it is received once.

    azure-functions-durable-python #507 (open): an EventRaised that arrives while nothing waits for its name is kept
    in `context.deferred_tasks[name]` (TaskOrchestrationExecutor.set_task_value), and every later
    `wait_for_external_event(name)` is completed from that entry, which the SDK never removes
    (DurableOrchestrationContext._add_to_open_tasks). The wait loop below waits again on the same name after an
    ignored reply, so without this the ignored reply would come back at once, forever (a RecursionError that fails
    the orchestration), and the valid reply would never be read. A buffered entry, if any, is exactly the event the
    wait just received: a wait registered while an entry exists is completed from it, and an event arriving while a
    wait is open goes to that wait. Deterministic on replay. Only the SDK's one-callback-per-name form is removed:
    should a fixed SDK queue several events per name, they are left alone. tests/host/durable/
    test_scheduler_events.py proves it on devhost through the real SDK.
    """
    deferred = getattr(context, "deferred_tasks", None)
    if isinstance(deferred, dict) and callable(deferred.get(name)):
        del deferred[name]


def race(
    context: df.DurableOrchestrationContext, action: Action, complete_by: datetime, cancel: TaskBase | None
) -> Generator[TaskBase, Any, AgentReply | Outcome]:
    """The race between the timer at CompleteBy, the Agent's reply and (for a forward step) the client's cancel. A
    reply for another instance or action, or a malformed one, is ignored and the wait goes on, with a fresh timer.

    The fresh timer is what lets the instance end on Azure: the extension's shim replays each WhenAny with only the
    children the SDK had not scheduled before (`compoundActions`), so a second wait on the same timer would hold the
    reply alone, and the shim would wait for a reply forever after the timer fired (docs/devhost.md, "Replay"). Every
    timer that does not win is cancelled, since DurableTask.Core completes no orchestration with an open timer."""
    instance_id = context.instance_id
    event_name = reply_event_name(action.value)
    timer = cast(TimerTask, context.create_timer(complete_by))  # the SDK annotates TaskBase; it returns a TimerTask
    while True:
        reply_task = context.wait_for_external_event(event_name)
        winner = yield context.task_any([reply_task, timer, *([cancel] if cancel is not None else [])])
        if winner is timer:
            log_live(context, "%s: %s timed out at %s", instance_id, action.value, complete_by)
            return Outcome.TIMED_OUT
        if cancel is not None and winner is cancel:
            timer.cancel()  # ends the shim's WhenAny when this race does not hold the cancel wait (a later step's)
            log_live(context, "%s: cancelled during %s", instance_id, action.value)
            return Outcome.CANCELLED
        forget_buffered_event(context, event_name)  # SDK #507: else an ignored reply comes back on the next wait
        try:
            reply = AgentReply.from_event(reply_task.result)  # a str today (SDK #295), a dict if it is fixed
        except ValueError:
            reply = None
            log_live(context, "%s: ignoring a malformed reply for %s", instance_id, action.value)
        if reply is not None and reply.instance_id == instance_id and reply.step == action:
            timer.cancel()
            return reply
        if reply is not None:
            log_live(context, "%s: ignoring a reply for %s/%s", instance_id, reply.instance_id, reply.step)
        timer.cancel()
        timer = cast(TimerTask, context.create_timer(complete_by))


def not_now(
    context: df.DurableOrchestrationContext, inp: WorkflowInput, action: Action, reply: AgentReply
) -> Generator[TaskBase, Any, dict[str, Any]]:
    """ "Not now": the Agent made no call because the remote service's breaker is open. The attempt ends without a
    FailureCount; the order (or its compensation) waits for the breaker (orderflow/breaker.py)."""
    retry_after = float(reply.result.get("retryAfterSeconds", inp.step_timeout_seconds))
    deferred = yield call(
        context,
        fn.DEFER_ORDER,
        DeferOrderInput(
            order_id=inp.order_id,
            instance_id=context.instance_id,
            step=action,
            retry_after_seconds=retry_after,
            # From the orchestration's clock, so a resent activity writes the same record (an idempotent no-op).
            retry_at=context.current_utc_datetime + timedelta(seconds=retry_after),
            reason=f"{action.value}: {CIRCUIT_OPEN}: {reply.error or ''}".strip(),
        ),
    )
    outcome = Outcome.DEFERRED if deferred else Outcome.SUPERSEDED
    return WorkflowResult(outcome=outcome, step=action).to_dict()
