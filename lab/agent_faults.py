"""`python -m lab agent [flags]`: the real Agent (`agent.worker.serve`) with the drills' fault switches around it.

Contract: the switches AGENT_REPLY_DELAY_MS, AGENT_REPLY_DELAY_MIN_MS, AGENT_REPLY_DELAY_SHARE and
AGENT_CLOCK_SKEW_SECONDS (or the flags `--reply-delay-ms`, ...) are off by default, and off they change nothing; every
other flag is the Agent's (`python -m agent --help`). They go in through the clock and the bus client the Agent takes
as parameters (`SkewedClock`, `HeldReplies`), so the deployed Agent carries none. Table: docs/modules-lab.md.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from azure.servicebus import ServiceBusMessage

from agent.__main__ import AGENT_SERVICE_NAME, create_client
from agent.config import config_from_args
from agent.handler import Sender
from agent.retry import unit_hash
from agent.worker import serve
from orderflow import telemetry
from orderflow.adapters import aio_bus_from_connection_string, is_embedded_connection
from orderflow.clock import SystemClock
from orderflow.clock import WaitingClock as Clock
from orderflow.settings import SERVICE_BUS_CONNECTION, Setting
from orderflow.telemetry import configure_logging

log = logging.getLogger("agent")

FAULT_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "AGENT_REPLY_DELAY_MS",
        "0",
        "Fault switch: hold replies back by up to this many ms (0 = off); the request is completed at once and the "
        "reply sent later in the background, so later replies can overtake it.",
    ),
    Setting("AGENT_REPLY_DELAY_MIN_MS", "0", "Fault switch: the least hold-back of a held reply (ms)."),
    Setting(
        "AGENT_REPLY_DELAY_SHARE",
        "1",
        "Fault switch: the share (0-1) of replies held back, chosen by AGENT_JITTER_SEED and the reply's MessageId.",
    ),
    Setting(
        "AGENT_CLOCK_SKEW_SECONDS",
        "0",
        "Fault switch: seconds added to the Agent's clock and its bus client's (negative: behind); the broker's "
        "clock is not skewed.",
    ),
)
_DEFAULTS = {s.name: str(s.default) for s in FAULT_SETTINGS}
# flag → (setting, type)
_FLAGS: dict[str, tuple[str, type]] = {
    "--reply-delay-ms": ("AGENT_REPLY_DELAY_MS", int),
    "--reply-delay-min-ms": ("AGENT_REPLY_DELAY_MIN_MS", int),
    "--reply-delay-share": ("AGENT_REPLY_DELAY_SHARE", float),
    "--clock-skew-seconds": ("AGENT_CLOCK_SKEW_SECONDS", float),
}


@dataclass(frozen=True)
class ReplyDelay:
    """Fault switch AGENT_REPLY_DELAY_MS / _MIN_MS / _SHARE (the timing drills: late and reordered replies).

    A `share` of replies is held back, each by a delay uniform in [min_ms, max_ms]; the rest go at once. Which reply
    and how long is a pure function of (seed, the reply's MessageId), so a run is reproducible whatever the timing
    and a drill can tell in advance which replies were held and for how long. `max_ms` 0 is off."""

    max_ms: int = 0
    min_ms: int = 0
    share: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_ms < 0 or self.min_ms < 0:
            raise ValueError("reply delays must not be negative")
        if self.max_ms and self.min_ms > self.max_ms:
            raise ValueError("reply_delay_min_ms must not exceed reply_delay_ms")
        if not 0.0 <= self.share <= 1.0:
            raise ValueError("reply_delay_share must be within [0, 1]")

    @property
    def enabled(self) -> bool:
        return self.max_ms > 0 and self.share > 0

    def seconds(self, message_id: str) -> float:
        """How long the reply with this MessageId is held back (0: sent at once)."""
        if not self.enabled or unit_hash(self.seed, message_id, "reply-delay") >= self.share:
            return 0.0
        low = min(self.min_ms, self.max_ms)
        return (low + (self.max_ms - low) * unit_hash(self.seed, message_id, "reply-delay-ms")) / 1000


@dataclass(frozen=True)
class AgentFaults:
    """The switches of one Agent process; `AgentFaults()` is all off."""

    reply_delay: ReplyDelay = ReplyDelay()
    clock_skew_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.clock_skew_seconds):
            raise ValueError("clock_skew_seconds must be a finite number")


def _number(name: str, kind: type, values: Mapping[str, Any]) -> Any:
    value = values.get(name)
    value = _DEFAULTS[name] if value is None or value == "" else value
    try:
        return kind(str(value))
    except ValueError as exc:
        word = "an integer" if kind is int else "a number"
        raise ValueError(f"app setting {name!r} must be {word}, got {value!r}") from exc


def faults_from_env(env: Mapping[str, Any], seed: int = 0) -> AgentFaults:
    """The switches from app settings (`env`; flags map onto the same names); `seed` is the Agent's jitter seed."""
    delay = ReplyDelay(
        _number("AGENT_REPLY_DELAY_MS", int, env),
        _number("AGENT_REPLY_DELAY_MIN_MS", int, env),
        _number("AGENT_REPLY_DELAY_SHARE", float, env),
        seed,
    )
    return AgentFaults(delay, _number("AGENT_CLOCK_SKEW_SECONDS", float, env))


class SkewedClock:
    """Fault switch AGENT_CLOCK_SKEW_SECONDS (the clock-skew drill): the Agent's clock `skew` seconds ahead (or
    behind, negative) of `inner`. Only `now()` moves; waiting is a duration and is not skewed. Every time the Agent
    reads goes through it: the deadline checks of a request and of its retries, lock renewal (against the expiry the
    broker stamps, as the azure-servicebus lock renewer compares it with the local clock), the breaker's times, the
    reply's completedAt, and its bus client's lock checks (`agent_bus`). The broker keeps its own clock, as Service
    Bus does."""

    def __init__(self, inner: Clock, skew: float) -> None:
        self._inner = inner
        self._skew = timedelta(seconds=skew)

    def now(self) -> datetime:
        return self._inner.now() + self._skew

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def agent_bus(connection: str | None, env: Mapping[str, str], faults: AgentFaults, clock: Clock) -> Any:
    """The Agent's bus client (`agent.__main__.create_client`); with the skew switch on, one whose local clock is the
    Agent's skewed `clock`: the SDK judges lock expiry on the machine's clock (`_servicebus_session.py`
    `_lock_expired`, `_common/message.py` `_lock_expired`: `locked_until_utc <= utc_now()`), and the embedded client
    on its `local_clock`. Only the embedded client takes one; a skewed clock on another client is refused."""
    if not faults.clock_skew_seconds:
        return create_client(connection, env)
    conn = connection or env.get(SERVICE_BUS_CONNECTION, "")
    if not is_embedded_connection(conn):
        raise ValueError(
            "AGENT_CLOCK_SKEW_SECONDS skews the bus client's clock too, which only the embedded client allows "
            "(Endpoint=embedded://...)"
        )
    return aio_bus_from_connection_string(conn, local_clock=clock.now)


def agent_clock(faults: AgentFaults, clock: Clock) -> Clock:
    """The Agent's clock: `clock` itself, or skewed by AGENT_CLOCK_SKEW_SECONDS when that switch is on."""
    if not faults.clock_skew_seconds:
        return clock
    log.warning("fault switch on: the Agent's clock runs %+g s off", faults.clock_skew_seconds)
    return SkewedClock(clock, faults.clock_skew_seconds)


class HeldReplies:
    """A replies `Sender` that holds some replies back (`ReplyDelay`): a held reply is sent by a task of its own
    after its delay and `send_messages` returns at once, so the handler completes the request right away and the
    session goes on: the order's next request (a newer attempt) and other orders' replies can overtake the held one,
    as they would behind a slow or paused Agent instance. Only installed when the switch is on.

    What it gives up, on purpose: the handler's "complete only after the reply is sent". A held reply is lost if the
    Agent dies first, or if its send fails (logged): the Scheduler's timer at CompleteBy and the Supervisor recover
    that step, as they recover any reply that never comes.

    As an async context manager it opens and closes the sender it wraps, giving held replies `grace` seconds first."""

    def __init__(self, sender: Sender, delay: ReplyDelay, clock: Clock, grace: float = 0.0) -> None:
        self._sender = sender
        self._delay = delay
        self._clock = clock
        self._grace = grace
        self._held: set[asyncio.Task[None]] = set()
        self.held = 0  # replies held back so far
        self.lost = 0  # held replies whose send failed

    async def __aenter__(self) -> HeldReplies:
        await self._sender.__aenter__()  # type: ignore[attr-defined]
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.flush(self._grace)
            log.info("replies held back: %d (lost %d)", self.held, self.lost)
        finally:
            await self._sender.__aexit__(kind, exc, tb)  # type: ignore[attr-defined]

    async def send_messages(self, message: ServiceBusMessage) -> None:
        seconds = self._delay.seconds(str(message.message_id))
        if seconds <= 0:
            await self._sender.send_messages(message)
            return
        self.held += 1
        task = asyncio.create_task(self._send_later(message, seconds), name=f"held-reply:{message.message_id}")
        self._held.add(task)
        task.add_done_callback(self._held.discard)

    async def _send_later(self, message: ServiceBusMessage, seconds: float) -> None:
        await self._clock.sleep(seconds)
        try:
            await self._sender.send_messages(message)
        except Exception:  # a lost reply is what the Scheduler's timer is for
            self.lost += 1
            log.exception("held reply %s could not be sent; its step's CompleteBy covers it", message.message_id)

    async def flush(self, grace: float) -> None:
        """On stop: give the held replies up to `grace` seconds to go out, then drop the rest (as a crash would)."""
        if not self._held:
            return
        _, pending = await asyncio.wait(set(self._held), timeout=grace)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if pending:
            log.warning("%d held repl(ies) dropped at stop", len(pending))


class HoldingClient:
    """A bus client whose sender of `replies_queue` holds replies back (`HeldReplies`); the rest is `inner`'s."""

    def __init__(self, inner: Any, replies_queue: str, delay: ReplyDelay, clock: Clock, grace: float) -> None:
        self._inner = inner
        self._replies_queue = replies_queue
        self._delay = delay
        self._clock = clock
        self._grace = grace
        self.replies: HeldReplies | None = None

    def get_queue_sender(self, queue_name: str, **kwargs: Any) -> Any:
        sender = self._inner.get_queue_sender(queue_name, **kwargs)
        if queue_name != self._replies_queue:
            return sender
        self.replies = HeldReplies(sender, self._delay, self._clock, self._grace)
        return self.replies

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def with_faults(client: Any, replies_queue: str, faults: AgentFaults, clock: Clock, grace: float) -> Any:
    """`client` itself, or a `HoldingClient` when the reply hold-back switch is on."""
    delay = faults.reply_delay
    if not delay.enabled:
        return client
    log.warning("fault switch on: holding back %s of the replies by %d-%d ms", delay.share, delay.min_ms, delay.max_ms)
    return HoldingClient(client, replies_queue, delay, clock, grace)


def _fault_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    for flag, (setting, kind) in _FLAGS.items():
        p.add_argument(flag, dest=setting, type=kind, default=None)
    return p


def split_args(argv: Sequence[str] | None) -> tuple[dict[str, Any], list[str]]:
    """The switches given as flags (by setting name), and the rest: the Agent's own arguments."""
    known, rest = _fault_parser().parse_known_args(argv)
    return {k: v for k, v in vars(known).items() if v is not None}, rest


async def _run(argv: Sequence[str] | None) -> int:
    given, rest = split_args(argv)
    config, args = config_from_args(rest)
    faults = faults_from_env({**os.environ, **given}, config.jitter_seed)
    configure_logging(args.log_level)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    clock = agent_clock(faults, SystemClock())
    async with agent_bus(args.connection, os.environ, faults, clock) as client:
        faulty = with_faults(client, config.replies_queue, faults, clock, config.shutdown_grace_ms / 1000)
        await serve(faulty, config, stop, clock=clock, env=os.environ)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    telemetry.configure_from_env(service_name=AGENT_SERVICE_NAME)
    return asyncio.run(_run(argv))
