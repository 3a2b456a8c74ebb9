"""The remote service simulator: the SAS pattern's "remote resource", with seeded, reproducible faults.

Contract: an aiohttp server on 127.0.0.1, `POST /steps/{name}` per step and per compensation taking `{orderId,
idempotencyKey, payload}`; a call's behaviour is a pure function of (script, seed, idempotencyKey, call number for that
key), `decide()`, whatever the timing. Faults: permanent (422), transient (503/429 with `retry-after-ms`), latency,
hang, scripts (`--script`, `POST /script`), outage (`POST /outage`). An effect is applied at most once per key
(SQLite, `BEGIN IMMEDIATE`); compensations undo it or leave a tombstone; `GET /effects` reports the ledger. Use it
from the command line (`python -m lab.simulator --help`) or in-process (`async with Simulator(config, db) as sim:
sim.url`). Every behaviour and ledger field: docs/modules-lab.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from aiohttp import web

from agent.retry import unit_hash
from orderflow.messages import CompensationName, StepName

from .simulator_ledger import COMPENSATIONS, AlreadyCompensated, EffectStore, KeyConflict

# A permanent failure's errorCode per step and per compensation (what the business would say). Every name here is
# served at `POST /steps/{name}`.
PERMANENT_CODES: dict[str, str] = {
    StepName.RESERVE_INVENTORY: "InsufficientStock",
    StepName.CHARGE_PAYMENT: "PaymentDeclined",
    StepName.ARRANGE_SHIPPING: "AddressUndeliverable",
    CompensationName.RELEASE_INVENTORY: "ReleaseRefused",
    CompensationName.REFUND_PAYMENT: "RefundRefused",
    CompensationName.CANCEL_SHIPMENT: "CancellationRefused",
}


@dataclass(frozen=True)
class FaultConfig:
    seed: int = 0
    transient_failure_rate: float = 0.0
    permanent_failure_rate: float = 0.0
    latency_ms_mean: float = 0.0
    hang_rate: float = 0.0
    hang_seconds: float = 30.0
    fail_first_calls: int = 0
    retry_after_ms: int = 100

    def __post_init__(self) -> None:
        for name in ("transient_failure_rate", "permanent_failure_rate", "hang_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1]")
        if self.transient_failure_rate + self.hang_rate > 1.0:
            raise ValueError("transient_failure_rate + hang_rate must not exceed 1")


class Fault(StrEnum):
    NONE = "none"
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    HANG = "hang"


@dataclass(frozen=True)
class Decision:
    fault: Fault
    latency: float  # seconds before answering
    status: int  # HTTP status of the answer (a hang answers 200 after hang_seconds)


def decide(config: FaultConfig, key: str, call_number: int) -> Decision:
    """What call number `call_number` (1-based) for idempotency key `key` does: pure in (seed, key, n)."""
    latency = _latency(config, key, call_number)
    if unit_hash(config.seed, key, "permanent") < config.permanent_failure_rate:
        return Decision(Fault.PERMANENT, latency, 422)
    roll = unit_hash(config.seed, key, call_number, "fault")
    if call_number <= config.fail_first_calls or roll < config.transient_failure_rate:
        status = 429 if unit_hash(config.seed, key, call_number, "status") < 0.5 else 503
        return Decision(Fault.TRANSIENT, latency, status)
    if roll < config.transient_failure_rate + config.hang_rate:
        return Decision(Fault.HANG, latency, 200)
    return Decision(Fault.NONE, latency, 200)


BEHAVIOURS: dict[str, Fault] = {
    "ok": Fault.NONE,
    "transient": Fault.TRANSIENT,
    "permanent": Fault.PERMANENT,
    "hang": Fault.HANG,
}
_NAMES = {fault: name for name, fault in BEHAVIOURS.items()}
_STATUS = {Fault.NONE: 200, Fault.PERMANENT: 422, Fault.HANG: 200}
FaultScript = dict[str, tuple[Fault, ...]]


def parse_script(raw: object) -> FaultScript:
    """Validate `{target: [behaviour, ...]}` (target: idempotency key or orderId); ValueError if bad."""
    if not isinstance(raw, dict):
        raise ValueError("a fault script must be a JSON object {target: [behaviour, ...]}")
    script: FaultScript = {}
    for target, behaviours in raw.items():
        if not isinstance(behaviours, list) or not all(b in BEHAVIOURS for b in behaviours):
            raise ValueError(f"script of {target!r} must be a list of {sorted(BEHAVIOURS)}")
        script[str(target)] = tuple(BEHAVIOURS[b] for b in behaviours)
    return script


def scripted_fault(script: FaultScript, key: str, order_id: str, call_number: int) -> Fault | None:
    """The scripted behaviour of call `call_number` (1-based) of `key`, or None (use the seeded decision)."""
    for target in (key, order_id):
        behaviours = script.get(target)
        if behaviours is not None:
            return behaviours[call_number - 1] if call_number <= len(behaviours) else None
    return None


def decide_call(config: FaultConfig, script: FaultScript, key: str, order_id: str, call_number: int) -> Decision:
    """`decide`, overridden by the script where it has an entry for this call."""
    seeded = decide(config, key, call_number)
    fault = scripted_fault(script, key, order_id, call_number)
    if fault is None:
        return seeded
    status = _STATUS.get(fault) or (seeded.status if seeded.fault is Fault.TRANSIENT else 503)
    return Decision(fault, seeded.latency, status)


def _latency(config: FaultConfig, key: str, call_number: int) -> float:
    if config.latency_ms_mean <= 0:
        return 0.0
    u = unit_hash(config.seed, key, call_number, "latency")
    return min(-math.log(1.0 - u) * config.latency_ms_mean, 10 * config.latency_ms_mean) / 1000


class Simulator:
    """The simulator as an object: start it on a port inside a test or the demo, stop it, read its effects."""

    def __init__(
        self,
        config: FaultConfig,
        db_path: str | Path,
        host: str = "127.0.0.1",
        port: int = 0,
        script: FaultScript | None = None,
    ) -> None:
        self.config = config
        self.script: FaultScript = dict(script or {})
        self._host = host
        self._port = port
        self.store = EffectStore(db_path)
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.outages: list[list[float | None]] = []  # [start, end] in Unix seconds; end None while down

    @property
    def down(self) -> bool:
        return bool(self.outages) and self.outages[-1][1] is None

    def set_down(self, down: bool) -> dict[str, Any]:
        """The outage switch: down, every call answers 503 and applies nothing; up, calls behave as configured."""
        if down and not self.down:
            self.outages.append([time.time(), None])
        elif not down and self.down:
            self.outages[-1][1] = time.time()
        return self.outage_report()

    def outage_report(self) -> dict[str, Any]:
        return {"down": self.down, "outages": [{"start": s, "end": e} for s, e in self.outages]}

    async def __aenter__(self) -> Simulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> str:
        """Listen on host:port (port 0 = any free port); returns the base URL."""
        self._runner = web.AppRunner(self.app(), shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self._host, self._port).start()
        bound_host, bound_port = self._runner.addresses[0][:2]
        self.url = f"http://{bound_host}:{bound_port}"
        return self.url

    async def stop(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.store.close()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/steps/{step}", self._step)
        app.router.add_get("/effects", self._effects)
        app.router.add_get("/health", self._health)
        app.router.add_get("/script", self._get_script)
        app.router.add_post("/script", self._post_script)
        app.router.add_get("/outage", self._get_outage)
        app.router.add_post("/outage", self._post_outage)
        app.router.add_get("/calls", self._calls)
        return app

    async def _get_outage(self, _: web.Request) -> web.Response:
        return web.json_response(self.outage_report())

    async def _post_outage(self, request: web.Request) -> web.Response:
        """`{"down": true|false}`: switch the outage on or off."""
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("down"), bool):
            return _error(400, "InvalidRequest", 'expected {"down": true|false}')
        return web.json_response(self.set_down(body["down"]))

    async def _calls(self, request: web.Request) -> web.Response:
        """The call log (`?since=UNIX_SECONDS` for the calls from then on)."""
        try:
            since = float(request.query.get("since", "0"))
        except ValueError:
            return _error(400, "InvalidRequest", "since must be a number of Unix seconds")
        return web.json_response({"calls": self.store.calls(since)})

    async def _get_script(self, _: web.Request) -> web.Response:
        return web.json_response({t: [_NAMES[f] for f in fs] for t, fs in self.script.items()})

    async def _post_script(self, request: web.Request) -> web.Response:
        """Merge `{target: [behaviour, ...]}` into the script (a target's list is replaced)."""
        try:
            self.script.update(parse_script(await request.json()))
        except ValueError as exc:
            return _error(400, "InvalidScript", str(exc))
        return await self._get_script(request)

    async def _health(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _effects(self, _: web.Request) -> web.Response:
        return web.json_response(self.store.report())

    async def _step(self, request: web.Request) -> web.Response:
        step = request.match_info["step"]
        if step not in PERMANENT_CODES:
            return _error(404, "UnknownStep", f"no step or compensation {step!r}")
        parsed = await _parse_call(request)
        if isinstance(parsed, web.Response):
            return parsed
        order_id, key = parsed
        at, number = time.time(), self.store.next_call(key)
        if self.down:
            self.store.log_call(at, key, 503, down=True)
            return self._transient(503)
        decision = decide_call(self.config, self.script, key, order_id, number)
        if (
            step in COMPENSATIONS
            and decision.fault is Fault.PERMANENT
            and scripted_fault(self.script, key, order_id, number) is None
        ):
            # A compensation is designed to succeed: the seeded permanent-failure rate (a customer's declined card,
            # an unknown address) does not apply to it; only a script makes it fail permanently (the drills).
            decision = Decision(Fault.NONE, decision.latency, 200)
        self.store.log_call(at, key, decision.status, down=False)
        await self._pause(decision.latency)
        if decision.fault is Fault.TRANSIENT:
            return self._transient(decision.status)
        if decision.fault is Fault.PERMANENT:
            return _error(422, PERMANENT_CODES[step], f"{step} rejected for order {order_id}")
        return await self._apply(key, order_id, step, decision)

    async def _apply(self, key: str, order_id: str, step: str, decision: Decision) -> web.Response:
        try:
            if step in COMPENSATIONS:
                result, replayed = self.store.compensate(key, order_id, CompensationName(step))
            else:
                result, replayed = self.store.apply(key, order_id, step)
        except KeyConflict as exc:
            return _error(409, "IdempotencyKeyReuse", str(exc))
        except AlreadyCompensated as exc:
            return _error(
                409, "AlreadyCompensated", str(exc), extra={"compensation": exc.compensation, "undone": exc.undone}
            )
        if decision.fault is Fault.HANG:
            await self._pause(self.config.hang_seconds)
        return web.json_response({"idempotencyKey": key, "replayed": replayed, **result})

    def _transient(self, status: int) -> web.Response:
        headers = {"retry-after-ms": str(self.config.retry_after_ms)}
        if status == 429 and self.config.retry_after_ms >= 1000:  # Retry-After is whole seconds (RFC 9110)
            headers["Retry-After"] = str(math.ceil(self.config.retry_after_ms / 1000))
        return _error(status, "Throttled" if status == 429 else "ServiceUnavailable", "try again", headers)

    async def _pause(self, seconds: float) -> None:
        """Sleep (simulated latency or hang), cut short when the simulator stops."""
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), seconds)


