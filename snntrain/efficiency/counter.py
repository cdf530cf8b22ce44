"""Counting on the device during validation: :class:`ActivityCounter` (forward hooks on connection and
spiking layers, NeuroBench's rules), with the per-layer state it keeps between calls."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from torch import nn

from ..backend import use_triton
from ..nn.attention import QKVNeuron
from ..nn.neurons import is_neuron
from ..nn.norm_neuron import NormNeuron
from .geometry import (
    _Geometry,
    connection_layers,
    count_reference,
    fanout_block,
    fanout_map,
    geometry,
    weight_fanin,
)
from .report import static_metrics

#: Spiking layers that hand their spikes to an attached counter themselves (``activity``), their neuron inside them
#: bypassed when fused: the norm-neuron and the fused attention product-neuron.
SELF_COUNTING = (NormNeuron, QKVNeuron)
#: Neurons (:func:`snntrain.nn.neurons.is_neuron`: the scan neurons, the step neurons and the parallel spiking neurons
#: PSN, MaskedPSN, SlidingPSN, whose product over time is counted as the neuron's update, not as synapses) are
#: counted by a forward hook on their output spikes.


#: Calls buffered per layer before they are folded into its totals.
ROWS = 64


# ----------------------------------------------------------------------------- per-layer state


_SYNOPS = None


def _synops():
    """:mod:`snntrain.kernels.synops`, imported at the first kernel launch (CPU-only use never loads Triton),
    then kept: the counting hooks call this on every layer call."""
    global _SYNOPS
    if _SYNOPS is None:
        from ..kernels import synops

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
            if isinstance(m, SELF_COUNTING) or (is_neuron(m) and not any(name.startswith(f + ".")
                                                                        for f in fused))]


class NotSpiking(ValueError):
    """A network that the efficiency report cannot describe: it has no snntrain spiking layers."""


def check_spiking(model: nn.Module) -> None:
    """Refuse (:class:`NotSpiking`, with the reason) a network without snntrain spiking layers
    (:func:`spiking_layers`): the report counts the spikes those layers fire and the synaptic operations they
    drive, so for any other network it would report zero spikes and activity that it never saw."""
    if not spiking_layers(model):
        raise NotSpiking(
            "the efficiency report covers networks with snntrain spiking layers (snntrain.nn neurons: IF, LIF, PLIF, "
            "PSN, MaskedPSN, SlidingPSN, a StepNeuron or any type of snntrain.nn.NEURONS; NormNeuron), and "
            f"{type(model).__name__} has none: it counts the spikes those layers fire and the "
            "synaptic operations they drive, so for this network it would report zero spikes, which would be "
            "wrong, not a measurement. Build the network's neurons with snntrain.nn (build_neuron, NormNeuron) to "
            "get the report")



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
        self.batch_size = 0  # the largest batch of one forward pass (this process's)
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
            self.batch_size = max(self.batch_size, self._batch)

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
        self.samples = self.passes = self.batch_size = 0
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
        per layer name, ``samples``, ``passes``, ``order`` (the layers in the order they ran) and ``batch_size``
        (the largest batch of one forward pass on this process: the same on every process of one loader)."""
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
        out["batch_size"] = self.batch_size
        return out


def _layer_type(module: nn.Module) -> str:
    if isinstance(module, NormNeuron):
        return f"{type(module.norm).__name__}+{type(module.neuron).__name__}"
    if isinstance(module, QKVNeuron):
        return f"QKV+{type(module.neuron).__name__}"
    return type(module).__name__
