"""The durable engine: answers the client operations (start, raise, status, query, terminate, purge, waits) on
the dispatching of `_dispatch.Dispatcher` (episodes, activities, timers, the task hub).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from azure.durable_functions.models.history import HistoryEventType as T
from azure.durable_functions.models.utils.df_serialization import df_dumps

from . import history as h
from ._dispatch import MAX_CONFLICTS, Dispatcher
from .binding import event_token_to_serialized, token_to_serialized
from .episode import TERMINAL, new_row
from .errors import (
    InstanceAlreadyExists,
    InstanceGone,
    InstanceNotFound,
    InstanceNotTerminal,
    OrchestratorNotFound,
)
from .ids import new_instance_id, validate_instance_id
from .records import Commit, Conflict, InstanceRow, Message
from .status import status_payload


class DurableEngine(Dispatcher):
    """Durable Functions backend of devhost for one task hub in one SQLite file."""

    # ---- client operations ---------------------------------------------------------------------------------
    async def start_new(
        self, name: str, instance_id: str | None = None, client_input: Any = None, version: str | None = None
    ) -> str:
        """Start an orchestration as DurableOrchestrationClient.start_new does; returns the instance id."""
        token = json.dumps(df_dumps(client_input)) if client_input is not None else None
        return await self.start_with_token(name, instance_id, token, version=version)

    async def start_with_token(
        self, name: str, instance_id: str | None, input_token: str | None, *, version: str | None = None
    ) -> str:
        """Start with the input given as posted JSON text (the HTTP API's request body).

        `version` is the start request's `version` query parameter (what start_new(version=...) sends): the
        instance's version, "" included; None takes host.json defaultVersion (see versioning.py).

        An id whose instance is Pending, Running, ContinuedAsNew or Suspended is refused with
        InstanceAlreadyExists("An Orchestration instance with the status <status> already exists."), as
        DurableClient.StartNewAsync does: it passes OverridableExistingInstanceStates.NonRunningStates (the default)
        as dedupe statuses, and AzureStorageOrchestrationService.CreateTaskOrchestrationAsync throws
        OrchestrationAlreadyExistsException with that message. A Completed, Failed, Terminated or Canceled id is
        reused with a fresh history. The HTTP API answers this with 500 (`DurableHttpApi.start`).
        """
        if name not in self._orchestrators:
            raise OrchestratorNotFound(
                f"The function '{name}' doesn't exist, is disabled, or is not an "
                f"orchestrator function. Additional info: devhost knows "
                f"{sorted(self._orchestrators)}."
            )
        instance_id = new_instance_id() if instance_id is None else validate_instance_id(instance_id)
        serialized = token_to_serialized(input_token)
        async with self._lock(instance_id):
            now = self._clock()
            row = new_row(instance_id, name, serialized, now)
            row.input = input_token or None
            instance_version = self.versioning.version_for_new_instance(version)
            self.store.create(
                row, h.execution_started(now, name, serialized, version=instance_version), refuse=_refuse_running
            )
        self._mark(instance_id)
        await self._notify()
        return instance_id

    async def raise_event(self, instance_id: str, event_name: str, data: Any = None) -> None:
        """Deliver an external event as `DurableOrchestrationClient.raise_event` does: `data` is posted as
        `json.dumps(data)`, so the orchestrator receives that JSON text as a `str` (SDK #295). Buffered by the SDK when
        raised before the orchestrator waits for it."""
        await self.raise_event_token(instance_id, event_name, json.dumps(df_dumps(data)))

    async def raise_event_token(self, instance_id: str, event_name: str, data_token: str | None) -> None:
        # Under the instance lock, as terminate: an episode that is committing a ContinueAsNew would otherwise give
        # the instance a new execution id after we read the old one, and the event would be dropped as belonging to
        # an older execution. The extension sends external events to the instance, not to an execution
        # (DurableClient.RaiseEventInternalAsync clears the execution id).
        async with self._lock(instance_id):
            event = h.event_raised(self._clock(), event_name, event_token_to_serialized(data_token))
            self.store.send_to_current(instance_id, _accepts_event(instance_id), event)
        self._mark(instance_id)

    async def get_status(
        self,
        instance_id: str,
        *,
        show_history: bool = False,
        show_history_output: bool = False,
        show_input: bool = True,
    ) -> dict[str, Any] | None:
        row = self.store.instance(instance_id)
        if row is None:
            return None
        events = self.store.history(instance_id) if show_history else None
        return status_payload(row, show_input=show_input, history=events, show_history_output=show_history_output)

    async def query(
        self,
        *,
        runtime_status: Iterable[str] | None = None,
        created_from: datetime | None = None,
        created_to: datetime | None = None,
        instance_id_prefix: str | None = None,
        top: int | None = None,
        continuation: str | None = None,
        show_input: bool = False,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Instances matching every given filter, oldest first; pages of `top` with an opaque continuation."""
        rows = [
            r
            for r in self.store.instances()
            if _matches(r, runtime_status, created_from, created_to, instance_id_prefix)
        ]
        offset = int(base64.urlsafe_b64decode(continuation.encode()).decode()) if continuation else 0
        end = len(rows) if not top or top <= 0 else offset + top
        page = rows[offset:end]
        next_token = base64.urlsafe_b64encode(str(end).encode()).decode() if end < len(rows) else None
        return [status_payload(r, show_input=show_input) for r in page], next_token

    async def terminate(self, instance_id: str, reason: str | None = None) -> None:
        async with self._lock(instance_id):
            for tries in itertools.count(1):
                row = self._existing(instance_id)
                if row.status in TERMINAL:
                    raise InstanceGone(f"Instance with ID {instance_id} is already {row.status}.")
                termination = self._termination(row, reason)
                try:
                    self.store.commit(termination)
                    break
                except Conflict:  # another host's episode of the instance committed first: terminate what it left
                    if tries >= MAX_CONFLICTS:
                        raise
        self._after_commit(termination, [], [])  # a parent told of its child's end; waits on every host woken
        await self._notify()

    async def purge(self, instance_id: str) -> int:
        async with self._lock(instance_id):
            row = self._existing(instance_id)
            if row.status not in TERMINAL:
                raise InstanceNotTerminal(
                    f"Only orchestrations in a terminal state can be purged, but the "
                    f"orchestration with instance ID {instance_id} has status {row.status}"
                )
            return self.store.purge(instance_id)

    async def purge_by(
        self,
        *,
        created_from: datetime,
        created_to: datetime | None = None,
        runtime_status: Iterable[str] | None = None,
    ) -> int:
        rows = [
            r
            for r in self.store.instances()
            if r.status in TERMINAL and _matches(r, runtime_status, created_from, created_to, None)
        ]
        return sum([await self.purge(r.instance_id) for r in rows])

    async def wait_for_status(self, instance_id: str, statuses: Iterable[str], timeout: float) -> dict[str, Any]:
        """Wait (event-driven, bounded) until the instance reaches one of `statuses`; returns its status."""
        wanted = set(statuses)

        def reached() -> bool:
            row = self.store.instance(instance_id)
            return row is not None and row.status in wanted

        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(reached), timeout)
        status = await self.get_status(instance_id)
        assert status is not None
        return status

    async def wait_for_history(
        self, instance_id: str, predicate: Callable[[list[h.Event]], bool], timeout: float
    ) -> list[h.Event]:
        """Wait (event-driven, bounded) until the instance's history satisfies `predicate`."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: predicate(self.store.history(instance_id))), timeout)
        return self.store.history(instance_id)

    def _termination(self, row: InstanceRow, reason: str | None) -> Commit:
        now = self._clock()
        ended = replace(row, status="Terminated", output=json.dumps(reason), last_updated_time=h.format_time(now))
        pending = self.store.pending(row.instance_id, row.execution_id)
        commit = Commit(
            row=ended,
            base=row,
            consumed=[i for i, _ in pending.messages] + pending.stale,
            drop_pending=True,
            ends=True,
            append=[h.event(T.EXECUTION_TERMINATED, now, Input=reason)],
        )
        if row.parent_instance_id and row.parent_execution_id:
            text = f"Orchestration '{row.instance_id}' was terminated: {reason}"
            failed = h.sub_orchestration_failed(now, int(row.parent_task_id or 0), text, json.dumps({"Message": text}))
            commit.messages.append(Message(row.parent_instance_id, row.parent_execution_id, failed))
        return commit

    def _existing(self, instance_id: str) -> InstanceRow:
        return _found(instance_id, self.store.instance(instance_id))


def _refuse_running(status: str) -> None:
    """StartNewAsync's dedupe: an id whose instance is not in a terminal status is refused (see start_with_token)."""
    if status not in TERMINAL:
        raise InstanceAlreadyExists(f"An Orchestration instance with the status {status} already exists.")


def _found(instance_id: str, row: InstanceRow | None) -> InstanceRow:
    if row is None:
        raise InstanceNotFound(f"No instance with ID {instance_id} found.")
    return row


def _accepts_event(instance_id: str) -> Callable[[InstanceRow | None], None]:
    def check(row: InstanceRow | None) -> None:
        status = _found(instance_id, row).status
        if status in TERMINAL:
            raise InstanceGone(f"Instance with ID {instance_id} is gone: it is {status}.")

    return check


def _matches(
    row: InstanceRow,
    statuses: Iterable[str] | None,
    created_from: datetime | None,
    created_to: datetime | None,
    prefix: str | None,
) -> bool:
    wanted = {s.lower() for s in statuses} if statuses else None
    created = h.parse_time(row.created_time)
    return (
        (wanted is None or row.status.lower() in wanted)
        and (created_from is None or created >= _aware(created_from))
        and (created_to is None or created <= _aware(created_to))
        and (prefix is None or row.instance_id.startswith(prefix))
    )


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
