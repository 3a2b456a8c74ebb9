"""Fixtures for the SDK-type Service Bus binding tests: a host event loop on its own thread, a registry of
deliveries, and a running SettlementServer the extension's client points at (the doubles: tests/support/
servicebus_sdk.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from azurefunctions.extensions.bindings.servicebus import ServiceBusMessageActions
from support.servicebus_sdk import HostLoop

from devhost.sdk_servicebus import DeliveryRegistry, SettlementServer, configure_message_actions


@pytest.fixture
def host_loop() -> Iterator[HostLoop]:
    with HostLoop() as hl:
        yield hl


@pytest.fixture
def isolated_argv(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A private copy of sys.argv (configure_message_actions appends to it) and a fresh client singleton."""
    argv = [
        sys.argv[0],
        "start",
        "--port",
        "7071",
    ]  # what `python -m devhost start --port 7071` leaves in argv
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(ServiceBusMessageActions, "_instance", None)
    return argv


@pytest.fixture
def registry() -> DeliveryRegistry:
    return DeliveryRegistry()


@pytest.fixture
def settlement(host_loop: HostLoop, registry: DeliveryRegistry, isolated_argv: list[str]) -> Iterator[SettlementServer]:
    """A running Settlement server, with ServiceBusMessageActions.get_instance() pointed at it."""
    server = SettlementServer(
        registry.lookup, host_loop.loop, lookup_session=registry.lookup_session, settle_timeout_s=10.0
    )
    configure_message_actions(server.start())
    try:
        yield server
    finally:
        server.stop()
