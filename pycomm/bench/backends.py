"""Process groups: one gloo control group plus one group per measured variant.

The default group is always gloo and carries only the bench's own traffic
(barriers, the iteration-count broadcast, result reductions). Each measured
backend, gloo included, gets a fresh group from new_group(), so the numbers
never include control traffic and every variant runs in the same processes.
"""

from __future__ import annotations

import importlib
from datetime import timedelta
from types import ModuleType
from typing import cast

import torch.distributed as dist

from pycomm.bench.config import PYCOMM, BenchConfig, Variant


class BackendError(RuntimeError):
    """A requested backend could not be loaded or initialised."""


def load_pycomm() -> ModuleType:
    """``import pycomm`` (which registers the backend) and verify it did.

    Imported here, in each rank and only on request, so a gloo-only run works
    while the native extension is missing or broken.
    """
    try:
        module = importlib.import_module("pycomm")
    except Exception as exc:  # ImportError, or an error raised by the extension
        raise BackendError(f"backend 'pycomm' requested but `import pycomm` failed: {one_line(exc)}") from exc
    if not hasattr(module, "Options"):
        raise BackendError("backend 'pycomm' requested but pycomm has no Options (extension not built?)")
    if PYCOMM not in dist.Backend.backend_list:
        raise BackendError("`import pycomm` did not register a torch.distributed backend named 'pycomm'")
    return module


def init_control(rank: int, world: int, timeout_s: float, store_addr: tuple[str, int] | None = None) -> None:
    """Default group (gloo). Local ranks join the TCPStore their launcher
    already serves (no free-port race); under torchrun, env:// as usual."""
    timeout = timedelta(seconds=timeout_s)
    try:
        if store_addr is None:
            dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world, timeout=timeout)
        else:
            host, port = store_addr
            store = dist.TCPStore(host, port, world, is_master=False, timeout=timeout)  # type: ignore[attr-defined]
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    except Exception as exc:
        raise BackendError(f"control group (gloo) failed to initialise: {one_line(exc)}") from exc


def create_group(variant: Variant, config: BenchConfig, pycomm: ModuleType | None) -> dist.ProcessGroup:
    """new_group() for one variant; pycomm variants get pycomm.Options."""
    known = [b for b in dist.Backend.backend_list if b != "undefined"]
    if variant.backend.lower() not in known:
        raise BackendError(f"unknown backend {variant.backend!r} (registered: {', '.join(known)})")
    options = None
    if variant.backend == PYCOMM:
        assert pycomm is not None
        try:
            options = pycomm.Options(**variant.pycomm_options())
        except Exception as exc:
            raise BackendError(f"pycomm.Options({_kwargs(variant)}) rejected: {one_line(exc)}") from exc
    try:
        group = dist.new_group(backend=variant.backend, pg_options=options, timeout=timedelta(seconds=config.timeout_s))
    except Exception as exc:
        raise BackendError(f"backend {variant.label!r} failed to initialise: {one_line(exc)}") from exc
    if group is None or group == dist.GroupMember.NON_GROUP_MEMBER:
        raise BackendError(f"backend {variant.label!r}: new_group() returned no group")
    return cast(dist.ProcessGroup, group)


def _kwargs(variant: Variant) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in variant.pycomm_options().items())


def one_line(exc: BaseException) -> str:
    """First line of an exception: C++ errors carry long traces. A first line
    that ends in ':' (pybind11's "incompatible arguments:") gets the next."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if text.endswith(":") and len(lines) > 1:
        text = f"{text} {lines[1]}"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
