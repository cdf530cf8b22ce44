"""Efficiency report of a spiking model: firing rates, activation sparsity, synaptic operations,
footprint and energy estimates, counted on the device during validation.

Counting (:class:`ActivityCounter`) uses forward hooks on the model's layers (a
:class:`~snntrain.nn.norm_neuron.NormNeuron` hands its spikes to the counter itself, and its fused
batch-norm kernel adds them up per channel as it fires them, without a second read):

* **Connection layers** (``Linear``, ``Conv1d/2d/3d``): each call's input is counted the way
  NeuroBench's ``SynapticOperations`` counts it. The effective operations of a call are the
  (nonzero input, nonzero weight) pairs that meet in some output, bias not included: the sum
  of the layer's output with the input and the weights binarised (``x != 0``, ``W != 0``);
  zero padding contributes nothing. They are accumulates (ACs) when every input value of the
  call is in ``{-1, 0, 1}``, multiply-accumulates (MACs) otherwise. Dense operations count
  every pair, zeros included (still without padding). Inputs arrive as the layer sees them:
  a SEW ``ADD`` sum (values 0, 1, 2) makes the next convolution's operations MACs, ``AND`` and
  ``IAND`` keep them ACs, the image into the stem is MACs.
* **Spiking layers** (:class:`~snntrain.nn.norm_neuron.NormNeuron`, the fused attention neuron
  :class:`~snntrain.nn.attention.QKVNeuron`, and neurons outside them): spikes per channel and
  neuron-steps, for firing rates and activation sparsity (the fraction of zero outputs, NeuroBench's
  ``ActivationSparsity``). The spiking transformers' projections are ``Linear`` layers over tokens
  ``[T, B, N, C]`` (the ANN equivalent reads every token once); the attention's products of two spike
  tensors (``Q K^T V``, ``K * V``) have no weights and are not synaptic operations in NeuroBench's sense:
  they are not counted (docs/transformers.md gives their operation counts).
* **The model**: how many samples (forward passes of one image) were counted, so that every
  count is reported per sample, like NeuroBench, and per time step (per sample / T).

Every count stays on the device (no host synchronisation per batch): a call writes its counts
into a fresh row of a small per-layer buffer (on CUDA one Triton launch per call, reading the map
once, :mod:`snntrain.kernels.synops`; the PyTorch reference elsewhere), and the rows are folded
into totals every few dozen calls and at the end. :meth:`ActivityCounter.totals` packs all
totals into one float64 tensor (exact below 2**53) so that processes can add theirs in one
collective; :func:`build_report` turns the reduced totals into the report.

Static metrics (:func:`static_metrics`) follow NeuroBench: ``ParameterCount``, ``Footprint``
(bytes of parameters and buffers) and ``ConnectionSparsity`` (zero weights of the connection
layers). Energy estimates (:data:`ENERGY_MODELS`) put the counts through two labelled models,
for the spiking network and for the same network as a non-spiking ANN (ReLU, one step):
a compute-only proxy (0.9 pJ per AC, 4.6 pJ per MAC) and one that also counts memory traffic.
docs/efficiency.md explains every number and where NeuroBench's rules and ours differ.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from .backend import use_triton
from .nn.attention import QKVNeuron
from .nn.neurons import BaseNeuron
from .nn.norm_neuron import NormNeuron

#: Layers whose inputs are counted as synaptic operations (NeuroBench's stateless connection layers).
CONNECTIONS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
#: Spiking layers that hand their spikes to an attached counter themselves (``activity``), their neuron inside them
#: bypassed when fused: the norm-neuron and the fused attention product-neuron.
SELF_COUNTING = (NormNeuron, QKVNeuron)
#: Version of the report's layout (``report["format"]``).
FORMAT = "snntrain-efficiency-1"
#: Calls buffered per layer before they are folded into its totals.
ROWS = 64


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
    from .kernels import synops

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


# ----------------------------------------------------------------------------- per-layer state


_SYNOPS = None


def _synops():
    """:mod:`snntrain.kernels.synops`, imported at the first kernel launch (CPU-only use never loads Triton),
    then kept: the counting hooks call this on every layer call."""
    global _SYNOPS
    if _SYNOPS is None:
        from .kernels import synops

        _SYNOPS = synops
    return _SYNOPS


class _Store:
    """The device counts of every connection layer of a counter: rows ``[L, ROWS, 3]`` of (effective ops,
    nonzeros, non-binary inputs) per call and totals ``[L, 4]`` of (AC ops, MAC ops, nonzero inputs, non-binary
    calls). Allocated once per counter and device and reused by every attach, with the per-call row views made
    once; all layers are folded together (a handful of launches, not a handful per layer)."""

    def __init__(self, layers: int, device: torch.device) -> None:
        with torch.inference_mode(False):  # normal tensors: totals() may run outside inference mode
            self.rows = torch.zeros(layers, ROWS, 3, dtype=torch.int64, device=device)
            self.acc = torch.zeros(layers, 4, dtype=torch.int64, device=device)
        self.row_views = self.rows.view(-1, 3).unbind(0)

    @staticmethod
    def fold_rows(rows: torch.Tensor, acc: torch.Tensor) -> None:
        """Add ``rows`` (``[..., ROWS, 3]``, unused rows zero) into ``acc`` (``[..., 4]``) and zero them: a call
        with no input outside {-1, 0, 1} adds its operations to the ACs, any other call to the MACs."""
        binary = rows[..., 2] == 0
        ops = rows[..., 0]
        acc += torch.stack([(ops * binary).sum(-1), (ops * ~binary).sum(-1), rows[..., 1].sum(-1),
                            (~binary).sum(-1)], -1)
        rows.zero_()

    def reset(self) -> None:
        self.rows.zero_()
        self.acc.zero_()


class _Call:
    """One kind of call of a connection layer (input shape, layout, batch, counting path) since the last attach:
    how it is counted (the kernel's plan, or the reference), the fan-out its counting reads, and what each such
    call adds to the host sums."""

    __slots__ = ("calls", "plan", "fan", "geo", "sums")

    def __init__(self, plan: Any, fan: torch.Tensor, geo: _Geometry, sums: tuple[int, ...]) -> None:
        self.calls, self.plan, self.fan, self.geo, self.sums = 0, plan, fan, geo, sums


class _Connection:
    """Counts of one connection layer: its device rows and totals in the counter's :class:`_Store` (row
    ``index``); host sums of what shapes decide, kept per kind of call (:class:`_Call`) and added up at the end."""

    #: the kinds of call kept before their host sums are added up and they are made again (varied input shapes)
    MAX_CALLS = 64

    def __init__(self, name: str, module: nn.Module, index: int) -> None:
        self.name, self.module, self.index = name, module, index
        self.rows: torch.Tensor | None = None
        self.used = 0
        self.acc: torch.Tensor | None = None
        self._calls: dict[tuple, _Call] = {}  # per attach: the fan-out maps depend on the weights
        self._fans: dict[tuple, torch.Tensor] = {}  # per attach: fan-out per frame layout (the kernel's, or the map)
        self._done = [0, 0, 0, 0, 0, 0]  # host sums of the kinds of call no longer in _calls
        self._geo: dict[tuple, _Geometry] = {}
        self._plan: dict[tuple, Any] = {}
        self._m: torch.Tensor | None = None  # per-tap weight counts
        self._row_views: Sequence[torch.Tensor] = ()

    @property
    def host(self) -> list[int]:
        """calls, frames, input elements, dense ops, ANN ops, ANN input elements since the last attach."""
        h = list(self._done)
        for call in self._calls.values():
            for i, v in enumerate(call.sums):
                h[i] += call.calls * v
        return h

    def fanin(self) -> torch.Tensor:
        """The weights' per-tap counts, read at the first call after :meth:`ActivityCounter.attach`."""
        if self._m is None:
            self._m = weight_fanin(self.module)
        return self._m

    def count(self, x: torch.Tensor, batch: int | None, kernel: bool, store: _Store) -> None:
        key = (x.shape, x.stride(), batch, kernel)
        call = self._calls.get(key)
        if call is None:
            call = self._prepare(x, batch, kernel, store)
            if len(self._calls) >= self.MAX_CALLS:
                self._done = self.host
                self._calls.clear()
                self._fans.clear()
            self._calls[key] = call
        row = self._row_views[self.used]
        if call.plan is not None:
            _synops().launch(call.plan, x, call.fan, row)
        else:
            row.copy_(count_reference(x.detach(), self._m, call.geo, call.fan))
        call.calls += 1
        self.used += 1
        if self.used == ROWS:
            self.fold()

    def _prepare(self, x: torch.Tensor, batch: int | None, kernel: bool, store: _Store) -> _Call:
        """The first call of its kind since the attach: geometry and plan (kept over attaches, shapes decide
        them), the fan-out from this validation's weights, the row views of the store."""
        shape = (tuple(x.shape), x.stride())
        geo = self._geo.get(shape)
        if geo is None:
            geo = self._geo[shape] = geometry(self.module, x.shape)
        m = self.fanin()
        if self.rows is None:
            self.rows, self.acc = store.rows[self.index], store.acc[self.index]
            self._row_views = store.row_views[self.index * ROWS: (self.index + 1) * ROWS]
        if kernel and len(geo.spatial_dims) in (0, 2):
            p = self._plan.get(shape)
            if p is None:
                p = self._plan[shape] = _synops().plan(shape[0], shape[1], x.dim() - geo.channel_dim,
                                                       device=x.device)
            frame: tuple = (p.block_shape, p.block_strides)
        else:
            p, frame = None, (tuple(x.shape[geo.channel_dim + 1:]) if geo.spatial_dims else (),)
        fan = self._fans.get(frame)  # one per frame layout: a smaller last batch reads the same fan-out
        if fan is None:
            fan = self._fans[frame] = fanout_block(m, geo, p) if p is not None else fanout_map(m, geo, frame[0])
        if batch and not geo.spatial_dims and x.dim() >= 3 and x.shape[1] == batch:
            steps = x.shape[0]  # a Linear over [T, B, ..., C] (tokens): the ANN reads every token once
        else:
            steps = geo.frames // batch if batch and geo.frames % batch == 0 else 1
        ann_frames = geo.frames // steps  # the ANN runs each frame of a sample once, not once per step
        sums = (1, geo.frames, geo.frames * geo.frame_numel, geo.frames * geo.dense_per_frame,
                ann_frames * geo.dense_per_frame, ann_frames * geo.frame_numel)
        return _Call(p, fan, geo, sums)

    def fold(self) -> None:
        if self.used == 0:
            return
        _Store.fold_rows(self.rows, self.acc)
        self.used = 0


