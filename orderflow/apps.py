"""Submitting apps: which app an order came from, and which orders, queues and statuses are that app's.

Service Bus does not stamp a message with its sender, so the app is read from the queue: each app has an inbound
queue only its identity may send to (`<name>-orders`) and a status queue only it may read (`<name>-status`).
An order's identity includes its app: stores, instance ids, LockedBy, Agent sessions and idempotency keys use the
order *key* `<app>.<orderId>` ('.' never occurs in an orderId, so two apps' keys never meet), except for the legacy
app (`LegacyOrdersApp`, the owner of the shared `orders-inbound` of before per-app queues), whose keys stay the bare
orderId so that its existing records and in-flight orders keep matching. A key is at most 24 + 1 + 64 = 89
characters: an instance id `<key>:<attempt>` (at most 95) keeps the Durable rules (orderflow/instance_ids.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

APP_NAME_MAX_LEN = 24
# Lower-case so that `<name>-orders` and `<name>-status` are valid queue names and a Bicep resource-name part;
# starting with a letter so that `submission-<name>` is a valid function name.
APP_NAME_PATTERN = re.compile(r"\A[a-z][a-z0-9-]{0,23}\Z")
SCOPE = "."  # between the app and the orderId in an order key; never in an orderId (messages.ORDER_ID_PATTERN)
NO_LEGACY_APP = "none"  # LegacyOrdersApp's value for "no legacy app": every app's keys are scoped


def valid_app_name(name: str) -> str:
    if not APP_NAME_PATTERN.match(name) or name == NO_LEGACY_APP:
        raise ValueError(
            f"app name {name!r} must be 1-{APP_NAME_MAX_LEN} characters of a-z 0-9 -, starting with a letter "
            f"(and not {NO_LEGACY_APP!r})"
        )
    return name


def inbound_queue(app: str) -> str:
    """The app's own inbound queue: only its identity may send there."""
    return f"{app}-orders"


def status_queue(app: str) -> str:
    """The app's own status queue: only its identity may read it; every status of its orders goes there."""
    return f"{app}-status"


def client_order_id(key: str) -> str:
    """The orderId the app chose, from an order key (what a status message to the app carries)."""
    return key.rpartition(SCOPE)[2]


def key_scope(key: str) -> str | None:
    """The app named in a scoped key; None for an unscoped key (the legacy app's)."""
    scope, sep, _ = key.rpartition(SCOPE)
    return scope if sep else None


@dataclass(frozen=True)
class KeyFilter:
    """The orders of one app, as a store query selects them by key: `scope` None = the unscoped keys (the legacy
    app's, no '.' in the id), else the keys `<scope>.<orderId>`. By key rather than by the records' `app` field, so
    that records written before per-app queues (no `app`) are found too."""

    scope: str | None

    def matches(self, key: str) -> bool:
        return key_scope(key) == self.scope

    def prefix(self) -> str | None:
        """The id prefix of a scoped filter (`<scope>.`); None for the unscoped one."""
        return None if self.scope is None else f"{self.scope}{SCOPE}"


@dataclass(frozen=True)
class SubmittingApps:
    """The apps (`SubmittingApps`), the legacy app (`LegacyOrdersApp`) and each app's backlog bound."""

    names: tuple[str, ...] = ("app",)
    legacy: str | None = "app"
    max_pending: int = 5000  # MaxPendingOrders: each app's bound unless `pending_bounds` names it
    pending_bounds: Mapping[str, int] = field(default_factory=dict)  # MaxPendingOrdersPerApp

    def __post_init__(self) -> None:
        if not self.names:
            raise ValueError("app setting SubmittingApps must name at least one app")
        for name in self.names:
            valid_app_name(name)
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"app setting SubmittingApps names an app twice: {','.join(self.names)}")
        if self.legacy is not None and self.legacy not in self.names:
            raise ValueError(f"app setting LegacyOrdersApp {self.legacy!r} is not one of SubmittingApps")
        unknown = sorted(set(self.pending_bounds) - set(self.names))
        if unknown:
            raise ValueError(f"app setting MaxPendingOrdersPerApp names unknown app(s): {', '.join(unknown)}")

    @classmethod
    def parse(cls, names: str, legacy: str, max_pending: int, per_app: str = "") -> SubmittingApps:
        return cls(
            names=tuple(n.strip() for n in names.split(",") if n.strip()),
            legacy=None if legacy.strip() in ("", NO_LEGACY_APP) else legacy.strip(),
            max_pending=max_pending,
            pending_bounds=_bounds(per_app),
        )

    def order_key(self, app: str, order_id: str) -> str:
        """The order's identity in every store and instance id: `<app>.<orderId>`, the bare orderId for the legacy
        app."""
        return order_id if app == self.legacy else f"{app}{SCOPE}{order_id}"

    def owner(self, key: str) -> str | None:
        """The app an order key belongs to, from the key alone (`owner_of` with no record: an unscoped key is the
        legacy app's); None when no configured app owns it."""
        return self.owner_of(key, None, None)

    def owner_of(self, key: str, app: str | None, reply_to: str | None) -> str | None:
        """The app a stored order belongs to: the record's own `app`; for a scoped key, its scope; for a record written
        before per-app queues (no `app`, a bare key, from the days when every app sent to one queue), the app whose
        status queue its replyTo names, else the legacy app. None: no configured app (one since removed)."""
        owner = app or key_scope(key) or next((n for n in self.names if status_queue(n) == reply_to), self.legacy)
        return owner if owner in self.names else None

    def keys_of(self, app: str) -> KeyFilter:
        """The store filter that selects `app`'s orders."""
        return KeyFilter(None if app == self.legacy else app)

    def pending_bound(self, app: str) -> int:
        return self.pending_bounds.get(app, self.max_pending)

    def status_queues(self) -> frozenset[str]:
        return frozenset(status_queue(a) for a in self.names)

    def inbound_queues(self) -> frozenset[str]:
        return frozenset(inbound_queue(a) for a in self.names)


def _bounds(text: str) -> dict[str, int]:
    """`app=100,partner=20` → {"app": 100, "partner": 20}; ValueError naming the entry that is not `name=N`, N ≥ 1."""
    bounds: dict[str, int] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, sep, value = entry.partition("=")
        if not sep or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"app setting MaxPendingOrdersPerApp: {entry!r} must be <app>=<positive integer>")
        bounds[valid_app_name(name.strip())] = int(value)
    return bounds
