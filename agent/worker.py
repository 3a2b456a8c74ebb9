"""The Agent's receive loop: sessions of `agent-requests`, several at once, FIFO within each, graceful stop.

`AgentWorker` runs `max_concurrent_sessions` slots. Each slot accepts the next available session
(`NEXT_AVAILABLE_SESSION`, i.e. one order), handles its requests one by one in order (`agent.handler`), and
releases the session when it has been idle for `receive_wait_ms`, so one order never starves the others
(seed 002, Sequential Convoy: FIFO per session, parallel across sessions). The session lock is renewed while
a slot holds it: for a session queue the message lock *is* the session lock (Service Bus docs, "Message
sessions": "the lock on the session is held ... messages in a session are locked by the session lock").
`agent-requests` has a 5 s LockDuration so that an Agent killed while it holds an order's session blocks that
order for at most 5 s (`orderflow/session_locks.py`); the live Agent renews every 2.5 s.

Written against the azure-servicebus aio API only (the client comes by injection), so the same code runs on
Azure Service Bus and on the embedded broker. A bus failure while handling a request abandons it and the
rest of its batch, so order is kept and the request is redelivered (MaxDeliveryCount ends a hopeless one).

Shutdown (SIGTERM/SIGINT set `stop`): slots take no new session or message; a request in flight gets
`shutdown_grace_ms` to finish, the rest of a batch is abandoned; past the grace, in-flight work is cancelled
unsettled and redelivered later — safe, because every step is idempotent by its key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
from azure.servicebus import NEXT_AVAILABLE_SESSION
from azure.servicebus.exceptions import OperationTimeoutError, SessionLockLostError

from agent.config import AgentConfig
from agent.handler import Outbox, RequestHandler
from agent.remote import HttpRemoteCaller, RemoteCaller
from orderflow.clock import SystemClock
from orderflow.clock import WaitingClock as Clock
from orderflow.session_locks import keep_lock_renewed

SESSION_ACCEPT_WAIT_SECONDS = 10.0
log = logging.getLogger("agent")

BATCH_SIZE = 10
ERROR_PAUSE_SECONDS = 1.0


class AgentWorker:
    def __init__(
        self, client: Any, caller: RemoteCaller, config: AgentConfig, clock: Clock | None = None
    ) -> None:
        self._client = client
        self._caller = caller
        self._config = config
        self._clock = clock or SystemClock()
        self.stats: Counter[str] = Counter()
        self._busy: set[asyncio.Task[Any]] = set()  # slots handling a request right now

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set, then finish in-flight requests within the grace period."""
        cfg = self._config
        async with AsyncExitStack() as stack:
            replies = await stack.enter_async_context(self._client.get_queue_sender(cfg.replies_queue))
            alerts = await stack.enter_async_context(self._client.get_queue_sender(cfg.alerts_queue))
            outbox = Outbox(replies, alerts, cfg.replies_queue, cfg.requests_queue)
            handler = RequestHandler(self._caller, outbox, cfg.retry_policy(), self._clock)
            slots = [
                asyncio.create_task(self._slot(handler, stop), name=f"agent-slot-{i}")
                for i in range(cfg.max_concurrent_sessions)
            ]
            log.info("agent serving %s with %d session slot(s)", cfg.requests_queue, len(slots))
            await stop.wait()
            for slot in slots:  # idle slots (waiting for a session or a message) stop at once
                if slot not in self._busy:
                    slot.cancel()
            await _finish(slots, cfg.shutdown_grace_ms / 1000)
        log.info("agent stopped: %s", dict(self.stats))

    async def _slot(self, handler: RequestHandler, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._serve_next_session(handler, stop)
            except OperationTimeoutError:
                continue  # no session became available within the wait: ask again
            except Exception:  # noqa: BLE001 - a slot must outlive any one failure
                self.stats["errors"] += 1
                log.exception("agent slot error; pausing")
                await _wait(stop, ERROR_PAUSE_SECONDS)

    async def _serve_next_session(self, handler: RequestHandler, stop: asyncio.Event) -> None:
        wait = self._config.receive_wait_ms / 1000
        # Waiting for a session is woken by the broker when one gets messages, so this wait is long: an idle Agent
        # does not poll. Once a session is held, `receive_wait_ms` bounds how long it is kept while idle.
        receiver = self._client.get_queue_receiver(
            self._config.requests_queue, session_id=NEXT_AVAILABLE_SESSION,
            max_wait_time=max(wait, SESSION_ACCEPT_WAIT_SECONDS)
        )
        async with receiver:
            renewer = asyncio.create_task(self._keep_session_locked(receiver))
            try:
                await self._drain_session(receiver, handler, stop, wait)
            finally:
                renewer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await renewer

    async def _drain_session(
        self, receiver: Any, handler: RequestHandler, stop: asyncio.Event, wait: float
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

    async def _process(self, receiver: Any, handler: RequestHandler, message: Any) -> bool:
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
        except Exception:  # noqa: BLE001 - abandon and let the broker redeliver (MaxDeliveryCount bounds it)
            self.stats["abandoned"] += 1
            log.exception("request %s failed; abandoning", getattr(message, "message_id", "?"))
            await _abandon_all(receiver, [message])
            return False
        finally:
            if task is not None:
                self._busy.discard(task)

    async def _keep_session_locked(self, receiver: Any) -> None:
        """Renew the session lock while the slot holds the session: at half its remaining time, so a renewal is
        never later than the expiry (`orderflow.session_locks.renew_delay`). With the 5 s LockDuration of
        `agent-requests` that is every 2.5 s. A failed renewal is retried while the lock is still valid; once the
        lock is lost (SessionLockLostError, or its expiry passed) renewing stops, and the slot's next receive or
        settlement raises SessionLockLostError, which ends the session (the request is redelivered; its
        idempotency key absorbs the repeat)."""
        session = receiver.session
        await keep_lock_renewed(session.renew_lock, lambda: getattr(session, "locked_until_utc", None), self._clock,
                                lost=(SessionLockLostError,), transient=(Exception,), log=log,
                                what=f"session {getattr(session, 'session_id', '?')}")


async def _abandon_all(receiver: Any, messages: Sequence[Any]) -> None:
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


async def serve(
    client: Any, config: AgentConfig, stop: asyncio.Event, clock: Clock | None = None
) -> Counter[str]:
    """Run the Agent with an aiohttp connection to `config.remote_url` until `stop`; returns the stats."""
    connector = aiohttp.TCPConnector(limit=2 * config.max_concurrent_sessions)
    async with aiohttp.ClientSession(connector=connector) as http:
        worker = AgentWorker(client, HttpRemoteCaller(http, config.remote_url), config, clock)
        await worker.run(stop)
        return worker.stats
