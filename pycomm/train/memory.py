"""Keep freed memory mapped, so a step's large temporaries cost no page faults.

glibc serves every allocation above 32 MiB with a fresh mmap and unmaps it on
free. A step of the large model allocates several tensors of the gradient's
size (the n-gram table's dense gradient, the compression hooks' residual and
decoded copies), so each step would page-fault ~100 MB back in: measured on a
2-core VM, that is 0.33 s of a 0.10 s step. Serving them from the heap and
never trimming it keeps those pages mapped from one step to the next (the
process's resident size then stays at its peak, which for a trainer is
where it sits anyway). The same effect as running under jemalloc or tcmalloc,
without depending on either.

Applied in each rank before any tensor exists. Numerics are untouched. Where
libc is not glibc (macOS, musl) this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

# From glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_NEVER_TRIM = 1 << 30  # bytes free at the heap's top before glibc returns any (mallopt takes an int)


def keep_freed_memory() -> bool:
    """Tell glibc malloc never to mmap or trim; True if it took effect."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success.
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM))
