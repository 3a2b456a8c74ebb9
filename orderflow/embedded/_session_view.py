"""What the embedded client's sync and aio `receiver.session` share (client.py, client_aio.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any


class SessionView:
    """What the sync and aio `receiver.session` share: the session's id, its lock's expiry and the renewer's error,
    read from the receiver's core (`self._receiver._core`)."""

    _receiver: Any

    @property
    def session_id(self) -> str | None:
        return self._receiver._core.session_id  # type: ignore[no-any-return]

    @property
    def locked_until_utc(self) -> datetime | None:
        lock = self._receiver._core.lock
        return None if lock is None else lock.locked_until

    @property
    def auto_renew_error(self) -> Exception | None:
        return self._receiver._core.auto_renew_error  # type: ignore[no-any-return]

    @auto_renew_error.setter
    def auto_renew_error(self, error: Exception | None) -> None:
        self._receiver._core.auto_renew_error = error
