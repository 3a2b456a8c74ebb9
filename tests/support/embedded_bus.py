"""The embedded client (orderflow/embedded/, sync or aio through support.aio_bridge) as a scenario `Bus`
(tests/support/bus_scenarios.py), as `SdkBus` (support.amqp_endpoint) is the SDK over the AMQP endpoint: each
client opens the broker file through its connection string, with the SDK run's options (`retry_total=0`), on the
broker's clock or on an `OffsetClock` the test moves (the client's local clock is then the broker's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orderflow.embedded import client, client_aio
from support.aio_bridge import LoopThread
from support.bus_scenarios import FlavoredBus, OffsetClock, Queues, declare


class EmbeddedBus(FlavoredBus):
    def __init__(self, db_path: Path, flavor: str, loop: LoopThread, clock: OffsetClock | None = None) -> None:
        self.db_path, self.flavor, self.loop, self.clock = db_path, flavor, loop, clock

    @property
    def connection_string(self) -> str:
        return f"Endpoint=embedded://{self.db_path}"

    def declare(self, queues: Queues) -> Queues:
        return declare(self.db_path, queues)

    def _options(self) -> dict[str, Any]:
        return {"retry_total": 0, "clock": self.clock}

    def sync_client(self) -> Any:
        return client.ServiceBusClient.from_connection_string(self.connection_string, **self._options())

    def aio_client(self) -> Any:
        return client_aio.ServiceBusClient.from_connection_string(self.connection_string, **self._options())
