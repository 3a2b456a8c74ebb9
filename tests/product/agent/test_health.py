"""The Agent's liveness endpoint (agent/health.py), which infra/app/agent.bicep's Container Apps probe calls:
`GET /healthz` on AGENT_HEALTH_PORT. Container Apps counts a status of 200-399 as a success and anything else, or no
answer within the timeout, as a failure (learn.microsoft.com/azure/container-apps/health-probes, "HTTP probes")."""

from __future__ import annotations

import asyncio

from agent.__main__ import _health
from agent.config import config_from_env
from agent.health import answer, serve_health


async def get(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data


async def test_healthz_answers_200_while_alive_then_503() -> None:
    state = {"alive": True}
    server = await serve_health("127.0.0.1", 0, lambda: state["alive"])
    port = server.sockets[0].getsockname()[1]
    try:
        ok = await get(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        state["alive"] = False
        down = await get(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        other = await get(port, b"GET / HTTP/1.1\r\n\r\n")
    finally:
        server.close()
    assert ok.startswith(b"HTTP/1.1 200 ") and ok.endswith(b"ok")
    assert down.startswith(b"HTTP/1.1 503 ")
    assert other.startswith(b"HTTP/1.1 404 ")


def test_only_a_get_of_healthz_is_answered_ok() -> None:
    assert answer(b"GET /healthz HTTP/1.1\r\n", True) == 200
    assert answer(b"GET /healthz?probe=1 HTTP/1.1\r\n", True) == 200
    assert answer(b"POST /healthz HTTP/1.1\r\n", True) == 404
    assert answer(b"garbage\r\n", True) == 400


async def test_the_endpoint_runs_only_when_agent_health_port_is_set() -> None:
    assert config_from_env({}).health_port == 0 and await _health(0, lambda: True) is None
    port = config_from_env({"AGENT_HEALTH_PORT": "18089"}).health_port
    server = await _health(port, lambda: True)
    assert server is not None and server.sockets[0].getsockname()[1] == 18089
    server.close()
