"""busbw vs size plot (PNG). matplotlib is optional: imported only here.

Also usable on a saved result: ``python -m pycomm.bench.plot RESULT.json OUT.png``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, is_dataclass
from typing import Any

from pycomm.bench.sizes import format_size

INSTALL_HINT = "--plot needs matplotlib: pip install matplotlib"


def matplotlib_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def write_plot(path: str, rows: Sequence[Any], meta: Mapping[str, Any]) -> None:
    """One panel per op; one line per backend/algorithm/codec label."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on benchmark hosts
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    records = [asdict(r) if is_dataclass(r) and not isinstance(r, type) else dict(r) for r in rows]
    ops = list(dict.fromkeys(r["op"] for r in records))
    fig, axes = plt.subplots(len(ops), 1, figsize=(8, 4 * max(1, len(ops))), squeeze=False)
    for ax, op in zip(axes[:, 0], ops, strict=True):
        labels = list(dict.fromkeys(r["label"] for r in records if r["op"] == op))
        for label in labels:
            points = sorted(
                (r["size_bytes"], r["busbw_GBps"])
                for r in records
                if r["op"] == op and r["label"] == label and r["busbw_GBps"] is not None
            )
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=label)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: format_size(int(x))))
        ax.set_xlabel("size (bytes per rank, nccl-tests convention)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{op} - {meta.get('dtype', '')}, world {meta.get('world_size', '?')}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m pycomm.bench.plot RESULT.json OUT.png", file=sys.stderr)
        return 2
    if not matplotlib_available():
        print(f"pycomm.bench.plot: error: {INSTALL_HINT}", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as fh:
        doc = json.load(fh)
    write_plot(args[1], doc["rows"], doc["meta"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
