"""Who an embedded client's connection acts as (its `Identity` option), and the refusal of a link its identity
has no right to, raised by the SDK's own code as azure-servicebus raises Service Bus's answer. The identity is bound
to the client's broker (one per connection string) when the client is made; a broker nobody bound is the owner's.
Sources: docs/modules-product.md, section orderflow/embedded/_access.py."""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from pathlib import Path

from azure.servicebus._pyamqp.error import AMQPLinkError, ErrorCondition, TokenAuthFailure
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport

from .broker import EmbeddedBroker
from .rights import OWNER, load_rights, unauthorized_description, unknown_identity_description

_LOG = logging.getLogger("azure.servicebus")
NAMESPACE = "embedded"  # the namespace host of the embedded broker's entity URIs (sb://embedded/<queue>)


@dataclass(frozen=True)
class BusAccess:
    """An identity (None or OWNER: every right) and the infra folder its rights are read from (None: infra/)."""

    identity: str | None
    infra: Path | None = None


_BOUND: weakref.WeakKeyDictionary[EmbeddedBroker, BusAccess] = weakref.WeakKeyDictionary()


def bind(broker: EmbeddedBroker, access: BusAccess) -> EmbeddedBroker:
    _BOUND[broker] = access
    return broker


def authorize(broker: EmbeddedBroker, queue: str, claim: str, entity_path: str | None = None) -> None:
    """What attaching a link to `queue` (its dead-letter queue: `entity_path`) learns of the connection's rights:
    nothing for the owner; a key name infra/ does not know fails the put-token (401: ServiceBusAuthenticationError);
    a missing claim detaches the link with amqp:unauthorized-access (ServiceBusAuthorizationError, not retried)."""
    access = _BOUND.get(broker)
    if access is None or access.identity in (None, OWNER):
        return
    rights = load_rights(access.infra)
    identity = access.identity
    if not rights.knows(identity):
        failure = TokenAuthFailure(401, unknown_identity_description(identity).encode())  # type: ignore[no-untyped-call]
        raise PyamqpTransport.create_servicebus_exception(_LOG, failure)
    if not rights.bus_allows(identity, claim, queue):
        resource = f"sb://{NAMESPACE}/{(entity_path or queue).lower()}"
        error = AMQPLinkError(ErrorCondition.UnauthorizedAccess, description=unauthorized_description(claim, resource))
        raise PyamqpTransport.create_servicebus_exception(_LOG, error)
