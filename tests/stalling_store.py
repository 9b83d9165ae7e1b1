"""A store that stalls before one key, to hold a rank at a chosen point of the backend's setup."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist


class StallingStore(dist.Store):
    """Delegates to the backend's store, but sleeps `stall_s` before waiting for a key that ends
    with `stall_key` (the backend's get() waits for its key first)."""

    def __init__(self, inner: dist.Store, stall_s: float, stall_key: str) -> None:
        super().__init__()
        self.inner = inner
        self.stall_s = stall_s
        self.stall_key = stall_key

    def set(self, key: str, value: Any) -> None:
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def add(self, key: str, value: int) -> int:
        return self.inner.add(key, value)

    def check(self, keys: list[str]) -> bool:
        return self.inner.check(keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        if any(k.endswith(self.stall_key) for k in keys):
            time.sleep(self.stall_s)
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)


# A Python store must outlive the C++ side's use of it: pybind11 finds the overrides through the
# Python object ("Not implemented" otherwise).
_KEEP_ALIVE: list[StallingStore] = []


def stall_pycomm_store(stall_key: str, stall_s: float) -> None:
    """Every pycomm backend this process creates from now on reads its store through a StallingStore,
    wrapped around the keys pycomm chose (its choice reads the store torch hands it, which a
    wrapper on one rank only must not change)."""
    import pycomm.backend as backend

    choose = backend._group_keys

    def stalling_keys(store: Any, global_ranks: list[int]) -> Any:
        formation = choose(store, global_ranks)
        formation.store = StallingStore(formation.store, stall_s=stall_s, stall_key=stall_key)
        _KEEP_ALIVE.append(formation.store)
        return formation

    backend._group_keys = stalling_keys
