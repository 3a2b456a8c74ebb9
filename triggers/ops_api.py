"""Operator HTTP API: httpTriggers under /api (auth level function, and a signed-in operator: orderflow/ops_http.py
`authorize`) over orderflow.operations, documented by GET /api/openapi.json. The mapping lives in
orderflow/ops_http.py, the document in orderflow/openapi.py."""

from __future__ import annotations

import json
import os

import azure.durable_functions as df
import azure.functions as func

from orderflow import function_names as fn
from orderflow import openapi, ops_http
from orderflow.runtime import get_services

bp = df.Blueprint()
FUNCTION = func.AuthLevel.FUNCTION
JSON = "application/json"


def _response(reply: ops_http.Reply) -> func.HttpResponse:
    return func.HttpResponse(reply.text(), status_code=reply.status, mimetype=JSON)


@bp.function_name(fn.OPS_ORDER)
@bp.route(route=openapi.ROUTE_ORDER, methods=[func.HttpMethod.GET], auth_level=FUNCTION)
@bp.durable_client_input(client_name="client")
async def ops_order(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    handler = ops_http.order(req.route_params["id"])
    return _response(await ops_http.serve(handler, req.headers, os.environ, client.get_status))


@bp.function_name(fn.OPS_ORDERS)
@bp.route(route=openapi.ROUTE_ORDERS, methods=[func.HttpMethod.GET], auth_level=FUNCTION)
async def ops_orders(req: func.HttpRequest) -> func.HttpResponse:
    return _response(await ops_http.serve(ops_http.orders(req.params), req.headers, os.environ))


@bp.function_name(fn.OPS_RESUBMIT)
@bp.route(route=openapi.ROUTE_RESUBMIT, methods=[func.HttpMethod.POST], auth_level=FUNCTION)
async def ops_resubmit(req: func.HttpRequest) -> func.HttpResponse:
    handler = ops_http.resubmit(req.route_params["id"], req.get_body())
    return _response(await ops_http.serve(handler, req.headers, os.environ))


@bp.function_name(fn.OPS_CANCEL)
@bp.route(route=openapi.ROUTE_CANCEL, methods=[func.HttpMethod.POST], auth_level=FUNCTION)
@bp.durable_client_input(client_name="client")
async def ops_cancel(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    handler = ops_http.cancel(req.route_params["id"], req.get_body(), client.raise_event)
    return _response(await ops_http.serve(handler, req.headers, os.environ, ok=202))


@bp.function_name(fn.OPS_SUMMARY)
@bp.route(route=openapi.ROUTE_SUMMARY, methods=[func.HttpMethod.GET], auth_level=FUNCTION)
async def ops_summary(req: func.HttpRequest) -> func.HttpResponse:
    return _response(await ops_http.serve(ops_http.summary(), req.headers, os.environ))


@bp.function_name(fn.OPS_OPENAPI)
@bp.route(route=openapi.ROUTE_OPENAPI, methods=[func.HttpMethod.GET], auth_level=FUNCTION)
async def ops_openapi(req: func.HttpRequest) -> func.HttpResponse:
    refused = ops_http.refusal(req.headers, os.environ)
    if refused is not None:
        return _response(refused)
    apps = (await get_services()).tunables.apps.names
    return func.HttpResponse(json.dumps(openapi.document(apps)), mimetype=JSON)
