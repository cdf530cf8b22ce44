"""Where a connection layer's inputs meet its weights: the fan-out of every input element (how many nonzero
weights read it) from the layer's geometry, and the PyTorch reference count built on it."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

#: Layers whose inputs are counted as synaptic operations (NeuroBench's stateless connection layers).
CONNECTIONS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


# ----------------------------------------------------------------------------- geometry


@dataclass(frozen=True)
class _Geometry:
    """How one call of a connection layer reads its input (host values, cached per input shape)."""

    frames: int                       # input frames in the call (batch x steps folded together)
    channel_dim: int                  # dim of the (batched) input holding the input channels / features
    spatial_dims: tuple[int, ...]     # dims a convolution slides over (empty for Linear)
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]          # zero padding before the first element, per spatial dim
    dilation: tuple[int, ...]
    out_size: tuple[int, ...]
    frame_numel: int                  # input elements per frame
    dense_per_frame: int              # synaptic operations per frame, zeros included, padding not
    fan_bound: int                    # the largest fan-out an input element can have (outputs x taps)


def _taps_reaching(size: int, out: int, k: int, stride: int, pad: int, dil: int) -> int:
    """Output positions o in [0, out) that read an input position through tap k: 0 <= o*stride - pad + k*dil < size."""
    lo = -((k * dil - pad) // stride)  # ceil((pad - k*dil) / stride)
    hi = (size - 1 + pad - k * dil) // stride
    return max(0, min(out - 1, hi) - max(0, lo) + 1)


def _conv_padding(layer: nn.Module, sizes: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per spatial dim: (left padding, total padding)."""
    if layer.padding_mode != "zeros":
        raise ValueError(f"{type(layer).__name__} with padding_mode={layer.padding_mode!r} cannot be counted; "
                         "synaptic operations are counted for padding_mode='zeros'")
    if isinstance(layer.padding, str):  # 'valid' or 'same' (PyTorch puts the odd element on the right)
        if layer.padding == "valid":
            return tuple(0 for _ in sizes), tuple(0 for _ in sizes)
        total = tuple(d * (k - 1) for d, k in zip(layer.dilation, layer.kernel_size))
        return tuple(t // 2 for t in total), total
    return tuple(layer.padding), tuple(2 * p for p in layer.padding)


def geometry(layer: nn.Module, shape: Sequence[int]) -> _Geometry:
    """The geometry of a call of ``layer`` (a :data:`CONNECTIONS` layer) on an input of ``shape``."""
    shape = tuple(int(s) for s in shape)
    if isinstance(layer, nn.Linear):
        if not shape or shape[-1] != layer.in_features:
            raise ValueError(f"Linear({layer.in_features}, {layer.out_features}) got input of shape {shape}")
        frames = math.prod(shape[:-1])
        return _Geometry(frames, len(shape) - 1, (), (), (), (), (), (), layer.in_features,
                         layer.in_features * layer.out_features, layer.out_features)
    d = len(layer.kernel_size)
    if len(shape) != d + 2:
        raise ValueError(f"{type(layer).__name__} input has shape {shape}; counting needs a batched "
                         f"[N, C, {', '.join('LHWD'[-d:] if d < 3 else 'DHW')}] input")
    sizes = shape[2:]
    left, total = _conv_padding(layer, sizes)
    outs = tuple((s + t - dl * (k - 1) - 1) // st + 1 for s, t, dl, k, st in
                 zip(sizes, total, layer.dilation, layer.kernel_size, layer.stride))
    dense = layer.in_channels * (layer.out_channels // layer.groups)
    for s, o, k, st, p, dl in zip(sizes, outs, layer.kernel_size, layer.stride, left, layer.dilation):
        dense *= sum(_taps_reaching(s, o, j, st, p, dl) for j in range(k))
    return _Geometry(shape[0], 1, tuple(range(2, 2 + d)), tuple(layer.kernel_size), tuple(layer.stride), left,
                     tuple(layer.dilation), outs, math.prod(shape[1:]), dense,
                     layer.out_channels // layer.groups * math.prod(layer.kernel_size))


def weight_fanin(layer: nn.Module) -> torch.Tensor:
    """Per input channel and kernel tap, the nonzero weights that read it (over the output channels of its group):
    int32 ``[C_in, *kernel]`` (``[in_features]`` for Linear), on the weight's device."""
    nz = layer.weight.detach() != 0
    if isinstance(layer, nn.Linear):
        return nz.sum(0, dtype=torch.int32)
    g = layer.groups
    out, cin_g, *kernel = nz.shape
    return nz.view(g, out // g, cin_g, *kernel).sum(1, dtype=torch.int32).reshape(cin_g * g, *kernel)


def fanout_map(m: torch.Tensor, geo: _Geometry, sizes: Sequence[int]) -> torch.Tensor:
    """Fan-out of every input element of one frame (nonzero weights it meets), int64 ``[C, *sizes]``, from the
    per-tap counts ``m`` of :func:`weight_fanin`: a tap reaches a position when some output reads it there."""
    if not geo.spatial_dims:
        return m.to(torch.int64)
    spec, factors = _tap_factors(geo, tuple(sizes), m.device)
    return torch.einsum(spec, m.double(), *factors).round().to(torch.int64)


@functools.lru_cache(maxsize=256)
def _tap_factors(geo: _Geometry, sizes: tuple[int, ...], device: torch.device) -> tuple[str, list[torch.Tensor]]:
    """Per spatial dim, which taps reach which positions (float64 ``[k, size]``), and the einsum that applies
    them: they depend on the shape only, so every validation reuses them."""
    factors, letters = [], []
    for i, size in enumerate(sizes):
        k = torch.arange(geo.kernel[i], device=device)[:, None]
        t = torch.arange(size, device=device)[None, :] + geo.padding[i] - k * geo.dilation[i]
        factors.append(((t >= 0) & (t % geo.stride[i] == 0) & (t // geo.stride[i] < geo.out_size[i])).double())
        letters.append(("klm"[i], "xyz"[i]))
    spec = "c" + "".join(k for k, _ in letters) + "," + ",".join(k + p for k, p in letters)
    spec += "->c" + "".join(p for _, p in letters)
    return spec, factors


@functools.lru_cache(maxsize=256)
def _reach(geo: _Geometry, sizes: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Which kernel taps reach which positions of a 2-d frame, float64 ``[k_h * k_w, H * W]`` (shape only)."""
    _, (fy, fx) = _tap_factors(geo, sizes, device)
    return torch.einsum("ky,lx->klyx", fy, fx).reshape(fy.shape[0] * fx.shape[0], -1)


def fanout_block(m: torch.Tensor, geo: _Geometry, p: Any) -> torch.Tensor:
    """:func:`fanout_map` of one frame laid out as the counting kernel reads it (int32 ``[S]`` in the frame's
    memory order, :func:`snntrain.kernels.synops.fan_block`) for a :func:`snntrain.kernels.synops.plan` ``p``.

    For ``Linear`` inputs and ``[C, H, W]`` frames stored channels-first or channels-last this is one matrix
    product of the per-tap weight counts ``m`` and the shape's cached tap-reach matrix, written straight in
    memory order (float64: exact integers); it runs once per layer and validation, so its launches count."""
    from ..kernels import synops

    shape, strides = p.block_shape, p.block_strides
    if not geo.spatial_dims and len(shape) == 1:
        return m.to(torch.int32)
    if len(geo.spatial_dims) == 2 and len(shape) == 3:
        c, h, w = shape

        def laid_out(expected: tuple[int, int, int]) -> bool:  # strides of size-1 dims do not matter
            return all(n == 1 or st == e for n, st, e in zip(shape, strides, expected))

        mk = m.reshape(c, -1).double()
        if laid_out((h * w, w, 1)):
            return (mk @ _reach(geo, (h, w), m.device)).flatten().to(torch.int32)
        if laid_out((1, w * c, c)):
            return (_reach(geo, (h, w), m.device).T @ mk.T).flatten().to(torch.int32)
    return synops.fan_block(fanout_map(m, geo, shape[1:]), p)


def count_reference(x: torch.Tensor, m: torch.Tensor, geo: _Geometry, fan: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """The counts of one call, int64 ``[3]``: effective operations, nonzero inputs, inputs outside
    ``{-1, 0, 1}`` (the PyTorch reference of :func:`snntrain.kernels.synops.count_synops`).

    The nonzero pattern (``|x|`` mapped to 0/1) times ``[fan-out, 1]`` is one matrix product per frame
    row, in float32 on the CPU over column chunks short enough that every partial sum is an integer below
    2**24 (exact), in float64 elsewhere (no TF32)."""
    frames = (x if geo.spatial_dims else x.reshape(-1, x.shape[-1])).contiguous()
    if fan is None:
        fan = fanout_map(m, geo, frames.shape[2:])
    n = frames.shape[0]
    a = frames.abs()
    nz = torch.sign(a)  # 1 where x != 0
    nonbinary = torch.count_nonzero(a.sub_(nz))
    exact, dtype = (2**24, torch.float32) if frames.device.type == "cpu" else (2**53, torch.float64)
    flat = nz.view(n, -1).to(dtype)
    cols = torch.stack([fan.flatten().to(dtype), torch.ones(flat.shape[1], dtype=dtype, device=flat.device)], 1)
    chunk = max(1, (exact - 1) // max(1, geo.fan_bound))
    total = sum((flat[:, i: i + chunk] @ cols[i: i + chunk]).double().sum(0) for i in range(0, flat.shape[1], chunk))
    return torch.cat([total.round().to(torch.int64), nonbinary.view(1)])


def connection_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The :data:`CONNECTIONS` layers of ``model`` with their names, in module order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, CONNECTIONS)]

