"""Instance-id rules: orderflow/instance_ids.py (used before any HTTP call) and devhost's Durable emulator
(devhost/durable/ids.py, which applies it) accept exactly the same ids. The rules: seed 004 "Orchestration
identity" (1-100 characters, no leading '@', none of / \\ # ?, no control characters); the characters as the
extension checks them: DurableClient.cs `IsInvalidCharacter` (Azure/azure-functions-durable-extension).
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from devhost.durable import InvalidInstanceId, validate_instance_id
from orderflow.instance_ids import durable_instance_id_problem
from orderflow.messages import MAX_ATTEMPT
from orderflow.records import instance_id


def devhost_accepts(value: str) -> bool:
    try:
        validate_instance_id(value)
    except InvalidInstanceId:
        return False
    return True


# Text biased towards the characters the rules are about.
RULE_CHARS = st.sampled_from(["/", "\\", "#", "?", "@", "\x00", "\n", "\x7f", "\x85", ":", "a", "0", "é", "-"])
IDS = st.one_of(st.text(max_size=120), st.lists(RULE_CHARS, max_size=110).map("".join))


@settings(max_examples=400, deadline=None)
@given(value=IDS)
@example(value="")
@example(value="x" * 100)
@example(value="x" * 101)
@example(value="a@b")
def test_orderflow_and_devhost_accept_the_same_instance_ids(value: str) -> None:
    assert (durable_instance_id_problem(value) is None) == devhost_accepts(value)


@pytest.mark.parametrize(("value", "rule"), [
    ("", "non-empty"), ("x/y:1", "/"), ("x?y", "?"), ("x#y", "#"), ("../x:1", "/"), ("x\\y", "\\"),
    ("@o:1", "'@'"), ("o\x00:1", "control"), ("o\x7f", "control"), ("o" * 101, "at most 100"),
])
def test_each_broken_rule_is_named(value: str, rule: str) -> None:
    problem = durable_instance_id_problem(value)
    assert problem is not None and rule in problem


@given(order_id=st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z"), attempt=st.integers(1, MAX_ATTEMPT))
def test_every_scheduler_instance_id_obeys_the_rules(order_id: str, attempt: int) -> None:
    assert durable_instance_id_problem(instance_id(order_id, attempt)) is None
