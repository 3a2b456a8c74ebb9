"""Who may do what, read from the role assignments of infra/ (the one source: `load_rights` parses the Bicep tree
with `_grants`, lazily, since tree-sitter is a dev dependency), and the answers Azure gives when an identity lacks a
right. The stand-ins (embedded client, AMQP endpoint, embedded store) ask `Rights.bus_allows` and
`Rights.store_allows`; an identity names a principal of infra/ (`FUNCTION_APP`, `AGENT`, `OPERATORS`, a submitting
application's name), or the namespace owner (`OWNER`), who has every right. Sources: docs/modules-product.md."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

from ._model import (
    AGENT,
    BUS_ACTIONS,
    COSMOS_ACTION,
    FUNCTION_APP,
    LISTEN,
    OPERATORS,
    OWNER,
    SEND,
    SIMULATOR,
    Grant,
    Rights,
    Role,
)

__all__ = [
    "AGENT",
    "BUS_ACTIONS",
    "COSMOS_ACTION",
    "FUNCTION_APP",
    "LISTEN",
    "OPERATORS",
    "OWNER",
    "SEND",
    "SIMULATOR",
    "Grant",
    "Rights",
    "Role",
    "load_rights",
    "submitting_app",
    "unauthorized_description",
    "unknown_identity_description",
]


@cache
def load_rights(infra: Path | None = None) -> Rights:
    """The rights of `infra` (default: this repository's infra/), parsed once per process."""
    from ._bicep import INFRA  # tree-sitter: only here, when rights are checked
    from ._grants import grants

    folder = (infra or INFRA).resolve()
    return Rights(tuple(grants(folder)), folder)


def submitting_app(reply_queue: str) -> str:
    """The submitting application whose status queue `reply_queue` is: `<name>-status` (infra/app/types.bicep)."""
    return reply_queue.removesuffix("-status")


def unauthorized_description(claim: str, resource: str, now: datetime | None = None) -> str:
    """Service Bus's description of a refused link or request (condition amqp:unauthorized-access): 'Unauthorized
    access. '<claim>' claim(s) are required to perform this operation. Resource: '<sb://...>'. TrackingId:...'."""
    moment = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S")
    return (
        f"Unauthorized access. '{claim}' claim(s) are required to perform this operation. Resource: '{resource}'. "
        f"TrackingId:{uuid.uuid4().hex}_G0, SystemTracker:NoSystemTracker, Timestamp:{moment}"
    )


def unknown_identity_description(identity: str) -> str:
    """The put-token refusal (401) of a key name that is neither the owner's nor an identity of infra/."""
    return (
        f"InvalidSignature: the SAS key name {identity!r} names no identity of infra/ (the local rights read "
        f"the role assignments of infra/; the owner is {OWNER})."
    )
