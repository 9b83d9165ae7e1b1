"""Hashed byte n-gram embedding: many parameters, little compute, a dense gradient.

Each position gets, besides its byte's embedding, the embeddings of the byte
bigram and trigram that end there, looked up in one shared table of
``buckets`` rows by a fixed hash (hash embeddings, as in fastText's subword
buckets). A lookup costs next to nothing however large the table, but DDP
all-reduces the table's whole gradient every step (a dense nn.Embedding
gradient is mostly zeros, and just as many bytes): the trainer's large model
uses this to make gradient communication, not compute, the bulk of a step on a
2-core machine.

Positions before the start of a sequence read as byte 256 (a start marker
outside the byte range), so every position has a bigram and a trigram.
"""

from __future__ import annotations

import torch
from torch import nn

ORDERS = (2, 3)  # bigrams and trigrams
START = 256  # the "byte" before a sequence's first one
_RADIX = 257  # bytes 0..255 and START
# Knuth's multiplicative hash: the low 32 bits of key * an odd constant near
# 2**32 / golden ratio, then scaled to [0, buckets). Keys stay below 2**27, so
# key * constant stays below 2**59 and int64 arithmetic never overflows.
_MULTIPLIER = 2654435761


def ngram_ids(idx: torch.Tensor, buckets: int, orders: tuple[int, ...] = ORDERS) -> torch.Tensor:
    """Bucket ids (len(orders), batch, time), int64, of the n-grams ending at each position of idx (batch, time)."""
    if buckets < 1 or buckets > 1 << 24:
        raise ValueError(f"buckets must be in [1, 2**24], got {buckets}")
    batch, time = idx.shape
    longest = max(orders)
    padded = torch.cat([torch.full((batch, longest - 1), START, dtype=torch.int64), idx.long()], dim=1)
    ids = []
    for order in orders:
        # key = order * 257**3 + sum of byte_i * 257**i over the n-gram's bytes (newest first):
        # distinct for every n-gram of every order up to 3, so only the hash can collide.
        key = torch.full((batch, time), order * _RADIX**3, dtype=torch.int64)
        for back in range(order):
            start = longest - 1 - back
            key += padded[:, start : start + time] * _RADIX**back
        mixed = (key * _MULTIPLIER) & 0xFFFFFFFF
        ids.append((mixed * buckets) >> 32)
    return torch.stack(ids)


class HashedNgrams(nn.Module):
    """Sum over ``orders`` of the embedding of the n-gram ending at each position."""

    def __init__(self, buckets: int, d_model: int, orders: tuple[int, ...] = ORDERS) -> None:
        super().__init__()
        if max(orders) > 3 or min(orders) < 1:
            raise ValueError(f"n-gram orders must be 1..3, got {orders}")
        self.buckets = buckets
        self.orders = orders
        self.table = nn.Embedding(buckets, d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """(batch, time, d_model) for byte ids (batch, time)."""
        return self.table(ngram_ids(idx, self.buckets, self.orders)).sum(dim=0)
