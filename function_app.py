"""The orderflow Functions app: one DFApp composed of the blueprints (Scheduler Agent Supervisor order pipeline)."""

import azure.durable_functions as df
import azure.functions as func

from activities import frozen_versions as frozen_activities
from activities import state as state_activities
from orchestrators import order_workflow
from orderflow import telemetry
from triggers import agent_replies, alarms, ops_api, retention, starter, submission, supervisor

telemetry.configure_from_env()  # Application Insights via OpenTelemetry when its connection string is set
app = df.DFApp(http_auth_level=func.AuthLevel.FUNCTION)

for blueprint in (
    submission.bp,
    starter.bp,
    agent_replies.bp,
    supervisor.bp,
    retention.bp,
    order_workflow.bp,
    state_activities.bp,
    frozen_activities.bp,
    ops_api.bp,
    alarms.bp,
):
    app.register_functions(blueprint)
