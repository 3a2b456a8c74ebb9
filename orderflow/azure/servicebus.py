"""Service Bus clients of azure-servicebus, sync or aio: identity-based on a namespace (`DefaultAzureCredential`,
as the Functions host reads `ServiceBusConnection__fullyQualifiedNamespace`), or from a connection string."""

from __future__ import annotations

from typing import Any


def client_for_namespace(namespace: str, *, aio: bool) -> Any:
    """`ServiceBusClient(namespace, DefaultAzureCredential())`, the aio one with `azure.identity.aio`'s credential."""
    if aio:
        from azure.identity.aio import DefaultAzureCredential as AioCredential

        return client_class(True)(namespace, credential=AioCredential())
    from azure.identity import DefaultAzureCredential

    return client_class(False)(namespace, credential=DefaultAzureCredential())


def client_from_connection_string(conn_str: str, *, aio: bool, **kwargs: Any) -> Any:
    """`ServiceBusClient.from_connection_string` (`Endpoint=sb://<namespace>.servicebus.windows.net/;...`)."""
    return client_class(aio).from_connection_string(conn_str, **kwargs)


def client_class(aio: bool) -> Any:
    if aio:
        from azure.servicebus.aio import ServiceBusClient as AioClient

        return AioClient
    from azure.servicebus import ServiceBusClient

    return ServiceBusClient
