"""Service Bus clients of azure-servicebus, sync or aio: identity-based on a namespace (`DefaultAzureCredential`,
as the Functions host reads `ServiceBusConnection__fullyQualifiedNamespace`), or from a connection string."""

from __future__ import annotations

from typing import Any

from orderflow.ports import BusClient


def aio_client_for_namespace(namespace: str) -> BusClient:
    """`azure.servicebus.aio.ServiceBusClient(namespace, azure.identity.aio.DefaultAzureCredential())`."""
    from azure.identity.aio import DefaultAzureCredential
    from azure.servicebus.aio import ServiceBusClient

    return ServiceBusClient(namespace, credential=DefaultAzureCredential())


def aio_client_from_connection_string(conn_str: str, **kwargs: Any) -> BusClient:
    """`azure.servicebus.aio.ServiceBusClient.from_connection_string` (`Endpoint=sb://<namespace>...`)."""
    from azure.servicebus.aio import ServiceBusClient

    return ServiceBusClient.from_connection_string(conn_str, **kwargs)


def client_for_namespace(namespace: str) -> Any:
    """`azure.servicebus.ServiceBusClient(namespace, DefaultAzureCredential())`."""
    from azure.identity import DefaultAzureCredential
    from azure.servicebus import ServiceBusClient

    return ServiceBusClient(namespace, credential=DefaultAzureCredential())


def client_from_connection_string(conn_str: str, **kwargs: Any) -> Any:
    """`azure.servicebus.ServiceBusClient.from_connection_string` (`Endpoint=sb://<namespace>...`)."""
    from azure.servicebus import ServiceBusClient

    return ServiceBusClient.from_connection_string(conn_str, **kwargs)
