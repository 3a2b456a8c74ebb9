"""Sample app for devhost's host-level tests (not the product): HTTP, timer, Service Bus (plain and SDK-type binding)
and a Durable orchestration, each recording what it did as JSON lines in $SAMPLE_OUT (append-only)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import timedelta

import azure.durable_functions as df
import azure.functions as func
import azurefunctions.extensions.bindings.servicebus as servicebus

app = df.DFApp(http_auth_level=func.AuthLevel.FUNCTION)


def record(kind: str, **data: object) -> None:
    line = json.dumps({"kind": kind, "pid": os.getpid(), "t": time.time(), **data}) + "\n"
    with open(os.environ["SAMPLE_OUT"], "a", encoding="utf-8") as out:
        out.write(line)


@app.route(route="orchestrators/{functionName}/{instanceId?}", methods=["POST"])
@app.durable_client_input(client_name="client")
async def http_start(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    instance_id = await client.start_new(
        req.route_params["functionName"], req.route_params.get("instanceId"), req.get_json() if req.get_body() else None
    )
    return client.create_check_status_response(req, instance_id)


@app.route(route="ping", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
def ping(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(json.dumps({"pong": req.params.get("x")}), mimetype="application/json")


@app.route(route="secret/{id:int}", methods=["GET"])
def secret(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(f"id={req.route_params['id']}")


@app.orchestration_trigger(context_name="context")
def slow_chain(context: df.DurableOrchestrationContext):  # type: ignore[no-untyped-def]
    """Three slow activities and a timer: long enough to be killed in the middle."""
    seconds = float(context.get_input() or 0.3)
    results = []
    for i in range(3):
        results.append(
            (yield context.call_activity("slow_step", {"i": i, "seconds": seconds, "instance": context.instance_id}))
        )
        if i == 1:
            yield context.create_timer(context.current_utc_datetime + timedelta(seconds=seconds))
    return results


@app.activity_trigger(input_name="request")
async def slow_step(request: dict) -> str:  # type: ignore[type-arg]
    await asyncio.sleep(request["seconds"])
    record("activity", instance=request["instance"], i=request["i"])
    return f"step{request['i']}"


@app.timer_trigger(schedule="%TickSchedule%", arg_name="timer", run_on_startup=False, use_monitor=True)
def tick(timer: func.TimerRequest) -> None:
    record("tick", past_due=timer.past_due)


@app.timer_trigger(schedule="0 0 0 1 1 *", arg_name="timer", run_on_startup=True, use_monitor=False)
def on_startup(timer: func.TimerRequest) -> None:
    """Due once a year: it runs at each host start only because of run_on_startup."""
    record("startup", past_due=timer.past_due)


@app.service_bus_queue_trigger(arg_name="msg", queue_name="%WorkQueue%", connection="ServiceBusConnection")
def work(msg: func.ServiceBusMessage) -> None:
    body = msg.get_body().decode()
    started = time.time()
    if body.startswith("fail"):
        raise RuntimeError("asked to fail")
    if body.startswith("slow"):
        time.sleep(0.2)
    record(
        "work",
        id=msg.message_id,
        start=started,
        delivery=msg.delivery_count,
        body=body,
        props=msg.application_properties,
        reply_to=msg.reply_to,
        correlation_id=msg.correlation_id,
    )


@app.service_bus_queue_trigger(
    arg_name="msg", queue_name="%SessionQueue%", connection="ServiceBusConnection", is_sessions_enabled=True
)
async def ordered(msg: func.ServiceBusMessage) -> None:
    started = time.time()
    await asyncio.sleep(0.05)
    record("session", session=msg.session_id, seq=int(msg.get_body().decode()), id=msg.message_id, start=started)


@app.service_bus_queue_trigger(
    arg_name="msg", queue_name="%SdkQueue%", connection="ServiceBusConnection", auto_complete_messages=False
)
async def settle_yourself(
    msg: servicebus.ServiceBusReceivedMessage, message_actions: servicebus.ServiceBusMessageActions
) -> None:
    body = b"".join(msg.body).decode()
    if body.startswith("poison"):
        await asyncio.to_thread(
            message_actions.deadletter,
            msg,
            deadletter_reason="InvalidField:body",
            deadletter_error_description="body says poison",
        )
    else:
        await asyncio.to_thread(message_actions.complete, msg)
    record("sdk", id=msg.message_id, body=body)