async def _parse_call(request: web.Request) -> tuple[str, str] | web.Response:
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "InvalidRequest", "body is not JSON")
    if not isinstance(body, dict):
        return _error(400, "InvalidRequest", "body must be a JSON object")
    for field, kind in (("orderId", str), ("idempotencyKey", str), ("payload", dict)):
        if not isinstance(body.get(field), kind) or (kind is str and not body[field]):
            return _error(400, "InvalidRequest", f"field '{field}' is missing or not a {kind.__name__}")
    return body["orderId"], body["idempotencyKey"]


def _error(
    status: int, code: str, message: str, headers: dict[str, str] | None = None, extra: dict[str, Any] | None = None
) -> web.Response:
    return web.json_response({"errorCode": code, "error": message, **(extra or {})}, status=status, headers=headers)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab.simulator", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765, help="0 = any free port (printed on start)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--transient-failure-rate", type=float, default=0.0)
    p.add_argument("--permanent-failure-rate", type=float, default=0.0)
    p.add_argument("--latency-ms-mean", type=float, default=0.0)
    p.add_argument("--hang-rate", type=float, default=0.0)
    p.add_argument("--hang-seconds", type=float, default=30.0)
    p.add_argument("--fail-first-calls", type=int, default=0, help="every key fails transiently N times first")
    p.add_argument("--retry-after-ms", type=int, default=100)
    p.add_argument(
        "--down-after",
        type=float,
        default=None,
        metavar="S",
        help="take the service down S seconds after start (every call 503, no effect); see POST /outage",
    )
    p.add_argument(
        "--down-for",
        type=float,
        default=0.0,
        metavar="D",
        help="with --down-after: bring it back after D seconds (default 0: down until POST /outage)",
    )
    p.add_argument("--db", default=".simulator.sqlite", help="SQLite file of the side effects")
    p.add_argument("--script", default=None, help="JSON file {idempotencyKey or orderId: [ok|transient|...]}")
    return p


