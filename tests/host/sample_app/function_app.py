"""Sample Durable Functions app for devhost's durable tests: one orchestrator per behaviour under test.

Activities keep their fault-injection state in module globals keyed by the caller's key, so each test uses
fresh
keys. `PLAN` lets a test change the orchestrator's code between two engine runs (nondeterminism).
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta
from typing import Any

import azure.durable_functions as df
import azure.functions as func

app = df.DFApp(http_auth_level=func.AuthLevel.ANONYMOUS)

ATTEMPTS: dict[str, int] = {}
PLAN: dict[str, str] = {"first": "say_hello"}
PROBE = {"active": 0, "peak": 0, "calls": 0}
_probe_lock = threading.Lock()
GATES: dict[str, threading.Event] = {}
COUNTER_GATES: dict[str, tuple[threading.Event, threading.Event]] = {}


# ---- activities --------------------------------------------------------------------------------------------
@app.activity_trigger(input_name="name")
def say_hello(name: str) -> str:
    return f"Hello {name}!"


@app.activity_trigger(input_name="text")
async def shout(text: str) -> str:
    await asyncio.sleep(0)
    return text.upper()


@app.activity_trigger(input_name="request")
def flaky(request: dict) -> dict[str, Any]:
    """Fails until it has been called more than `fail_times` times for `key`."""
    key = request["key"]
    ATTEMPTS[key] = ATTEMPTS.get(key, 0) + 1
    if ATTEMPTS[key] <= request["fail_times"]:
        raise RuntimeError(f"flaky failure {ATTEMPTS[key]} for {key}")
    return {"key": key, "attempts": ATTEMPTS[key]}


@app.activity_trigger(input_name="seconds")
def probe(seconds: float) -> int:
    """Records how many activities run at once (work that takes `seconds`)."""
    with _probe_lock:
        PROBE["active"] += 1
        PROBE["calls"] += 1
        PROBE["peak"] = max(PROBE["peak"], PROBE["active"])
    time.sleep(seconds)
    with _probe_lock:
        PROBE["active"] -= 1
    return 1


@app.activity_trigger(input_name="key")
def gated(key: str) -> str:
    """Blocks until the test opens the gate named `key` (bounded), counting its runs."""
    ATTEMPTS[key] = ATTEMPTS.get(key, 0) + 1
    GATES.setdefault(key, threading.Event()).wait(timeout=30)
    return f"ran {key}"


# ---- orchestrators -----------------------------------------------------------------------------------------
@app.orchestration_trigger(context_name="context")
def hello_sequence(context: df.DurableOrchestrationContext):
    cities = context.get_input() or ["Tokyo", "Seattle"]
    results = []
    for city in cities:
        results.append((yield context.call_activity("say_hello", city)))
    results.append((yield context.call_activity("shout", "done")))
    context.set_custom_status({"greeted": len(cities)})
    return results


@app.orchestration_trigger(context_name="context")
def fan_out(context: df.DurableOrchestrationContext):
    spec = context.get_input()
    tasks = [context.call_activity("probe", spec["seconds"]) for _ in range(spec["count"])]
    results = yield context.task_all(tasks)
    return sum(results)


@app.orchestration_trigger(context_name="context")
def approval(context: df.DurableOrchestrationContext):
    """Races the Approval event against a deadline; optionally waits `after` seconds more on a new timer."""
    spec = context.get_input()
    deadline = context.current_utc_datetime + timedelta(seconds=spec["timeout"])
    timer = context.create_timer(deadline)
    event = context.wait_for_external_event("Approval")
    winner = yield context.task_any([event, timer])
    if winner == event:
        timer.cancel()
        outcome = f"approved:{event.result}"
    else:
        outcome = "timeout"
    if spec.get("after"):
        yield context.create_timer(context.current_utc_datetime + timedelta(seconds=spec["after"]))
    return outcome


@app.orchestration_trigger(context_name="context")
def late_waiter(context: df.DurableOrchestrationContext):
    """Waits on a short timer first, then for the Go event (raised before this wait in the test)."""
    yield context.create_timer(context.current_utc_datetime + timedelta(seconds=context.get_input()))
    payload = yield context.wait_for_external_event("Go")
    return {"got": payload}


@app.orchestration_trigger(context_name="context")
def retrying(context: df.DurableOrchestrationContext):
    spec = context.get_input()
    options = df.RetryOptions(
        first_retry_interval_in_milliseconds=spec["interval_ms"], max_number_of_attempts=spec["max_attempts"]
    )
    try:
        result = yield context.call_activity_with_retry("flaky", options, spec)
    except Exception as exc:  # noqa: BLE001
        return {"failed": str(exc).splitlines()[0]}
    return result


@app.orchestration_trigger(context_name="context")
def retrying_pair(context: df.DurableOrchestrationContext):
    """Two with-retry calls in parallel plus a plain call: retry timers interleave with other tasks."""
    spec = context.get_input()
    options = df.RetryOptions(first_retry_interval_in_milliseconds=spec["interval_ms"], max_number_of_attempts=4)
    first = context.call_activity_with_retry("flaky", options, {"key": spec["a"], "fail_times": 2})
    second = context.call_activity_with_retry("flaky", options, {"key": spec["b"], "fail_times": 1})
    plain = context.call_activity("say_hello", "pair")
    results = yield context.task_all([first, second, plain])
    return [results[0]["attempts"], results[1]["attempts"], results[2]]


@app.orchestration_trigger(context_name="context")
def flaky_child(context: df.DurableOrchestrationContext):
    """A sub-orchestration that fails while its `flaky` activity does (the activity keeps the attempt count, so the
    orchestrator itself stays deterministic)."""
    return (yield context.call_activity("flaky", context.get_input()))


@app.orchestration_trigger(context_name="context")
def retrying_parent(context: df.DurableOrchestrationContext):
    """Calls flaky_child with CallSubOrchestratorWithRetry; does not catch, so exhausted retries fail it."""
    spec = context.get_input()
    options = df.RetryOptions(
        first_retry_interval_in_milliseconds=spec["interval_ms"], max_number_of_attempts=spec["max_attempts"]
    )
    return (yield context.call_sub_orchestrator_with_retry("flaky_child", options, spec))


@app.orchestration_trigger(context_name="context")
def exploding(context: df.DurableOrchestrationContext):
    yield context.call_activity("say_hello", "before")
    raise ValueError("boom: the order is invalid")


@app.orchestration_trigger(context_name="context")
def changing(context: df.DurableOrchestrationContext):
    """Its first activity comes from PLAN; the test edits PLAN between two engine runs."""
    first = yield context.call_activity(PLAN["first"], "x")
    go = yield context.wait_for_external_event("Go")
    return [first, go]


@app.orchestration_trigger(context_name="context")
def parent(context: df.DurableOrchestrationContext):
    child = yield context.call_sub_orchestrator("hello_sequence", ["Oslo"])
    try:
        yield context.call_sub_orchestrator("exploding", None, instance_id=f"{context.instance_id}-bad")
    except Exception as exc:  # noqa: BLE001
        return {"child": child, "error": str(exc).splitlines()[0]}
    return {"child": child}


@app.orchestration_trigger(context_name="context")
def waiting_parent(context: df.DurableOrchestrationContext):
    """Waits on a child that waits for an Approval (tests terminate the child)."""
    try:
        yield context.call_sub_orchestrator("approval", {"timeout": 600}, instance_id=f"{context.instance_id}-child")
    except Exception as exc:  # noqa: BLE001
        return {"error": str(exc).splitlines()[0]}
    return "child completed"


@app.orchestration_trigger(context_name="context")
def countdown(context: df.DurableOrchestrationContext):
    n = context.get_input()
    if n > 0:
        yield context.call_activity("say_hello", str(n))
        context.continue_as_new(n - 1)
        return None
    return "liftoff"


@app.orchestration_trigger(context_name="context")
def waits_on_gate(context: df.DurableOrchestrationContext):
    return (yield context.call_activity("gated", context.get_input()))


@app.orchestration_trigger(context_name="context")
def uses_entity(context: df.DurableOrchestrationContext):
    yield context.call_entity(df.EntityId("counter_entity", "k"), "add", 1)
    return "unreachable"


@app.entity_trigger(context_name="context")
def counter_entity(context: df.DurableEntityContext) -> None:
    context.set_state((context.get_state(lambda: 0) or 0) + 1)


# ---- a client function (durableClient binding) -------------------------------------------------------------
@app.route(route="start/{name}", methods=["POST"])
@app.durable_client_input(client_name="client")
async def http_start(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    instance_id = await client.start_new(req.route_params["name"], None, req.get_json())
    return client.create_check_status_response(req, instance_id)


@app.orchestration_trigger(context_name="context")
def eternal_counter(context: df.DurableOrchestrationContext):  # type: ignore[no-untyped-def]
    """Adds each `add` event to its total and continues as new; `stop` returns the total. The replay is slow on
    purpose (a test gate), so that an event can arrive while an episode that continues-as-new is running."""
    total = context.get_input() or 0
    value = yield context.wait_for_external_event("add")
    gate = COUNTER_GATES.get(context.instance_id)
    if gate is not None and not context.is_replaying and value != "stop":
        gate[0].set()  # this episode is running...
        gate[1].wait(10)  # ...and stays in flight until the test lets it finish
    if value == "stop":
        return total
    context.continue_as_new(total + int(value))
    return None