class _Spiking:
    """Counts of one spiking layer: spikes per channel (device rows of float32 sums, exact below 2**24 spikes
    per channel and call, folded into float64), neuron-steps and T (host)."""

    def __init__(self, name: str, module: nn.Module) -> None:
        self.name, self.module = name, module
        self.rows: torch.Tensor | None = None
        self.used = 0
        self.acc: torch.Tensor | None = None
        self.host = [0, 0, 0]  # calls, neuron-steps, ANN activations (neurons of one step)
        self.steps = 0
        self._row_views: Sequence[torch.Tensor] = ()
        self._plans: dict[tuple, Any] = {}  # the kernel's launch and channel map per input shape and layout

    def _allocate(self, channels: int, device: torch.device) -> None:
        if self.rows is None or (not self.host[0] and self.rows.device != device):  # none yet, or kept from a
            # validation on another device
            with torch.inference_mode(False):  # normal tensors: totals() may run outside inference mode
                self.rows = torch.zeros(ROWS, channels, dtype=torch.float32, device=device)
                self.acc = torch.zeros(channels, dtype=torch.float64, device=device)
                self._row_views = self.rows.unbind(0)
        elif self.rows.shape[1] != channels:
            raise RuntimeError(f"spiking layer {self.name} gave {channels} channels after {self.rows.shape[1]}")

    def next_row(self, channels: int, per_channel: int, device: torch.device) -> torch.Tensor | None:
        """The zeroed float32 row that the next call's spikes may be added to by the kernel that fires them
        (then :meth:`count` with ``counted``), or None where its float32 sums would not be exact."""
        self._allocate(channels, device)
        return self._row_views[self.used] if per_channel < 2**24 else None

    def count(self, s: torch.Tensor, kernel: bool = False) -> None:
        """Count the spikes ``s`` of one call (a call whose spikes the firing kernel already added to
        :meth:`next_row` has only the host's part left: :meth:`_counted`)."""
        channel_dim = 2 if s.dim() >= 3 else 1  # [T, B, C, ...] or [T, N]
        channels = s.shape[channel_dim]
        self._allocate(channels, s.device)
        if s.numel() // channels < 2**24:  # a float32 sum of fewer than 2**24 zeros and ones is exact
            self._sum_into(self._row_views[self.used], s, channel_dim, kernel)
            self._counted(s)
        else:
            dims = [d for d in range(s.dim()) if d != channel_dim]
            self.acc += torch.sum(s.detach(), dim=dims, dtype=torch.float64)
            self._counted(s, row=False)

    def _counted(self, s: torch.Tensor, row: bool = True) -> None:
        """The host's part of a call whose spikes are in its row (``row``) or already in the totals."""
        if row:
            self.used += 1
            if self.used == ROWS:
                self.fold()
        steps, n = s.shape[0], s.numel()
        if steps > self.steps:
            self.steps = steps
        h = self.host
        h[0] += 1
        h[1] += n
        h[2] += n // steps

    def _sum_into(self, row: torch.Tensor, s: torch.Tensor, channel_dim: int, kernel: bool) -> None:
        if kernel:  # one pass in memory order (the Triton kernel adds into the zeroed row)
            key = (tuple(s.shape), s.stride())
            plan = self._plans.get(key)
            if plan is None:
                if len(self._plans) >= 8:
                    self._plans.clear()
                synops = _synops()
                p = synops.plan(key[0], key[1], s.dim() - channel_dim, device=s.device, sums=True)
                plan = self._plans[key] = (p, synops.channel_block(p, s.device))
            _synops().launch_channel_sums(plan[0], s.detach(), plan[1], row)
        else:
            dims = [d for d in range(s.dim()) if d != channel_dim]
            torch.sum(s.detach(), dim=dims, dtype=torch.float32, out=row)

    def fold(self) -> None:
        if self.used == 0:
            return
        self.acc += self.rows[: self.used].sum(0, dtype=torch.float64)
        self.rows[: self.used].zero_()  # the kernel adds into its row
        self.used = 0


