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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """schemathesis names each operation's item `test_…[GET /orders]` but gives them all the test function's node id
    (test_ops_api_schemathesis.py). pytest-xdist's `--dist loadfile` (`make test`) queues items by node id, so it
    would run one of them: the operation goes into the node id too (pytest 9 keeps it as `_id`, 8 as `_nodeid`)."""
    for item in items:
        label = getattr(item, "operation_label", None)
        if not isinstance(label, str) or item.nodeid.endswith(f"[{label}]"):
            continue
        unique = f"{item.nodeid}[{label}]"
        if hasattr(item, "_id"):
            item._id = type(item._id).parse(unique)
        else:
            item._nodeid = unique
        assert item.nodeid == unique, item.nodeid
