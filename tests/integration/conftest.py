"""Integration fixtures: a fresh in-process deployment per test, and the process-wide in-memory metric
reader.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from integration_support import Pipeline, open_pipeline


@pytest.fixture
async def pipeline(tmp_path: Path) -> AsyncIterator[Pipeline]:
    deployment = await open_pipeline(tmp_path)
    yield deployment
    await deployment.aclose()
