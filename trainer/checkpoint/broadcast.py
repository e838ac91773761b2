"""Rank 0's training state on every rank, in bounded pieces: how a resume needs no shared disk.

Only rank 0 reads a checkpoint. It sends the others a *skeleton* (the state with every tensor
replaced by its shape and dtype: small, pickled through one ``broadcast_object``), then the
tensors' bytes as one stream cut into chunks of at most :data:`CHUNK_BYTES`, each one
``dist.broadcast``. Every tensor is viewed as bytes, so tensors of every dtype share the stream
and one buffer. The chunks travel on the collective's device (CPU for gloo, the GPU for NCCL);
on CPU a chunk that lies inside one tensor is broadcast straight from and into that tensor, with
no copy. Each rank thus holds the state plus one chunk, never a pickled copy of a multi-GB state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from trainer import distributed as distributed_

#: The most bytes one broadcast carries.
CHUNK_BYTES = 64 << 20


@dataclass(frozen=True)
class _Slot:
    """Where the skeleton had a tensor: its index in the stream, shape and dtype."""

    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype


def _split(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """``obj`` with each tensor replaced by a ``_Slot`` (appended to ``tensors``)."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _Slot(len(tensors) - 1, tuple(obj.shape), obj.dtype)
    if isinstance(obj, dict):
        return {k: _split(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_split(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_split(v, tensors) for v in obj)
    return obj


def _join(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(skeleton, _Slot):
        return tensors[skeleton.index]
    if isinstance(skeleton, dict):
        return {k: _join(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, list):
        return [_join(v, tensors) for v in skeleton]
    if isinstance(skeleton, tuple):
        return tuple(_join(v, tensors) for v in skeleton)
    return skeleton


def _collective_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_state(state: Any, chunk_bytes: int = CHUNK_BYTES) -> Any:
    """Rank 0's ``state`` (dicts, lists and tuples of tensors and plain values) on every rank,
    tensors on CPU; the others pass anything (None). Collective; identity without a group."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return state
    main = dist.get_rank() == 0
    tensors: list[torch.Tensor] = []
    skeleton = distributed_.broadcast_object(_split(state, tensors) if main else None)
    if main:
        # Non-contiguous tensors (rare in a state dict) travel as a contiguous copy.
        tensors = [t.detach().cpu().contiguous() for t in tensors]
    else:
        slots: list[_Slot] = []
        _slots(skeleton, slots)  # in stream order: the same walk as _split's
        tensors = [torch.empty(s.shape, dtype=s.dtype) for s in slots]
    _broadcast_bytes([t.reshape(-1).view(torch.uint8) for t in tensors], main, chunk_bytes)
    return _join(skeleton, tensors)


def _slots(skeleton: Any, out: list[_Slot]) -> None:
    if isinstance(skeleton, _Slot):
        out.append(skeleton)
    elif isinstance(skeleton, dict):
        for v in skeleton.values():
            _slots(v, out)
    elif isinstance(skeleton, list | tuple):
        for v in skeleton:
            _slots(v, out)


def _chunks(sizes: list[int], chunk_bytes: int) -> list[list[tuple[int, int, int]]]:
    """The stream of ``sizes`` bytes cut into chunks: each a list of (tensor, start, end)."""
    chunks: list[list[tuple[int, int, int]]] = []
    current: list[tuple[int, int, int]] = []
    room = chunk_bytes
    for i, size in enumerate(sizes):
        start = 0
        while start < size:
            end = min(size, start + room)
            current.append((i, start, end))
            room -= end - start
            start = end
            if room == 0:
                chunks.append(current)
                current, room = [], chunk_bytes
    if current:
        chunks.append(current)
    return chunks


def _broadcast_bytes(views: list[torch.Tensor], main: bool, chunk_bytes: int) -> None:
    """Overwrite every rank's ``views`` (1-D uint8) with rank 0's, chunk by chunk."""
    device = _collective_device()
    buf: torch.Tensor | None = None
    for chunk in _chunks([v.numel() for v in views], chunk_bytes):
        if device.type == "cpu" and len(chunk) == 1:
            i, start, end = chunk[0]
            dist.broadcast(views[i][start:end], src=0)  # straight into the tensor
            continue
        if buf is None:
            buf = torch.empty(chunk_bytes, dtype=torch.uint8, device=device)
        n = sum(end - start for _, start, end in chunk)
        if main:
            at = 0
            for i, start, end in chunk:
                buf[at : at + end - start].copy_(views[i][start:end])
                at += end - start
        dist.broadcast(buf[:n], src=0)
        if not main:
            at = 0
            for i, start, end in chunk:
                views[i][start:end].copy_(buf[at : at + end - start])
                at += end - start
