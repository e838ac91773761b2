"""Data for DDP: each rank reads a disjoint shard, epochs reshuffle, and a run can resume mid-epoch.

``DistributedSampler(drop_last=True)`` gives every rank the same number of samples and the
DataLoader's ``drop_last`` the same number of full batches, so no rank ever waits in an
all-reduce for a batch another rank does not have (the classic uneven-input hang).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from trainer.config import ConfigError


class ResumableSampler(DistributedSampler):
    """A DistributedSampler that can start its next epoch part-way through.

    The permutation depends only on (seed, epoch), so skipping the first ``n`` indices of an
    epoch reproduces exactly the order an uninterrupted run would have seen.
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int, shuffle: bool):
        super().__init__(
            dataset,
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=True,
        )
        self.skip = 0

    def skip_next(self, n: int) -> None:
        """Leave out the first ``n`` indices of the next iteration only."""
        self.skip = n

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        skip, self.skip = self.skip, 0
        return iter(indices[skip:])

    def __len__(self) -> int:
        return self.num_samples - self.skip


def build_loader(
    dataset: Dataset,
    batch_size: int,
    rank: int,
    world_size: int,
    seed: int,
    shuffle: bool,
    num_workers: int,
    pin_memory: bool,
) -> DataLoader:
    """A DataLoader over this rank's shard; full batches only.

    Training (``shuffle``) needs at least one full batch per rank; an eval set smaller than
    that is read as one smaller batch per rank instead.
    """
    sampler = ResumableSampler(dataset, world_size, rank, seed, shuffle)
    if sampler.num_samples < batch_size:
        if shuffle or sampler.num_samples == 0:
            raise ConfigError(
                [
                    f"batch_size: larger than one rank's share of the dataset "
                    f"({sampler.num_samples} samples) (got {batch_size})"
                ]
            )
        batch_size = sampler.num_samples  # a small eval set: one smaller batch per rank
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=num_workers,
        pin_memory=pin_memory,
        # Its own generator: creating an iterator must not draw from the global RNG, or a
        # resumed run (which creates it at a different moment) would see different dropout.
        generator=torch.Generator().manual_seed(seed),
        persistent_workers=num_workers > 0,
    )


class MicroBatches:
    """An endless stream of micro-batches across epochs that knows where it is.

    ``position()`` is (epoch, batches already handed out in that epoch); passing it back to the
    constructor continues the same sequence, which is what exact resume needs.

    ``prefetch()`` draws the next batch ahead of time and starts its copy to ``device``, so
    that the loop can do the host's share of loading (indexing, collating, pinning) while the
    GPU is busy with the current backward. A batch drawn ahead but not yet handed out is not
    counted by ``position()``: a checkpoint taken then resumes at that very batch.
    """

    def __init__(
        self,
        loader: DataLoader,
        epoch: int = 0,
        batch_in_epoch: int = 0,
        device: torch.device | None = None,
    ):
        self.loader = loader
        self.sampler: ResumableSampler = loader.sampler  # type: ignore[assignment]
        self.device = device  # None: leave batches where the loader put them
        self.epoch = epoch
        self.batch_in_epoch = batch_in_epoch
        self._drawn = (epoch, batch_in_epoch)  # the position of the loader's iterator
        self._ahead: tuple[Any, tuple[int, int]] | None = None
        self._it: Iterator[Any] | None = None

    def position(self) -> tuple[int, int]:
        return self.epoch, self.batch_in_epoch

    def prefetch(self) -> None:
        """Draw the next batch now (a no-op when one is already waiting)."""
        if self._ahead is None:
            batch = self._draw()
            if self.device is not None:
                batch = to_device(batch, self.device)
            self._ahead = (batch, self._drawn)

    def __next__(self) -> Any:
        self.prefetch()
        assert self._ahead is not None
        batch, (self.epoch, self.batch_in_epoch) = self._ahead
        self._ahead = None
        return batch

    def _draw(self) -> Any:
        epoch, taken = self._drawn
        while True:
            if self._it is None:
                self.sampler.set_epoch(epoch)  # a new permutation per epoch, same on all ranks
                self.sampler.skip_next(taken * self.loader.batch_size)
                self._it = iter(self.loader)
            try:
                batch = next(self._it)
            except StopIteration:
                self._it = None
                epoch, taken = epoch + 1, 0
                continue
            self._drawn = (epoch, taken + 1)
            return batch


def to_device(batch: Any, device: torch.device) -> Any:
    """Move a tensor or a (nested) tuple/list/dict of tensors to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def batch_len(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, dict):
        return batch_len(next(iter(batch.values())))
    return batch_len(batch[0])
