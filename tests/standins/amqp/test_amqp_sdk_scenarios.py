"""The scenarios of tests/support/bus_scenarios.py, run with the unmodified azure-servicebus SDK (sync and aio)
against the AMQP endpoint: as `python -m devhost servicebus` in a subprocess, or, for the scenarios where time
must pass, on a thread of this process over a broker whose clock the test moves (one endpoint each).

The SDK spends most of a scenario asleep (0.05 s per frame while it opens a link, a 1 s keep-alive tick when it
closes), so the scenarios run concurrently, once per session, each on its own queues; every test reports one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from support.aio_bridge import LoopThread
from support.amqp_endpoint import InProcess, SdkBus, Served, in_process_endpoint
from support.bus_scenarios import FLAVORS, SCENARIOS, Outcome, Queues, Scenario, report, run_concurrently


@pytest.fixture(scope="module")
def untimed_outcomes(amqp_server: Served, aio_loop: LoopThread) -> dict[tuple[str, str], Outcome]:
    jobs = {
        (case.name, flavor): (
            lambda case=case, flavor=flavor: case.run(
                SdkBus(amqp_server, flavor, aio_loop), amqp_server.declare(Queues.fresh())
            )
        )
        for case in SCENARIOS
        if not case.needs_clock
        for flavor in FLAVORS
    }
    return run_concurrently(jobs)


@contextmanager
def _endpoints(root: Path, count: int) -> Iterator[list[InProcess]]:
    with ExitStack() as stack:
        yield [stack.enter_context(in_process_endpoint(root / f"e{i}")) for i in range(count)]


@pytest.fixture(scope="module")
def timed_outcomes(
    tmp_path_factory: pytest.TempPathFactory, aio_loop: LoopThread
) -> Iterator[dict[tuple[str, str], Outcome]]:
    cases = [(case, flavor) for case in SCENARIOS if case.needs_clock for flavor in FLAVORS]
    with _endpoints(tmp_path_factory.mktemp("timed"), len(cases)) as endpoints:
        jobs = {
            (case.name, flavor): (
                lambda case=case, flavor=flavor, served=served: case.run(
                    SdkBus(served, flavor, aio_loop), served.declare(Queues.fresh())
                )
            )
            for (case, flavor), served in zip(cases, endpoints, strict=True)
        }
        yield run_concurrently(jobs)


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("case", [s for s in SCENARIOS if not s.needs_clock], ids=lambda s: s.name)
def test_scenario_over_amqp(case: Scenario, flavor: str, untimed_outcomes: dict[tuple[str, str], Outcome]) -> None:
    report(untimed_outcomes[(case.name, flavor)])


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("case", [s for s in SCENARIOS if s.needs_clock], ids=lambda s: s.name)
def test_timed_scenario_over_amqp(case: Scenario, flavor: str, timed_outcomes: dict[tuple[str, str], Outcome]) -> None:
    report(timed_outcomes[(case.name, flavor)])
