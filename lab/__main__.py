"""`python -m lab`: the demo, up/down, the drills, the remote-service simulator and the Agent with fault switches."""

from __future__ import annotations

import argparse
import sys
from typing import Any

# Commands that take their own arguments, parsed by their own entry points.
PASS_THROUGH = {
    "simulator": "the remote-service simulator (`python -m lab simulator --help`; same as `python -m lab.simulator`)",
    "agent": "the real Agent with the drills' fault switches (lab/agent_faults.py; other flags: `python -m agent`)",
}


def add_commands(sub: Any) -> None:
    """demo, drill, drills, up and down on the subparsers `sub` (also `python -m devhost`'s aliases)."""
    from .demo import add_command as add_demo
    from .drill import add_command as add_drill
    from .drills_report import add_command as add_drills
    from .up import add_commands as add_up

    add_demo(sub)
    add_drill(sub)
    add_drills(sub)
    add_up(sub)


def run(args: argparse.Namespace) -> int:
    """Run a command `add_commands` added."""
    if args.command == "demo":
        from .demo import run_demo

        return run_demo(args)
    if args.command == "drills":
        from .drills_report import run_drills_command

        return run_drills_command(args)
    if args.command == "drill":
        from .drill import run_drill_command

        return run_drill_command(args)
    from . import up

    return up.up(args) if args.command == "up" else up.down(args)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_commands(sub)
    for name, text in PASS_THROUGH.items():
        sub.add_parser(name, help=text, add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "simulator":
        from .simulator import main as simulator

        simulator(argv[1:])
        return 0
    if argv and argv[0] == "agent":
        from .agent_faults import main as agent

        return agent(argv[1:])
    return run(_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
