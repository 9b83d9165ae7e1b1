"""Codec throughput on this CPU: GB/s of fp32 data for encode, decode and decodeAdd (acc += decode)
of each pycomm codec, one thread, 64 MiB, against a memcpy of the same fp32 buffer measured the same
way, and torch's own tensor.to(float16 / bfloat16 / float8) casts.

    python3 benchmarks/codec_throughput.py [--mib 64] [--reps 7] [--json PATH]

Every pycomm call writes into an output allocated (and touched) once beforehand, as the collectives
do with their scratch buffers: a fresh 64 MiB output per call costs page faults that can take longer
than the conversion itself (the "fresh out" column shows that cost for decode). The memcpy row is
`dst.copy_(src)` between two such fp32 tensors; "of memcpy" is a codec's GB/s over it. Timings are
medians of --reps runs after one warm-up. Writes benchmarks/results/codec_throughput.json (or --json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from pycomm import _C

ROOT = Path(__file__).resolve().parent.parent
TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn,
                "fp8_e5m2": torch.float8_e5m2}


def gbps(fn: Callable[[], object], nbytes: int, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="fp32 buffer size in MiB (default 64)")
    parser.add_argument("--reps", type=int, default=7, help="timed runs per figure, median taken (default 7)")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "codec_throughput.json",
                        help="where to write the results (default benchmarks/results/codec_throughput.json)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    n = args.mib * 1024 * 1024 // 4
    nbytes = n * 4
    x = torch.randn(n)
    decoded = torch.empty(n)
    acc = torch.zeros(n)
    copy = torch.empty(n)
    memcpy = gbps(lambda: copy.copy_(x), nbytes, args.reps)
    isa = _C.codec_isa() if hasattr(_C, "codec_isa") else "unknown (a build from before the codec kernel tables)"
    header = (f"{'codec':<10}{'encode':>8}{'of memcpy':>11}{'decode':>8}{'of memcpy':>11}{'decodeAdd':>11}"
              f"{'of memcpy':>11}{'decode, fresh out':>19}{'torch .to()':>13}{'torch back':>12}")
    print(f"GB/s of fp32, {args.mib} MiB, 1 thread, median of {args.reps}; memcpy (dst.copy_(src)) {memcpy:.2f} GB/s; "
          f"codec kernels: {isa}")
    print(header)
    rows = []
    for codec, dtype in TORCH_DTYPES.items():
        encoded = _C.codec_encode(codec, x)
        enc = gbps(lambda: _C.codec_encode(codec, x, out=encoded), nbytes, args.reps)
        dec = gbps(lambda: _C.codec_decode(codec, encoded, n, out=decoded), nbytes, args.reps)
        dec_add = gbps(lambda: _C.codec_decode_add(codec, encoded, acc), nbytes, args.reps)
        dec_fresh = gbps(lambda: _C.codec_decode(codec, encoded, n), nbytes, args.reps)
        cast = x.to(dtype)
        to = gbps(lambda: x.to(dtype), nbytes, args.reps)
        back = gbps(lambda: cast.to(torch.float32), nbytes, args.reps)
        rows.append({"codec": codec, "encode_GBps": enc, "decode_GBps": dec, "decode_add_GBps": dec_add,
                     "encode_of_memcpy": enc / memcpy, "decode_of_memcpy": dec / memcpy,
                     "decode_add_of_memcpy": dec_add / memcpy, "decode_fresh_out_GBps": dec_fresh,
                     "torch_to_GBps": to, "torch_back_GBps": back})
        print(f"{codec:<10}{enc:>8.2f}{enc / memcpy:>11.0%}{dec:>8.2f}{dec / memcpy:>11.0%}{dec_add:>11.2f}"
              f"{dec_add / memcpy:>11.0%}{dec_fresh:>19.2f}{to:>13.2f}{back:>12.2f}")
    command = " ".join(["python3", "benchmarks/codec_throughput.py", *argv])
    result = {"command": command, "mib": args.mib, "reps": args.reps, "threads": 1, "codec_isa": isa,
              "memcpy_GBps": memcpy, "rows": rows}
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
