"""``task=lm``: a tiny character-level GPT on a text file.

The default corpus, ``trainer/data/corpus.txt``, ships with the package: ~60 KB of sentences
drawn from a small English grammar, so a few hundred steps visibly lower the loss with no
download. Point ``task_args.corpus`` at any UTF-8 text file to train on your own.

The model is a plain pre-norm decoder in the shape of GPT-2 (and of nanoGPT's ``model.py``):
one fused q/k/v projection per layer and ``F.scaled_dot_product_attention(is_causal=True)``, so
on a GPU attention runs in the flash kernel with no mask and no layout copies around it.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

DEFAULT_CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus.txt"
# The embedding and head get this many rows at least, rounded up from the vocabulary: a head
# of 30 columns is a matrix product that bf16 tensor cores cannot tile (they want multiples
# of 8); 64 is nanoGPT's choice (its 50257 tokens become 50304). The extra rows are never a
# target, so training pushes their logits down; the loss and accuracy are unchanged in meaning.
VOCAB_MULTIPLE = 64


class CharChunks(Dataset):
    """Non-overlapping windows of ``block_size + 1`` characters as (input, target) pairs."""

    def __init__(self, ids: torch.Tensor, block_size: int):
        self.ids = ids
        self.block_size = block_size

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.block_size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.ids[i * self.block_size : (i + 1) * self.block_size + 1]
        return chunk[:-1], chunk[1:]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: one q/k/v matrix product, then SDPA with is_causal."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd: must be a multiple of n_head={n_head} (got {n_embd})")
        self.n_head = n_head
        self.dropout = dropout
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        # (b, t, 3, heads, head_dim) -> q, k, v as (b, heads, t, head_dim) views, the layout
        # SDPA takes; the head dimension stays contiguous, as the flash kernel needs.
        q, k, v = self.qkv(x).view(b, t, 3, self.n_head, c // self.n_head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x)); GELU MLP of 4x width."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd, bias=bias),
            nn.GELU(),
            nn.Linear(4 * n_embd, n_embd, bias=bias),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    """A decoder-only transformer; the output head shares its weight with the token embedding.

    ``forward(idx, targets)`` returns ``(logits, loss)`` (the loss is None without targets),
    as nanoGPT's does: with ``compile=true`` the cross-entropy is compiled with the model.
    """

    def __init__(
        self,
        vocab_size: int,
        block_size: int,
        n_layer: int,
        n_head: int,
        n_embd: int,
        dropout: float,
        bias: bool = False,
    ):
        super().__init__()
        rows = -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
        self.tok = nn.Embedding(rows, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout, bias) for _ in range(n_layer))
        self.norm = nn.LayerNorm(n_embd, bias=bias)
        self.head = nn.Linear(n_embd, rows, bias=False)
        self.head.weight = self.tok.weight
        # GPT-2's init: N(0, 0.02) everywhere (N(0, 1) embeddings through the tied head would
        # give huge initial logits), and the two projections into the residual stream scaled
        # down by sqrt(2 * n_layer) so the stream's variance does not grow with depth.
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:
            for proj in (block.attn.proj, block.mlp[2]):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * n_layer))

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        t = idx.shape[1]
        x = self.drop(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class LMTask:
    """Next-character prediction; metrics: perplexity is exp(loss), so only ``accuracy``."""

    def __init__(
        self,
        corpus: str | None = None,
        block_size: int = 64,
        n_layer: int = 2,
        n_head: int = 4,
        n_embd: int = 64,
        dropout: float = 0.1,
        bias: bool = False,
        eval_fraction: float = 0.1,
    ):
        text = Path(corpus or DEFAULT_CORPUS).read_text(encoding="utf-8")
        self.vocab = sorted(set(text))
        lookup = {c: i for i, c in enumerate(self.vocab)}
        self.ids = torch.tensor([lookup[c] for c in text], dtype=torch.long)
        self.block_size = block_size
        self.tokens_per_sample = block_size  # read by the loop for tokens_per_s
        self.model_args = dict(
            vocab_size=len(self.vocab),
            block_size=block_size,
            n_layer=n_layer,
            n_head=n_head,
            n_embd=n_embd,
            dropout=dropout,
            bias=bias,
        )
        self.eval_fraction = eval_fraction

    def build_model(self) -> nn.Module:
        return TinyGPT(**self.model_args)

    def blocks(self, model: TinyGPT) -> list[nn.Module]:
        """The transformer blocks: what strategy fsdp shards one by one, and what
        activation_checkpointing recomputes."""
        return list(model.blocks)

    def build_datasets(self) -> tuple[CharChunks, CharChunks]:
        split = int(len(self.ids) * (1 - self.eval_fraction))
        return CharChunks(self.ids[:split], self.block_size), CharChunks(
            self.ids[split:], self.block_size
        )

    def loss(self, model: nn.Module, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        inputs, targets = batch
        logits, loss = model(inputs, targets)
        if model.training:  # the loop only reports eval metrics: skip the work while training
            return loss, {}
        return loss, {"accuracy": (logits.argmax(dim=-1) == targets).float().mean()}


# The factory for ``task=lm``: ``task_args`` are LMTask's keyword arguments.
build = LMTask
