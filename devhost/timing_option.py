"""`--timing`, the option of `devhost start`, `demo` and `drill` that picks the Durable engine's timing
(devhost/durable/timing.py); here, apart, so that the command lines build without loading the engine."""

from __future__ import annotations

import argparse

TIMINGS = ("local", "azure-storage")


def add_timing_argument(parser: argparse.ArgumentParser, default: str | None = "local", note: str = "") -> None:
    """`--timing` on `parser`; `note` says what the default is when it is None (the drill's, which depends on it)."""
    parser.add_argument(
        "--timing",
        choices=TIMINGS,
        default=default,
        metavar="TIMING",
        help="the Durable engine's latencies: local (a message is read the moment it is written) or azure-storage "
        "(the Azure Storage provider's: idle queue polling that backs off to host.json maxQueuePollingInterval, "
        "partition leases and visibility timeouts after a host loss; docs/devhost.md) "
        + (note or f"(default {default})"),
    )
