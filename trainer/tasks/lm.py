"""``task=lm``: a tiny character-level GPT on a text file.

The default corpus, ``trainer/data/corpus.txt``, ships with the package: ~60 KB of sentences
drawn from a small English grammar, so a few hundred steps visibly lower the loss with no
download. Point ``task_args.corpus`` at any UTF-8 text file to train on your own.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

DEFAULT_CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus.txt"


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


class TinyGPT(nn.Module):
    """A decoder-only transformer built from torch's own pre-norm encoder layers + a causal mask.

    The output head shares its weight with the token embedding (as in GPT-2).
    """

    def __init__(
        self,
        vocab_size: int,
        block_size: int,
        n_layer: int,
        n_head: int,
        n_embd: int,
        dropout: float,
    ):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(
            n_embd,
            n_head,
            4 * n_embd,
            dropout,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        # Nested tensors are an inference fast path for padded batches; we never pad.
        self.blocks = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.tok.weight
        # GPT-2's small init: N(0, 1) embeddings through a tied head give huge initial logits.
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)
        self.register_buffer(
            "causal_mask",
            nn.Transformer.generate_square_subsequent_mask(block_size),
            persistent=False,
        )

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.drop(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)))
        x = self.blocks(x, mask=self.causal_mask[:t, :t], is_causal=True)
        return self.head(self.norm(x))


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
        )
        self.eval_fraction = eval_fraction

    def build_model(self) -> nn.Module:
        return TinyGPT(**self.model_args)

    def build_datasets(self) -> tuple[CharChunks, CharChunks]:
        split = int(len(self.ids) * (1 - self.eval_fraction))
        return CharChunks(self.ids[:split], self.block_size), CharChunks(
            self.ids[split:], self.block_size
        )

    def loss(self, model: nn.Module, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        inputs, targets = batch
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        if model.training:  # the loop only reports eval metrics: skip the work while training
            return loss, {}
        return loss, {"accuracy": (logits.argmax(dim=-1) == targets).float().mean()}


# The factory for ``task=lm``: ``task_args`` are LMTask's keyword arguments.
build = LMTask
