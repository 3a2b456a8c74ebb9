"""The remote service simulator: seeded determinism, idempotent side effects under retries and concurrency."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from lab.simulator import Fault, FaultConfig, Simulator, decide

KEYS = [f"order-{i}:charge-payment" for i in range(2000)]


def call(order_id: str = "o-1", step: str = "charge-payment") -> dict[str, Any]:
    return {"orderId": order_id, "idempotencyKey": f"{order_id}:{step}", "payload": {"amount": "10.00"}}


async def post(
    http: aiohttp.ClientSession, sim: Simulator, body: Any, step: str = "charge-payment", timeout: float = 5.0
) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with http.post(f"{sim.url}/steps/{step}", json=body, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
        return r.status, await r.json(), dict(r.headers)


async def effects(http: aiohttp.ClientSession, sim: Simulator) -> dict[str, Any]:
    async with http.get(f"{sim.url}/effects") as r:
        return await r.json()


def test_decisions_are_a_pure_function_of_seed_key_and_call_number() -> None:
    config = FaultConfig(
        seed=11, transient_failure_rate=0.3, permanent_failure_rate=0.05, hang_rate=0.02, latency_ms_mean=20
    )
    first = [decide(config, key, n) for key in KEYS[:300] for n in (1, 2, 3)]
    again = [decide(FaultConfig(**config.__dict__), key, n) for key in KEYS[:300] for n in (1, 2, 3)]
    assert first == again
    other_seed = [
        decide(FaultConfig(**{**config.__dict__, "seed": 12}), key, n) for key in KEYS[:300] for n in (1, 2, 3)
    ]
    assert other_seed != first


def test_fault_rates_follow_the_configuration() -> None:
    config = FaultConfig(seed=3, transient_failure_rate=0.3, permanent_failure_rate=0.1, hang_rate=0.05)
    kinds = Counter(decide(config, key, 1).fault for key in KEYS)
    assert kinds[Fault.PERMANENT] / len(KEYS) == pytest.approx(0.1, abs=0.03)
    # transient and hang are drawn among the non-permanent keys
    assert kinds[Fault.TRANSIENT] / len(KEYS) == pytest.approx(0.9 * 0.3, abs=0.03)
    assert kinds[Fault.HANG] / len(KEYS) == pytest.approx(0.9 * 0.05, abs=0.02)
    statuses = Counter(decide(config, key, 1).status for key in KEYS if decide(config, key, 1).fault is Fault.TRANSIENT)
    assert set(statuses) == {429, 503}


def test_permanent_failure_is_decided_per_key() -> None:
    config = FaultConfig(seed=5, permanent_failure_rate=0.5)
    for key in KEYS[:100]:
        assert len({decide(config, key, n).fault for n in range(1, 6)}) == 1


def test_fail_first_calls_then_succeed() -> None:
    config = FaultConfig(seed=1, fail_first_calls=2)
    assert [decide(config, "k", n).fault for n in (1, 2, 3, 4)] == [Fault.TRANSIENT] * 2 + [Fault.NONE] * 2


def test_latency_is_exponential_around_the_mean_and_capped() -> None:
    config = FaultConfig(seed=9, latency_ms_mean=50)
    latencies = [decide(config, key, 1).latency for key in KEYS]
    assert sum(latencies) / len(latencies) == pytest.approx(0.05, rel=0.1)
    assert max(latencies) <= 0.5


def test_invalid_rates_are_refused() -> None:
    with pytest.raises(ValueError, match="hang_rate"):
        FaultConfig(hang_rate=1.5)
    with pytest.raises(ValueError, match="must not exceed 1"):
        FaultConfig(transient_failure_rate=0.7, hang_rate=0.5)


async def test_effect_applied_once_under_retries(tmp_path: Path) -> None:
    async with (
        Simulator(FaultConfig(seed=2, fail_first_calls=2), tmp_path / "db") as sim,
        aiohttp.ClientSession() as http,
    ):
        statuses = [(await post(http, sim, call()))[0] for _ in range(5)]
        assert statuses[:2] in ([503, 503], [429, 503], [503, 429], [429, 429]) and statuses[2:] == [200] * 3
        bodies = [(await post(http, sim, call()))[1] for _ in range(2)]
        assert bodies[0] == bodies[1] and bodies[0]["replayed"] is True
        report = await effects(http, sim)
    assert report["effects"] == [{"orderId": "o-1", "step": "charge-payment", "applied": 1}]
    assert report["duplicates"] == 0 and report["calls"] == 7


async def test_effect_applied_once_under_concurrent_duplicates(tmp_path: Path) -> None:
    async with (
        Simulator(FaultConfig(seed=4, latency_ms_mean=5), tmp_path / "db") as sim,
        aiohttp.ClientSession() as http,
    ):
        results = await asyncio.gather(*(post(http, sim, call()) for _ in range(25)))
        report = await effects(http, sim)
    assert {status for status, _, _ in results} == {200}
    assert [body["replayed"] for _, body, _ in results].count(False) == 1
    assert len({body["confirmation"] for _, body, _ in results}) == 1
    assert report["totalApplied"] == 1 and report["duplicates"] == 0


async def test_runs_are_reproducible_for_a_seed(tmp_path: Path) -> None:
    config = FaultConfig(seed=21, transient_failure_rate=0.4, permanent_failure_rate=0.1)

    async def run(db: Path) -> list[int]:
        async with Simulator(config, db) as sim, aiohttp.ClientSession() as http:
            return [(await post(http, sim, call(f"o-{i}")))[0] for i in range(15) for _ in range(3)]

    first, second = await run(tmp_path / "a"), await run(tmp_path / "b")
    assert first == second and {422, 200} <= set(first) and {429, 503} & set(first)


async def test_transient_answers_carry_retry_hints(tmp_path: Path) -> None:
    config = FaultConfig(seed=1, transient_failure_rate=1.0, retry_after_ms=1500)
    async with Simulator(config, tmp_path / "db") as sim, aiohttp.ClientSession() as http:
        answers = [await post(http, sim, call(f"o-{i}")) for i in range(12)]
        report = await effects(http, sim)
    for status, body, headers in answers:
        assert headers["retry-after-ms"] == "1500" and body["errorCode"] in (
            "Throttled",
            "ServiceUnavailable",
        )
        assert headers.get("Retry-After") == ("2" if status == 429 else None)
    assert {status for status, _, _ in answers} == {429, 503}
    assert report["totalApplied"] == 0  # a transient failure applies nothing


async def test_sub_second_hint_is_sent_in_milliseconds_only(tmp_path: Path) -> None:
    config = FaultConfig(seed=1, transient_failure_rate=1.0, retry_after_ms=100)
    async with Simulator(config, tmp_path / "db") as sim, aiohttp.ClientSession() as http:
        answers = [await post(http, sim, call(f"o-{i}")) for i in range(12)]
    assert {status for status, _, _ in answers} == {429, 503}
    assert all("Retry-After" not in h and h["retry-after-ms"] == "100" for _, _, h in answers)


async def test_permanent_failure_has_a_step_error_code(tmp_path: Path) -> None:
    async with (
        Simulator(FaultConfig(seed=1, permanent_failure_rate=1.0), tmp_path / "db") as sim,
        aiohttp.ClientSession() as http,
    ):
        status, body, _ = await post(http, sim, call(step="reserve-inventory"), step="reserve-inventory")
    assert status == 422 and body["errorCode"] == "InsufficientStock"


async def test_hang_applies_the_effect_but_the_caller_times_out(tmp_path: Path) -> None:
    config = FaultConfig(seed=1, hang_rate=1.0, hang_seconds=30)
    async with Simulator(config, tmp_path / "db") as sim, aiohttp.ClientSession() as http:
        with pytest.raises(TimeoutError):
            await post(http, sim, call(), timeout=0.2)
        report = await effects(http, sim)
    assert report["totalApplied"] == 1  # the effect happened; the answer never came: retry must not duplicate it


@pytest.mark.parametrize(
    ("step", "body", "status", "code"),
    [
        ("teleport", call(), 404, "UnknownStep"),
        ("charge-payment", {"orderId": "o-1", "payload": {}}, 400, "InvalidRequest"),
        ("charge-payment", {"orderId": "o-1", "idempotencyKey": "", "payload": {}}, 400, "InvalidRequest"),
        ("charge-payment", [1, 2], 400, "InvalidRequest"),
    ],
)
async def test_invalid_calls_are_rejected(tmp_path: Path, step: str, body: Any, status: int, code: str) -> None:
    async with Simulator(FaultConfig(), tmp_path / "db") as sim, aiohttp.ClientSession() as http:
        got_status, got, _ = await post(http, sim, body, step=step)
    assert (got_status, got["errorCode"]) == (status, code)


async def test_key_reused_for_another_order_is_a_conflict(tmp_path: Path) -> None:
    async with Simulator(FaultConfig(), tmp_path / "db") as sim, aiohttp.ClientSession() as http:
        await post(http, sim, call("o-1"))
        status, body, _ = await post(http, sim, {**call("o-2"), "idempotencyKey": "o-1:charge-payment"})
    assert status == 409 and body["errorCode"] == "IdempotencyKeyReuse"


async def test_effects_survive_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "db"
    async with Simulator(FaultConfig(), db) as sim, aiohttp.ClientSession() as http:
        first = (await post(http, sim, call()))[1]
    async with Simulator(FaultConfig(), db) as sim, aiohttp.ClientSession() as http:
        second = (await post(http, sim, call()))[1]
        report = await effects(http, sim)
    assert second["replayed"] and second["confirmation"] == first["confirmation"] and report["totalApplied"] == 1


def test_effect_store_applies_once_across_connections(tmp_path: Path) -> None:
    """Two simulator processes on one database must not both apply a key (BEGIN IMMEDIATE transaction)."""
    from concurrent.futures import ThreadPoolExecutor

    from lab.simulator_ledger import EffectStore

    EffectStore(tmp_path / "db").close()  # create the schema once

    def apply_once(_: int) -> bool:
        store = EffectStore(tmp_path / "db")
        try:
            return store.apply("o-1:charge-payment", "o-1", "charge-payment")[1]
        finally:
            store.close()

    with ThreadPoolExecutor(max_workers=8) as pool:
        replayed = list(pool.map(apply_once, range(16)))
    assert replayed.count(False) == 1
    store = EffectStore(tmp_path / "db")
    assert store.report()["totalApplied"] == 1
    store.close()


# --- scripted faults: a targeted override of the seeded decision, still deterministic -----------------------


def test_script_overrides_the_seeded_decision_per_call_then_falls_back() -> None:
    from lab.simulator import decide_call, parse_script

    config = FaultConfig(seed=7, permanent_failure_rate=1.0)  # seeded: every key is rejected
    script = parse_script({"o-1": ["transient", "hang", "ok"]})
    faults = [decide_call(config, script, "o-1:charge-payment", "o-1", n).fault for n in (1, 2, 3, 4)]
    assert faults == [Fault.TRANSIENT, Fault.HANG, Fault.NONE, Fault.PERMANENT]
    assert decide_call(config, script, "o-2:charge-payment", "o-2", 1) == decide(config, "o-2:charge-payment", 1)
    assert decide_call(config, script, "o-1:x", "o-1", 1).status in (429, 503)
    again = [decide_call(config, script, "o-1:charge-payment", "o-1", n) for n in (1, 2, 3, 4)]
    assert again == [decide_call(config, script, "o-1:charge-payment", "o-1", n) for n in (1, 2, 3, 4)]


def test_an_idempotency_key_script_wins_over_its_order_script() -> None:
    from lab.simulator import decide_call, parse_script

    script = parse_script({"o-1": ["transient"], "o-1:charge-payment": ["permanent"]})
    config = FaultConfig()
    assert decide_call(config, script, "o-1:charge-payment", "o-1", 1).fault is Fault.PERMANENT
    assert decide_call(config, script, "o-1:charge-payment", "o-1", 1).status == 422
    assert decide_call(config, script, "o-1:reserve-inventory", "o-1", 1).fault is Fault.TRANSIENT


@pytest.mark.parametrize("raw", [[], {"o-1": "ok"}, {"o-1": ["ok", "explode"]}])
def test_malformed_scripts_are_refused(raw: Any) -> None:
    from lab.simulator import parse_script

    with pytest.raises(ValueError, match="script"):
        parse_script(raw)


async def test_script_endpoint_drives_calls_and_counts_them(tmp_path: Path) -> None:
    async with Simulator(FaultConfig(seed=3), tmp_path / "db") as sim, aiohttp.ClientSession() as http:
        async with http.post(f"{sim.url}/script", json={"o-1": ["transient", "permanent"]}) as r:
            assert r.status == 200 and await r.json() == {"o-1": ["transient", "permanent"]}
        async with http.post(f"{sim.url}/script", json={"o-2": ["nope"]}) as r:
            assert r.status == 400 and (await r.json())["errorCode"] == "InvalidScript"
        statuses = [(await post(http, sim, call("o-1")))[0] for _ in range(3)]
        report = await effects(http, sim)
        async with http.get(f"{sim.url}/script") as r:
            assert await r.json() == {"o-1": ["transient", "permanent"]}
    assert statuses[0] in (429, 503) and statuses[1:] == [422, 200]
    assert report["callsByKey"] == {"o-1:charge-payment": 3} and report["totalApplied"] == 1


def test_script_file_is_loaded_from_the_command_line(tmp_path: Path) -> None:
    from lab.simulator import build_parser, script_from_args

    path = tmp_path / "script.json"
    path.write_text('{"o-9:arrange-shipping": ["hang", "ok"]}')
    args = build_parser().parse_args(["--script", str(path)])
    assert script_from_args(args) == {"o-9:arrange-shipping": (Fault.HANG, Fault.NONE)}
    assert script_from_args(build_parser().parse_args([])) == {}
