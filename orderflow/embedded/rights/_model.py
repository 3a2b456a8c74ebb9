"""The rights model: identities, roles (actions and data actions), grants, and the checks on them
(`Rights.bus_allows`, `Rights.store_allows`). Read from infra/ by `_grants`; used through the package."""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

FUNCTION_APP, AGENT, OPERATORS, SIMULATOR = "function-app", "agent", "operators", "simulator"
# The Service Bus emulator's (and a namespace's) root policy: Manage, Send and Listen on every entity
# (https://learn.microsoft.com/azure/service-bus-messaging/overview-emulator: its connection string names it).
OWNER = "RootManageSharedAccessKey"
SEND, LISTEN = "Send", "Listen"
# The data action each Service Bus claim stands for (the built-in roles page, integration: Data Sender's
# Microsoft.ServiceBus/*/send/action, Data Receiver's .../receive/action).
BUS_ACTIONS = {
    SEND: "Microsoft.ServiceBus/namespaces/messages/send/action",
    LISTEN: "Microsoft.ServiceBus/namespaces/messages/receive/action",
}
COSMOS_ACTION = "Microsoft.DocumentDB/databaseAccounts/"


@dataclass(frozen=True)
class Role:
    """A role definition: its name, control-plane actions and data actions (`*` wildcards, as Azure writes them)."""

    name: str
    actions: tuple[str, ...] = ()
    data_actions: tuple[str, ...] = ()

    def allows(self, data_action: str) -> bool:
        """Whether a data action is granted (wildcards; case-insensitive, as Azure compares operation names)."""
        return any(fnmatchcase(data_action.lower(), pattern.lower()) for pattern in self.data_actions)


@dataclass(frozen=True)
class Grant:
    """One role assignment: `resource` is a queue name ("" for the whole namespace) for service "servicebus", a
    data-plane path (`/`, `/dbs/<db>`, `/dbs/<db>/colls/<container>`) for "cosmos", a symbol for anything else."""

    identity: str
    role: Role
    service: str
    resource: str
    where: str  # file:line and symbol of the assignment in infra/

    def covers(self, path: str) -> bool:
        if self.service == "servicebus":
            return self.resource in ("", path)
        scope = self.resource.rstrip("/")
        return not scope or path == scope or path.startswith(scope + "/")


@dataclass(frozen=True)
class Rights:
    """Every grant of one infra folder."""

    grants: tuple[Grant, ...]
    infra: Path | None = None
    identities: frozenset[str] = field(default=frozenset())

    def __post_init__(self) -> None:
        object.__setattr__(self, "identities", frozenset(g.identity for g in self.grants))

    def knows(self, identity: str) -> bool:
        return identity == OWNER or identity in self.identities

    def of(self, identity: str) -> list[Grant]:
        return [g for g in self.grants if g.identity == identity]

    def bus_allows(self, identity: str, claim: str, queue: str) -> bool:
        """Whether `identity` holds `claim` (SEND, LISTEN) on `queue` (its dead-letter queue is part of it)."""
        if identity == OWNER:
            return True
        action = BUS_ACTIONS[claim]
        return any(g.service == "servicebus" and g.covers(queue) and g.role.allows(action) for g in self.of(identity))

    def store_allows(self, identity: str, data_action: str, path: str) -> bool:
        """Whether `identity` may perform a Cosmos DB data action (`items/read`, `readMetadata`, ... after
        `COSMOS_ACTION`) on `path` (`/` or `/dbs/<db>/colls/<container>`)."""
        if identity == OWNER:
            return True
        action = data_action if data_action.startswith(COSMOS_ACTION) else COSMOS_ACTION + data_action
        return any(g.service == "cosmos" and g.covers(path) and g.role.allows(action) for g in self.of(identity))
