"""Alarm trigger: the timer that evaluates the alarms (orderflow/alarms.py), sets their metrics and raises the alert
event of each alarm that starts firing."""

from __future__ import annotations

import azure.durable_functions as df
import azure.functions as func

from orderflow import function_names as fn
from orderflow.operations import Operations, app_listens
from orderflow.runtime import get_services

bp = df.Blueprint()


# A missed tick is not run late (use_monitor off): the next one, a minute away by default, reads the same figures.
@bp.function_name(fn.ALARMS)
@bp.timer_trigger(arg_name="timer", schedule="%AlarmSchedule%", run_on_startup=False, use_monitor=False)
async def alarms(timer: func.TimerRequest) -> None:
    await Operations(await get_services(), listens=app_listens).alarm_tick()