def script_from_args(args: argparse.Namespace) -> FaultScript:
    return parse_script(json.loads(Path(args.script).read_text())) if args.script else {}


def config_from_args(args: argparse.Namespace) -> FaultConfig:
    return FaultConfig(
        seed=args.seed,
        transient_failure_rate=args.transient_failure_rate,
        permanent_failure_rate=args.permanent_failure_rate,
        latency_ms_mean=args.latency_ms_mean,
        hang_rate=args.hang_rate,
        hang_seconds=args.hang_seconds,
        fail_first_calls=args.fail_first_calls,
        retry_after_ms=args.retry_after_ms,
    )


async def _serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    script = script_from_args(args)
    async with Simulator(config_from_args(args), args.db, args.host, args.port, script) as sim:
        print(f"simulator listening on {sim.url}", flush=True)
        outage = None
        if args.down_after is not None:
            outage = asyncio.create_task(_scheduled_outage(sim, args.down_after, args.down_for))
        await stop.wait()
        if outage is not None:
            outage.cancel()


async def _scheduled_outage(sim: Simulator, after: float, duration: float) -> None:
    """`--down-after S --down-for D`: down from S seconds after start, for D seconds (0: until switched back)."""
    await asyncio.sleep(max(0.0, after))
    sim.set_down(True)
    if duration > 0:
        await asyncio.sleep(duration)
        sim.set_down(False)


def main(argv: list[str] | None = None) -> None:
    asyncio.run(_serve(build_parser().parse_args(argv)))


if __name__ == "__main__":
    main()
