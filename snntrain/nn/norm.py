"""Normalisation layers for spiking feature maps, selected by name from the config."""

from __future__ import annotations

from torch import nn

NORMS = ("batchnorm",)


def build_norm2d(norm: str, channels: int, backend: str = "auto") -> nn.Module:
    """A normalisation over the channels of ``[N, C, H, W]`` feature maps.

    ``batchnorm`` is :class:`torch.nn.BatchNorm2d` (statistics over batch and space).
    """
    if norm == "batchnorm":
        return nn.BatchNorm2d(channels)
    raise ValueError(f"norm={norm!r} is not valid; choose one of {', '.join(NORMS)}")
