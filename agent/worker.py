"""The Agent's receive loop: sessions of `agent-requests`, several at once, FIFO within each, graceful stop.

`AgentWorker` holds up to `max_concurrent_sessions` sessions; `session_acceptors` acceptors take the next available
session (one order) and hand it to a task that handles its requests in order (`agent.handler`) and releases it when
idle for `receive_wait_ms` (seed 002, Sequential Convoy). Session locks are renewed while held. Written against the
azure-servicebus aio API only (the client is injected); a bus failure abandons the request and the rest of its batch.
Shutdown (SIGTERM/SIGINT set `stop`): nothing new is taken, in-flight work gets `shutdown_grace_ms`, then is cancelled
unsettled. `serve` gives every request the one `SharedBreaker` of `RemoteServiceName`; with the breaker on and no
`CosmosDb__accountEndpoint`, the Agent refuses to start. Why a few acceptors, lock figures: docs/modules-product.md."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from datetime import datetime
from typing import Any, Literal, Protocol, Self

import aiohttp
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusSessionFilter
from azure.servicebus.exceptions import OperationTimeoutError, SessionLockLostError

from agent.config import AgentConfig
from agent.handler import Outbox, RequestHandler, Sender, Settler, circuit_alerter
from agent.remote import HttpRemoteCaller, RemoteCaller
from agent.retry import CallGate
from orderflow.adapters import open_breaker_documents
from orderflow.breaker import BreakerConfig, OnTransition, shared_breaker
from orderflow.clock import SystemClock
from orderflow.clock import WaitingClock as Clock
from orderflow.ports import DocumentStore
from orderflow.session_locks import keep_lock_renewed

SESSION_ACCEPT_WAIT_SECONDS = 10.0
log = logging.getLogger("agent")

BATCH_SIZE = 10
ERROR_PAUSE_SECONDS = 1.0
# How long a slot waits after a session came with its lock already expired on this Agent's clock (the clock runs at
# least the LockDuration ahead of the broker's: the SDK refuses every operation on such a session). Long enough not
# to take sessions from healthy Agents every second; short enough to resume soon after the clock is set right.
CLOCK_AHEAD_PAUSE_SECONDS = 30.0

# Builds the circuit breaker once the alerts sender is open: given the `on_transition` that alerts on it.
BreakerFactory = Callable[[OnTransition], CallGate]


class QueueSender(Sender, Protocol):
    """A sender as `get_queue_sender` returns it, to be opened with `async with`."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: Any) -> None: ...


class HeldSession(Protocol):
    """The session a session receiver holds (azure-servicebus `ServiceBusSession`)."""

    @property
    def session_id(self) -> str | None: ...

    @property
    def locked_until_utc(self) -> datetime | None: ...

    async def renew_lock(self) -> object: ...


