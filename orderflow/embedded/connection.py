"""The `embedded://` scheme that selects a stand-in, and the check for it, without loading the stand-ins.

A Service Bus connection string `Endpoint=embedded://<sqlite>[;...]` selects the embedded broker, a Cosmos DB
endpoint `embedded://<sqlite>` the embedded store (orderflow.adapters chooses; orderflow.embedded._core parses).
"""

from __future__ import annotations

EMBEDDED_SCHEME = "embedded://"


def is_embedded_connection(conn_str: str) -> bool:
    """Whether a Service Bus connection string names the embedded broker (`Endpoint=embedded://...`)."""
    pairs = (part.split("=", 1) for part in conn_str.split(";") if "=" in part)
    endpoint = next((value.strip() for key, value in pairs if key.strip().lower() == "endpoint"), "")
    return endpoint.lower().startswith(EMBEDDED_SCHEME)
