"""The `embedded://` scheme that selects a stand-in, and the check for it, without loading the stand-ins.

A Service Bus connection string `Endpoint=embedded://<sqlite>[;...]` selects the embedded broker, a Cosmos DB
endpoint `embedded://<sqlite>` the embedded store (orderflow.adapters chooses; orderflow.embedded._core parses).
The identity a local connection acts as (orderflow/embedded/rights) is the embedded broker's `Identity` option, the
SAS key name of the emulator form of its AMQP endpoint, or the store endpoint's `identity=` option:
`bus_connection_as` and `store_endpoint_as` set it, so that the lab and the CLI give each process its own.
"""

from __future__ import annotations

from collections.abc import Mapping

EMBEDDED_SCHEME = "embedded://"


def is_embedded_connection(conn_str: str) -> bool:
    """Whether a Service Bus connection string names the embedded broker (`Endpoint=embedded://...`)."""
    pairs = (part.split("=", 1) for part in conn_str.split(";") if "=" in part)
    endpoint = next((value.strip() for key, value in pairs if key.strip().lower() == "endpoint"), "")
    return endpoint.lower().startswith(EMBEDDED_SCHEME)


# -- identities (orderflow/embedded/rights): who a local connection acts as ----------------------------------------

IDENTITY = "Identity"  # the embedded broker's connection-string option
KEY_NAME = "SharedAccessKeyName"  # the emulator form's: the SAS key name the SDK puts in its CBS token
OWNER_KEY = "RootManageSharedAccessKey"
STORE_IDENTITY = "identity"  # the embedded store endpoint's option


def _pairs(conn_str: str) -> list[tuple[str, str]]:
    return [(k.strip(), v.strip()) for k, _, v in (p.partition("=") for p in conn_str.split(";") if p.strip())]


def is_local_connection(conn_str: str) -> bool:
    """The embedded broker's, or the emulator form of its AMQP endpoint (`UseDevelopmentEmulator=true`)."""
    emulator = any(k.lower() == "usedevelopmentemulator" and v.lower() == "true" for k, v in _pairs(conn_str))
    return emulator or is_embedded_connection(conn_str)


def connection_identity(conn_str: str) -> str | None:
    """The identity a local connection string names (`Identity`, or the emulator form's `SharedAccessKeyName`);
    None when it names none (the owner)."""
    key = IDENTITY if is_embedded_connection(conn_str) else KEY_NAME
    return next((v for k, v in _pairs(conn_str) if k.lower() == key.lower() and v), None)


def bus_connection_as(conn_str: str, identity: str | None) -> str:
    """A local Service Bus connection string acting as `identity` (None: the owner, every right): the embedded
    broker's `Identity` option, the emulator form's SharedAccessKeyName (RootManageSharedAccessKey for the owner).
    Any other string (Azure's: the identity is the credential's) is returned as it is."""
    if not is_local_connection(conn_str):
        return conn_str
    embedded = is_embedded_connection(conn_str)
    key = IDENTITY if embedded else KEY_NAME
    pairs = [(k, v) for k, v in _pairs(conn_str) if k.lower() != key.lower()]
    name = identity or (None if embedded else OWNER_KEY)
    if name is not None:
        pairs.insert(1, (key, name))
    return ";".join(f"{k}={v}" for k, v in pairs) + ("" if embedded else ";")


def store_endpoint_as(endpoint: str, identity: str | None) -> str:
    """An embedded store endpoint (`embedded://PATH[?options]`) acting as `identity` (its `identity=` option; None:
    the owner); any other endpoint as it is."""
    if not endpoint.lower().startswith(EMBEDDED_SCHEME):
        return endpoint
    path, _, query = endpoint.partition("?")
    options = [o for o in query.split("&") if o and o.partition("=")[0] != STORE_IDENTITY]
    if identity is not None:
        options.append(f"{STORE_IDENTITY}={identity}")
    return path + ("?" + "&".join(options) if options else "")


def store_identity(endpoint: str) -> str | None:
    """The identity an embedded store endpoint names, None when it names none."""
    query = endpoint.partition("?")[2]
    return next((v for k, _, v in (o.partition("=") for o in query.split("&")) if k == STORE_IDENTITY and v), None)


def settings_as(env: Mapping[str, str], identity: str | None) -> dict[str, str]:
    """App settings whose local Service Bus connection (`ServiceBusConnection`) and store endpoint
    (`CosmosDb__accountEndpoint`) act as `identity`; Azure's are left as they are."""
    out = dict(env)
    if out.get("ServiceBusConnection"):
        out["ServiceBusConnection"] = bus_connection_as(out["ServiceBusConnection"], identity)
    if out.get("CosmosDb__accountEndpoint"):
        out["CosmosDb__accountEndpoint"] = store_endpoint_as(out["CosmosDb__accountEndpoint"], identity)
    return out
