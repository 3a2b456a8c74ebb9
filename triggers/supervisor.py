"""Supervisor trigger: the timer that recovers or escalates Processing records whose CompleteBy expired."""

from __future__ import annotations

import azure.durable_functions as df
import azure.functions as func

from orderflow import function_names as fn
from orderflow.runtime import get_services
from orderflow.supervisor import run_supervisor

bp = df.Blueprint()


@bp.function_name(fn.SUPERVISOR)
@bp.timer_trigger(arg_name="timer", schedule="%SupervisorSchedule%", run_on_startup=False, use_monitor=False)
async def supervisor(timer: func.TimerRequest) -> None:
    await run_supervisor(await get_services())