class SessionReceiver(Settler, Protocol):
    """A receiver of one session of `agent-requests`: receive, settle, renew the session's lock."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: Any) -> None: ...

    @property
    def session(self) -> HeldSession: ...

    async def receive_messages(
        self, max_message_count: int | None = ..., max_wait_time: float | None = ...
    ) -> list[Any]: ...

    async def abandon_message(self, message: Any, /) -> None: ...

    async def close(self) -> None: ...


class AgentBus(Protocol):
    """The aio Service Bus client as far as the Agent uses it: the core's `BusClient` calls plus session receivers
    (azure-servicebus and the embedded broker's aio client both have them)."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: Any) -> None: ...

    def get_queue_sender(self, queue_name: str, /) -> QueueSender: ...

    def get_queue_receiver(
        self,
        queue_name: str,
        /,
        *,
        session_id: str | Literal[ServiceBusSessionFilter.NEXT_AVAILABLE] | None = ...,
        max_wait_time: float | None = ...,
    ) -> SessionReceiver: ...


class AgentWorker:
    def __init__(
        self,
        client: AgentBus,
        caller: RemoteCaller,
        config: AgentConfig,
        clock: Clock | None = None,
        breaker: BreakerFactory | None = None,
    ) -> None:
        self._client = client
        self._caller = caller
        self._config = config
        self._clock = clock or SystemClock()
        self._make_breaker = breaker
        self.stats: Counter[str] = Counter()
        self._busy: set[asyncio.Task[Any]] = set()  # session tasks handling a request right now

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set, then finish in-flight requests within the grace period."""
        cfg = self._config
        async with AsyncExitStack() as stack:
            replies = await stack.enter_async_context(self._client.get_queue_sender(cfg.replies_queue))
            alerts = await stack.enter_async_context(self._client.get_queue_sender(cfg.alerts_queue))
            outbox = Outbox(replies, alerts, cfg.replies_queue, cfg.requests_queue)
            breaker = None
            if self._make_breaker is not None:
                breaker = self._make_breaker(circuit_alerter(alerts, self._clock))
            handler = RequestHandler(self._caller, outbox, cfg.retry_policy(), self._clock, breaker)
            sessions: set[asyncio.Task[None]] = set()
            # Up to `session_acceptors` accepts under way at once, all taking the same slots.
            slots = asyncio.Semaphore(cfg.max_concurrent_sessions)
            acceptors = [
                asyncio.create_task(self._acceptor(handler, stop, sessions, slots), name=f"agent-acceptor-{i}")
                for i in range(min(cfg.session_acceptors, cfg.max_concurrent_sessions))
            ]
            log.info("agent serving %s with %d session slot(s)", cfg.requests_queue, cfg.max_concurrent_sessions)
            await stop.wait()
            for acceptor in acceptors:  # takes no new session; an accept under way is given up
                acceptor.cancel()
            held = list(sessions)
            for session in held:  # sessions waiting for a message stop at once; those handling one get the grace
                if session not in self._busy:
                    session.cancel()
            await _finish([*acceptors, *held], cfg.shutdown_grace_ms / 1000)
        log.info("agent stopped: %s", dict(self.stats))

    async def _acceptor(
        self,
        handler: RequestHandler,
        stop: asyncio.Event,
        sessions: set[asyncio.Task[None]],
        slots: asyncio.Semaphore,
    ) -> None:
        """One acceptor: whenever a slot is free, take the next available session and serve it in a task."""
        while not stop.is_set():
            await slots.acquire()
            try:
                session = await self._accept_session()
            except OperationTimeoutError:  # no session became available within the wait: ask again
                slots.release()
                continue
            except Exception:  # the acceptor must outlive any one failure
                slots.release()
                self.stats["errors"] += 1
                log.exception("agent could not accept a session; pausing")
                await _wait(stop, ERROR_PAUSE_SECONDS)
                continue
            except BaseException:  # cancelled (stop)
                slots.release()
                raise
            task = asyncio.create_task(self._serve_session(session, handler, stop))
            sessions.add(task)
            task.add_done_callback(sessions.discard)
            task.add_done_callback(lambda _: slots.release())

    async def _accept_session(self) -> tuple[SessionReceiver, AsyncExitStack]:
        """The receiver of the next available session, opened, and the stack that closes it (releases the session);
        OperationTimeoutError when no session comes within the wait."""
        wait = self._config.receive_wait_ms / 1000
        # Waiting for a session is woken by the broker when one gets messages, so this wait is long: an idle Agent
        # does not poll. Once a session is held, `receive_wait_ms` bounds how long it is kept while idle.
        receiver = self._client.get_queue_receiver(
            self._config.requests_queue,
            session_id=NEXT_AVAILABLE_SESSION,
            max_wait_time=max(wait, SESSION_ACCEPT_WAIT_SECONDS),
        )
        stack = AsyncExitStack()
        try:
            return await stack.enter_async_context(receiver), stack
        except BaseException:
            # No session (or cancelled): close what the attempt opened, e.g. the embedded broker's wake-up socket.
            with contextlib.suppress(Exception):
                await receiver.close()
            raise

    async def _serve_session(
        self, session: tuple[SessionReceiver, AsyncExitStack], handler: RequestHandler, stop: asyncio.Event
    ) -> None:
        """Handle an accepted session until it is idle, lost, or stop; then release it (close its receiver). The
        slot stays taken for `ERROR_PAUSE_SECONDS` after a failure, so a failing bus is not hammered."""
        receiver, stack = session
        if self._expired_on_arrival(receiver):
            await stack.aclose()  # give the session back at once: a healthy Agent can take it
            await _wait(stop, CLOCK_AHEAD_PAUSE_SECONDS)
            return
        try:
            async with stack:
                renewer = asyncio.create_task(self._keep_session_locked(receiver))
                try:
                    await self._drain_session(receiver, handler, stop, self._config.receive_wait_ms / 1000)
                finally:
                    renewer.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await renewer
        except OperationTimeoutError:
            pass
        except Exception:  # one session's failure must not stop the Agent
            self.stats["errors"] += 1
            log.exception("agent session error; pausing")
            await _wait(stop, ERROR_PAUSE_SECONDS)

    def _expired_on_arrival(self, receiver: SessionReceiver) -> bool:
        """Whether the session's lock had expired on this Agent's clock when the broker granted it. The SDK judges a
        session lock on the machine's clock (`_servicebus_session.py` `_lock_expired`), so every receive, settlement
        and renewal on it would raise SessionLockLostError: the clock runs at least the LockDuration ahead."""
        session = receiver.session
        until, now = getattr(session, "locked_until_utc", None), self._clock.now()
        if until is None or until > now:
            return False
        self.stats["expired_on_arrival"] += 1
        log.error(
            "session %s was granted with its lock already expired on this Agent's clock (locked until %s, now %s): "
            "this machine's clock runs at least the LockDuration ahead of Service Bus; session given back, slot "
            "paused %g s",
            getattr(session, "session_id", "?"),
            until.isoformat(),
            now.isoformat(),
            CLOCK_AHEAD_PAUSE_SECONDS,
        )
        return True

    async def _drain_session(
        self, receiver: SessionReceiver, handler: RequestHandler, stop: asyncio.Event, wait: float
    ) -> None:
        """Handle the session's requests in order until it is idle, a failure, or stop."""
        while not stop.is_set():
            batch = await receiver.receive_messages(max_message_count=BATCH_SIZE, max_wait_time=wait)
            if not batch:
                return
            for index, message in enumerate(batch):
                if stop.is_set():
                    await _abandon_all(receiver, batch[index:])
                    return
                if not await self._process(receiver, handler, message):
                    await _abandon_all(receiver, batch[index + 1 :])
                    return

    async def _process(self, receiver: SessionReceiver, handler: RequestHandler, message: Any) -> bool:
        """Handle one request; False when it failed and was abandoned (the batch must stop to keep order)."""
        self.stats["received"] += 1
        task = asyncio.current_task()
        if task is not None:
            self._busy.add(task)
        try:
            self.stats[(await handler.handle(receiver, message)).value] += 1
            return True
        except SessionLockLostError:
            raise
        except Exception:  # abandon and let the broker redeliver (MaxDeliveryCount bounds it)
            self.stats["abandoned"] += 1
            log.exception("request %s failed; abandoning", getattr(message, "message_id", "?"))
            await _abandon_all(receiver, [message])
            return False
        finally:
            if task is not None:
                self._busy.discard(task)

    async def _keep_session_locked(self, receiver: SessionReceiver) -> None:
        """Renew the session lock while the slot holds the session: at half its remaining time, so a renewal is
        never later than the expiry (`orderflow.session_locks.renew_delay`). With the 5 s LockDuration of
        `agent-requests` that is every 2.5 s. A failed renewal is retried while the lock is still valid; once the
        lock is lost (SessionLockLostError, or its expiry passed) renewing stops, and the slot's next receive or
        settlement raises SessionLockLostError, which ends the session (the request is redelivered; its
        idempotency key absorbs the repeat)."""
        session = receiver.session
        await keep_lock_renewed(
            session.renew_lock,
            lambda: getattr(session, "locked_until_utc", None),
            self._clock,
            lost=(SessionLockLostError,),
            transient=(Exception,),
            log=log,
            what=f"session {getattr(session, 'session_id', '?')}",
        )


async def _abandon_all(receiver: SessionReceiver, messages: Sequence[Any]) -> None:
    for message in messages:
        with contextlib.suppress(Exception):  # a lost lock releases the message anyway
            await receiver.abandon_message(message)


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def _finish(tasks: list[asyncio.Task[None]], grace: float) -> None:
    _, pending = await asyncio.wait(tasks, timeout=grace) if tasks else (set(), set())
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def open_breaker_store(env: Mapping[str, str]) -> DocumentStore | None:
    """The breaker documents, or None when the breaker is off (`CircuitBreakerFailureThreshold` 0). Raises
    ValueError on invalid breaker settings, or when it is on and `CosmosDb__accountEndpoint` is not set."""
    config = BreakerConfig.from_env(env)
    if not config.enabled:
        log.info("circuit breaker off (CircuitBreakerFailureThreshold=0)")
        return None
    try:
        return open_breaker_documents(env)
    except KeyError as exc:
        raise ValueError(
            "the circuit breaker needs the store every Agent instance shares: set CosmosDb__accountEndpoint "
            "(embedded://PATH locally), or CircuitBreakerFailureThreshold=0 to run without a breaker"
        ) from exc


def breaker_factory(documents: DocumentStore, clock: Clock, env: Mapping[str, str]) -> BreakerFactory:
    """The configured `SharedBreaker` over `documents`, alerting through the `on_transition` it is given."""

    def make(on_transition: OnTransition) -> CallGate:
        breaker = shared_breaker(documents, clock, env, on_transition)
        log.info("circuit breaker of %s: %s", breaker.service, breaker.config)
        return breaker

    return make


async def serve(
    client: AgentBus,
    config: AgentConfig,
    stop: asyncio.Event,
    clock: Clock | None = None,
    env: Mapping[str, str] | None = None,
) -> Counter[str]:
    """Run the Agent with an aiohttp connection to `config.remote_url` and the shared circuit breaker (app settings
    from `env`, default the environment) until `stop`; returns the stats."""
    source = os.environ if env is None else env
    wall = clock or SystemClock()
    documents = open_breaker_store(source)
    try:
        factory = None if documents is None else breaker_factory(documents, wall, source)
        connector = aiohttp.TCPConnector(limit=2 * config.max_concurrent_sessions)
        async with aiohttp.ClientSession(connector=connector) as http:
            worker = AgentWorker(client, HttpRemoteCaller(http, config.remote_url), config, wall, factory)
            await worker.run(stop)
            return worker.stats
    finally:
        if documents is not None:
            await documents.aclose()
