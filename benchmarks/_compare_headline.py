"""The headline of `python -m benchmarks compare`: how the peer ran (`peer_setup`) and the three ratios of ours over
the peer in that mode (`headline`), with the small number helpers they share."""

from __future__ import annotations

from typing import Any

from ._compare_systems import Options


def p50(figures: dict[str, Any]) -> float | None:
    return (figures.get("single_order_latency_ms") or {}).get("p50")


def peer_setup(options: Options, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """How the peer ran: its start mode and bound, and its SQLite settings."""
    return {
        "mode": options.peer_mode,
        "concurrency": options.peer_concurrency,
        "polling_interval_s": options.peer_polling_interval if options.peer_mode == "queue" else None,
        "synchronous": options.peer_synchronous_level(),
        "journal_mode": "WAL",
        "label": f"DBOS {options.peer_mode_label()}",
        "sqlite": options.sqlite_label(),
        "sqlite_same_as_ours": None if settings is None else settings["same"],
    }


def headline(document: dict[str, Any]) -> dict[str, Any]:
    """The headline comparison: ours against the peer in the mode it ran, at the largest burst."""
    ours, peer, setup = document["ours"], document["peer"], document["peer_setup"]
    ratio = {
        "orders_per_s": document.get("ratio_orders_per_s_ours_over_peer"),
        "cpu_ms_per_order": document.get("ratio_cpu_ms_per_order_ours_over_peer"),
        "single_order_p50": document.get("ratio_single_order_p50_ours_over_peer"),
    }
    text = (
        f"ours/{setup['label']} ({setup['sqlite']}), {ours.get('orders_per_s_at')} orders at once: "
        f"orders/s {fig(ours.get('orders_per_s'))} vs {fig(peer.get('orders_per_s'))} "
        f"(ratio {fig(ratio['orders_per_s'])}); CPU ms per order {fig(ours.get('cpu_ms_per_order'))} vs "
        f"{fig(peer.get('cpu_ms_per_order'))} (ratio {fig(ratio['cpu_ms_per_order'])}); single-order p50 "
        f"{fig(p50(ours))} vs {fig(p50(peer))} ms (ratio {fig(ratio['single_order_p50'])})"
    )
    return {
        "peer": setup["label"],
        "peer_mode": setup["mode"],
        "peer_concurrency": setup["concurrency"],
        **ratio,
        "text": text,
    }


def fig(value: Any) -> str:
    return "n/a" if value is None else f"{value:g}"


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None
