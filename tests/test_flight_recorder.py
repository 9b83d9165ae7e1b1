"""The flight recorder: the last ops of each group in torch's dump format, dumped on a collective's
timeout (with TORCH_FR_DUMP_TEMP_FILE set) and on request, read by torch's own analyzer
(`python -m torch.distributed.flight_recorder.fr_trace`). World 3: rank 2 skips one all_reduce;
ranks 0 and 1 time out and dump, rank 2 dumps on request; the analyzer names rank 2 and the op.
Also the entries themselves (sequence numbers, sizes, dtypes, states), TORCH_FR_BUFFER_SIZE's ring
and 0, and a dump path that cannot be written."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from mp import run_ranks
from support import Failures, assert_no_failures

TIMEOUT_S = 120
PREFIX = "pycomm_fr_rank_"


def skipping_worker(rank: int, world: int, folder: str) -> tuple[list[str], int]:
    import pycomm

    f = Failures(rank)
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    dist.all_reduce(t)  # rank 2's last: ranks 0 and 1 run one more
    if rank < 2:
        try:
            dist.all_reduce(t)
            f.add("the skipped all_reduce", "completed without rank 2")
        except RuntimeError as e:
            f.check("the skipped all_reduce times out", None if "timed out" in str(e).lower() or "timeout" in str(e).lower() else str(e))
        dumped = Path(folder) / f"{PREFIX}{rank}"
        f.check("dumped on the timeout", None if dumped.exists() else f"no {dumped}")
    else:
        written = pycomm.dump_flight_recorder()
        f.check("dump on request", None if written == os.path.join(folder, f"{PREFIX}2") else written)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all((Path(folder) / f"{PREFIX}{r}").exists() for r in range(2)):
            time.sleep(0.05)
    return f.result()


def test_analyzer_names_the_rank_that_skipped_an_all_reduce() -> None:
    with tempfile.TemporaryDirectory() as folder:
        env = {"TORCH_FR_DUMP_TEMP_FILE": os.path.join(folder, PREFIX), "TORCH_FR_BUFFER_SIZE": "100"}
        assert_no_failures(
            run_ranks(skipping_worker, 3, backend="pycomm", timeout_s=TIMEOUT_S, args=(folder,), pg_timeout_s=3,
                      destroy=False, env=env)
        )
        assert sorted(os.listdir(folder)) == [f"{PREFIX}{r}" for r in range(3)]
        analysis = subprocess.run(
            [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", folder, "-p", PREFIX],
            capture_output=True, text=True, timeout=120,
        )
        report = analysis.stdout + analysis.stderr
        assert analysis.returncode == 0, report
        assert "missing ranks: {2}" in report, report
        assert "all_reduce" in report and "sequence number: 4" in report, report
        # The ops every rank ran match: nothing else reported (a broadcast's root writes nothing,
        # yet its entry must carry the same sizes as the others').
        assert "has errors" not in report and "MISMATCH" not in report, report


def entries_worker(rank: int, world: int) -> tuple[list[str], int]:
    import pycomm

    f = Failures(rank)
    dist.all_reduce(torch.ones(5, 2))
    dist.all_gather_into_tensor(torch.empty(world * 3, dtype=torch.int64), torch.ones(3, dtype=torch.int64))
    if rank == 0:
        dist.send(torch.ones(7, dtype=torch.float16), 1)
    elif rank == 1:
        dist.recv(torch.empty(7, dtype=torch.float16), 0)
    dist.barrier()
    dump = pycomm.flight_recorder_entries()
    f.check("version", None if dump["version"] == "2.10" else dump["version"])
    pg = dump["pg_config"]
    f.check("pg_config ranks", None if pg.get("0", {}).get("ranks") == str(list(range(world))) else f"{pg}")
    mine = [e for e in dump["entries"] if e["process_group"][0] == "0"]
    names = [e["profiling_name"] for e in mine]
    expected = ["gloo:all_reduce", "gloo:_all_gather_base"]
    expected += ["gloo:send 0->1"] if rank == 0 else ["gloo:recv 1<-0"] if rank == 1 else []
    expected += ["gloo:barrier"]
    f.check("names", None if names == expected else f"{names}")
    f.check("sizes", None if mine[0]["input_sizes"] == [[5, 2]] and mine[1]["output_sizes"] == [[world * 3]] else f"{mine[:2]}")
    f.check("dtypes", None if mine[0]["input_dtypes"] == ["Float"] and mine[1]["input_dtypes"] == ["Long"] else f"{mine[:2]}")
    collectives = [e["collective_seq_id"] for e in mine if not e["is_p2p"]]
    f.check("collective sequence numbers", None if collectives == [1, 2, 3] else f"{collectives}")
    p2p = [e["p2p_seq_id"] for e in mine if e["is_p2p"]]
    f.check("p2p sequence numbers", None if p2p == ([1] if rank < 2 else []) else f"{p2p}")
    states = {e["state"] for e in mine}
    f.check("states", None if states == {"completed"} else f"{states}")
    ids = [e["record_id"] for e in dump["entries"]]
    f.check("record ids ascending", None if ids == sorted(ids) else f"{ids}")
    # A path that cannot be written: a clear error naming it, and the group keeps working.
    with pytest.raises(RuntimeError, match="no-such-folder"):
        pycomm.dump_flight_recorder("/proc/no-such-folder/dump")
    t = torch.ones(3)
    dist.all_reduce(t)
    f.check("all_reduce after a failed dump", None if torch.equal(t, torch.full((3,), float(world))) else f"{t}")
    with pytest.raises(ValueError, match="TORCH_FR_DUMP_TEMP_FILE"):
        pycomm.dump_flight_recorder()
    return f.result()


def test_entries_describe_each_op() -> None:
    assert_no_failures(run_ranks(entries_worker, 3, backend="pycomm", timeout_s=TIMEOUT_S))


def ring_worker(rank: int, world: int, capacity: int) -> tuple[list[str], int]:
    import pycomm

    f = Failures(rank)
    for _ in range(12):
        dist.all_reduce(torch.ones(2))
    entries = pycomm.flight_recorder_entries()["entries"]
    seqs = [e["collective_seq_id"] for e in entries]
    expected = list(range(12 - capacity + 1, 13)) if capacity else []
    f.check(f"TORCH_FR_BUFFER_SIZE={capacity}", None if seqs == expected else f"{seqs}")
    return f.result()


@pytest.mark.parametrize("capacity", [0, 5])
def test_buffer_size_keeps_the_last_entries(capacity: int) -> None:
    env = {"TORCH_FR_BUFFER_SIZE": str(capacity)}
    assert_no_failures(run_ranks(ring_worker, 2, backend="pycomm", timeout_s=TIMEOUT_S, args=(capacity,), env=env))


def uneven_worker(rank: int, world: int, folder: str) -> tuple[list[str], int]:
    """Ops whose entries differ between ranks by design (uneven all_to_all_single splits) must not
    read as mismatches; dumps written from two
    threads at once to one path must both succeed and leave one whole dump."""
    import threading

    import pycomm

    f = Failures(rank)
    n_in = 3 + 2 * rank  # rank r sends 3 + 2r elements, split evenly as far as they go
    splits_in = [n_in // world + (1 if j < n_in % world else 0) for j in range(world)]
    all_in = [[(3 + 2 * r) // world + (1 if j < (3 + 2 * r) % world else 0) for j in range(world)] for r in range(world)]
    splits_out = [all_in[r][rank] for r in range(world)]
    out = torch.empty(sum(splits_out))
    dist.all_to_all_single(out, torch.ones(n_in), splits_out, splits_in)
    # (No point-to-point op here: torch 2.13's analyzer groups a send right after a collective into
    # one coalesced op when its p2p sequence number equals the collective's, whatever the backend.)
    dist.barrier()
    path = os.path.join(folder, f"{PREFIX}{rank}")
    errors: list[str] = []

    def dump_many() -> None:
        for _ in range(20):
            try:
                pycomm.dump_flight_recorder(path)
            except RuntimeError as e:
                errors.append(str(e))

    threads = [threading.Thread(target=dump_many) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    f.check("dumps from two threads", None if not errors else errors[0])
    leftovers = [name for name in os.listdir(folder) if name.startswith(PREFIX) and not name[len(PREFIX):].isdigit()]
    f.check("no partial files named like dumps", None if not leftovers else f"{leftovers}")
    return f.result()


def test_uneven_ops_and_concurrent_dumps_read_cleanly() -> None:
    with tempfile.TemporaryDirectory() as folder:
        assert_no_failures(run_ranks(uneven_worker, 3, backend="pycomm", timeout_s=TIMEOUT_S, args=(folder,)))
        analysis = subprocess.run(
            [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", folder, "-p", PREFIX],
            capture_output=True, text=True, timeout=120,
        )
        report = analysis.stdout + analysis.stderr
        assert analysis.returncode == 0 and "Traceback" not in report, report
        assert "MISMATCH" not in report and "has errors" not in report, report
