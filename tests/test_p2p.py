"""Point-to-point ops (send/recv, isend/irecv, batch_isend_irecv) and object collectives."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from mp import run_ranks
from reference import check_equal, input_for
from support import Failures, assert_no_failures

MIB = 1 << 20
TIMEOUT_S = 120


def _exchange_worker(rank: int, world: int) -> tuple[list[str], int]:
    """Every rank sends 4 MiB to the next rank BEFORE receiving from the previous one.

    4 MiB does not fit in loopback socket buffers, so a backend that completes
    a send only when the peer has posted its recv, and progresses the recv only
    after that, deadlocks here (run_ranks reports the hang).
    """
    f = Failures(rank)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for k, dtype in enumerate(
        (torch.float32, torch.int64, torch.bfloat16, torch.uint8)
    ):
        n = 4 * MIB // torch.empty((), dtype=dtype).element_size()
        sent = input_for(k, rank, (n,), dtype, None)
        original = sent.clone()
        expected = input_for(k, prv, (n,), dtype, None)
        name = str(dtype).removeprefix("torch.")

        label = f"isend then irecv, 4 MiB {name}"
        with f.guard(label):
            got = torch.empty(n, dtype=dtype)
            send_req = dist.isend(sent, nxt)
            recv_req = dist.irecv(got, prv)
            send_req.wait()
            recv_req.wait()
            f.check(label, check_equal(got, expected))
            f.check(label + " send buffer unchanged", check_equal(sent, original))

        label = f"isend then blocking recv, 4 MiB {name}"
        with f.guard(label):
            got = torch.empty(n, dtype=dtype)
            send_req = dist.isend(sent, nxt)
            dist.recv(got, prv)
            send_req.wait()
            f.check(label, check_equal(got, expected))
    return f.result()


@pytest.mark.parametrize("world", [2, 3])
def test_isend_before_irecv_large(backend: str, world: int) -> None:
    assert_no_failures(
        run_ranks(_exchange_worker, world, backend=backend, timeout_s=TIMEOUT_S)
    )


# Sizes of a message that is held because it arrived before its receive was posted: empty, one
# element, odd, either side of the 512 KiB chunk and several chunks (int64 elements).
EARLY_COUNTS = (0, 1, 4099, 65535, 65536, 65537, 524287)


def _arrived_before_posted_worker(rank: int, world: int) -> tuple[list[str], int]:
    """Rank 1 sends, then both ranks pass a barrier, and only then does rank 0 post its receive.
    The barrier's frames follow the message on the same socket, so when rank 0 has passed it the
    whole message is already held by the transport: the receive is served from what was held."""
    f = Failures(rank)
    for k, n in enumerate(EARLY_COUNTS):
        label = f"message held before its receive, {n} int64"
        with f.guard(label):
            if rank == 1:
                sent = input_for(600 + k, 1, (n,), torch.int64, None)
                work = dist.isend(sent, 0, tag=11)
                dist.barrier()
                work.wait()
                f.check(label + ", send buffer unchanged", check_equal(sent, input_for(600 + k, 1, (n,), torch.int64, None)))
            else:
                dist.barrier()
                got = torch.full((n,), -1, dtype=torch.int64)
                dist.recv(got, 1, tag=11)
                f.check(label, check_equal(got, input_for(600 + k, 1, (n,), torch.int64, None)))
    return f.result()


@pytest.mark.usefixtures("pycomm")
def test_message_held_before_its_receive_is_exact(pycomm: Any) -> None:
    assert_no_failures(run_ranks(_arrived_before_posted_worker, 2, backend="pycomm", timeout_s=TIMEOUT_S,
                                 pg_options=pycomm.Options(transport="tcp")))


def _batch_ring_worker(rank: int, world: int) -> tuple[list[str], int]:
    """batch_isend_irecv exchanging with both ring neighbours at once, several sizes/dtypes."""
    f = Failures(rank)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    seed = 0
    for dtype in (torch.float32, torch.float16, torch.int32, torch.bool):
        for n in (0, 1, 13, 4099, MIB):
            seed += 1
            name = str(dtype).removeprefix("torch.")
            label = f"batch_isend_irecv ring {name} n={n}"

            # Message from a to b is seeded by (a, b) so direction mix-ups are visible.
            def msg(
                src: int,
                dst: int,
                seed: int = seed,
                dtype: torch.dtype = dtype,
                n: int = n,
            ) -> torch.Tensor:
                return input_for(seed, src * world + dst, (n,), dtype, None)

            from_prev = torch.empty(n, dtype=dtype)
            from_next = torch.empty(n, dtype=dtype)
            ops = [
                dist.P2POp(dist.isend, msg(rank, nxt), nxt),
                dist.P2POp(dist.isend, msg(rank, prv), prv),
                dist.P2POp(dist.irecv, from_prev, prv),
                dist.P2POp(dist.irecv, from_next, nxt),
            ]
            with f.guard(label):
                for req in dist.batch_isend_irecv(ops):
                    req.wait()
                f.check(label + " from prev", check_equal(from_prev, msg(prv, rank)))
                f.check(label + " from next", check_equal(from_next, msg(nxt, rank)))
    return f.result()


def test_batch_isend_irecv_ring(backend: str) -> None:
    assert_no_failures(
        run_ranks(_batch_ring_worker, 3, backend=backend, timeout_s=TIMEOUT_S)
    )


# (tag, numel): one large message so that tag matching cannot rely on everything
# already sitting in a receive buffer.
_TAGGED = ((1, 10), (2, 1000), (3, 300_000))


def _tags_worker(rank: int, world: int) -> tuple[list[str], int]:
    f = Failures(rank)
    if rank == 0:
        reqs = [
            dist.isend(input_for(tag, 0, (n,), torch.float32, None), 1, tag=tag)
            for tag, n in _TAGGED
        ]
        # Two messages with the same tag must arrive in order.
        reqs += [
            dist.isend(input_for(70 + k, 0, (5,), torch.int64, None), 1, tag=7)
            for k in range(2)
        ]
        for req in reqs:
            req.wait()
        dist.send(torch.tensor([1.5, -2.5], dtype=torch.bfloat16), 1, tag=0)
        got = torch.empty(3, dtype=torch.bool)
        dist.recv(got, 1, tag=9)
        f.check("reply", check_equal(got, torch.tensor([True, False, True])))
    elif rank == 1:
        # Receive in a different order than sent: matching must be by tag.
        for tag, n in reversed(_TAGGED):
            got = torch.empty(n, dtype=torch.float32)
            dist.recv(got, 0, tag=tag)
            f.check(
                f"tag {tag}",
                check_equal(got, input_for(tag, 0, (n,), torch.float32, None)),
            )
        for k in range(2):
            got = torch.empty(5, dtype=torch.int64)
            dist.recv(got, 0, tag=7)
            f.check(
                f"tag 7 message {k}",
                check_equal(got, input_for(70 + k, 0, (5,), torch.int64, None)),
            )
        got = torch.empty(2, dtype=torch.bfloat16)
        dist.recv(got, 0, tag=0)
        f.check(
            "bf16 tag 0",
            check_equal(got, torch.tensor([1.5, -2.5], dtype=torch.bfloat16)),
        )
        dist.send(torch.tensor([True, False, True]), 0, tag=9)
    return f.result()


def test_send_recv_tags(backend: str) -> None:
    results = run_ranks(_tags_worker, 2, backend=backend, timeout_s=TIMEOUT_S)
    assert_no_failures(results)


def _obj(key: int) -> dict[str, Any]:
    """An object whose pickle size varies a lot with key (0 bytes to ~100 KB of payload)."""
    return {
        "key": key,
        "text": "pycomm" * (key * 5_000 % 17_000),
        "nested": [key, (key, None), {"k": 1.5}],
        "tensor": torch.arange(key + 1, dtype=torch.float64),
    }


def _same(a: Any, b: Any) -> bool:
    """Deep equality that also works for the tensor inside _obj."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    return bool(a == b)


