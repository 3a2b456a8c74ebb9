"""Drive an `aio` client through its sync twin's surface, so one scenario body runs on both: every call of the
wrapped client (and of the senders, receivers and sessions it hands out) runs on an event loop in its own thread,
awaited there; `with` maps to `async with`. The aio code paths (the SDK's async transport) are the ones exercised."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from typing import Any

_WRAPPED_MODULES = ("azure.servicebus.aio", "orderflow.embedded.client_aio")
CALL_TIMEOUT = 120.0  # seconds any one call may take (each scenario bounds its own waits far below this)


class LoopThread:
    """An event loop running in a daemon thread until `close`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="aio-bridge", daemon=True)
        self._thread.start()

    def call(self, function: Callable[[], Any]) -> Any:
        """Call `function` on the loop's thread; await what it returns if that is awaitable."""

        async def run() -> Any:
            result = function()
            if inspect.isawaitable(result):
                result = await result
            return result

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(CALL_TIMEOUT)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def _needs_wrapping(value: Any) -> bool:
    module = type(value).__module__ or ""
    return any(module == m or module.startswith(m + ".") for m in _WRAPPED_MODULES)


class Synced:
    """A sync view of one aio object."""

    def __init__(self, target: Any, loop: LoopThread) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_loop", loop)

    def _wrap(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self._wrap(item) for item in value]
        return Synced(value, self._loop) if _needs_wrapping(value) else value

    def __getattr__(self, name: str) -> Any:
        value = self._loop.call(lambda: getattr(self._target, name))
        if callable(value) and not isinstance(value, type):
            return lambda *args, **kwargs: self._wrap(self._loop.call(lambda: value(*args, **kwargs)))
        return self._wrap(value)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)

    def __enter__(self) -> Synced:
        self._loop.call(self._target.__aenter__)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._loop.call(lambda: self._target.__aexit__(*exc))