class _Sink:
    """A :class:`NormNeuron`'s ``activity`` while a counter is attached: the layer calls it with every call's
    spikes (``counted``: its fused kernel already added them to :meth:`row`), instead of a forward hook."""

    __slots__ = ("counter", "layer")

    def __init__(self, counter: ActivityCounter, layer: _Spiking) -> None:
        self.counter, self.layer = counter, layer

    def row(self, x: torch.Tensor, T: int | None) -> torch.Tensor | None:
        """The row the fused kernel adds the spikes of input ``x`` to, where this counter counts with kernels."""
        if not self.counter._kernel(x):
            return None
        channels = x.shape[-3]
        return self.layer.next_row(channels, x.numel() // channels * (T or 1), x.device)

    def __call__(self, spikes: torch.Tensor, counted: bool = False) -> None:
        self.counter._count_spikes(self.layer, spikes, counted)


def spiking_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every spiking layer whose output is spikes: each :class:`NormNeuron` (its neuron is bypassed when
    fused) and each neuron that is not inside one."""
    fused = [name for name, m in model.named_modules() if isinstance(m, SELF_COUNTING)]
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, SELF_COUNTING) or (isinstance(m, BaseNeuron) and not any(name.startswith(f + ".")
                                                                                    for f in fused))]


class NotSpiking(ValueError):
    """A network that the efficiency report cannot describe: it has no snntrain spiking layers."""


def check_spiking(model: nn.Module) -> None:
    """Refuse (:class:`NotSpiking`, with the reason) a network without snntrain spiking layers
    (:func:`spiking_layers`): the report counts the spikes those layers fire and the synaptic operations they
    drive, so for any other network it would report zero spikes and activity that it never saw."""
    if not spiking_layers(model):
        raise NotSpiking(
            "the efficiency report covers networks with snntrain spiking layers (snntrain.nn IF, LIF, PLIF or "
            f"NormNeuron), and {type(model).__name__} has none: it counts the spikes those layers fire and the "
            "synaptic operations they drive, so for this network it would report zero spikes, which would be "
            "wrong, not a measurement. Build the network's neurons with snntrain.nn (build_neuron, NormNeuron) to "
            "get the report")


def connection_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, CONNECTIONS)]


class ActivityCounter:
    """Forward hooks that count a model's activity on the device over any number of forward passes.

    Args:
        model: the network (its input is ``[B, ...]``, repeated over T inside, or ``[T, B, C, H, W]``).
        backend: ``torch``, ``triton`` or ``auto``: how layers are counted (the Triton kernels for spiking
            outputs and ``Conv2d`` and ``Linear`` inputs on CUDA, the PyTorch reference otherwise).
        connections: also count synaptic operations (False: spiking layers only, for firing rates).

    ``attach()`` registers the hooks and starts from zero; ``detach()`` removes them. The weights are read
    at each layer's first call after ``attach()`` (attach again after changing them). The counts stay on
    the device until :meth:`totals`.
    """

    def __init__(self, model: nn.Module, backend: str = "auto", connections: bool = True) -> None:
        self.model = model
        self.backend = backend
        self.spiking = {name: _Spiking(name, m) for name, m in spiking_layers(model)}
        self.connections = ({name: _Connection(name, m, i) for i, (name, m) in enumerate(connection_layers(model))}
                            if connections else {})
        self._stores: dict[torch.device, _Store] = {}  # the connection layers' device counts, per device
        self.samples = self.passes = 0
        self.order: list[str] = []  # layer names in the order of their first call
        self._seen: set[str] = set()
        self._batch: int | None = None
        self._handles: list[Any] = []
        self._kernels: dict[torch.device, bool] = {}

    # hooks
    def _model_pre(self, module: nn.Module, args: tuple) -> None:
        x = args[0] if args else None
        if torch.is_tensor(x) and x.dim() >= 1:
            self._batch = int(x.shape[1] if x.dim() == 5 else x.shape[0])
            self.samples += self._batch
            self.passes += 1

    def _model_post(self, module: nn.Module, args: tuple, output: Any) -> None:
        self._batch = None

    def _kernel(self, x: torch.Tensor) -> bool:
        """Whether inputs on ``x``'s device are counted by the Triton kernel (decided once per device)."""
        decided = self._kernels.get(x.device)
        if decided is None:
            decided = self._kernels[x.device] = use_triton(self.backend, x)
        return decided

    def _first(self, name: str) -> None:
        if name not in self._seen:
            self._seen.add(name)
            self.order.append(name)

    def _connection_pre(self, layer: _Connection, module: nn.Module, args: tuple) -> None:
        self._first(layer.name)
        x = args[0]
        store = self._stores.get(x.device)
        if store is None:
            store = self._stores[x.device] = _Store(len(self.connections), x.device)
        layer.count(x, self._batch, self._kernel(x), store)

    def _count_spikes(self, layer: _Spiking, s: torch.Tensor, counted: bool = False) -> None:
        """Count one call's spikes of ``layer`` (from its hook or its :class:`_Sink`)."""
        self._first(layer.name)
        if counted:  # the row was handed out (and made) by next_row: only the bookkeeping is left
            layer._counted(s)
        else:
            layer.count(s, self._kernel(s))

    def _spiking_post(self, layer: _Spiking, module: nn.Module, args: tuple, output: Any) -> None:
        self._count_spikes(layer, output[0] if isinstance(output, tuple) else output)

    def attach(self) -> ActivityCounter:
        self.detach()
        self.reset()
        self._handles.append(self.model.register_forward_pre_hook(self._model_pre))
        self._handles.append(self.model.register_forward_hook(self._model_post))
        for layer in self.connections.values():
            self._handles.append(layer.module.register_forward_pre_hook(partial(self._connection_pre, layer)))
        for layer in self.spiking.values():
            if isinstance(layer.module, SELF_COUNTING) and layer.module.activity is None:
                # it hands its spikes over itself (and may count them as it fires them); a hook if another counter
                # holds it
                layer.module.activity = _Sink(self, layer)
            else:
                self._handles.append(layer.module.register_forward_hook(partial(self._spiking_post, layer)))
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for layer in self.spiking.values():
            if isinstance(layer.module, SELF_COUNTING) and isinstance(layer.module.activity, _Sink) \
                    and layer.module.activity.counter is self:
                del layer.module.activity  # back to the class's None: the module as it was

    def reset(self) -> None:
        for name, layer in self.spiking.items():
            fresh = _Spiking(name, layer.module)
            fresh._plans = layer._plans  # shapes decide these
            if layer.rows is not None:  # the device buffers (and their row views) serve again, zeroed
                if layer.used:
                    layer.rows.zero_()
                layer.acc.zero_()
                fresh.rows, fresh.acc, fresh._row_views = layer.rows, layer.acc, layer._row_views
            self.spiking[name] = fresh
        for name, layer in self.connections.items():
            fresh = _Connection(name, layer.module, layer.index)
            fresh._geo, fresh._plan = layer._geo, layer._plan  # shapes decide these; the weights are read again
            self.connections[name] = fresh
        for store in self._stores.values():
            store.reset()
        self.samples = self.passes = 0
        self.order.clear()
        self._seen.clear()
        self._batch = None

    # totals
    def _called(self) -> tuple[list[_Spiking], list[_Connection]]:
        return ([s for s in self.spiking.values() if s.host[0]], [c for c in self.connections.values() if c.host[0]])

    def totals(self) -> torch.Tensor | None:
        """Every count, one float64 tensor on the device (None when nothing ran): per spiking layer that ran
        (model order) its spikes per channel and its host counts, per connection layer that ran its device
        and host counts, then the samples and forward passes (the spiking layers' T is not packed: it is the
        same everywhere). Every process that ran the same layers packs the same layout,
        so the tensors can be added with one collective and handed to :meth:`unpack`."""
        spiking, conns = self._called()
        if not spiking and not conns:
            return None
        device = (spiking[0].acc if spiking else conns[0].acc).device
        parts, host = [], []
        for s in spiking:
            s.fold()
            parts.append(s.acc)
            host += s.host
        for store in self._stores.values():  # every connection layer at once
            _Store.fold_rows(store.rows, store.acc)
        for c in conns:
            c.used = 0
            host += c.host
        if conns:
            stores = {c.acc.device for c in conns}
            if len(stores) == 1 and len(conns) == len(self.connections):  # all of them, in store order
                parts.append(self._stores[stores.pop()].acc.double().flatten())
            else:
                parts += [c.acc.double() for c in conns]
        host += [self.samples, self.passes]
        return torch.cat([*parts, torch.tensor(host, dtype=torch.float64, device=device)])

    def static_metrics(self) -> dict[str, Any]:
        """:func:`static_metrics` of the model, with the weight counts of every connection layer that ran since
        :meth:`attach` (read at its first call) instead of a second pass over those weights."""
        return static_metrics(self.model, {c.name: c._m for c in self.connections.values() if c._m is not None})

    def unpack(self, flat: torch.Tensor) -> dict[str, Any]:
        """Reduced totals (from :meth:`totals`, on any device) as plain values: ``spiking`` and ``connections``
        per layer name, ``samples``, ``passes`` and ``order`` (the layers in the order they ran)."""
        spiking, conns = self._called()
        sizes = [s.acc.numel() for s in spiking] + [4] * len(conns)
        values = flat.detach().cpu()
        parts = values[: sum(sizes)].split(sizes)
        host = values[sum(sizes):].tolist()
        out: dict[str, Any] = {"spiking": {}, "connections": {}, "order": list(self.order)}
        i = 0
        for s, part in zip(spiking, parts):
            calls, neuron_steps, ann = host[i: i + 3]
            i += 3
            out["spiking"][s.name] = {"type": _layer_type(s.module), "channel_spikes": part,
                                      "spikes": float(part.sum()), "neuron_steps": neuron_steps,
                                      "ann_activations": ann, "steps": s.steps, "calls": int(calls)}
        for c, part in zip(conns, parts[len(spiking):]):
            calls, frames, numel, dense, ann_dense, ann_inputs = host[i: i + 6]
            i += 6
            ac, mac, nonzero, nonbinary_calls = part.tolist()
            out["connections"][c.name] = {"type": type(c.module).__name__, "ac": ac, "mac": mac, "nonzero": nonzero,
                                          "numel": numel, "dense": dense, "ann_dense": ann_dense,
                                          "ann_inputs": ann_inputs, "calls": int(calls),
                                          "nonbinary_calls": int(nonbinary_calls), "frames": frames}
        out["samples"], out["passes"] = int(host[i]), int(host[i + 1])
        return out


def _layer_type(module: nn.Module) -> str:
    if isinstance(module, NormNeuron):
        return f"{type(module.norm).__name__}+{type(module.neuron).__name__}"
    if isinstance(module, QKVNeuron):
        return f"QKV+{type(module.neuron).__name__}"
    return type(module).__name__


# ----------------------------------------------------------------------------- static metrics


def static_metrics(model: nn.Module, fanin: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """NeuroBench's static metrics of ``model``: ``ParameterCount``, ``Footprint`` (bytes of parameters and
    buffers) and ``ConnectionSparsity`` (zero weights over all weights of the connection layers).

    ``fanin`` (layer name -> :func:`weight_fanin` of its current weights, e.g. what an
    :class:`ActivityCounter` read this validation) saves reading those layers' weights again: its sum is the
    layer's nonzero weights."""
    fanin = fanin or {}
    params = sum(p.numel() for p in model.parameters())
    footprint = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    layers = connection_layers(model)
    total = sum(m.weight.numel() for _, m in layers)
    read = [fanin[name].flatten() for name, _ in layers if name in fanin]
    nonzero = [(m.weight.detach() != 0).sum() for name, m in layers if name not in fanin]
    if read:  # the counts the counter read: one concatenation and one sum, not a launch per layer
        nonzero.append(torch.cat([f.to(read[0].device) for f in read]).sum(dtype=torch.int64))
    zeros = total - int(torch.stack([n.to(nonzero[0].device) for n in nonzero]).sum()) if layers else 0
    return {"ParameterCount": params, "Footprint": footprint,
            "ConnectionSparsity": zeros / total if total else 0.0}


# ----------------------------------------------------------------------------- energy


@dataclass(frozen=True)
class EnergyModel:
    """Energy per operation and per memory word, picojoules."""

    name: str
    description: str
    source: str
    ac: float = 0.9                 # 32-bit float add, 45 nm
    mac: float = 4.6                # 32-bit float multiply (3.7) + add (0.9), 45 nm
    word: float = 0.0               # one 32-bit word read or written in SRAM

    def snn(self, w: dict[str, float]) -> float:
        """pJ per sample of the spiking network from the per-sample workload ``w``."""
        access = self.word
        energy = w["Effective_ACs"] * (self.ac + 3 * access) + w["Effective_MACs"] * (self.mac + 3 * access)
        if access:
            energy += (w["nonzero_inputs"] * access + w["neuron_updates"] * (self.mac + 3 * access)
                       + w["spikes"] * access)
        return energy

    def ann(self, a: dict[str, float]) -> float:
        """pJ per sample of the same network as a ReLU ANN (one step, dense) from its workload ``a``."""
        access = self.word
        energy = a["MACs"] * (self.mac + 3 * access)
        if access:
            energy += a["inputs"] * access + a["activations"] * 2 * access
        return energy


HOROWITZ = ("M. Horowitz, \"Computing's energy problem (and what we can do about it)\", ISSCC 2014: 45 nm, "
            "32-bit float add 0.9 pJ, multiply 3.7 pJ, 8 KB SRAM 10 pJ per 64-bit access")
ENERGY_MODELS = (
    EnergyModel(
        "compute", "0.9 pJ per AC, 4.6 pJ per MAC; nothing else (the proxy most SNN papers report)", HOROWITZ),
    EnergyModel(
        "compute+memory",
        "0.9 pJ per AC and 4.6 pJ per MAC, plus 5 pJ per 32-bit SRAM word (half a 64-bit access), no data "
        "reuse: every synaptic operation reads its weight and reads and writes its target's partial sum; every "
        "nonzero input is read once; SNN: every neuron-step reads its input current and reads and writes its "
        "membrane (3 words) with one MAC for the update, every spike is written; ANN: every activation reads its "
        "sum and writes its output (2 words). Memory accesses counted beside arithmetic as in Lemaire et al., "
        "ICONIP 2022, and Dampfhoffer et al., IEEE TETCI 2023", HOROWITZ, word=5.0),
)


# ----------------------------------------------------------------------------- the report


def build_report(totals: dict[str, Any], static: dict[str, Any] | None = None,
                 energy_models: Sequence[EnergyModel] = ENERGY_MODELS) -> dict[str, Any]:
    """The efficiency report (plain values, JSON-ready) from :meth:`ActivityCounter.unpack` output and
    :func:`static_metrics`. Workload values are per sample (one forward pass of one image) and per time step."""
    samples = max(1, totals["samples"])
    spiking, conns = totals["spiking"], totals["connections"]
    steps = max([s["steps"] for s in spiking.values()] or [1])
    spikes = sum(s["spikes"] for s in spiking.values())
    neuron_steps = sum(s["neuron_steps"] for s in spiking.values())
    ac = sum(c["ac"] for c in conns.values())
    mac = sum(c["mac"] for c in conns.values())
    dense = sum(c["dense"] for c in conns.values())
    synops = {"Effective_MACs": mac / samples, "Effective_ACs": ac / samples, "Dense": dense / samples}
    workload = {
        "SynapticOperations": synops,
        "SynapticOperations_per_time_step": {k: v / steps for k, v in synops.items()},
        "ActivationSparsity": 1.0 - spikes / neuron_steps if neuron_steps else 0.0,
        "firing_rate": spikes / neuron_steps if neuron_steps else 0.0,
        "spikes": spikes / samples,
        "neuron_updates": neuron_steps / samples,
        "nonzero_inputs": sum(c["nonzero"] for c in conns.values()) / samples,
    }
    ann = {"MACs": sum(c["ann_dense"] for c in conns.values()) / samples,
           "inputs": sum(c["ann_inputs"] for c in conns.values()) / samples,
           "activations": sum(s["ann_activations"] for s in spiking.values()) / samples}
    flat = {**synops, **{k: workload[k] for k in ("spikes", "neuron_updates", "nonzero_inputs")}}
    energy = []
    for model in energy_models:
        snn_uj, ann_uj = model.snn(flat) * 1e-6, model.ann(ann) * 1e-6
        energy.append({"model": model.name, "description": model.description, "source": model.source,
                       "snn_uJ": snn_uj, "ann_uJ": ann_uj, "ann_over_snn": ann_uj / snn_uj if snn_uj else None})
    layers = []
    for name in totals["order"]:
        if name in conns:
            c = conns[name]
            layers.append({
                "name": name, "type": c["type"], "kind": "connection",
                "Effective_ACs": c["ac"] / samples, "Effective_MACs": c["mac"] / samples, "Dense": c["dense"] / samples,
                "input_sparsity": 1.0 - c["nonzero"] / c["numel"] if c["numel"] else 0.0,
                "binary_input_calls": (c["calls"] - c["nonbinary_calls"]) / c["calls"] if c["calls"] else 0.0,
                "calls_per_pass": c["calls"] / max(1, totals["passes"]),
                "ann_MACs": c["ann_dense"] / samples,
            })
        elif name in spiking:
            s = spiking[name]
            rate = s["spikes"] / s["neuron_steps"] if s["neuron_steps"] else 0.0
            layers.append({"name": name, "type": s["type"], "kind": "spiking", "firing_rate": rate,
                           "ActivationSparsity": 1.0 - rate, "neurons": s["ann_activations"] / samples,
                           "spikes": s["spikes"] / samples})
    return {"format": FORMAT, "T": steps, "samples": totals["samples"], "static": dict(static or {}),
            "workload": workload, "ann": ann, "energy": energy, "layers": layers}


# ----------------------------------------------------------------------------- presentation


def _si(value: float | None, digits: int = 3) -> str:
    """``12.3 M``-style numbers for the tables."""
    if value is None:
        return "n/a"
    value = float(value)
    for factor, suffix in ((1e12, " T"), (1e9, " G"), (1e6, " M"), (1e3, " k")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g}{suffix}"
    return f"{value:.{digits}g}"


def markdown(report: dict[str, Any], title: str = "Efficiency report", layers: bool = True) -> str:
    """The report as markdown tables: totals, energy estimates beside the ANN, and (``layers``) per layer."""
    w, syn, steps = report["workload"], report["workload"]["SynapticOperations"], report["T"]
    st = report.get("static") or {}
    intro = (f"{report['samples']} samples (forward passes of one input) of the validation data, T = {steps}; "
             "values per sample (one forward pass over all T steps) and per time step. Synaptic operations "
             "follow NeuroBench's rules: inputs all in {-1, 0, 1}: accumulates (ACs), otherwise "
             "multiply-accumulates (MACs); zero inputs and zero weights skipped; bias, norms, pooling, "
             "element-wise ops and neuron updates not included.")
    lines = [f"## {title}", "", intro, "", "| metric (NeuroBench name) | per sample | per time step |", "|---|---|---|"]
    per_step = w["SynapticOperations_per_time_step"]
    for key, label in (("Effective_ACs", "effective ACs (Effective_ACs)"),
                       ("Effective_MACs", "effective MACs (Effective_MACs)"), ("Dense", "dense operations (Dense)")):
        lines.append(f"| {label} | {_si(syn[key])} | {_si(per_step[key])} |")
    lines.append(f"| spikes | {_si(w['spikes'])} | {_si(w['spikes'] / steps)} |")
    lines.append(f"| activation sparsity (ActivationSparsity) | {w['ActivationSparsity']:.4f} | |")
    lines.append(f"| firing rate | {w['firing_rate']:.4f} | |")
    if st:
        lines.append(f"| parameters (ParameterCount) | {_si(st['ParameterCount'])} | |")
        lines.append(f"| footprint, bytes (Footprint) | {_si(st['Footprint'])} | |")
        lines.append(f"| connection sparsity (ConnectionSparsity) | {st['ConnectionSparsity']:.4f} | |")
    lines.append(f"| same network as an ANN (ReLU, one step): MACs | {_si(report['ann']['MACs'])} | |")
    lines += ["", "| energy model | SNN, µJ per sample | same network as ANN (ReLU, one step), µJ | ANN / SNN |",
              "|---|---|---|---|"]
    for e in report["energy"]:
        ratio = "n/a" if e["ann_over_snn"] is None else f"{e['ann_over_snn']:.2f}"
        lines.append(f"| {e['model']} | {e['snn_uJ']:.4g} | {e['ann_uJ']:.4g} | {ratio} |")
    lines.append("")
    sources = []
    for e in report["energy"]:
        lines.append(f"- {e['model']}: {e['description']}.")
        if e["source"] not in sources:
            sources.append(e["source"])
    lines += [f"- Energy per operation and per memory access: {source}." for source in sources]
    if layers and report["layers"]:
        lines += ["", "| layer | type | firing rate | input sparsity | ACs | MACs | dense | binary-input calls |",
                  "|---|---|---|---|---|---|---|---|"]
        for lay in report["layers"]:
            if lay["kind"] == "spiking":
                lines.append(f"| {lay['name']} | {lay['type']} | {lay['firing_rate']:.4f} | | | | | |")
            else:
                lines.append(f"| {lay['name']} | {lay['type']} | | {lay['input_sparsity']:.4f} | "
                             f"{_si(lay['Effective_ACs'])} | {_si(lay['Effective_MACs'])} | {_si(lay['Dense'])} | "
                             f"{lay['binary_input_calls']:.2f} |")
    lines.append("")
    return "\n".join(lines)


_CHART_BASES: dict[tuple, Any] = {}
#: The chart's colours (RGB), indexed by the values of :func:`chart_indices`: white, black, then the bars'.
CHART_PALETTE = ((255, 255, 255), (0, 0, 0), (215, 215, 215), (50, 110, 200), (230, 140, 40), (60, 160, 80))
_WHITE, _BLACK, _DENSE, _AC, _MAC, _RATE = range(len(CHART_PALETTE))


def chart_indices(report: dict[str, Any], width: int = 640):
    """The per-layer chart as palette indices (uint8 ``[H, W]`` into :data:`CHART_PALETTE`): for each connection
    layer its effective ACs (blue) and MACs (orange) over its dense operations (grey, bars scaled to the largest),
    for each spiking layer its firing rate (green, scaled to the largest). The layer names are drawn once per list
    of layers and reused, so a chart per validation costs a few array writes and the encoding."""
    import numpy as np

    layers = report["layers"]
    row, label = 11, 200
    key = (tuple(lay["name"] for lay in layers), width)
    base = _CHART_BASES.get(key)
    if base is None:
        from PIL import Image, ImageDraw, ImageFont

        img = Image.new("L", (width, row * (len(layers) + 2) + 2), 255)
        draw = ImageDraw.Draw(img)
        font = ImageFont.load_default()
        draw.text((4, 2), "synaptic ops per sample: blue AC + orange MAC over grey dense; firing rate: green",
                  fill=0, font=font)
        for i, lay in enumerate(layers):
            draw.text((4, row * (i + 2) - 1), lay["name"][-32:], fill=0, font=font)
        if len(_CHART_BASES) >= 8:
            _CHART_BASES.clear()
        # text ink (anti-aliased grey levels included) as black, the rest white: two palette entries
        base = _CHART_BASES[key] = np.where(np.asarray(img) < 160, _BLACK, _WHITE).astype(np.uint8)
    img = base.copy()
    span = width - label - 8
    dense_max = max([lay["Dense"] for lay in layers if lay["kind"] == "connection"] or [1.0]) or 1.0
    rate_max = max([lay["firing_rate"] for lay in layers if lay["kind"] == "spiking"] or [1.0]) or 1.0

    def bar(y: int, start: float, length: float, colour: int) -> int:
        a, b = label + round(span * start), label + round(span * (start + length))
        img[y + 2: y + row - 2, a:b] = colour
        return b

    for i, lay in enumerate(layers):
        y = row * (i + 2)
        if lay["kind"] == "connection":
            ac, mac = lay["Effective_ACs"] / dense_max, lay["Effective_MACs"] / dense_max
            bar(y, 0.0, lay["Dense"] / dense_max, _DENSE)
            bar(y, 0.0, ac, _AC)
            bar(y, ac, mac, _MAC)
        else:
            bar(y, 0.0, lay["firing_rate"] / rate_max, _RATE)
    return img


def layer_chart(report: dict[str, Any], width: int = 640):
    """The per-layer chart of :func:`chart_indices` as an RGB picture (uint8 ``[H, W, 3]``)."""
    import numpy as np

    return np.asarray(CHART_PALETTE, dtype=np.uint8)[chart_indices(report, width)]


def chart_png(report: dict[str, Any], width: int = 640) -> tuple[bytes, int, int]:
    """The per-layer chart encoded as a 4-bit palette PNG: (bytes, height, width). Written here with ``zlib``
    (rows unfiltered, two pixels a byte, fastest deflate), about 0.4 ms on a 2-core CPU, where PIL's PNG encoder
    takes 1.2-2.4 ms for the same picture as 8-bit palette indices, and ``SummaryWriter.add_image`` (float
    conversion, RGB PNG at the default compression) about 15 ms."""
    import struct
    import zlib

    import numpy as np

    idx = chart_indices(report, width)
    h, w = idx.shape
    packed = np.zeros((h, 1 + (w + 1) // 2), dtype=np.uint8)  # a filter-type byte (0: none), then the row
    packed[:, 1:1 + w // 2] = (idx[:, 0:w - w % 2:2] << 4) | idx[:, 1:w:2]
    if w % 2:
        packed[:, -1] = idx[:, -1] << 4

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 4, 3, 0, 0, 0))
           + chunk(b"PLTE", bytes(c for rgb in CHART_PALETTE for c in rgb))
           + chunk(b"IDAT", zlib.compress(packed.tobytes(), 1)) + chunk(b"IEND", b""))
    return png, h, w
