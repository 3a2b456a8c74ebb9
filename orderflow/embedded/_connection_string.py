"""Embedded connection strings: `Endpoint=embedded://<db>[?<faults>][;ConfigFile=...][;DuplicateDelivery=true]
[;Identity=<name>]` parsed (`parse_embedded`), and the broker a connection string names, bound to its identity
(`broker_from_connection_string`). Section orderflow/embedded/_core.py of docs/modules-product.md."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ._access import BusAccess, bind
from .broker import EmbeddedBroker
from .broker._bus_faults import BusFaults, split_endpoint
from .connection import EMBEDDED_SCHEME


@dataclass(frozen=True)
class EmbeddedConnection:
    """A parsed `Endpoint=embedded://<db path>[?<faults>][;ConfigFile=<config path>][;DuplicateDelivery=true]
    [;Identity=<name>]` connection string. `DuplicateDelivery` and the endpoint's options (`BusFaults`) are
    fault-injection switches (orderflow/embedded/broker/): a lost first complete; server busy, timeouts and dropped
    connections. `Identity`: the identity of infra/ it acts as (orderflow/embedded/_access.py; none: the owner)."""

    db_path: str
    config_file: str | None
    duplicate_delivery: bool = False
    faults: BusFaults | None = None
    identity: str | None = None


def parse_connection_string(conn_str: str) -> dict[str, str]:
    """`Key=Value;...` → dict with lower-cased keys (values keep their case; '=' allowed in values)."""
    pairs = (part.split("=", 1) for part in conn_str.split(";") if part.strip())
    return {key.strip().lower(): value.strip() for key, value in pairs}


def parse_embedded(conn_str: str) -> EmbeddedConnection:
    parts = parse_connection_string(conn_str)
    endpoint = parts.get("endpoint", "")
    if not endpoint.lower().startswith(EMBEDDED_SCHEME):
        raise ValueError("not an embedded connection string: Endpoint must start with embedded://")
    path, faults = split_endpoint(endpoint[len(EMBEDDED_SCHEME) :])
    if not path:
        raise ValueError("embedded connection string needs a database path: Endpoint=embedded://<path>")
    config = parts.get("configfile")
    duplicate = parts.get("duplicatedelivery", "false").lower()
    if duplicate not in ("true", "false"):
        raise ValueError(f"DuplicateDelivery must be true or false, got {duplicate!r}")
    config_file = os.path.abspath(config) if config else None
    identity = parts.get("identity") or None
    return EmbeddedConnection(os.path.abspath(path), config_file, duplicate == "true", faults, identity)


def broker_from_connection_string(conn_str: str, *, infra: Any = None, **kwargs: Any) -> EmbeddedBroker:
    """The connection's broker, bound to its identity (`infra`: the folder its rights are read from)."""
    c = parse_embedded(conn_str)
    broker = EmbeddedBroker(
        c.db_path, config=c.config_file, duplicate_delivery=c.duplicate_delivery, faults=c.faults, **kwargs
    )
    return bind(broker, BusAccess(c.identity, infra))
