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


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("", "non-empty"),
        ("x/y:1", "/"),
        ("x?y", "?"),
        ("x#y", "#"),
        ("../x:1", "/"),
        ("x\\y", "\\"),
        ("@o:1", "'@'"),
        ("o\x00:1", "control"),
        ("o\x7f", "control"),
        ("o" * 101, "at most 100"),
    ],
)
def test_each_broken_rule_is_named(value: str, rule: str) -> None:
    problem = durable_instance_id_problem(value)
    assert problem is not None and rule in problem


@given(order_id=st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z"), attempt=st.integers(1, MAX_ATTEMPT))
def test_every_scheduler_instance_id_obeys_the_rules(order_id: str, attempt: int) -> None:
    assert durable_instance_id_problem(instance_id(order_id, attempt)) is None


def test_devhost_md_states_the_length_rule_the_code_applies() -> None:
    """The product keeps 100 characters; the extension's own limit is 256 (Azure/azure-functions-durable-extension
    src/WebJobs.Extensions.DurableTask/ContextImplementations/DurableClient.cs, `MaxInstanceIdLength = 256`), so the
    docs must not call 100 the extension's rule."""
    from pathlib import Path

    from orderflow.instance_ids import MAX_INSTANCE_ID_LENGTH

    doc = (Path(__file__).resolve().parents[3] / "docs" / "devhost.md").read_text()
    (bullet,) = [line for line in doc.split("\n- ") if line.startswith("instance ids validated")]
    bullet = " ".join(bullet.split())
    assert f"1–{MAX_INSTANCE_ID_LENGTH} characters" in bullet
    assert "the extension itself allows 256" in bullet
    assert "as the extension does" not in bullet
    assert durable_instance_id_problem("x" * 101) is not None and durable_instance_id_problem("x" * 100) is None
