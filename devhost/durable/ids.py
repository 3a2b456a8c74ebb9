"""Instance-id rules of Durable Functions (seed 004, "Orchestration identity")."""

from __future__ import annotations

import unicodedata
import uuid

from .errors import InvalidInstanceId

MAX_INSTANCE_ID_LENGTH = 100
FORBIDDEN_CHARACTERS = frozenset("/\\#?")


def new_instance_id() -> str:
    """A fresh id as the extension makes one: a GUID without dashes (`Guid.NewGuid().ToString("N")`)."""
    return uuid.uuid4().hex


def validate_instance_id(instance_id: object) -> str:
    """Return the id when it obeys the rules, else raise InvalidInstanceId naming the broken rule.

    Rules (seed 004): 1 to 100 characters; must not start with '@'; none of / \\ # ?; no control characters.
    """
    if not isinstance(instance_id, str) or not instance_id:
        raise InvalidInstanceId("Instance ID must be a non-empty string.")
    if len(instance_id) > MAX_INSTANCE_ID_LENGTH:
        raise InvalidInstanceId(
            f"Instance ID must be at most {MAX_INSTANCE_ID_LENGTH} characters long (got {len(instance_id)})."
        )
    if instance_id.startswith("@"):
        raise InvalidInstanceId("Instance ID must not start with '@'.")
    bad = sorted(FORBIDDEN_CHARACTERS.intersection(instance_id))
    if bad:
        raise InvalidInstanceId(f"Instance ID must not contain {' '.join(bad)}.")
    if any(unicodedata.category(ch) == "Cc" for ch in instance_id):
        raise InvalidInstanceId("Instance ID must not contain control characters.")
    return instance_id
