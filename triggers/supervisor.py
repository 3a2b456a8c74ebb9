"""Supervisor trigger: the timer that recovers or escalates Processing records whose CompleteBy expired."""

from __future__ import annotations

import azure.durable_functions as df
import azure.functions as func

from orderflow import function_names as fn
from orderflow.runtime import get_services
from orderflow.starter import DurableStarts
from orderflow.supervisor import run_supervisor

bp = df.Blueprint()


@bp.function_name(fn.SUPERVISOR)
@bp.timer_trigger(arg_name="timer", schedule="%SupervisorSchedule%", run_on_startup=False, use_monitor=False)
@bp.durable_client_input(client_name="client")
async def supervisor(timer: func.TimerRequest, client: df.DurableOrchestrationClient) -> None:
    await run_supervisor(await get_services(), DurableStarts(client.start_new, client.get_status))
