"""Operator HTTP API: httpTriggers under /api (auth level function) over orderflow.operations, documented by
GET /api/openapi.json. The mapping lives in orderflow/ops_http.py, the document in orderflow/openapi.py."""

from __future__ import annotations

import json
import os

import azure.durable_functions as df
import azure.functions as func

from orderflow import function_names as fn
from orderflow import openapi, ops_http

bp = df.Blueprint()
FUNCTION = func.AuthLevel.FUNCTION
JSON = "application/json"


def _response(reply: ops_http.Reply) -> func.HttpResponse:
    return func.HttpResponse(reply.text(), status_code=reply.status, mimetype=JSON)


@bp.function_name(fn.OPS_ORDER)
@bp.route(route=openapi.ROUTE_ORDER, methods=[func.HttpMethod.GET], auth_level=FUNCTION)
@bp.durable_client_input(client_name="client")
async def ops_order(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    return _response(await ops_http.serve(ops_http.order(req.route_params["id"]), client.get_status))


@bp.function_name(fn.OPS_ORDERS)
@bp.route(route=openapi.ROUTE_ORDERS, methods=[func.HttpMethod.GET], auth_level=FUNCTION)
async def ops_orders(req: func.HttpRequest) -> func.HttpResponse:
    return _response(await ops_http.serve(ops_http.orders(req.params)))


@bp.function_name(fn.OPS_RESUBMIT)
@bp.route(route=openapi.ROUTE_RESUBMIT, methods=[func.HttpMethod.POST], auth_level=FUNCTION)
async def ops_resubmit(req: func.HttpRequest) -> func.HttpResponse:
    handler = ops_http.resubmit(req.route_params["id"], req.get_body(), req.headers, os.environ)
    return _response(await ops_http.serve(handler))


@bp.function_name(fn.OPS_CANCEL)
@bp.route(route=openapi.ROUTE_CANCEL, methods=[func.HttpMethod.POST], auth_level=FUNCTION)
@bp.durable_client_input(client_name="client")
async def ops_cancel(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    handler = ops_http.cancel(req.route_params["id"], req.get_body(), req.headers, os.environ, client.raise_event)
    return _response(await ops_http.serve(handler, ok=202))


@bp.function_name(fn.OPS_SUMMARY)
@bp.route(route=openapi.ROUTE_SUMMARY, methods=[func.HttpMethod.GET], auth_level=FUNCTION)
async def ops_summary(req: func.HttpRequest) -> func.HttpResponse:
    return _response(await ops_http.serve(ops_http.summary()))


@bp.function_name(fn.OPS_OPENAPI)
@bp.route(route=openapi.ROUTE_OPENAPI, methods=[func.HttpMethod.GET], auth_level=FUNCTION)
async def ops_openapi(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(json.dumps(openapi.document()), mimetype=JSON)
