"""An AMQP 1.0 endpoint that speaks Service Bus's dialect over the embedded broker, so the unmodified SDKs
(azure-servicebus, @azure/service-bus, the Functions host's .NET SDK) work against the local queues: same SQLite
file, same semantics as the embedded client. `python -m devhost servicebus` runs it (`serve`); clients use the
emulator's connection string. What it implements and how it differs from Service Bus: docs/devhost.md, "The AMQP
endpoint"; the modules' notes: docs/modules-product.md."""

from __future__ import annotations

from typing import Any

from ._cli import add_arguments, serve

__all__ = ["Endpoint", "add_arguments", "serve"]


def __getattr__(name: str) -> Any:
    if name == "Endpoint":  # loads proton on first use, so `python -m devhost --help` does not
        from ._server import Endpoint

        return Endpoint
    raise AttributeError(name)
