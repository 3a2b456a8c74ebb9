"""Fixtures of the Agent tests: a fresh fake bus and clock per test, an in-process simulator."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from agent_fakes import FakeBus, FakeClock  # noqa: E402

from agent.simulator import FaultConfig, Simulator  # noqa: E402


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
