"""Purge trigger: the timer that deletes the Durable instances of finished attempts past InstanceRetentionSeconds."""

from __future__ import annotations

import azure.durable_functions as df
import azure.functions as func

from orderflow import function_names as fn
from orderflow.retention import durable_purge, run_purge
from orderflow.runtime import get_services

bp = df.Blueprint()


@bp.function_name(fn.PURGE)
@bp.timer_trigger(arg_name="timer", schedule="%PurgeSchedule%", run_on_startup=False, use_monitor=False)
@bp.durable_client_input(client_name="client")
async def purge(timer: func.TimerRequest, client: df.DurableOrchestrationClient) -> None:
    await run_purge(await get_services(), durable_purge(client))
