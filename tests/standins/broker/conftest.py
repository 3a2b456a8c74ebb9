"""Fixtures for the embedded broker tests: an injectable clock, a fresh broker file, fresh queue names."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from orderflow.embedded.broker import EmbeddedBroker
from orderflow.embedded.client import ServiceBusClient

REPO_ROOT = Path(__file__).resolve().parents[3]


class FakeClock:
    """A clock the test moves by hand: lock expiry, windows and TTL without sleeping."""

    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "bus.db"


@pytest.fixture
def broker(db_path: Path, clock: FakeClock) -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker(db_path, clock=clock)
    yield b
    b.close()


@pytest.fixture
def live(tmp_path: Path) -> Iterator[ServiceBusClient]:
    """A broker on the real clock (waiters in threads and other processes share it), and a client of it."""
    broker = EmbeddedBroker(tmp_path / "bus.db")
    with ServiceBusClient(broker) as client:
        yield client
    broker.close()


@pytest.fixture
def client(broker: EmbeddedBroker) -> Iterator[ServiceBusClient]:
    with ServiceBusClient(broker) as c:
        yield c


@pytest.fixture
def queue(broker: EmbeddedBroker) -> Callable[..., str]:
    """Declare a queue with a fresh name: `queue(requires_session=True, max_delivery_count=3)`."""

    def declare(**properties: Any) -> str:
        name = f"q-{uuid.uuid4().hex[:10]}"
        broker.declare_queue(name, **properties)
        return name

    return declare
