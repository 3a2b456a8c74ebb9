"""The Cosmos DB protocol server of the tests: `tests/support/cosmosdb_server.js` in a node subprocess.

That script runs `@vercel/cosmosdb-server` (node_modules, from package.json) with the harness's fix of its one
known quirk on the product's path: a point read of a missing document answers 404, as on Cosmos DB, instead of
the package's 500 (see the script's header). It adds a fault hook and a request log for tests, driven through
`CosmosServer.fault()` and `CosmosServer.requests()`.

The server listens on a free 127.0.0.1 port over HTTPS with the package's self-signed certificate. azure-cosmos
skips certificate verification for 127.0.0.1/localhost itself (azure/cosmos/aio/_asynchronous_request.py: "We
are disabling the SSL verification for local emulator(localhost/127.0.0.1)"); the control calls here do the same.
"""

from __future__ import annotations

import json
import re
import shutil
import ssl
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "tests" / "support" / "cosmosdb_server.js"
PACKAGE = REPO / "node_modules" / "@vercel" / "cosmosdb-server" / "package.json"
READY = re.compile(r"Ready to accept HTTPS? connections at (\S+):(\d+)")
START_TIMEOUT_SECONDS = 20.0
CONTROL_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class SeenRequest:
    method: str
    path: str
    query: bool  # a POST .../docs carrying x-ms-documentdb-isquery


class CosmosServer:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._tls = ssl.create_default_context()
        self._tls.check_hostname = False
        self._tls.verify_mode = ssl.CERT_NONE  # the package's self-signed certificate, on 127.0.0.1 only

    def _control(self, method: str, route: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.endpoint}/_orderflow_test/{route}",
            data=data,
            method=method,
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=CONTROL_TIMEOUT_SECONDS, context=self._tls) as response:
            text = response.read().decode()
        return json.loads(text) if text else None

    @contextmanager
    def fault(self, method: str, path: str, status: int, times: int | None = None) -> Iterator[None]:
        """Answer `status` to `method path` (`times` requests, or all until the block ends)."""
        spec: dict[str, Any] = {"method": method, "path": path, "status": status}
        if times is not None:
            spec["times"] = times
        self._control("POST", "faults", spec)
        try:
            yield
        finally:
            self._control("DELETE", "faults")

    def clear_requests(self) -> None:
        self._control("DELETE", "requests")

    def requests(self) -> list[SeenRequest]:
        """Every Cosmos request the server received since the last `clear_requests()`, in order."""
        return [SeenRequest(r["method"], r["path"], r["query"]) for r in self._control("GET", "requests")]


def _wait_ready(proc: subprocess.Popen[str]) -> str:
    """Read the server's stdout until its ready line (bounded by a timer that kills a silent server)."""
    assert proc.stdout is not None
    timer = threading.Timer(START_TIMEOUT_SECONDS, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            match = READY.search(line)
            if match:
                return f"https://127.0.0.1:{match.group(2)}"
    finally:
        timer.cancel()
    raise RuntimeError(f"cosmosdb-server exited (code {proc.poll()}) before it was ready")


def _drain(proc: subprocess.Popen[str]) -> None:
    for _ in proc.stdout or ():
        pass


def missing_prerequisite() -> str | None:
    if shutil.which("node") is None or not PACKAGE.exists():
        return "the Cosmos tests need node and node_modules/@vercel/cosmosdb-server (run `make setup`)"
    return None


@contextmanager
def run_cosmos_server() -> Iterator[CosmosServer]:
    node = shutil.which("node")
    assert node is not None, missing_prerequisite()
    proc = subprocess.Popen(
        [node, str(SHIM), "--host", "127.0.0.1", "--port", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    drain = threading.Thread(target=_drain, args=(proc,), daemon=True)
    try:
        endpoint = _wait_ready(proc)
        drain.start()  # keep reading so a chatty server never blocks on a full pipe
        yield CosmosServer(endpoint)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if drain.is_alive():
            drain.join(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
