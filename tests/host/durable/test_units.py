"""Pure pieces of the durable backend: instance-id rules, retry delays, action decoding, episode batching."""

from __future__ import annotations

from datetime import timedelta

import pytest
from azure.durable_functions.models.actions.ActionType import ActionType as A

from devhost.durable.actions import flatten, nondeterminism
from devhost.durable.episode import select_batch
from devhost.durable.errors import InvalidInstanceId
from devhost.durable.ids import validate_instance_id
from devhost.durable.retry import RetryPolicy
from devhost.durable.timeline import Bookkeeping


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
    assert policy.may_retry_after(3) and not policy.may_retry_after(4)
    sdk_json = {"firstRetryIntervalInMilliseconds": 250, "maxNumberOfAttempts": 2}  # RetryOptions.to_json
    assert RetryPolicy.from_json(sdk_json).delay_after_attempt(5) == timedelta(milliseconds=250)


def test_v1_and_v2_action_shapes_flatten_to_the_same_order() -> None:
    call = {"actionType": A.CALL_ACTIVITY, "functionName": "a", "input": "1"}
    timer = {"actionType": A.CREATE_TIMER, "fireAt": "2030-01-01T00:00:00.000000Z", "isCanceled": False}
    wait = {"actionType": A.WAIT_FOR_EXTERNAL_EVENT, "externalEventName": "E", "reason": "ExternalEvent"}
    v1 = [[call], [timer, wait]]
    v2 = [[call, {"actionType": A.WHEN_ANY, "compoundActions": [timer, wait]}]]
    assert flatten(v1) == flatten(v2[0])
    assert [a.kind for a in flatten(v1)] == [A.CALL_ACTIVITY, A.CREATE_TIMER, A.WAIT_FOR_EXTERNAL_EVENT]


def test_nondeterminism_names_expected_and_actual() -> None:
    recorded = [{"kind": int(A.CALL_ACTIVITY), "name": "A"}]
    replay = flatten([{"actionType": A.CALL_ACTIVITY, "functionName": "B"}])
    message = nondeterminism(recorded, replay, finished=True)
    assert message is not None and "CallActivity 'A'" in message and "CallActivity 'B'" in message
    assert (
        nondeterminism(recorded, flatten([{"actionType": A.CALL_ACTIVITY, "functionName": "A"}]), finished=True) is None
    )
    assert "nothing" in (nondeterminism(recorded, [], finished=True) or "")


def test_a_retry_event_always_opens_its_own_episode() -> None:
    state = Bookkeeping(tasks={"0": {"group": "0", "role": "call"}, "3": {"group": "0", "role": "timer"}})
    completed = {"EventType": 5, "TaskScheduledId": 1}
    failed_retry = {"EventType": 6, "TaskScheduledId": 0}
    retry_timer = {"EventType": 11, "TimerId": 3}
    inbox = [(1, completed), (2, failed_retry), (3, completed), (4, retry_timer)]
    assert [i for i, _ in select_batch(inbox, state)] == [1]
    assert [i for i, _ in select_batch(inbox[1:], state)] == [2, 3]
    assert [i for i, _ in select_batch(inbox[3:], state)] == [4]
