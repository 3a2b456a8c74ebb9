"""A waiting link in proton's reactor: the broker's cross-process wake-ups (the notify protocol, stepped by
`ReceiverCore.look`) with the waiter's socket watched by the reactor and its due moments as reactor timers, so a
waiting link costs no thread and no polling. Why and how: docs/modules-product.md."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from proton import Event, Handler
from proton.reactor import Container

if TYPE_CHECKING:
    from proton._reactor import Task  # the type of Container.schedule's result (not re-exported)

from orderflow.embedded._core import ReceiverCore

T = TypeVar("T")
FOREVER = 3600.0  # a link with credit waits in rounds of an hour (each round a fresh wait session)
_FALLBACK_RECHECK = 0.25  # without AF_UNIX the notify module re-checks at this period; so do we
_LOG = logging.getLogger("orderflow.embedded.amqp")


def guarded(function: Callable[[], None]) -> None:
    """Run a reactor callback; an exception is logged, never let out (it would stop the reactor, every client)."""
    try:
        function()
    except Exception:  # noqa: BLE001
        _LOG.exception("AMQP endpoint callback failed")


class Later(Handler):
    """A reactor timer that calls a function (`Container.schedule(delay, Later(function))`), guarded."""

    def __init__(self, function: Callable[[], None]) -> None:
        super().__init__()
        self._function = function

    def on_timer_task(self, event: object) -> None:
        guarded(self._function)


def waiter_socket(core: ReceiverCore) -> socket.socket | None:
    """The datagram socket a sender pokes (None without AF_UNIX). notify.Waiter keeps it private; the reactor
    must select on it rather than block a thread in `Waiter.wait`."""
    sock = getattr(core.waiter, "_sock", None)
    return sock if isinstance(sock, socket.socket) else None


class Wait(Handler, Generic[T]):
    """One wait: look (`attempt`) until it returns something, `seconds` pass, or `cancel`; then `done(result)`.
    Every look runs on the reactor thread; between looks the reactor watches the waiter's socket and a timer."""

    def __init__(
        self,
        container: Container,
        core: ReceiverCore,
        attempt: Callable[[], T | None],
        done: Callable[[T | None], None],
        seconds: float = FOREVER,
        *,
        register_first: bool = False,
    ) -> None:
        super().__init__()
        self._container, self._core, self._attempt, self._done = container, core, attempt, done
        self._deadline = time.monotonic() + seconds
        self._register_first = register_first
        self._epoch = -1
        self._timer: Task | None = None
        self._selectable: Any = None
        self.active = False

    def start(self) -> None:
        self._epoch = self._core.begin_wait()
        self.active = True
        self._step()

    def _step(self) -> None:
        if not self.active:
            return
        self._cancel_timer()
        try:
            result, sleep = self._core.look(
                self._attempt, self._deadline, self._epoch, register_first=self._register_first
            )
        except BaseException:
            self.cancel()
            raise
        self._register_first = False
        if not self.active:  # cancelled from inside the look (the attempt ended the link)
            return
        if sleep is None:
            self._finish()
            self._done(result)
            return
        self._watch(True)
        if waiter_socket(self._core) is None:
            sleep = min(sleep, _FALLBACK_RECHECK)
        self._timer = self._container.schedule(max(sleep, 0.0), self)

    def refresh(self) -> None:
        """Look again now (the client renewed its credit): what became due is taken, the timer recomputed."""
        self._step()

    def cancel(self) -> None:
        """Stop waiting (credit withdrawn, link closed); a claim that reached this wait is passed on."""
        if self.active:
            self._finish()
            self._core.end_wait(self._epoch)

    def _finish(self) -> None:
        self.active = False
        self._cancel_timer()
        self._watch(False)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _watch(self, reading: bool) -> None:
        sock = waiter_socket(self._core)
        if sock is None:
            return
        if reading and self._selectable is None:
            self._selectable = self._container.selectable(handler=self, delegate=sock)  # type: ignore[arg-type]
            self._selectable._transport = None  # proton's IO handler sees every selectable: "not a transport"
        if self._selectable is None:
            return
        if reading:
            self._selectable.reading = True
            self._selectable.update()
        else:  # done with the socket: leave it to the waiter (release: the reactor must not close it)
            self._selectable.reading = False
            self._selectable.release()
            self._selectable.terminate()
            self._selectable.update()
            self._selectable = None

    # proton events ----------------------------------------------------------------------------------------

    def on_selectable_readable(self, event: Event) -> None:
        guarded(self._step)  # `look` drains the pokes

    def on_timer_task(self, event: Event) -> None:
        self._timer = None
        guarded(self._step)
