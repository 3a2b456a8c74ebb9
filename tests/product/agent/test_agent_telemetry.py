"""The Agent's entry point configures telemetry from its environment, as function_app.py does: Azure Monitor
OpenTelemetry with the Agent's managed identity when APPLICATIONINSIGHTS_CONNECTION_STRING is set (agent.bicep sets
it), nothing otherwise. The exporter is mocked at the boundary (azure.monitor.opentelemetry, azure.identity)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import azure.identity
import azure.monitor.opentelemetry
import pytest

import agent.__main__ as entry

CONNECTION = "InstrumentationKey=00000000-0000-0000-0000-000000000000;IngestionEndpoint=https://example.invalid/"
TELEMETRY_ENV = (
    "APPLICATIONINSIGHTS_CONNECTION_STRING",
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
    "AZURE_CLIENT_ID",
)


class FakeCredential:
    def __init__(self, *, client_id: str | None = None) -> None:
        self.client_id = client_id


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """What main() did, in order: configured the exporter (with its arguments) and ran the worker."""
    seen: list[tuple[str, Any]] = []

    def configure_azure_monitor(**kwargs: Any) -> None:
        seen.append(("configure_azure_monitor", kwargs))

    async def run(argv: Sequence[str] | None) -> int:
        seen.append(("run", argv))
        return 0

    monkeypatch.setattr(azure.monitor.opentelemetry, "configure_azure_monitor", configure_azure_monitor)
    monkeypatch.setattr(azure.identity, "ManagedIdentityCredential", FakeCredential)
    monkeypatch.setattr(entry, "_run", run)
    for name in TELEMETRY_ENV:
        monkeypatch.delenv(name, raising=False)
    return seen


def test_without_a_connection_string_the_agent_exports_nothing(events: list[tuple[str, Any]]) -> None:
    assert entry.main(["--log-level", "info"]) == 0
    assert events == [("run", ["--log-level", "info"])]


def test_with_a_connection_string_the_agent_exports_with_its_identity(
    events: list[tuple[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APPLICATIONINSIGHTS_CONNECTION_STRING", CONNECTION)
    monkeypatch.setenv("APPLICATIONINSIGHTS_AUTHENTICATION_STRING", "ClientId=agent-client-id;Authorization=AAD")
    monkeypatch.setenv("AZURE_CLIENT_ID", "agent-client-id")
    assert entry.main([]) == 0
    (configured, kwargs), ran = events
    assert configured == "configure_azure_monitor" and ran == ("run", [])  # before the worker starts
    assert isinstance(kwargs["credential"], FakeCredential) and kwargs["credential"].client_id == "agent-client-id"
    assert kwargs["logger_name"] == "orderflow"
