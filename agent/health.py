"""The Agent's health endpoint: `GET /healthz` on AGENT_HEALTH_PORT, for the Container Apps liveness probe.

Container Apps probes are httpGet or tcpSocket only (infra/app/agent.bicep). A TCP accept succeeds while the event
loop is blocked, since the kernel completes the handshake; an HTTP answer needs the loop, so it shows the process is
alive. 200 while the Agent's serve task runs, 503 once it has ended (the process is about to exit or is stuck in its
shutdown), 404 for any other path. No body is read, nothing else is served, nothing is logged per request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

_ANSWERS = {
    200: b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
    503: b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    404: b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    400: b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
}
REQUEST_LINE_TIMEOUT = 5.0


def answer(request_line: bytes, alive: bool) -> int:
    """The status for one request line (`GET /healthz HTTP/1.1`)."""
    parts = request_line.split()
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
        return 400
    if parts[0] != b"GET" or parts[1].split(b"?")[0] != b"/healthz":
        return 404
    return 200 if alive else 503


async def serve_health(host: str, port: int, alive: Callable[[], bool]) -> asyncio.Server:
    """Start the endpoint; the caller closes the returned server."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), REQUEST_LINE_TIMEOUT)
            writer.write(_ANSWERS[answer(line, alive())])
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    return await asyncio.start_server(handle, host, port)
