"""Fixtures for the devhost durable tests (see harness.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.host.durable.harness import Hub, HubFactory


@pytest.fixture
async def hubs(tmp_path: Path) -> AsyncIterator[HubFactory]:
    factory = HubFactory(tmp_path / "state" / "durable.db")
    yield factory
    await factory.close()


@pytest.fixture
async def hub(hubs: HubFactory) -> Hub:
    return await hubs.start()
