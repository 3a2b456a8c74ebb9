"""Fixtures: a real `python -m devhost start` subprocess hosting tests/host/sample_host_app with fresh state."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.hosted import HostedSample


@pytest.fixture()
def make_host(tmp_path: Path) -> Iterator[Callable[..., HostedSample]]:
    hosts: list[HostedSample] = []

    def make(**overrides: str) -> HostedSample:
        host = HostedSample(tmp_path, overrides)
        hosts.append(host)
        return host

    yield make
    for h in hosts:
        h.process.stop()
        h.bus.close()


@pytest.fixture()
def host(make_host: Callable[..., HostedSample]) -> HostedSample:
    return make_host().start()
