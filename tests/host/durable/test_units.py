"""Pure pieces of the durable backend: instance-id rules, retry delays, action decoding."""

from __future__ import annotations

from datetime import timedelta

import pytest
from azure.durable_functions.models.actions.ActionType import ActionType as A

from devhost.durable.actions import flatten
from devhost.durable.errors import InvalidInstanceId
from devhost.durable.ids import validate_instance_id
from devhost.durable.retry import RetryPolicy


def test_instance_id_rules_from_seed_004() -> None:
    assert validate_instance_id("order-42:1") == "order-42:1"
    assert validate_instance_id("x" * 100) == "x" * 100
    for bad in ["", "x" * 101, "@a", "a/b", "a\\b", "a#b", "a?b", "a\nb", "a\x00b"]:
        with pytest.raises(InvalidInstanceId):
            validate_instance_id(bad)


def test_retry_delay_grows_by_the_backoff_and_is_capped() -> None:
    # DTFx RetryInterceptor.ComputeNextDelay: first * coefficient ** retryCount, capped by MaxRetryInterval.
    policy = RetryPolicy(
        first_retry_interval_ms=100,
        max_number_of_attempts=4,
        backoff_coefficient=2,
        max_retry_interval_ms=300,
    )
    assert [policy.delay_after_attempt(n) for n in (1, 2, 3)] == [
        timedelta(milliseconds=100),
        timedelta(milliseconds=200),
        timedelta(milliseconds=300),
    ]
    sdk_json = {"firstRetryIntervalInMilliseconds": 250, "maxNumberOfAttempts": 2}  # RetryOptions.to_json
    assert RetryPolicy.from_json(sdk_json).delay_after_attempt(5) == timedelta(milliseconds=250)
    # Without maxRetryIntervalInMilliseconds (the Python SDK never sends one) the extension's RetryOptions caps the
    # delay at DefaultMaxRetryinterval, 6 days (WebJobs.Extensions.DurableTask/RetryOptions.cs).
    growing = RetryPolicy(first_retry_interval_ms=86_400_000, max_number_of_attempts=9, backoff_coefficient=2)
    assert growing.delay_after_attempt(4) == timedelta(days=6)


def test_v1_and_v2_action_shapes_flatten_to_the_same_order() -> None:
    call = {"actionType": A.CALL_ACTIVITY, "functionName": "a", "input": "1"}
    timer = {"actionType": A.CREATE_TIMER, "fireAt": "2030-01-01T00:00:00.000000Z", "isCanceled": False}
    wait = {"actionType": A.WAIT_FOR_EXTERNAL_EVENT, "externalEventName": "E", "reason": "ExternalEvent"}
    v1 = [[call], [timer, wait]]
    v2 = [[call, {"actionType": A.WHEN_ANY, "compoundActions": [timer, wait]}]]
    assert flatten(v1) == flatten(v2[0])
    assert [a.kind for a in flatten(v1)] == [A.CALL_ACTIVITY, A.CREATE_TIMER, A.WAIT_FOR_EXTERNAL_EVENT]