def _objects_worker(rank: int, world: int) -> tuple[list[str], int]:
    f = Failures(rank)

    with f.guard("all_gather_object"):
        out: list[Any] = [None] * world
        dist.all_gather_object(out, _obj(rank))
        for r in range(world):
            f.check(
                f"all_gather_object[{r}]",
                None if _same(out[r], _obj(r)) else f"got {out[r]!r:.200}",
            )

    src = 1 % world
    with f.guard("broadcast_object_list"):
        objs: list[Any] = (
            [_obj(src + 10), 42, None] if rank == src else [None, None, "junk"]
        )
        dist.broadcast_object_list(objs, src=src)
        ok = _same(objs[0], _obj(src + 10)) and objs[1] == 42 and objs[2] is None
        f.check("broadcast_object_list", None if ok else f"got {objs!r:.200}")

    dst = world - 1
    with f.guard("gather_object"):
        gathered: list[Any] | None = [None] * world if rank == dst else None
        dist.gather_object(_obj(rank + 20), gathered, dst=dst)
        if gathered is not None:
            for r in range(world):
                f.check(
                    f"gather_object[{r}]",
                    None if _same(gathered[r], _obj(r + 20)) else "wrong object",
                )

    with f.guard("scatter_object_list"):
        received: list[Any] = [None]
        dist.scatter_object_list(
            received, [_obj(30 + j) for j in range(world)] if rank == 0 else None, src=0
        )
        f.check(
            "scatter_object_list",
            None if _same(received[0], _obj(30 + rank)) else "wrong object",
        )

    # send_object_list / recv_object_list along a chain 0 -> 1 -> ... -> world-1.
    with f.guard("send/recv_object_list"):
        if rank > 0:
            got: list[Any] = [None, None]
            dist.recv_object_list(got, src=rank - 1)
            ok = _same(got[0], _obj(40 + rank - 1)) and got[1] == "tail"
            f.check("recv_object_list", None if ok else f"got {got!r:.200}")
        if rank < world - 1:
            dist.send_object_list([_obj(40 + rank), "tail"], dst=rank + 1)
        f.check("object collectives ran", None)
    return f.result()


@pytest.mark.parametrize("world", [2, 3])
def test_object_collectives(backend: str, world: int) -> None:
    assert_no_failures(
        run_ranks(_objects_worker, world, backend=backend, timeout_s=TIMEOUT_S)
    )
