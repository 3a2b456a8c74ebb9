"""Instance-id rules of Durable Functions (seed 004, "Orchestration identity")."""

from __future__ import annotations

import uuid

from orderflow.instance_ids import durable_instance_id_problem

from .errors import InvalidInstanceId


def new_instance_id() -> str:
    """A fresh id as the extension makes one: a GUID without dashes (`Guid.NewGuid().ToString("N")`)."""
    return uuid.uuid4().hex


def validate_instance_id(instance_id: object) -> str:
    """Return the id when it obeys the rules, else raise InvalidInstanceId naming the broken rule.

    Rules (seed 004): 1 to 100 characters; must not start with '@'; none of / \\ # ?; no control characters. One
    definition serves the product (`orderflow/instance_ids.py`, checked before any HTTP call) and devhost.
    """
    problem = durable_instance_id_problem(instance_id)
    if problem is not None:
        raise InvalidInstanceId(f"Instance ID {problem}.")
    assert isinstance(instance_id, str)
    return instance_id
