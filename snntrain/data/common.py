"""Helpers shared by the datamodules."""

from __future__ import annotations

import torch

from ..distributed import eval_sampler
from ..validation import positive_int

__all__ = ["check_fraction", "eval_sampler", "loader_generator", "positive_int", "split_indices"]


def check_fraction(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) < 1.0:
        raise ValueError(f"{name}={value!r} must be a number strictly between 0 and 1")
    return float(value)


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """A deterministic shuffled split of ``range(n)`` into train and validation indices."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = max(1, round(n * val_fraction))
    return sorted(perm[n_val:]), sorted(perm[:n_val])


def loader_generator(seed: int) -> torch.Generator:
    """A generator for DataLoader shuffling, so the batch order depends only on the seed."""
    return torch.Generator().manual_seed(seed)
