"""`python -m devhost servicebus`: open the broker file the embedded client uses (`<state dir>/servicebus.db`),
declare the queues of the config, serve AMQP until SIGINT/SIGTERM, and print `listening on amqp://HOST:PORT`."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from types import FrameType

from orderflow.embedded.broker import EmbeddedBroker
from orderflow.embedded.broker._bus_faults import BusFaults

DB_NAME = "servicebus.db"  # as lab/system.py and local.settings.sample.json name it under the state dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=5672, help="TCP port (default 5672, the emulator's; 0 = any)")
    parser.add_argument(
        "--state-dir", type=Path, default=Path(".devhost"), help=f"folder of {DB_NAME} (default .devhost)"
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=Path("servicebus.config.json"),
        help="queues to declare, in the emulator's Config.json format (default servicebus.config.json)",
    )
    parser.add_argument(
        "--faults",
        default="",
        metavar="OPTIONS",
        help="inject faults, as the embedded broker's endpoint options (serverBusyRate=0.1&outageFile=PATH&...); "
        "default none",
    )
    parser.add_argument(
        "--infra",
        type=Path,
        default=None,
        help="folder whose role assignments give each SAS key name (an identity of infra/) its rights "
        "(default: the repository's infra/; RootManageSharedAccessKey has every right)",
    )


def serve(
    host: str, port: int, state_dir: Path, config: Path | None, faults: str = "", infra: Path | None = None
) -> int:
    """Serve until a signal; returns the exit status."""
    if config is not None and not config.is_file():
        print(f"devhost servicebus: config file not found: {config}", file=sys.stderr, flush=True)
        return 1
    try:
        injected = BusFaults.parse(faults, (state_dir / DB_NAME).resolve())
    except ValueError as exc:
        print(f"devhost servicebus: --faults: {exc}", file=sys.stderr, flush=True)
        return 1
    from ._server import Endpoint  # proton is loaded only by the command that serves

    # proton logs every write to a socket its client already closed (pyamqp closes right after its Close frame).
    logging.getLogger("proton").setLevel(logging.CRITICAL)

    broker = EmbeddedBroker(state_dir / DB_NAME, config=config, faults=injected)
    try:
        endpoint = Endpoint(broker, host, port, infra)
    except OSError as exc:
        print(f"devhost servicebus: cannot listen on {host}:{port}: {exc}", file=sys.stderr, flush=True)
        broker.close()
        return 1

    def stop(signum: int, frame: FrameType | None) -> None:
        endpoint.stop()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    print(f"listening on {endpoint.url}", flush=True)
    try:
        endpoint.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        broker.close()
    return 0
