"""Choosing the implementation from configuration: connection strings and identity-based app settings.

Functions host conventions: a binding's `connection="ServiceBusConnection"` reads
`ServiceBusConnection__fullyQualifiedNamespace` (identity-based) or the connection string in
`ServiceBusConnection` (https://learn.microsoft.com/azure/azure-functions/functions-bindings-service-bus#connections).
The real clients are only constructed (no network): azure-servicebus connects lazily.
"""

from __future__ import annotations

import json
from pathlib import Path

import azure.servicebus
import azure.servicebus.aio
import pytest

from orderflow import adapters
from orderflow.embedded import client as embedded
from orderflow.embedded import client_aio as embedded_aio

SAS = "Endpoint=sb://demo.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=abc="
REPO_CONFIG = Path(__file__).resolve().parents[3] / "servicebus.config.json"


def test_embedded_scheme_gives_the_embedded_client_and_loads_config(tmp_path):
    conn = f"Endpoint=embedded://{tmp_path}/bus.db;ConfigFile={REPO_CONFIG}"
    with adapters.bus_from_connection_string(conn) as client:
        assert isinstance(client, embedded.ServiceBusClient)
        assert client.broker.path == str(tmp_path / "bus.db")
        assert set(client.broker.queue_names()) >= {"orders-inbound", "agent-requests", "app-status"}


def test_relative_paths_resolve_against_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sb.json").write_text(json.dumps({"UserConfig": {"Namespaces": [{"Queues": [{"Name": "x"}]}]}}))
    with adapters.bus_from_connection_string("endpoint=EMBEDDED://data/bus.db; ConfigFile=sb.json") as client:
        assert client.broker.path == str(tmp_path / "data" / "bus.db")
        assert client.broker.queue_names() == ["x"]


def test_sas_connection_string_gives_the_real_sdk_client():
    client = adapters.bus_from_connection_string(SAS)
    assert isinstance(client, azure.servicebus.ServiceBusClient)
    assert client.fully_qualified_namespace == "demo.servicebus.windows.net"
    client.close()


async def test_aio_variants_pick_the_same_way(tmp_path):
    real = adapters.aio_bus_from_connection_string(SAS)
    assert isinstance(real, azure.servicebus.aio.ServiceBusClient)
    await real.close()
    async with adapters.aio_bus_from_connection_string(f"Endpoint=embedded://{tmp_path}/bus.db") as local:
        assert isinstance(local, embedded_aio.ServiceBusClient)


def test_settings_prefer_the_identity_based_namespace(tmp_path):
    env = {
        "ServiceBusConnection__fullyQualifiedNamespace": "prod.servicebus.windows.net",
        "ServiceBusConnection": f"Endpoint=embedded://{tmp_path}/bus.db",
    }
    client = adapters.bus_from_settings(env)
    assert isinstance(client, azure.servicebus.ServiceBusClient)
    assert client.fully_qualified_namespace == "prod.servicebus.windows.net"
    assert type(client._credential).__name__ == "DefaultAzureCredential"  # identity only, no keys
    client.close()


async def test_aio_settings_use_the_aio_credential():
    env = {"ServiceBusConnection__fullyQualifiedNamespace": "prod.servicebus.windows.net"}
    client = adapters.aio_bus_from_settings(env)
    assert isinstance(client, azure.servicebus.aio.ServiceBusClient)
    assert type(client._credential).__module__.startswith("azure.identity.aio")
    await client.close()


def test_settings_fall_back_to_the_connection_string(tmp_path):
    client = adapters.bus_from_settings({"Bus": f"Endpoint=embedded://{tmp_path}/bus.db"}, connection="Bus")
    assert isinstance(client, embedded.ServiceBusClient)
    client.close()


def test_missing_settings_name_what_to_set():
    with pytest.raises(KeyError, match="ServiceBusConnection__fullyQualifiedNamespace"):
        adapters.bus_from_settings({})


def test_embedded_endpoint_needs_a_path():
    with pytest.raises(ValueError):
        adapters.bus_from_connection_string("Endpoint=embedded://")
