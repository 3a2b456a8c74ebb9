"""Instance ids: the Durable Functions rules, and the product's rule for a Scheduler instance.

Durable rules (seed 004, "Orchestration identity"): 1-100 characters, no leading '@', none of / \\ # ?, no control
characters; an id we *address* (raise an event to) must not be empty. The characters follow the extension's
`DurableClient.StartNewAsync` (`IsInvalidCharacter`); the length is the documented, stricter 100.
devhost's Durable emulator applies the same function (devhost/durable/ids.py `validate_instance_id`).
Product rule: the Scheduler instance of one attempt is `<orderId>:<attempt>` (`orderflow.records.instance_id`).
Sources and the extension's own limits: docs/modules-product.md."""

from __future__ import annotations

import unicodedata

MAX_INSTANCE_ID_LENGTH = 100
FORBIDDEN_CHARACTERS = frozenset("/\\#?")


def durable_instance_id_problem(instance_id: object) -> str | None:
    """None when `instance_id` obeys the Durable instance-id rules, else which rule it breaks (a sentence)."""
    if not isinstance(instance_id, str) or not instance_id:
        return "must be a non-empty string"
    if len(instance_id) > MAX_INSTANCE_ID_LENGTH:
        return f"must be at most {MAX_INSTANCE_ID_LENGTH} characters long (got {len(instance_id)})"
    if instance_id.startswith("@"):
        return "must not start with '@'"
    bad = sorted(FORBIDDEN_CHARACTERS.intersection(instance_id))
    if bad:
        return f"must not contain {' '.join(bad)}"
    if any(unicodedata.category(ch) == "Cc" for ch in instance_id):
        return "must not contain control characters"
    return None
