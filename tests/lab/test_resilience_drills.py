"""Resilience drills (issue 11, item 4) in real processes: `python -m devhost drill retry-budget|remote-outage|
backlog-flood`'s own code (lab/resilience_drills.py) on the whole local system (devhost, the Agent, the simulator),
small enough for the suite (about three minutes together), and the pieces the drills stand on: the simulator's outage
switch and call log, and the reading of the breaker's history against the remote's calls.

Each drill's verdict is checked, then its main claims are read again independently: the simulator's ledger (its
SQLite file, or `GET /effects`), the state store, the orders DB and the operator alerts.

- retry-budget (CLI, `--json`): every call fails, breaker off. Every order failed with its reason (its sent step
  compensated at the threshold); the calls per
  order step within RemoteCallBudgetPerStep, and exactly the no-crash product: (retries + 1) x FailureThreshold (a
  request is delivered once when nothing crashes).
- remote-outage: the remote down for 12 s while 40 orders run. No order in Error, each Processed with one effect per
  step; the breaker opened, re-opened after a failed probe with the doubled cool-down, closed after the outage,
  raised CircuitOpened and CircuitClosed; calls while open <= probes x half-open rounds.
- backlog-flood: 120 orders at once against MaxPendingOrders 30 and MaxOrdersInProcessing 10. Rejected orders got
  `rejected` / `backlog full` and have no record in either store; admitted ones Processed in attempt 1; both bounds
  held in the samples.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from azure.servicebus import ServiceBusReceiveMode
from support.e2e_support import Client, running_client

from lab.drill_common import Verdict, parse_overrides
from lab.resilience_drills import (
    DRILL_SETTINGS,
    BreakerHistory,
    CallsWhileOpen,
    ResilienceOptions,
    resilience_config,
    run_resilience_drill,
)
from lab.simulator import FaultConfig, Simulator
from lab.simulator_ledger import EffectStore
from lab.system import LOCAL_DEFAULTS, ROOT, LocalSystem
from orderflow.breaker import BreakerDoc, BreakerState
from orderflow.messages import STEPS, AlertKind, OperatorAlert
from orderflow.records import ProcessState
from orderflow.retry_budget import RetryBudget
from orderflow.session_locks import CrashBudget

# --- the simulator's outage switch -----------------------------------------------------------------------------


def _body(order_id: str, step: str) -> dict[str, Any]:
    return {"orderId": order_id, "idempotencyKey": f"{order_id}:{step}", "payload": {}}


async def _outage_session(tmp_path: Path) -> dict[str, Any]:
    async with Simulator(FaultConfig(seed=1), tmp_path / "sim.db") as sim, aiohttp.ClientSession() as http:

        async def step(order_id: str) -> int:
            async with http.post(f"{sim.url}/steps/reserve-inventory", json=_body(order_id, "reserve-inventory")) as r:
                return r.status

        async def get(path: str) -> Any:
            async with http.get(f"{sim.url}{path}") as r:
                return await r.json()

        async def outage(body: Any) -> tuple[int, Any]:
            async with http.post(f"{sim.url}/outage", json=body) as r:
                return r.status, await r.json()

        seen: dict[str, Any] = {"before": await step("o-1")}
        seen["down"] = await outage({"down": True})
        seen["during"] = [await step("o-2") for _ in range(3)]
        seen["effects_during"] = await get("/effects")
        seen["up"] = await outage({"down": False})
        seen["after"] = await step("o-2")
        seen["bad"] = await outage({"down": "yes"})
        seen["effects"] = await get("/effects")
        seen["calls"] = (await get("/calls"))["calls"]
        seen["outage"] = await get("/outage")
        return seen


def test_the_outage_switch_answers_503_with_no_effect_and_counts_the_calls(tmp_path: Path) -> None:
    seen = asyncio.run(_outage_session(tmp_path))
    assert seen["before"] == 200 and seen["during"] == [503, 503, 503] and seen["after"] == 200
    status, switched = seen["down"]
    assert status == 200 and switched["down"] is True and switched["outages"][0]["end"] is None
    assert seen["bad"][0] == 400
    during = seen["effects_during"]
    assert [e["orderId"] for e in during["effects"]] == ["o-1"]  # nothing applied while down
    report = seen["effects"]
    assert report["callsByKey"] == {"o-1:reserve-inventory": 1, "o-2:reserve-inventory": 4}
    assert report["callsWhileDown"] == 3 and report["callsWhileDownByKey"] == {"o-2:reserve-inventory": 3}
    assert report["duplicates"] == 0 and report["totalApplied"] == 2
    (window,) = seen["outage"]["outages"]
    assert seen["outage"]["down"] is False and window["start"] < window["end"]
    calls = seen["calls"]
    assert [(c["status"], c["down"]) for c in calls] == [
        (200, False),
        (503, True),
        (503, True),
        (503, True),
        (200, False),
    ]
    assert [c["at"] for c in calls] == sorted(c["at"] for c in calls)
    assert all(window["start"] <= c["at"] < window["end"] for c in calls if c["down"])


def test_the_outage_can_be_scheduled_from_the_command_line(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lab.simulator",
            "--port",
            "0",
            "--db",
            str(tmp_path / "s.db"),
            "--down-after",
            "0",
            "--down-for",
            "30",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split("listening on ")[1].strip()

        async def probe() -> tuple[int, dict[str, Any]]:
            async with aiohttp.ClientSession() as http:
                for _ in range(50):  # the switch is set on the simulator's loop right after it listens
                    async with http.get(f"{url}/outage") as r:
                        state = await r.json()
                    if state["down"]:
                        break
                    await asyncio.sleep(0.05)
                async with http.post(f"{url}/steps/charge-payment", json=_body("o-9", "charge-payment")) as r:
                    return r.status, state

        status, state = asyncio.run(probe())
        assert status == 503 and state["down"] is True
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# --- reading the breaker's history against the remote's calls ---------------------------------------------------

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _ts(seconds: float) -> float:
    return _at(seconds).timestamp()


def _open(opened: float, cooldown: float, reason: str = "5 failed requests within 10 s") -> BreakerDoc:
    return BreakerDoc(
        service="fulfilment",
        state=BreakerState.OPEN,
        opened_at=_at(opened),
        open_until=_at(opened + cooldown),
        cooldown_seconds=cooldown,
        changed_at=_at(opened),
        reason=reason,
    )


def _outage_history() -> list[tuple[float, BreakerDoc]]:
    """Open at 10 s (3 s), a probe fails at 13.2 s (re-open, 6 s), a probe succeeds at 19.5 s (closed)."""
    first = _open(10.0, 3.0)
    half_open = first.model_copy(
        update={
            "state": BreakerState.HALF_OPEN,
            "probes_started": 1,
            "half_open_since": _at(13.1),
            "reason": "cool-down over",
        }
    )
    second = _open(13.2, 6.0, "a probe failed")
    closed = BreakerDoc(
        service="fulfilment", state=BreakerState.CLOSED, changed_at=_at(19.5), reason="a probe succeeded"
    )
    return [
        (_ts(9.0), BreakerDoc(service="fulfilment")),
        (_ts(10.03), first),
        (_ts(13.15), half_open),
        (_ts(13.25), second),
        (_ts(19.55), closed),
    ]


def test_the_history_gives_each_open_round_and_the_half_open_rounds_between_them() -> None:
    history = BreakerHistory.from_docs(_outage_history())
    assert [(r.opened_at, r.open_until, r.seen_at) for r in history.rounds] == [
        (_ts(10.0), _ts(13.0), _ts(10.03)),
        (_ts(13.2), _ts(19.2), _ts(13.25)),
    ]
    assert [r.reason for r in history.rounds] == ["5 failed requests within 10 s", "a probe failed"]
    (episode,) = history.episodes(end=_ts(60))
    assert (episode.opened_at, episode.seen_at, episode.closed_at, episode.half_open_rounds) == (
        _ts(10.0),
        _ts(10.03),
        _ts(19.5),
        2,
    )


def test_calls_while_open_are_the_probes_and_calls_in_flight_at_the_opening_are_apart() -> None:
    history = BreakerHistory.from_docs(_outage_history())
    calls = [{"at": _ts(t)} for t in (9.9, 10.01, 10.02, 10.9, 13.1, 19.4, 19.6, 25.0)]
    counted = CallsWhileOpen.count(history, calls, end=_ts(60))
    # 10.01 and 10.02: after openedAt, before the open document was seen (let through while closed); 10.9: seen
    # open, but within the grace (orderflow.breaker.CACHE_TTL, 1 s: granted before the opening, still in flight, or
    # from an Agent's cached read); 13.1 and 19.4: the two probes; 9.9, 19.6 and 25.0: the breaker was closed.
    assert counted == CallsWhileOpen(at_opening=3, while_open=2, strictly_open=0, half_open_rounds=2)
    leaked = CallsWhileOpen.count(history, [*calls, {"at": _ts(11.1)}, {"at": _ts(15.0)}], end=_ts(60))
    assert leaked.while_open == 4 and leaked.strictly_open == 2  # two calls the open breaker let through
    no_grace = CallsWhileOpen.count(history, calls, end=_ts(60), grace=0.0)
    assert (no_grace.at_opening, no_grace.while_open) == (2, 3)  # 10.9 would count as let through while open


def test_a_breaker_still_open_at_the_end_has_no_closing() -> None:
    history = BreakerHistory.from_docs([(_ts(10.05), _open(10.0, 3.0))])
    (episode,) = history.episodes(end=_ts(12.0))
    assert episode.closed_at == _ts(12.0) and episode.half_open_rounds == 0


# --- options and verdict ----------------------------------------------------------------------------------------


def test_drill_settings_leave_the_crash_budget_to_the_local_defaults() -> None:
    # The drills that kill change no setting of the crash budget (orderflow/session_locks.py):
    # tests/product/infra/test_crash_budget.py proves it for LOCAL_DEFAULTS, so it holds in every such drill.
    budget_settings = {
        "StepTimeoutSeconds",
        "ClaimLeaseSeconds",
        "FailureThreshold",
        "RetryBackoffBaseSeconds",
        "RetryBackoffMaxSeconds",
    }
    assert set(CrashBudget.__dataclass_fields__) >= {"step_timeout_s", "claim_lease_s", "failure_threshold"}
    # retry-budget and remote-outage kill nothing (the budget guards against kills): they shorten the step and the
    # claim lease only.
    for drill, values in DRILL_SETTINGS.items():
        allowed = {"StepTimeoutSeconds", "ClaimLeaseSeconds"} if drill in ("retry-budget", "remote-outage") else set()
        assert budget_settings & set(values) == allowed, drill
    assert budget_settings <= set(LOCAL_DEFAULTS)


def test_settings_are_the_base_then_the_drill_then_set() -> None:
    options = ResilienceOptions("remote-outage", overrides=parse_overrides(["CircuitBreakerProbes=2", "X=a=b"]))
    values = options.settings_values()
    assert values["CircuitBreakerProbes"] == "2" and values["X"] == "a=b"
    assert values["CircuitBreakerCooldownSeconds"] == DRILL_SETTINGS["remote-outage"]["CircuitBreakerCooldownSeconds"]
    sample = ResilienceOptions("backlog-flood", settings="sample").settings_values()
    assert sample["StepTimeoutSeconds"] == "30" and sample["MaxPendingOrders"] == "60"
    with pytest.raises(ValueError, match="NAME=VALUE"):
        parse_overrides(["CircuitBreakerProbes"])
    with pytest.raises(ValueError):
        ResilienceOptions("host-crash")


def test_the_verdict_passes_only_when_every_check_holds() -> None:
    verdict = Verdict("retry-budget", 3, 0, 0, 0, {"a": True, "b": True}, {"budget": 75})
    assert verdict.passed and verdict.to_json() == {
        "drill": "retry-budget",
        "passed": True,
        "orders": 3,
        "lost": 0,
        "duplicate_side_effects": 0,
        "stuck": 0,
        "checks": {"a": True, "b": True},
        "figures": {"budget": 75},
    }
    verdict.checks["b"] = False
    assert not verdict.passed and verdict.failed_checks() == ["b"]


# --- the drills, end to end -------------------------------------------------------------------------------------


def _drill(client: Client, options: ResilienceOptions) -> Verdict:
    return asyncio.run(run_resilience_drill(client.system, options))


def _assert_common(verdict: dict[str, Any], orders: int) -> None:
    figures = json.dumps(verdict)  # the whole verdict in the failure message
    assert verdict["orders"] == orders, figures
    assert verdict["lost"] == 0 and verdict["duplicate_side_effects"] == 0 and verdict["stuck"] == 0, figures
    assert verdict["passed"] and all(verdict["checks"].values()), figures


@pytest.mark.slow
def test_retry_budget_drill_keeps_every_step_within_the_budget(tmp_path: Path) -> None:
    orders = 6
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "devhost",
            "drill",
            "retry-budget",
            "--orders",
            str(orders),
            "--json",
            "--timeout",
            "150",
            "--work-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    verdict = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, (verdict, proc.stderr[-3000:])
    _assert_common(verdict, orders)
    figures = verdict["figures"]
    env = LocalSystem(resilience_config(tmp_path, ResilienceOptions("retry-budget"))).env()
    budget = RetryBudget.from_env(env)
    assert figures["budget"] == budget.budget and figures["arithmetic"] == budget.arithmetic(4)
    # Independently, from the simulator's own file: one key per order (the first step; the others never ran), each
    # called (retries + 1) x FailureThreshold times: nothing crashed, so every request was delivered once.
    store = EffectStore(tmp_path / "simulator.db")
    try:
        report = store.report()
    finally:
        store.close()
    by_key = report["callsByKey"]
    ids = [f"retry-budget-1-{i:05d}" for i in range(orders)]
    steps = {k: v for k, v in by_key.items() if k.endswith(":reserve-inventory")}
    assert sorted(steps) == sorted(f"{o}:reserve-inventory" for o in ids)
    expected = budget.calls_per_request(4) * budget.failure_threshold
    assert set(steps.values()) == {expected} and expected <= budget.budget, by_key
    assert figures["max_calls_per_step"] == expected and report["totalApplied"] == 0
    # At the threshold the sent step is compensated (the drill lets the compensation through: a no-op, one call).
    assert {k: v for k, v in by_key.items() if k not in steps} == {f"{o}:release-inventory": 1 for o in ids}
    records = [_state(tmp_path, o) for o in ids]
    assert all(
        r["processState"] == "Compensated"
        and r["lastError"].startswith("FailureThresholdReached")
        and r["failureCount"] == budget.failure_threshold
        for r in records
    ), records


def _state(work_dir: Path, order_id: str) -> dict[str, Any]:
    import sqlite3

    with sqlite3.connect(work_dir / "store.db") as db:
        (doc,) = db.execute("SELECT doc FROM order_state WHERE id = ?", (order_id,)).fetchone()
    record: dict[str, Any] = json.loads(doc)
    return record


def _breaker_alerts(client: Client) -> list[OperatorAlert]:
    with client.bus.get_queue_receiver(
        "operator-alerts", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as receiver:
        alerts = [
            OperatorAlert.model_validate_json(b"".join(m.body))
            for m in receiver.receive_messages(max_message_count=200, max_wait_time=1)
        ]
    return [a for a in alerts if a.kind in (AlertKind.CIRCUIT_OPENED, AlertKind.CIRCUIT_CLOSED)]


@pytest.mark.slow
def test_remote_outage_drill_keeps_every_order_out_of_error(tmp_path: Path) -> None:
    # 18 s of outage, so that a failed probe falls inside it. With the drill's 8 s steps the breaker opened at about
    # 1 s into the outage and its second round failed its probe at about 11 s (outage 24 s: rounds at 1.2, 5.0, 12.0
    # and 19.0 s, closed at 26 s). With 20 s steps the orders caught at the Agent waited 30 s before the first probe,
    # and a 12 s outage ended before it in 5 runs of 6.
    options = ResilienceOptions("remote-outage", orders=40, outage_after=2.0, outage_for=18.0, timeout=180)
    with running_client(resilience_config(tmp_path, options)) as client:
        verdict = _drill(client, options).to_json()
        _assert_common(verdict, 40)
        figures = verdict["figures"]
        text = json.dumps(verdict)
        assert figures["in_flight_at_outage"] > 0 and figures["error"] == 0, text
        assert 0 < figures["time_to_open_s"] < figures["outage_s"], text
        assert figures["calls_during_outage"] > 0, text
        assert figures["calls_while_open"] <= figures["probes"] * figures["half_open_rounds"], text
        # A probe failed during the outage: the breaker opened again with the doubled cool-down (3 s, then 6 s).
        assert [r.split("+")[1] for r in figures["open_rounds_s"][:2]] == ["3.0", "6.0"], text
        assert figures["closed_at_s"] > figures["outage_s"], text
        for i in range(40):
            order_id = f"remote-outage-1-{i:05d}"
            record = client.state(order_id)
            assert record is not None and record.process_state is ProcessState.PROCESSED, (order_id, record)
            assert client.effects(order_id) == {step.value: 1 for step in STEPS}, order_id
        kinds = [a.kind for a in _breaker_alerts(client)]
        assert kinds[0] is AlertKind.CIRCUIT_OPENED and kinds[-1] is AlertKind.CIRCUIT_CLOSED, kinds


@pytest.mark.slow
def test_backlog_flood_drill_rejects_past_the_bound_and_writes_nothing(tmp_path: Path) -> None:
    options = ResilienceOptions(
        "backlog-flood",
        orders=120,
        timeout=150,
        overrides=(("MaxPendingOrders", "30"), ("MaxOrdersInProcessing", "10")),
    )
    with running_client(resilience_config(tmp_path, options)) as client:
        verdict = _drill(client, options).to_json()
        _assert_common(verdict, 120)
        figures = verdict["figures"]
        text = json.dumps(verdict)
        assert figures["rejected"] > 0 and figures["admitted"] > 0, text
        assert figures["admitted"] + figures["rejected"] == 120, text
        assert figures["max_processing_seen"] <= 10 and figures["max_pending_seen"] <= 30, text
        assert figures["attempts"] == {"1": figures["admitted"]}, text
        assert figures["peak_rss_mb"]["devhost"] > 0 and figures["peak_rss_mb"]["agent"] > 0, text
        for i in range(120):
            order_id = f"backlog-flood-1-{i:05d}"
            record = client.state(order_id)
            if record is None:  # rejected (the drill's client saw `rejected` / `backlog full`): nothing stored
                assert client.order(order_id) is None, order_id
            else:
                assert record.process_state is ProcessState.PROCESSED and record.attempt == 1, (order_id, record)
