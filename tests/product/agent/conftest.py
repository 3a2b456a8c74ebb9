"""Fixtures of the Agent tests: a fresh fake bus and clock per test, an in-process simulator."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.agent_fakes import FakeBus, FakeClock

from lab.simulator import FaultConfig, Simulator


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def bus() -> FakeBus:
    return FakeBus()


@pytest.fixture
async def simulator(tmp_path: Path) -> AsyncIterator[Simulator]:
    async with Simulator(FaultConfig(seed=7), tmp_path / "effects.sqlite") as sim:
        yield sim
