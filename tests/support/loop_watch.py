"""For tests of code that runs on the event loop and may hand work to threads: `record_hand_offs` lists each call given
to `asyncio.to_thread`, and `LoopBeat` counts the loop's turns while something waits (a stalled loop counts none)."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

import pytest

BEAT_S = 0.01


def record_hand_offs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the functions handed to `asyncio.to_thread` from now on (a partial by its function's name)."""
    seen: list[str] = []
    real = asyncio.to_thread

    async def to_thread(func: Any, /, *args: Any, **kwargs: Any) -> Any:
        seen.append(getattr(getattr(func, "func", func), "__name__", repr(func)))
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", to_thread)
    return seen


class LoopBeat:
    """`async with LoopBeat() as beat:` a task that counts a tick every BEAT_S while the block runs."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def _beat(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(BEAT_S)

    async def __aenter__(self) -> LoopBeat:
        self._task = asyncio.create_task(self._beat())
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        assert self._task is not None
        self._task.cancel()
