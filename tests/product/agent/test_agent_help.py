"""`python -m agent --help` shows each flag's default and says that the simulator's port must match
AGENT_REMOTE_URL."""

from __future__ import annotations

import re

from agent.config import AGENT_SETTINGS, build_parser


def _help() -> str:
    return re.sub(r"\s+", " ", build_parser().format_help())


def test_help_shows_every_default() -> None:
    text = _help()
    for setting in AGENT_SETTINGS:
        assert f"app setting {setting.name}, else {setting.default}" in text, setting.name
    assert "app setting AgentRequestsQueueName, else agent-requests" in text
    assert "(default: INFO)" in text


def test_help_says_the_simulator_port_must_match_the_remote_url() -> None:
    text = _help()
    assert "must match AGENT_REMOTE_URL" in text
    assert "python -m lab.simulator --port 8765" in text
    assert "AGENT_REMOTE_URL=http://127.0.0.1:<port>" in text
