"""A waiting receive or session accept is ONE Service Bus call, however long it waits and whatever it found: on Azure
the server holds the receive's link credit (or the session accept) until a message or session comes or the wait ends
(azure-servicebus `_servicebus_receiver.py` `_receive`: one flow with max_wait_time; `_open_with_retry` for
NEXT_AVAILABLE_SESSION). The embedded client looks again after each wake-up (client.py `_wait_for`), so the counters of
azure_cost (`_azure_cost_meter.py`) and compare (`compare_shim/`) count the wait once (`waiting_wrapper`) and, while
`IN_WAIT` is set, do not count the broker's looks inside it as calls."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any

WAITED = ("take", "accept_session")  # the broker methods a wait calls on each look
IN_WAIT: contextvars.ContextVar[bool] = contextvars.ContextVar("in_wait", default=False)


def waiting_wrapper(original: Any, count: Callable[[str, str, bool], None]) -> Any:
    """`ServiceBusReceiver._wait_for` (sync or aio) that sets IN_WAIT while it waits (asyncio.to_thread carries it to
    the looks' worker threads) and, when it returns, calls `count(queue, name, found)` once: name `accept_session` for
    a session accept, `take` for a receive."""

    def counted(receiver: Any, attempt: Any, result: Any) -> None:
        core = receiver._core
        name = "accept_session" if getattr(attempt, "__func__", None) is type(core).try_open else "take"
        count(core.queue, name, bool(result))

    if asyncio.iscoroutinefunction(original):

        async def wait_async(self: Any, attempt: Any, *args: Any, **kwargs: Any) -> Any:
            token = IN_WAIT.set(True)
            try:
                result = await original(self, attempt, *args, **kwargs)
            finally:
                IN_WAIT.reset(token)
            counted(self, attempt, result)
            return result

        return wait_async

    def wait(self: Any, attempt: Any, *args: Any, **kwargs: Any) -> Any:
        token = IN_WAIT.set(True)
        try:
            result = original(self, attempt, *args, **kwargs)
        finally:
            IN_WAIT.reset(token)
        counted(self, attempt, result)
        return result

    return wait
