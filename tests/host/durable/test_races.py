"""Race scenarios: events, timers, retries, failures and nondeterminism, through the real SDK client and raw
HTTP.

Conformance sources: azure/durable_functions/models/TaskOrchestrationExecutor.py (event buffering, replay),
models/Task.py RetryAbleTask (retry timer after every failed attempt, the last included), and
HttpApiHandler.cs of Azure/azure-functions-durable-extension (raiseEvent 202/404/410).

Raised through the SDK client, event data reaches the orchestrator as the JSON text the client posted, a `str`:
`DurableOrchestrationClient.raise_event` posts `json.dumps(data)` through aiohttp's `json=` and the extension stores
that JSON-string token as it is (azure-functions-durable-python #295, open). Raised over HTTP with an object or string
body, the orchestrator gets that value.

Each race is ordered by what the test waits for, never by a sleep: timers run on an injected clock that the test moves
(DurableEngine(clock=...), then engine.poke()), and "while an episode runs" is held open by a gate in the orchestrator.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest
from azure.durable_functions.models.history import HistoryEventType as T

from tests.host.durable.harness import WAIT, Hub, HubFactory, ManualClock
from tests.host.sample_app.function_app import COUNTER_GATES, PLAN


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def count(history: list[dict], event_type: T) -> int:
    return sum(1 for e in history if e["EventType"] == event_type)


async def raise_http(hub: Hub, instance_id: str, name: str, body: str) -> int:
    url = f"{hub.base}/instances/{instance_id}/raiseEvent/{name}"
    async with hub.http.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
        return response.status


async def started_waiting(hub: Hub, instance_id: str) -> None:
    await hub.engine.wait_for_history(instance_id, lambda h: count(h, T.TIMER_CREATED) >= 1, WAIT)


async def test_event_before_timer_wins_through_the_client(hub: Hub) -> None:
    instance_id = await hub.client.start_new("approval", new_id("evt"), {"timeout": 30})
    await started_waiting(hub, instance_id)
    await hub.client.raise_event(instance_id, "Approval", {"by": "ann"})
    status = await hub.wait(instance_id)
    assert status["output"] == 'approved:{"by": "ann"}'  # the JSON text, a str (SDK #295)


async def test_event_before_timer_wins_through_http(hub: Hub) -> None:
    instance_id = await hub.client.start_new("approval", new_id("evt"), {"timeout": 30})
    await started_waiting(hub, instance_id)
    assert await raise_http(hub, instance_id, "Approval", '"yes"') == 202
    status = await hub.wait(instance_id)
    assert status["output"] == "approved:yes"


@pytest.mark.parametrize(
    ("body", "received"),
    [
        ('{"by": "ann"}', "approved:{'by': 'ann'}"),  # an object token stays an object: the orchestrator gets a dict
        ('"{\\"by\\": \\"ann\\"}"', 'approved:{"by": "ann"}'),  # a string token stays a string, JSON inside or not
        ("[1, 2]", "approved:[1, 2]"),
    ],
)
async def test_a_raised_event_is_the_posted_json_token_as_it_is(hub: Hub, body: str, received: str) -> None:
    """Conformance: HttpApiHandler.HandleRaiseEventRequestAsync (Azure/azure-functions-durable-extension) parses the
    body with `JToken.Parse` and raises that token; nothing unwraps a string that holds JSON. The Python client's
    `raise_event` posts such a string (`json.dumps(data)` through aiohttp's `json=`), hence #295."""
    instance_id = await hub.client.start_new("approval", new_id("tok"), {"timeout": 30})
    await started_waiting(hub, instance_id)
    assert await raise_http(hub, instance_id, "Approval", body) == 202
    status = await hub.wait(instance_id)
    assert status["output"] == received


async def test_timer_before_event_then_a_late_raise_is_gone(hub: Hub) -> None:
    instance_id = await hub.client.start_new("approval", new_id("late"), {"timeout": 0.2})
    status = await hub.wait(instance_id)
    assert status["output"] == "timeout"
    assert await raise_http(hub, instance_id, "Approval", '"too late"') == 410
    with pytest.raises(Exception, match="is gone"):
        await hub.client.raise_event(instance_id, "Approval", "too late")


async def test_event_raised_before_the_wait_is_buffered(hubs: HubFactory) -> None:
    clock = ManualClock()
    hub = await hubs.start(clock=clock)
    instance_id = await hub.client.start_new("late_waiter", new_id("buf"), 0.3)
    await started_waiting(hub, instance_id)  # on its timer, which cannot fire until the clock moves
    await hub.client.raise_event(instance_id, "Go", {"n": 1})
    history = await hub.engine.wait_for_history(instance_id, lambda h: count(h, T.EVENT_RAISED) == 1, WAIT)
    assert count(history, T.TIMER_FIRED) == 0  # the event really came before the wait
    assert (await hub.engine.get_status(instance_id) or {})["runtimeStatus"] == "Running"
    clock.advance(hub, 1)
    status = await hub.wait(instance_id)
    assert status["output"] == {"got": '{"n": 1}'}  # the buffered event, as the JSON text the client posted (#295)


async def test_cancelled_timer_firing_late_is_tolerated(hubs: HubFactory) -> None:
    clock = ManualClock()
    hub = await hubs.start(clock=clock)
    instance_id = await hub.client.start_new("approval", new_id("cancel"), {"timeout": 0.2, "after": 0.6})
    await started_waiting(hub, instance_id)
    await hub.client.raise_event(instance_id, "Approval", "ok")  # the event wins: no timer can fire yet
    # The orchestrator cancelled its deadline and now waits on the 0.6 s timer.
    await hub.engine.wait_for_history(instance_id, lambda h: count(h, T.TIMER_CREATED) == 2, WAIT)
    clock.advance(hub, 0.3)  # the cancelled 0.2 s timer fires during that wait...
    await hub.engine.wait_for_history(instance_id, lambda h: count(h, T.TIMER_FIRED) == 1, WAIT)
    assert (await hub.engine.get_status(instance_id) or {})["runtimeStatus"] == "Running"  # ...and is ignored
    clock.advance(hub, 1)
    status = await hub.wait(instance_id)
    assert status["runtimeStatus"] == "Completed" and status["output"] == 'approved:"ok"'  # JSON text (#295)
    assert count(hub.engine.store.history(instance_id), T.TIMER_FIRED) == 2


async def test_retry_succeeds_after_failures(hub: Hub) -> None:
    key = new_id("flaky")
    instance_id = await hub.client.start_new(
        "retrying", new_id("retry"), {"key": key, "fail_times": 2, "interval_ms": 100, "max_attempts": 4}
    )
    status = await hub.wait(instance_id)
    assert status["output"] == {"key": key, "attempts": 3}
    history = hub.engine.store.history(instance_id)
    assert count(history, T.TASK_FAILED) == 2
    assert count(history, T.TIMER_CREATED) == 2  # one retry timer per failure (DTFx RetryInterceptor)
    assert count(history, T.TASK_SCHEDULED) == 3


async def test_retries_exhausted_fail_the_task_after_the_final_timer(hub: Hub) -> None:
    key = new_id("flaky")
    instance_id = await hub.client.start_new(
        "retrying", new_id("retry"), {"key": key, "fail_times": 9, "interval_ms": 50, "max_attempts": 3}
    )
    status = await hub.wait(instance_id)
    assert status["output"] == {"failed": f"Activity function 'flaky' failed: RuntimeError: flaky failure 3 for {key} "}
    history = hub.engine.store.history(instance_id)
    assert count(history, T.TASK_SCHEDULED) == 3
    assert count(history, T.TASK_FAILED) == 3
    assert count(history, T.TIMER_FIRED) == 3  # the SDK waits one extra timer after the last attempt


async def test_parallel_retries_interleave_with_plain_tasks(hub: Hub) -> None:
    spec = {"a": new_id("a"), "b": new_id("b"), "interval_ms": 80}
    instance_id = await hub.client.start_new("retrying_pair", new_id("pair"), spec)
    status = await hub.wait(instance_id)
    assert status["output"] == [3, 2, "Hello pair!"], status


async def test_orchestrator_exception_fails_the_instance_with_its_message(hub: Hub) -> None:
    instance_id = await hub.client.start_new("exploding", new_id("boom"))
    status = await hub.wait(instance_id)
    assert status["runtimeStatus"] == "Failed"
    assert status["output"] == "Orchestrator function 'exploding' failed: boom: the order is invalid"
    sdk_status = await hub.client.get_status(instance_id)
    assert sdk_status.runtime_status.value == "Failed"


async def test_nondeterministic_replay_fails_naming_expected_and_actual(hubs: HubFactory) -> None:
    PLAN["first"] = "say_hello"
    hub = await hubs.start()
    instance_id = await hub.client.start_new("changing", new_id("nd"))
    await hub.engine.wait_for_history(instance_id, lambda h: count(h, T.TASK_COMPLETED) == 1, WAIT)
    await hubs.stop(hub)
    PLAN["first"] = "shout"  # the orchestrator's code changes between two runs on the same db
    try:
        hub = await hubs.start()
        await hub.client.raise_event(instance_id, "Go", 1)
        status = await hub.wait(instance_id)
    finally:
        PLAN["first"] = "say_hello"
    # DurableTask.Core TaskOrchestrationContext.HandleTaskScheduledEvent: the exception's message is the output.
    assert status["runtimeStatus"] == "Failed"
    assert status["output"] == (
        "Non-Deterministic workflow detected: A previous execution of this orchestration scheduled an activity task "
        "with sequence number 0 named 'say_hello', but the current orchestration replay instead scheduled an activity "
        "task named 'shout' with this sequence number.  Was a change made to the orchestrator code after this "
        "instance had already started running?"
    )


async def test_event_raised_while_a_continue_as_new_episode_runs_reaches_the_new_execution(hub: Hub) -> None:
    # Source: the extension raises external events to the instance, not to an execution
    # (azure-functions-durable-extension DurableClient.RaiseEventInternalAsync clears the execution id: "External
    # events are not supposed to target any particular execution ID"), so an event raised while an episode is
    # committing a ContinueAsNew is delivered to the new execution.
    iid = f"ctr-{uuid.uuid4().hex[:6]}"
    entered, release = threading.Event(), threading.Event()
    COUNTER_GATES[iid] = (entered, release)
    # Know when the second raise has reached the engine: it then waits for the instance lock that the running
    # episode holds (DurableEngine._step keeps it across the replay).
    reached = asyncio.Event()
    raise_event_token = hub.engine.raise_event_token

    async def observed_raise(instance_id: str, event_name: str, data_token: str | None) -> Any:
        reached.set()
        return await raise_event_token(instance_id, event_name, data_token)

    hub.engine.raise_event_token = observed_raise  # type: ignore[method-assign]
    await hub.client.start_new("eternal_counter", iid, 0)
    await hub.client.raise_event(iid, "add", 1)  # arrives as the str "1" (#295); the orchestrator int()s it
    assert await asyncio.to_thread(entered.wait, WAIT)  # the episode that will continue-as-new is running
    reached.clear()
    second = asyncio.create_task(hub.client.raise_event(iid, "add", 10))
    await asyncio.wait_for(reached.wait(), WAIT)
    # In the same step as `reached.set()` the raise ran up to the instance lock and queued on it.
    assert not second.done() and hub.engine._lock(iid).locked()  # the raise is waiting on the running episode
    release.set()
    await second
    # The execution that received 10 continued as new with 11 (history of the current execution only).
    await hub.engine.wait_for_history(
        iid,
        lambda events: any(e.get("EventType") == T.EXECUTION_STARTED and e.get("Input") == "11" for e in events),
        WAIT,
    )
    # "stop" through the client would arrive as the JSON text '"stop"' (#295); the raw HTTP body "stop" is the str.
    assert await raise_http(hub, iid, "add", '"stop"') == 202
    status = await hub.wait(iid)
    assert status["output"] == 11, status
