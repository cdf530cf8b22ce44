"""Normalisation layers for spiking feature maps, selected by name from the config.

:class:`LayerNorm` and :class:`LayerNorm2d` follow the ``backend`` convention of the
neurons: ``torch`` runs the PyTorch reference, ``triton`` our kernels
(:mod:`snntrain.kernels.layer_norm`), ``auto`` the kernels for CUDA tensors. The
attribute can be switched at any time (:func:`snntrain.nn.set_backend`) and never
changes the state-dict, which matches :class:`torch.nn.LayerNorm` (``weight``, ``bias``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..backend import check_backend, use_triton
from ..validation import positive_int

NORMS = ("batchnorm", "layernorm")


def _triton_layer_norm(x, weight, bias, eps: float, dim: int) -> torch.Tensor:
    # Imported on first use: the kernel module needs triton, and TRITON_INTERPRET must be
    # set before it is imported.
    from ..kernels.layer_norm import layer_norm

    return layer_norm(x, weight, bias, eps, dim)


def _check_eps(eps: object) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps={eps!r} is not valid; it must be a finite number >= 0")
    return float(eps)


class LayerNorm(nn.Module):
    """Drop-in for :class:`torch.nn.LayerNorm` with a Triton backend.

    Normalises over the trailing ``normalized_shape`` dims of ``[*, *normalized_shape]``
    input. With several normalised dims the Triton path flattens them into one (a view
    when they are contiguous with each other, else a copy). The Triton path returns the
    input's dtype (statistics in fp32) also under autocast, where the PyTorch reference
    returns fp32.

    Args:
        normalized_shape: an int or a tuple of positive ints.
        eps: added to the variance.
        elementwise_affine: learn ``weight`` (init 1) and ``bias`` (init 0).
        bias: with ``elementwise_affine``, whether there is a ``bias``.
        backend: ``auto``, ``torch`` or ``triton``.
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        backend: str = "auto",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        if not shape:
            raise ValueError("normalized_shape=() is not valid; give at least one dim")
        self.normalized_shape = tuple(positive_int("normalized_shape", n) for n in shape)
        self.eps = _check_eps(eps)
        self.elementwise_affine = bool(elementwise_affine)
        factory = {"device": device, "dtype": dtype}
        if self.elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, **factory))
            self.bias = nn.Parameter(torch.empty(self.normalized_shape, **factory)) if bias else None
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.backend = check_backend(backend)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not use_triton(self.backend, x):
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        k = len(self.normalized_shape)
        if x.dim() < k or tuple(x.shape[-k:]) != self.normalized_shape:
            raise ValueError(
                f"input has shape {tuple(x.shape)}; LayerNorm{self.normalized_shape} expects "
                f"its last {k} dim(s) to be {self.normalized_shape}"
            )
        if k == 1:
            return _triton_layer_norm(x, self.weight, self.bias, self.eps, -1)
        w = None if self.weight is None else self.weight.flatten()
        b = None if self.bias is None else self.bias.flatten()
        y = _triton_layer_norm(x.flatten(-k), w, b, self.eps, -1)
        return y.unflatten(-1, self.normalized_shape)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
                f"backend={self.backend}")


class LayerNorm2d(nn.Module):
    """Layer norm over the channels of ``[N, C, H, W]`` or ``[T, B, C, H, W]`` maps (dim -3).

    Every spatial position (and sample, and time step) is normalised over its ``C``
    channels; ``weight`` and ``bias`` have shape ``[C]``. The Triton path reads the
    channels-first layout in place; the PyTorch reference moves the channels last,
    calls :func:`torch.nn.functional.layer_norm` and moves them back.

    Args:
        num_channels: ``C``.
        eps: added to the variance.
        affine: learn ``weight`` (init 1) and ``bias`` (init 0).
        backend: ``auto``, ``torch`` or ``triton``.
    """

    def __init__(
        self, num_channels: int, eps: float = 1e-5, affine: bool = True, backend: str = "auto", device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.num_channels = positive_int("num_channels", num_channels)
        self.eps = _check_eps(eps)
        self.affine = bool(affine)
        factory = {"device": device, "dtype": dtype}
        if self.affine:
            self.weight = nn.Parameter(torch.empty(self.num_channels, **factory))
            self.bias = nn.Parameter(torch.empty(self.num_channels, **factory))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.backend = check_backend(backend)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.affine:
            nn.init.ones_(self.weight)
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() not in (4, 5):
            raise ValueError(
                f"LayerNorm2d expects [N, C, H, W] or [T, B, C, H, W] input, got shape {tuple(x.shape)} "
                f"({x.dim()} dims)"
            )
        if x.shape[-3] != self.num_channels:
            raise ValueError(
                f"input has {x.shape[-3]} channels (dim -3 of shape {tuple(x.shape)}) but "
                f"LayerNorm2d was built for num_channels={self.num_channels}"
            )
        if use_triton(self.backend, x):
            return _triton_layer_norm(x, self.weight, self.bias, self.eps, -3)
        y = F.layer_norm(x.movedim(-3, -1), (self.num_channels,), self.weight, self.bias, self.eps).movedim(-1, -3)
        return y.contiguous() if x.is_contiguous() else y

    def extra_repr(self) -> str:
        return f"{self.num_channels}, eps={self.eps}, affine={self.affine}, backend={self.backend}"


def build_norm2d(norm: str, channels: int, backend: str = "auto") -> nn.Module:
    """A normalisation over the channels of ``[N, C, H, W]`` feature maps.

    ``batchnorm`` is :class:`torch.nn.BatchNorm2d` (statistics over batch and space);
    ``layernorm`` is :class:`LayerNorm2d` (statistics over the channels of each
    position, no running state), which follows ``backend``.
    """
    if norm == "batchnorm":
        return nn.BatchNorm2d(channels)
    if norm == "layernorm":
        return LayerNorm2d(channels, backend=backend)
    raise ValueError(f"norm={norm!r} is not valid; choose one of {', '.join(NORMS)}")
