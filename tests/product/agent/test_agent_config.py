"""Configuration: app settings, flags over them, validation, the documented settings table kept in sync."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import AGENT_SETTINGS, config_from_args, config_from_env

REPO = Path(__file__).resolve().parents[3]


def test_defaults_come_from_the_settings_registries() -> None:
    config = config_from_env({})
    assert (config.requests_queue, config.replies_queue, config.alerts_queue) == (
        "agent-requests",
        "agent-replies",
        "operator-alerts",
    )
    assert config.max_concurrent_sessions == 8 and config.max_retries == 4 and config.backoff_base_ms == 100


def test_app_settings_are_read() -> None:
    config = config_from_env(
        {
            "AgentRequestsQueueName": "req-x",
            "AGENT_REMOTE_URL": "http://h:1",
            "AGENT_MAX_CONCURRENT_SESSIONS": "3",
            "AGENT_MAX_RETRIES": "0",
            "AGENT_BACKOFF_BASE_MS": "250",
            "AGENT_JITTER_SEED": "9",
        }
    )
    assert (config.requests_queue, config.remote_url, config.max_concurrent_sessions, config.max_retries) == (
        "req-x",
        "http://h:1",
        3,
        0,
    )
    policy = config.retry_policy()
    assert (policy.backoff_base, policy.max_retries, policy.jitter_seed) == (0.25, 0, 9)


def test_flags_override_app_settings() -> None:
    config, args = config_from_args(
        ["--max-retries", "7", "--remote-url", "http://x:2", "--connection", "c"],
        {"AGENT_MAX_RETRIES": "1", "AGENT_MAX_CONCURRENT_SESSIONS": "5"},
    )
    assert (config.max_retries, config.remote_url, config.max_concurrent_sessions) == (7, "http://x:2", 5)
    assert args.connection == "c"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AGENT_MAX_RETRIES": "many"}, "must be an integer"),
        ({"AGENT_MAX_CONCURRENT_SESSIONS": "0"}, "at least 1"),
        ({"AGENT_MAX_RETRIES": "-1"}, "must not be negative"),
        ({"AGENT_BACKOFF_BASE_MS": "0"}, "must be positive"),
    ],
)
def test_invalid_settings_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config_from_env(env)


def test_every_agent_setting_is_documented_with_its_default() -> None:
    readme = (REPO / "README.md").read_text()  # the table lab/docs_tables.py generates from AGENT_SETTINGS
    for setting in AGENT_SETTINGS:
        assert f"| `{setting.name}` | `{setting.default}` |" in readme, setting.name


def test_cli_help_lists_the_flags() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "agent", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    for flag in (
        "--remote-url",
        "--max-concurrent-sessions",
        "--max-retries",
        "--backoff-base-ms",
        "--connection",
    ):
        assert flag in out
