"""Contract-test fixtures: store backends (embedded SQLite; azure-cosmos against a Cosmos protocol server).

The Cosmos backend talks to `@vercel/cosmosdb-server` (node_modules, `make setup`), started once per session
on a free 127.0.0.1 port over HTTPS with its self-signed certificate. azure-cosmos skips certificate
verification for 127.0.0.1/localhost itself (azure/cosmos/aio/_asynchronous_request.py: "We are disabling the
SSL verification for local emulator(localhost/127.0.0.1)"), so no `connection_verify=False` is needed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orderflow.store import Stores
from orderflow.store.cosmos_store import CosmosNames, CosmosStateStore, open_cosmos_with_key
from orderflow.store.sqlite_store import open_sqlite_stores

REPO = Path(__file__).resolve().parents[2]
COSMOS_CLI = REPO / "node_modules" / "@vercel" / "cosmosdb-server" / "lib" / "cli.js"
READY = re.compile(r"Ready to accept HTTPS? connections at (\S+):(\d+)")
START_TIMEOUT_SECONDS = 20.0
ANY_KEY = "dGVzdC1rZXktbm90LWEtc2VjcmV0"  # the protocol server accepts any key


@dataclass
class Backend:
    """One adapter under test. `open()` gives a fresh, isolated store; `open_peer()` a second, independent
    connection to the same data (another process, as far as the store is concerned)."""

    name: str
    open: Callable[[], Awaitable[Stores]]
    open_peer: Callable[[], Awaitable[Stores]]
    charges_request_units: bool


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


@pytest.fixture(scope="session")
def cosmos_endpoint() -> Iterator[str]:
    node = shutil.which("node")
    if node is None or not COSMOS_CLI.exists():
        pytest.fail(
            "the Cosmos contract tests need node and node_modules/@vercel/cosmosdb-server (run `make setup`)"
        )
    proc = subprocess.Popen(
        [node, str(COSMOS_CLI), "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    drain = threading.Thread(target=_drain, args=(proc,), daemon=True)
    try:
        endpoint = _wait_ready(proc)
        drain.start()  # keep reading so a chatty server never blocks on a full pipe
        yield endpoint
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


def _drain(proc: subprocess.Popen[str]) -> None:
    for _ in proc.stdout or ():
        pass


def fresh_cosmos_names() -> CosmosNames:
    tag = uuid.uuid4().hex[:12]
    return CosmosNames(f"orders-{tag}", "orders", f"state-{tag}", "orderState", "supervisorCheckpoints")


def _sqlite_backend(tmp_path: Path) -> Backend:
    path = tmp_path / "store.db"

    async def open_() -> Stores:
        return Stores(*open_sqlite_stores(path))

    return Backend("sqlite", open_, open_, charges_request_units=False)


def _cosmos_backend(endpoint: str) -> Backend:
    names = fresh_cosmos_names()

    async def open_() -> Stores:
        return Stores(*await open_cosmos_with_key(endpoint, ANY_KEY, names))

    async def open_peer() -> Stores:
        return Stores(*await open_cosmos_with_key(endpoint, ANY_KEY, names, create_containers=False))

    return Backend("cosmos", open_, open_peer, charges_request_units=True)


@pytest.fixture(params=["sqlite", pytest.param("cosmos", marks=pytest.mark.cosmos)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return _sqlite_backend(tmp_path)
    return _cosmos_backend(request.getfixturevalue("cosmos_endpoint"))


@pytest.fixture
async def stores(backend: Backend) -> AsyncIterator[Stores]:
    opened = await backend.open()
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
async def peer(backend: Backend, stores: Stores) -> AsyncIterator[Stores]:
    """A second, independent connection to the same store as `stores`."""
    opened = await backend.open_peer()
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
async def cosmos_state(cosmos_endpoint: str) -> AsyncIterator[CosmosStateStore]:
    """The Cosmos state-store adapter alone, for checks of the protocol server itself."""
    _, state = await open_cosmos_with_key(cosmos_endpoint, ANY_KEY, fresh_cosmos_names())
    try:
        yield state
    finally:
        await state.aclose()
