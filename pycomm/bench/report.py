"""Result rows, the nccl-tests-style table, the summary and the JSON file."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from pycomm.bench.config import BenchConfig, Variant

SCHEMA = "pycomm.bench/1"


@dataclass
class Row:
    op: str
    backend: str
    label: str  # backend plus pycomm options, as shown in the table
    algo: str | None
    compression: str | None
    transport: str | None
    chunk_bytes: int | None
    dtype: str
    size_bytes: int
    count: int
    iters: int | None = None
    time_us: float | None = None  # median over reps of the max over ranks
    algbw_GBps: float | None = None
    busbw_GBps: float | None = None
    wrong: int | None = None  # None when --no-check or failed
    ratio_vs_first: float | None = None  # busbw / first variant's busbw
    error: str | None = None
    rep_time_us: list[float] | None = None  # per-call time of each rep (max over ranks): the noise

    @classmethod
    def for_variant(cls, op: str, variant: Variant, dtype: str, size: int, count: int) -> Row:
        # Every field of the variant, under the same name.
        return cls(op=op, dtype=dtype, size_bytes=size, count=count, **asdict(variant))


COLUMNS = ("size", "count", "type", "op", "backend", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "wrong", "ratio")


class Table:
    """Fixed-width table; widths depend only on the config so rows can be
    printed as soon as each size is measured."""

    def __init__(self, config: BenchConfig) -> None:
        op_width = max(len(op) for op in config.ops)
        label_width = max(len(v.label) for v in config.variants)
        self.widths = (12, 12, 8, max(op_width, 2), max(label_width, 7), 10, 11, 11, 6, 6)

    def _line(self, cells: Sequence[str]) -> str:
        # Text columns left-aligned, numbers right-aligned, as nccl-tests.
        parts = []
        for i, (cell, width) in enumerate(zip(cells, self.widths, strict=True)):
            parts.append(cell.ljust(width) if i in (2, 3, 4) else cell.rjust(width))
        return "  ".join(parts).rstrip()

    def header(self) -> str:
        # "#" keeps the header out of the way of awk/grep on data rows.
        line = self._line(COLUMNS)
        return "#" + line[1:] if line.startswith(" ") else "# " + line

    def row(self, row: Row) -> str:
        lead = [str(row.size_bytes), str(row.count), row.dtype, row.op, row.label]
        if row.error is not None:
            return self._line(lead) + f"  error: {row.error}"
        cells = lead + [
            _num(row.time_us, 1),
            _num(row.algbw_GBps, 3),
            _num(row.busbw_GBps, 3),
            "N/A" if row.wrong is None else str(row.wrong),
            _num(row.ratio_vs_first, 2),
        ]
        return self._line(cells)


def _num(value: float | None, digits: int) -> str:
    return "N/A" if value is None else f"{value:.{digits}f}"


def preamble(meta: dict[str, object], config: BenchConfig) -> list[str]:
    """Comment lines before the table: what ran, where, and how it was timed."""
    if config.iters:
        iters = f"{config.iters} fixed"
    else:
        iters = f"auto (~{config.target_time:g} s per size per backend, max {config.max_iters}/rep)"
    hosts = ", ".join(meta["hosts"])  # type: ignore[arg-type]
    labels = ", ".join(v.label for v in config.variants)
    lines = [
        f"# pycomm.bench: {meta['command']}",
        f"# world {meta['world_size']} ({meta['launcher']}) on {hosts}; torch {meta['torch_version']}; {meta['date']}",
        f"# backends: {labels}; dtype {config.dtype}; check {'on' if config.check else 'off'}",
        f"# warmup {config.warmup}, iters {iters}, reps {config.reps}: time = median over reps of the slowest rank",
        "# size = max(bytes sent, bytes received) per rank and busbw as nccl-tests; ratio = busbw / first backend's",
        f"# memcpy bandwidth of rank 0 in this run: {meta.get('memcpy_GBps', 0.0):.2f} GB/s",
    ]
    lines += [f"# note: {note}" for note in config.notes]
    lines.append("#")
    return lines


def summary(rows: Sequence[Row], config: BenchConfig) -> list[str]:
    """Per op and variant: average busbw and wrong count (nccl-tests footer)."""
    lines = ["#"]
    for op in config.ops:
        for variant in config.variants:
            mine = [r for r in rows if r.op == op and r.label == variant.label]
            bws = [r.busbw_GBps for r in mine if r.busbw_GBps is not None]
            avg = f"{statistics.fmean(bws):.3f}" if bws else "N/A"
            failed = sum(1 for r in mine if r.error is not None)
            wrong = sum(r.wrong or 0 for r in mine)
            status = f"wrong {wrong}" if config.check else "wrong N/A"
            if wrong and not variant.exact:
                status += " (lossy codec: reported, not a failure)"
            if failed:
                status += f", {failed} size(s) failed"
            lines.append(f"# {op:<14} {variant.label:<16} avg busbw {avg:>8} GB/s  {status}")
    return lines


def write_json(path: str, meta: dict[str, object], rows: Sequence[Row]) -> None:
    """One JSON document: {"schema", "meta", "rows"}; rows keep every field
    (None for not measured / not applicable) so consumers need no guessing."""
    doc = {"schema": SCHEMA, "meta": meta, "rows": [asdict(r) for r in rows]}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
