from typing import Any

import torch.distributed as dist

class PycommBackend(dist.ProcessGroup):  # a c10d Backend; torch wraps it in a ProcessGroup
    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        timeout_ms: int,
        group_name: str,
        bind_host: str,
        algorithm: str,
        chunk_bytes: int,
        debug: str,
    ) -> None: ...

def cuda_available() -> bool: ...
def interface_address(ifname: str) -> str: ...
def local_address_toward(host: str) -> str: ...
def __getattr__(name: str) -> Any: ...
