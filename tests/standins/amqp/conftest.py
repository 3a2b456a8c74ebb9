"""Fixtures for the AMQP endpoint (tests/support/amqp_endpoint.py): the endpoint as `python -m devhost servicebus`
in a subprocess, one for the session; one on a thread of this process per test, over a broker whose clock the test
moves; and the event loop the aio SDK runs on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.aio_bridge import LoopThread
from support.amqp_endpoint import BASE_CONFIG, InProcess, Served, in_process_endpoint, start_subprocess, stop_subprocess


@pytest.fixture(scope="session")
def amqp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    state_dir = tmp_path_factory.mktemp("amqp-endpoint")
    config = state_dir / "servicebus.config.json"
    config.write_text(json.dumps(BASE_CONFIG), encoding="utf-8")
    process, port = start_subprocess(state_dir, config)
    yield Served(port, state_dir / "servicebus.db")
    assert stop_subprocess(process) == 0


@pytest.fixture
def in_process(tmp_path: Path) -> Iterator[InProcess]:
    with in_process_endpoint(tmp_path) as served:
        yield served


@pytest.fixture(scope="session")
def aio_loop() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.close()
