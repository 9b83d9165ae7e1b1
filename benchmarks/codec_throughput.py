"""Codec throughput on this CPU: GB/s of fp32 input for encode and decode of each pycomm codec,
against torch's own tensor.to(float16 / bfloat16 / float8) casts, one thread, 64 MiB.

    python3 benchmarks/codec_throughput.py
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from pycomm import _C

ROOT = Path(__file__).resolve().parent.parent
TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn,
                "fp8_e5m2": torch.float8_e5m2}


def gbps(fn, nbytes: int, reps: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9


def main() -> int:
    torch.set_num_threads(1)
    n = 16 * 1024 * 1024
    x = torch.randn(n)
    nbytes = x.numel() * 4
    rows = []
    print(f"{'codec':<10}{'encode':>10}{'decode':>10}{'torch .to()':>13}{'torch back':>12}   GB/s of fp32, 64 MiB, 1 thread")
    for codec, dtype in TORCH_DTYPES.items():
        encoded = _C.codec_encode(codec, x)
        enc = gbps(lambda: _C.codec_encode(codec, x), nbytes)
        dec = gbps(lambda: _C.codec_decode(codec, encoded, n), nbytes)
        cast = x.to(dtype)
        to = gbps(lambda: x.to(dtype), nbytes)
        back = gbps(lambda: cast.to(torch.float32), nbytes)
        rows.append({"codec": codec, "encode_GBps": enc, "decode_GBps": dec, "torch_to_GBps": to,
                     "torch_back_GBps": back})
        print(f"{codec:<10}{enc:>10.2f}{dec:>10.2f}{to:>13.2f}{back:>12.2f}")
    out = ROOT / "benchmarks" / "results" / "codec_throughput.json"
    out.write_text(json.dumps({"command": "python3 benchmarks/codec_throughput.py", "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
