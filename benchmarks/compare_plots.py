"""The plots of `python -m benchmarks compare` (matplotlib, PNG): throughput and CPU per order against the burst size,
latency against the offered rate; both systems on each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

STYLE = {
    "ours": {"color": "tab:blue", "marker": "o", "label": "orderflow (devhost)"},
    "peer": {"color": "tab:orange", "marker": "s", "label": "DBOS (SQLite)"},
}


def plot(document: dict[str, Any], out_dir: Path, quick: bool) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    setup = document.get("peer_setup") or {}
    styles = {kind: dict(style) for kind, style in STYLE.items()}
    if setup.get("label"):  # name the peer's start mode (and its SQLite settings when they are not ours)
        sqlite = "" if setup.get("sqlite_same_as_ours") else f"; {setup.get('synchronous')}"
        styles["peer"]["label"] = f"{setup['label']} (SQLite{sqlite})"
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = ".quick.png" if quick else ".png"
    run = (
        f"{'quick run, ' if quick else ''}commit {document['commit']}{' (dirty)' if document['dirty'] else ''}, "
        f"remote latency {document['parameters']['remote_latency_ms_mean']:g} ms"
        + (f"\n{setup['sqlite']}" if setup.get("sqlite") else "")
    )
    written = []

    for key, ylabel, name, title in (
        ("orders_per_s", "orders/s (N submitted at once → all terminal)", "compare-throughput", "Throughput"),
        ("cpu_ms_per_order", "CPU ms per order (all processes)", "compare-cpu", "CPU per order"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for kind, style in styles.items():
            bursts = document[kind]["bursts"]
            xs = [b["orders"] for b in bursts]
            ax.plot(xs, [b[key] for b in bursts], **style)
            if key == "orders_per_s":  # every rep, faint, so the spread shows
                for b in bursts:
                    ax.scatter(
                        [b["orders"]] * len(b["orders_per_s_each"]),
                        b["orders_per_s_each"],
                        color=style["color"],
                        alpha=0.3,
                        s=14,
                    )
        sizes = sorted({b["orders"] for kind in STYLE for b in document[kind]["bursts"]})
        ax.set_xscale("log")
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.minorticks_off()
        ax.set_xlabel("orders submitted at once (N)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{title} against N\n{run}", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out_dir / f"{name}{suffix}"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind, style in styles.items():
        rates = document[kind]["rates"]
        xs = [r["offered_per_s"] for r in rates]
        ax.plot(
            xs,
            [r["latency_ms"]["p50"] for r in rates],
            color=style["color"],
            marker=style["marker"],
            label=f"{style['label']} p50",
        )
        ax.plot(
            xs,
            [r["latency_ms"]["p99"] for r in rates],
            color=style["color"],
            marker=style["marker"],
            linestyle="--",
            label=f"{style['label']} p99",
        )
    ax.set_xlabel("offered rate (orders/s, evenly spaced)")
    ax.set_ylabel("latency, submit → terminal (ms, log scale)")
    ax.set_yscale("log")  # from ~100 ms idle to tens of seconds past saturation
    ax.set_title(f"Latency against offered rate\n{run}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / f"compare-latency{suffix}"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written
