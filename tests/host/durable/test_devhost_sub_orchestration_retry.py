"""CallSubOrchestratorWithRetry through the real SDK: a failed sub-orchestration is retried with the retry options, and
the parent fails once the attempts are used up.

Sources: DTFx RetryInterceptor.Invoke (durabletask core/RetryInterceptor.cs): after each failed attempt a durable timer
of FirstRetryInterval (times BackoffCoefficient^n); after the last one a timer due at once ("Dummy timer for
back-compat", DTFx #661: earlier versions waited a full interval there), then the failure is rethrown;
azure/durable_functions/models/Task.py RetryAbleTask (the SDK opens that timer and the next attempt itself, and fails
the task once `max_number_of_attempts` is reached); DurableOrchestrationContext.call_sub_orchestrator_with_retry
(action CallSubOrchestratorWithRetry carrying `retryOptions`).
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from azure.durable_functions.models.history import HistoryEventType as T

from devhost.durable import history as h
from tests.host.durable.harness import Hub
from tests.host.sample_app.function_app import ATTEMPTS


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def count(history: list[dict], event_type: T) -> int:
    return sum(1 for e in history if e["EventType"] == event_type)


def retry_delays(history: list[dict]) -> list[timedelta]:
    """FireAt minus creation time of each timer the parent created."""
    return [
        h.parse_time(e["FireAt"]) - h.parse_time(e["Timestamp"]) for e in history if e["EventType"] == T.TIMER_CREATED
    ]


async def test_a_failing_sub_orchestration_is_retried_until_it_succeeds(hub: Hub) -> None:
    key = new_id("child")
    spec = {"key": key, "fail_times": 2, "interval_ms": 150, "max_attempts": 4}
    instance_id = await hub.client.start_new("retrying_parent", new_id("subretry"), spec)
    status = await hub.wait(instance_id)
    assert status["runtimeStatus"] == "Completed", status
    assert status["output"] == {"key": key, "attempts": 3}  # two failed sub-orchestrations, the third succeeded
    history = hub.engine.store.history(instance_id)
    assert count(history, T.SUB_ORCHESTRATION_INSTANCE_CREATED) == 3
    assert count(history, T.SUB_ORCHESTRATION_INSTANCE_FAILED) == 2
    assert count(history, T.SUB_ORCHESTRATION_INSTANCE_COMPLETED) == 1
    assert retry_delays(history) == [timedelta(milliseconds=150)] * 2  # one retry timer per failure, of the interval
    assert ATTEMPTS[key] == 3


async def test_retries_exhausted_fail_the_parent(hub: Hub) -> None:
    key = new_id("child")
    spec = {"key": key, "fail_times": 9, "interval_ms": 50, "max_attempts": 3}
    instance_id = await hub.client.start_new("retrying_parent", new_id("subretry"), spec)
    status = await hub.wait(instance_id)
    assert status["runtimeStatus"] == "Failed", status
    assert "Orchestrator function 'retrying_parent' failed" in status["output"]
    assert f"flaky failure 3 for {key}" in status["output"]  # the last attempt's failure is the one reported
    history = hub.engine.store.history(instance_id)
    assert count(history, T.SUB_ORCHESTRATION_INSTANCE_CREATED) == 3
    assert count(history, T.SUB_ORCHESTRATION_INSTANCE_FAILED) == 3
    assert count(history, T.TIMER_FIRED) == 3  # the SDK waits one extra timer after the last attempt
    assert retry_delays(history) == [timedelta(milliseconds=50)] * 2 + [timedelta(0)]  # that one is due at once
    assert ATTEMPTS[key] == 3
