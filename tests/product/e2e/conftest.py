"""End-to-end fixtures: ONE local system per module (devhost, Agent, simulator), a client per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.e2e_support import FAST_SETTINGS, Client, running_client

from lab.system import SystemConfig


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    config = SystemConfig(
        work_dir=tmp_path_factory.mktemp("e2e"),
        seed=7,
        hang_seconds=8.0,
        latency_ms_mean=2.0,
        settings=dict(FAST_SETTINGS),
    )
    with running_client(config) as c:
        yield c
