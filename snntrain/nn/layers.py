"""Building blocks for multi-step spiking networks: time-distributed layers, dropout over time and SEW
connections."""

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
        x = x.flatten(0, 1)
        if not x.is_cuda and x.dim() == 4 and len(self) and isinstance(self[0], nn.Conv2d) and not x.is_contiguous():
            # PyTorch's CPU convolution (oneDNN) gets the weight gradient wrong (a different value on every call),
            # or crashes, on some channels-last maps (a strided 1x1 convolution of 4 or 8 channels): the CPU path
            # hands a convolution contiguous maps
            x = x.contiguous()
        return super().forward(x).unflatten(0, (t, b))

    def folded(self, x: torch.Tensor) -> torch.Tensor:
        """The layers on a batch that is already folded, ``[N, ...]``: a static image ``[B, C, H, W]`` that a
        stem convolution reads once before its output is repeated over T (direct encoding)."""
        return super().forward(x)


class TemporalDropout(nn.Module):
    """Dropout of ``[T, B, ...]`` input with one mask for all T steps of a sample (as SpikingJelly's
    multi-step ``layer.Dropout``): a unit that is dropped stays silent for the whole sequence, instead of a
    fresh mask per step, which would act as extra input noise to the neurons after it. Kept elements are
    scaled by ``1 / (1 - p)``; in eval mode the input passes unchanged.
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise ValueError(f"dropout p={p!r} must be a number in [0, 1)")
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.dim() < 2:
            raise ValueError(f"TemporalDropout expects [T, B, ...] input, got shape {tuple(x.shape)}")
        keep = torch.empty((1, *x.shape[1:]), dtype=x.dtype, device=x.device).bernoulli_(1.0 - self.p)
        return x * keep.div_(1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


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
