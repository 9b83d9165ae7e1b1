"""Measuring one op at one size for every variant: the phases of nccl-tests'
inner loop (warm-up, timed reps, check) plus an iteration-count calibration.

All variants share the buffers and are measured in the same processes, their
timed reps interleaved, so they see the same data and the same noise.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable

import torch
import torch.distributed as dist

from pycomm.bench import data, timing
from pycomm.bench.agreement import agree, guard
from pycomm.bench.config import BenchConfig, Variant
from pycomm.bench.descriptors import Collective, Layout
from pycomm.bench.report import Row


class SizeMeasurement:
    def __init__(
        self,
        coll: Collective,
        layout: Layout,
        pool: torch.Tensor,
        period: int,
        config: BenchConfig,
        groups: list[dist.ProcessGroup],
        alive: list[bool],
    ) -> None:
        self.coll = coll
        self.layout = layout
        self.period = period
        self.cfg = config
        control = dist.group.WORLD
        assert control is not None  # the default group exists (runner made it)
        self.control: dist.ProcessGroup = control
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.bufs = coll.make_buffers(layout, pool)
        self.calls: list[Callable[[], None]] = [
            functools.partial(coll.run, self.bufs, g, self.rank, self.world) for g in groups
        ]
        self.nvar = len(groups)
        # Shared with the caller: a variant that fails is dropped for the rest
        # of this op (its group may be in a bad state after an error).
        self.alive = alive
        self.was_alive = list(alive)
        self.errors: list[str | None] = [None] * self.nvar
        self.iters = [config.iters or 1] * self.nvar
        self.prime = [True] * self.nvar  # see timing.timed_rep
        self.times = torch.zeros(self.nvar, config.reps, dtype=torch.float64)
        self.wrong = torch.zeros(self.nvar, dtype=torch.int64)

    def run(self) -> list[Row]:
        """All phases; rows for the variants alive at the start (no row for
        one dropped at an earlier size)."""
        self._warmup()
        if not self.cfg.iters:
            self._calibrate()
        self._timed_reps()
        if self.cfg.check:
            self._check()
        return self._rows()

    def _live(self) -> list[int]:
        return [v for v in range(self.nvar) if self.alive[v]]

    def _settle(self, local: list[str | None]) -> None:
        for v, message in enumerate(agree(local, self.control)):
            if message is not None and self.alive[v]:
                self.alive[v] = False
                self.errors[v] = message

    def _warmup(self) -> None:
        local: list[str | None] = [None] * self.nvar
        for v in self._live():
            self.bufs.reset()
            _, local[v] = guard(timing.warmup, self.calls[v], self.cfg.warmup)
        self._settle(local)

    def _calibrate(self) -> None:
        per_rep = self.cfg.target_time / self.cfg.reps
        local: list[str | None] = [None] * self.nvar
        for v in self._live():
            self.bufs.reset()
            seconds, local[v] = timing.calibrate(self.calls[v], per_rep / 2, self.cfg.max_iters, self.control)
            self.iters[v] = timing.iters_for(seconds, per_rep, self.cfg.max_iters)
            self.prime[v] = seconds < per_rep  # a call longer than a rep dwarfs a wake-up
        self._settle(local)

    def _timed_reps(self) -> None:
        # Variants interleaved, and the order rotated every rep, so drift and
        # bursts of noise (other processes, the hypervisor) hit all alike.
        for rep in range(self.cfg.reps):
            local: list[str | None] = [None] * self.nvar
            for k in range(self.nvar):
                v = (rep + k) % self.nvar
                if self.alive[v]:
                    self.bufs.reset()
                    elapsed, local[v] = guard(
                        timing.timed_rep, self.calls[v], self.iters[v], self.control, self.prime[v]
                    )
                    self.times[v, rep] = elapsed or 0.0
            self._settle(local)
        self.times = timing.max_over_ranks(self.times, self.control)

    def _check(self) -> None:
        """One call per variant on exact integer data, after the timed loop so
        it also catches state the loop left corrupted."""
        expected: list[torch.Tensor | None] = []  # computed once, shared by variants

        def checked_call(v: int) -> int:
            self.coll.fill_check(self.bufs, self.layout, self.rank, self.period)
            self.calls[v]()
            if not expected:
                expected.append(self.coll.expected(self.layout, self.rank, self.world, self.period))
            return 0 if expected[0] is None else data.count_wrong(self.bufs.out, expected[0])

        local: list[str | None] = [None] * self.nvar
        for v in self._live():
            count, local[v] = guard(checked_call, v)
            self.wrong[v] = count or 0
        self._settle(local)
        dist.all_reduce(self.wrong, op=dist.ReduceOp.SUM, group=self.control)

    def _rows(self) -> list[Row]:
        factor = self.coll.busbw_factor(self.world)
        rows: list[Row] = []
        for v, variant in enumerate(self.cfg.variants):
            row = self._row(variant)
            if self.errors[v] is not None:
                row.error = self.errors[v]
            elif self.alive[v]:
                per_call = [t / self.iters[v] for t in self.times[v].tolist()]
                seconds = statistics.median(per_call)
                row.iters = self.iters[v]
                row.rep_time_us = [round(t * 1e6, 3) for t in per_call]
                row.time_us = seconds * 1e6
                if seconds > 0:
                    row.algbw_GBps = self.layout.size_bytes / seconds / 1e9
                    row.busbw_GBps = row.algbw_GBps * factor
                row.wrong = int(self.wrong[v]) if self.cfg.check else None
            rows.append(row)
        first = rows[0].busbw_GBps
        for row in rows:
            if row.busbw_GBps is not None and first:
                row.ratio_vs_first = row.busbw_GBps / first
        return [row for v, row in enumerate(rows) if self.was_alive[v]]

    def _row(self, variant: Variant) -> Row:
        return Row.for_variant(self.coll.name, variant, self.cfg.dtype, self.layout.size_bytes, self.layout.count)
