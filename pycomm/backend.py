"""Registers pycomm with torch.distributed and creates its backend for each process group."""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import socket
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from pycomm import _C
from pycomm.options import Options
from pycomm.tuning import load_cost_model

logger = logging.getLogger("pycomm")

BACKEND_NAME = "pycomm"


def _rendezvous_host(store: Any) -> str | None:
    """The host of the TCPStore behind the (prefixed) store, if any."""
    seen = 0
    while store is not None and seen < 8:
        host = getattr(store, "host", None)
        if isinstance(host, str) and host:
            return host
        store = getattr(store, "underlying_store", None)
        seen += 1
    return os.environ.get("MASTER_ADDR") or None


def bind_address(options: Options, store: Any) -> str:
    """The address this rank listens on: the named interface's, or the one that reaches the store.

    Never the wildcard address: a rank accepts connections only where its peers can reach it.
    """
    if options.socket_ifname:
        return _C.interface_address(options.socket_ifname)
    host = _rendezvous_host(store)
    if host is None:
        logger.info("pycomm: no rendezvous host known; listening on 127.0.0.1 "
                    "(set PYCOMM_SOCKET_IFNAME for several hosts)")
        return "127.0.0.1"
    try:
        if ipaddress.ip_address(host).is_loopback:
            return "127.0.0.1" if ipaddress.ip_address(host).version == 4 else "::1"
    except ValueError:
        if host == "localhost":
            return "127.0.0.1"
    return _C.local_address_toward(host)


def host_id() -> str:
    """Ranks with the same id share memory: same machine, same boot, same network namespace (two
    namespaces on one machine are two hosts to us, as they are to the network), and what decides
    whether memory can really be shared: the same IPC namespace and the same /dev/shm. Containers
    on one host network (docker --network host, Kubernetes hostNetwork) share the first three but
    usually not the last two. PYCOMM_HOST_ID overrides it."""
    explicit = os.environ.get("PYCOMM_HOST_ID")
    if explicit:
        return explicit
    parts = [socket.gethostname()]
    for path in ("/proc/sys/kernel/random/boot_id",):
        try:
            parts.append(open(path).read().strip())
        except OSError:
            pass
    for namespace in ("net", "ipc"):
        try:
            parts.append(os.readlink(f"/proc/self/ns/{namespace}"))
        except OSError:
            pass
    try:
        shm = os.stat("/dev/shm")
        parts.append(f"shm:{shm.st_dev}:{shm.st_ino}")
    except OSError:
        pass
    return "/".join(parts)


# How many groups of each member list this process has formed under the default group that
# _formed_under refers to (weakly: a destroyed default group must not live on here).
_formed: dict[tuple[int, ...], int] = {}
_formed_under: weakref.ref[Any] | None = None


@dataclass
class Formation:
    """How a group forms: the store under keys every member names alike and, for a group formed
    from the default group, that group's backend and a key of the new group that every member
    names alike, from which it derives its secret (config.h: Lineage) instead of reading one from
    the store."""

    store: Any
    parent: Any = None
    key: str = ""


def _group_keys(store: Any, global_ranks: list[int]) -> Formation:
    """How the group forms (Formation): above all, the store under keys every member names alike.

    torch hands a group's backend PrefixStore("<device>/", PrefixStore("<group name>/", S)), S the
    default group's store, and the name is a per-process count of groups: a rank whose count went
    another way (torch 2.14's shrink_group counts on the ranks that shrink, not on the one it left
    out) would wait under another prefix than its peers until the timeout. The members and how many
    groups of those members this process formed before agree on every member, since torch has each
    create its groups in the same order. The default group's shrink depth, the same on every
    survivor, keeps a generation's keys apart from the last one's (shrinking the default group
    restarts torch's names, and S, at the first default group's). A group formed under a default
    group that was never shrunk inherits from it; a shrunk one numbers the ranks anew, so its
    global ranks are not indices into it."""
    global _formed_under
    try:
        default = dist.distributed_c10d._get_default_group()
    except (RuntimeError, ValueError):
        return Formation(store)  # no default group yet: this is it, and its name is the same everywhere
    try:
        backend = default._get_backend(torch.device("cpu"))
    except (RuntimeError, ValueError):
        backend = None  # a default group without a CPU backend (nccl alone): never shrunk by pycomm
    depth = backend.shrink_depth if isinstance(backend, _C.PycommBackend) else 0
    shared = getattr(getattr(store, "underlying_store", None), "underlying_store", None)
    if shared is None or not global_ranks:
        return Formation(dist.PrefixStore(f"pycomm-world{depth}/", store) if depth > 0 else store)
    if _formed_under is None or _formed_under() is not default:
        _formed.clear()
        _formed_under = weakref.ref(default)
    members = tuple(global_ranks)
    nth = _formed.get(members, 0)
    _formed[members] = nth + 1
    digest = hashlib.sha256(",".join(map(str, members)).encode()).hexdigest()[:24]
    key = f"pycomm/group/{depth}/{digest}/{nth}/"
    parent = backend if isinstance(backend, _C.PycommBackend) and depth == 0 else None
    return Formation(dist.PrefixStore(key, shared), parent, key)


def create_backend(dist_options: Any, pg_options: Any) -> _C.PycommBackend:
    """The creator torch calls for every process group of backend "pycomm"."""
    # First, before anything can fail on one rank only: every member counts this group (_group_keys).
    ranks = [int(r) for r in getattr(dist_options, "global_ranks_in_group", None) or []]
    formation = _group_keys(dist_options.store, ranks)
    store = formation.store
    if pg_options is None:
        pg_options = Options()
    if not isinstance(pg_options, Options):
        raise TypeError(f"pycomm: pg_options must be a pycomm.Options, got {type(pg_options).__name__}")
    options = pg_options.resolved()
    config = {
        "timeout_ms": options.timeout_ms(dist_options.timeout),
        "group_name": str(dist_options.group_id or ""),
        "bind_host": bind_address(options, store),
        "algorithm": options.algorithm,
        "transport": options.transport,
        "cuda_transport": options.cuda_transport,
        "host_id": host_id(),
        "compression": options.compression,
        "chunk_bytes": options.chunk_bytes,
        "cuda_chunk_bytes": options.cuda_chunk_bytes,
        "bucket_bytes": options.bucket_bytes,
        "tcp_linger_ms": options.tcp_linger_ms,
        "unexpected_bytes": options.unexpected_bytes,
        "debug": options.debug,
        "cost_model": load_cost_model(),
    }
    backend = _C.PycommBackend(store, dist_options.group_rank, dist_options.group_size, config,
                               parent=formation.parent, lineage_key=formation.key, parent_ranks=ranks)
    backend._set_trace_group(str(dist_options.group_id or ""), "pycomm", ranks)
    return backend


def register() -> None:
    if BACKEND_NAME in dist.Backend.backend_list and hasattr(dist.Backend, BACKEND_NAME.upper()):
        plugin = dist.Backend._plugins.get(BACKEND_NAME.upper())
        if plugin is not None and plugin.creator_fn is create_backend:
            return
    dist.Backend.register_backend(BACKEND_NAME, create_backend, extended_api=True, devices=["cpu", "cuda"])
