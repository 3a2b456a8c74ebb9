"""Integration fixtures: a fresh in-process deployment per test, and the process-wide in-memory metric
reader.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from azure.durable_functions.models.utils import http_utils
from support.integration_support import Pipeline, open_pipeline
from support.replies_support import ScriptedDurableApi

from orderflow import runtime


@pytest.fixture
async def pipeline(tmp_path: Path) -> AsyncIterator[Pipeline]:
    deployment = await open_pipeline(tmp_path)
    yield deployment
    await deployment.aclose()


@pytest.fixture
async def durable_api() -> AsyncIterator[ScriptedDurableApi]:
    """A scripted Durable HTTP API on 127.0.0.1 (port 0) for the real DurableOrchestrationClient."""
    api = ScriptedDurableApi()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", api.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    api.base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield api
    finally:
        await runner.cleanup()
        await http_utils._close_session()  # the SDK keeps one global aiohttp session per process


@pytest.fixture
async def replies(pipeline: Pipeline) -> AsyncIterator[Pipeline]:
    """The pipeline, installed as what the triggers' get_services() returns on this loop."""
    runtime.use_services(pipeline.services)
    yield pipeline
    runtime.reset_services()
