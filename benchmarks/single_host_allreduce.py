"""One host, world W: medians of pycomm.all_reduce uncompressed and compressed (1 MiB and 64 MiB
float32), written as JSON by rank 0; for comparing two builds in one session, alternating:

    PYTHONPATH=<checkout A> python3 benchmarks/single_host_allreduce.py 2 29702 a-w2.json
    PYTHONPATH=<checkout B> python3 benchmarks/single_host_allreduce.py 2 29712 b-w2.json
"""
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def worker(rank, world, port, out):
    import pycomm
    torch.set_num_threads(1)
    dist.init_process_group("pycomm", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    res = {}
    for nbytes in (1 << 20, 64 << 20):
        x = torch.randn(nbytes // 4)
        for codec in ("none", "fp16", "fp8_e4m3"):
            times = []
            for it in range(8 if nbytes < 8 << 20 else 5):
                t = x.clone(); dist.barrier(); s = time.perf_counter()
                pycomm.all_reduce(t, compression=codec)
                times.append(time.perf_counter() - s)
            res[f"{nbytes >> 20}MiB {codec}"] = statistics.median(times[1:])
    if rank == 0:
        open(out, "w").write(json.dumps(res))
    dist.destroy_process_group()

if __name__ == "__main__":
    world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    mp.start_processes(worker, args=(world, port, out), nprocs=world, start_method="spawn")
