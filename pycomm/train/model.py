"""A small decoder-only transformer over bytes (GPT-style, pre-LayerNorm).

At the ``small`` preset deliberately tiny (0.14M parameters): the point is a
real gradient all-reduce every step, not a good language model, and 2 CPU
cores must run tens of steps per minute at world 2. The ``large`` preset adds a
hashed n-gram input embedding (pycomm.train.ngram): tens of millions of
parameters whose gradient DDP must all-reduce, for little more compute. No
dropout: runs are then a pure function of the seed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pycomm.train.ngram import HashedNgrams


class _Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not a multiple of n_heads {n_heads}")
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, dim = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(dim, dim=2)
        # (batch, heads, time, head_dim) for scaled_dot_product_attention
        q, k, v = (t.view(batch, time, self.n_heads, dim // self.n_heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, time, dim))
        return x + self.mlp(self.ln2(x))


class CharTransformer(nn.Module):
    def __init__(
        self, vocab: int, context: int, d_model: int, n_heads: int, n_layers: int, hash_buckets: int = 0
    ) -> None:
        super().__init__()
        self.context = context
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(context, d_model)
        # Created only when asked for: the small model then draws the same
        # initial weights from the seed as it did before this option existed.
        self.ngrams = HashedNgrams(hash_buckets, d_model) if hash_buckets else None
        self.blocks = nn.ModuleList(_Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        # Untied output head: with tied weights one parameter gets gradient from
        # two places, which is fine for DDP but makes the bucket story less plain.
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.apply(_init)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (batch, time, vocab) for byte ids (batch, time)."""
        time = idx.shape[1]
        if time > self.context:
            raise ValueError(f"sequence of {time} exceeds the context of {self.context}")
        x = self.tok(idx) + self.pos(torch.arange(time, device=idx.device))
        if self.ngrams is not None:
            x = x + self.ngrams(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy (nats).

    A free function taking logits, so the training step calls the DDP wrapper
    (whose forward arms the gradient all-reduce) and not the bare module.
    """
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _init(module: nn.Module) -> None:
    # GPT-2's scheme: small normal weights keep the initial loss near ln(256).
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
