"""The scenarios of tests/support/bus_scenarios.py (the same table the unmodified azure-servicebus SDK runs against
the AMQP endpoint, tests/standins/amqp/test_amqp_sdk_scenarios.py) on the embedded client, sync and aio: the mirror
is held to what the SDK does on Service Bus. The untimed scenarios share one broker file, each on its own queues; each
scenario where time must pass has a broker file of its own, on an `OffsetClock` the scenario moves (nothing sleeps
for a lock or a schedule). They run concurrently, once per module; every test reports one."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from support.aio_bridge import LoopThread
from support.bus_scenarios import FLAVORS, SCENARIOS, OffsetClock, Outcome, Queues, Scenario, report, run_concurrently
from support.embedded_bus import EmbeddedBus

UNTIMED = [s for s in SCENARIOS if not s.needs_clock]
TIMED = [s for s in SCENARIOS if s.needs_clock]


@pytest.fixture(scope="module")
def aio_loop() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.close()


def _job(case: Scenario, bus: EmbeddedBus) -> tuple[tuple[str, str], Callable[[], None]]:
    return (case.name, bus.flavor), lambda: case.run(bus, bus.declare(Queues.fresh()))


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory, aio_loop: LoopThread) -> dict[tuple[str, str], Outcome]:
    root = tmp_path_factory.mktemp("embedded-scenarios")
    shared = root / "untimed.db"
    jobs = dict(_job(case, EmbeddedBus(shared, flavor, aio_loop)) for case in UNTIMED for flavor in FLAVORS)
    for index, (case, flavor) in enumerate((case, flavor) for case in TIMED for flavor in FLAVORS):
        jobs.update([_job(case, EmbeddedBus(root / f"timed-{index}.db", flavor, aio_loop, OffsetClock()))])
    return run_concurrently(jobs)


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("case", UNTIMED, ids=lambda s: s.name)
def test_scenario_on_embedded_client(case: Scenario, flavor: str, outcomes: dict[tuple[str, str], Outcome]) -> None:
    report(outcomes[(case.name, flavor)])


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("case", TIMED, ids=lambda s: s.name)
def test_timed_scenario_on_embedded_client(
    case: Scenario, flavor: str, outcomes: dict[tuple[str, str], Outcome]
) -> None:
    report(outcomes[(case.name, flavor)])
