"""Building blocks for multi-step spiking networks: time-distributed layers and SEW connections."""

from __future__ import annotations

import torch
from torch import nn

CONNECTS = ("ADD", "AND", "IAND")


class MultiStep(nn.Sequential):
    """Apply stateless layers (conv, norm, pooling, linear) to every time step at once.

    Input ``[T, B, ...]`` is folded to ``[T * B, ...]``, run through the layers and
    unfolded again, so a convolution sees one large batch instead of T small ones.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 3:
            raise ValueError(f"MultiStep expects [T, B, ...] input, got shape {tuple(x.shape)}")
        t, b = x.shape[:2]
        y = super().forward(x.flatten(0, 1))
        return y.unflatten(0, (t, b))


def check_connect(connect: object) -> str:
    if not isinstance(connect, str) or connect.upper() not in CONNECTS:
        raise ValueError(f"connect={connect!r} is not valid; choose one of {', '.join(CONNECTS)}")
    return connect.upper()


def sew_connect(out: torch.Tensor, identity: torch.Tensor, connect: str) -> torch.Tensor:
    """Spike-element-wise residual ``g(A, S)`` of the block output ``A`` and the shortcut ``S``.

    ``ADD``: ``A + S``; ``AND``: ``A * S``; ``IAND``: ``(1 - A) * S`` (Fang et al., 2021).
    """
    if connect == "ADD":
        return out + identity
    if connect == "AND":
        return out * identity
    if connect == "IAND":
        return (1.0 - out) * identity
    raise ValueError(f"connect={connect!r} is not valid; choose one of {', '.join(CONNECTS)}")
