"""Starter trigger: the timer poll that claims due Pending records and starts their Scheduler (the safety net)."""

from __future__ import annotations

import logging

import azure.durable_functions as df
import azure.functions as func

from orderflow import function_names as fn
from orderflow.runtime import get_services
from orderflow.starter import run_starter

bp = df.Blueprint()
log = logging.getLogger("orderflow.starter")


@bp.function_name(fn.STARTER_TIMER)
@bp.timer_trigger(arg_name="timer", schedule="%StarterSchedule%", run_on_startup=False, use_monitor=False)
@bp.durable_client_input(client_name="client")
async def starter_timer(timer: func.TimerRequest, client: df.DurableOrchestrationClient) -> None:
    services = await get_services()
    result = await run_starter(services, client.start_new)
    if result.claimed or result.start_failed or result.already_running:
        log.info(
            "starter: started %d, lost %d races, %d start failures, %d already running",
            len(result.claimed),
            result.lost_race,
            len(result.start_failed),
            len(result.already_running),
        )
