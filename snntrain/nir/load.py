"""A NIR graph, ours or another library's, run with snntrain layers (:func:`load_nir`, :func:`node_map`)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..nn.layers import MultiStep
from ..nn.neurons import IF, LIF, BaseNeuron
from .targets import DEFAULT_DT, READOUT_MEAN, NIRError


def _uniform(node_name: str | None, field: str, value: Any) -> float:
    arr = np.asarray(value, dtype=np.float64)
    if arr.size == 0:
        raise NIRError(f"{_prefix(node_name)}{field} is empty")
    first = float(arr.reshape(-1)[0])
    if not np.all(arr == first):
        raise NIRError(f"{_prefix(node_name)}{field} differs between neurons ({arr.min():g} to {arr.max():g}); "
                       "snntrain neurons share one value per layer")
    return first


def _prefix(name: str | None) -> str:
    return f"{name}: " if name else ""


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def _lif(name: str | None, tau: float, r: float, v_leak: float, v_th: float, v_reset: float, dt: float, backend: str,
         kind: str = "LIF") -> BaseNeuron:
    """snntrain's neuron for NIR's ``tau dv/dt = (v_leak - v) + r I`` stepped by forward Euler with ``dt``."""
    tau_steps = tau / dt
    if not _close(v_leak, v_reset):
        raise NIRError(f"{_prefix(name)}{kind} with v_leak={v_leak:g} != v_reset={v_reset:g}: snntrain's LIF leaks "
                       "towards its reset potential")
    if math.isinf(tau_steps):  # no leak at all: snnTorch writes its Leaky(beta=1) with tau = r = inf
        if not math.isinf(r):
            raise NIRError(f"{_prefix(name)}{kind} with tau=inf and r={r:g} adds none of its input (r dt / tau = 0)")
        return IF(v_threshold=v_th, v_reset=v_reset, backend=backend)
    if not tau_steps > 1.0:
        hint = ""
        if tau / dt**2 > 1.0:
            hint = (f" Norse 1.1's to_nir writes tau multiplied by its dt (norse/norse#411): a LIFBoxCell with "
                    f"tau_mem_inv = 1/tau_mem is written as tau = dt * tau_mem; if this graph comes from Norse, its "
                    f"time constant is {tau / dt:g} s ({tau / dt**2:g} steps of {dt:g} s): divide the graph's tau "
                    "by dt before loading it.")
        raise NIRError(f"{_prefix(name)}{kind} with tau={tau:g} s at dt={dt:g} s is {tau_steps:g} steps; snntrain's "
                       f"LIF needs more than one step (pass the dt the graph was written for).{hint}")
    if _close(r, 1.0):
        decay_input = True
    elif _close(r, tau_steps):
        decay_input = False
    else:
        raise NIRError(f"{_prefix(name)}{kind} with r={r:g}: snntrain's LIF takes r = 1 (input divided by tau) or r = "
                       f"tau/dt = {tau_steps:g} (input added unscaled)")
    if not decay_input and tau_steps >= 2.0**40 and v_reset == 0.0:
        # V - V / tau rounds to V in float32 for tau >= 2**40 steps: the IF (snntrain writes IF so for snnTorch)
        return IF(v_threshold=v_th, v_reset=v_reset, backend=backend)
    return LIF(tau=tau_steps, v_threshold=v_th, v_reset=v_reset, decay_input=decay_input, backend=backend)


def neuron_from_nir(node: Any, dt: float, backend: str = "torch", name: str | None = None) -> BaseNeuron:
    """The snntrain neuron of a NIR ``LIF``, ``IF`` or ``CubaLIF`` node (the inverse of :func:`neuron_to_nir`).

    ``IF``: ``r = 1/dt`` is NIR's IF stepped by ``dt`` (snntrain, SpikingJelly); ``r = 1`` is read as the
    IF that adds its input unscaled each step, which is what Norse and Sinabs simulate when they write
    ``r = 1`` (and the only IF snnTorch's importer takes). ``CubaLIF`` maps only with ``tau_syn = dt`` (the
    synaptic current is the step's weighted input: snnTorch's ``Synaptic(alpha=0)``); snntrain's neurons have no
    synaptic current otherwise."""
    import nir

    v_th = _uniform(name, "v_threshold", node.v_threshold)
    v_reset = _uniform(name, "v_reset", node.v_reset if node.v_reset is not None else 0.0)
    r = _uniform(name, "r", node.r)
    if isinstance(node, nir.IF):
        if not (_close(r * dt, 1.0) or _close(r, 1.0)):
            raise NIRError(f"{_prefix(name)}IF with r={r:g} at dt={dt:g}: snntrain's IF adds its input unscaled, "
                           f"which is r = 1/dt = {1 / dt:g} (NIR's IF stepped by dt) or r = 1 (as Norse and Sinabs "
                           "write it); pass the dt the graph was written for")
        return IF(v_threshold=v_th, v_reset=v_reset, backend=backend)
    v_leak = _uniform(name, "v_leak", node.v_leak)
    if isinstance(node, nir.CubaLIF):
        tau_syn = _uniform(name, "tau_syn", node.tau_syn)
        if not _close(tau_syn, dt):
            raise NIRError(f"{_prefix(name)}CubaLIF with tau_syn={tau_syn:g} s ({tau_syn / dt:g} steps of "
                           f"dt={dt:g} s): snntrain's neurons have no synaptic current (only tau_syn = dt, a current "
                           "that is the step's input, maps to a LIF); snnTorch's Synaptic and Norse's LIFCell export "
                           "to CubaLIF")
        w_in = _uniform(name, "w_in", node.w_in)
        return _lif(name, _uniform(name, "tau_mem", node.tau_mem), r * w_in, v_leak, v_th, v_reset, dt, backend,
                    "CubaLIF")
    return _lif(name, _uniform(name, "tau", node.tau), r, v_leak, v_th, v_reset, dt, backend)


class SumPool2d(nn.Module):
    """Sum over each window (zero padding)."""

    def __init__(self, kernel_size, stride, padding) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, count_include_pad=True, divisor_override=1)


class AvgPool2d(nn.Module):
    """Average over each window; a window that covers the whole map is global average pooling."""

    def __init__(self, kernel_size, stride, padding) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) == tuple(self.kernel_size) and not any(self.padding):
            return F.adaptive_avg_pool2d(x, 1)
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding)


class Threshold(nn.Module):
    """NIR's ``Threshold``: 1 where the input exceeds ``threshold``, else 0."""

    def __init__(self, threshold: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("threshold", threshold)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x > self.threshold).to(x.dtype)


class Scale(nn.Module):
    """NIR's ``Scale``: elementwise product with ``scale`` (the per-sample shape)."""

    def __init__(self, scale: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def _pair(v: Any) -> tuple[int, int]:
    a = np.asarray(v).reshape(-1).astype(np.int64)
    return (int(a[0]), int(a[0])) if a.size == 1 else (int(a[0]), int(a[1]))


def _conv(node: Any) -> nn.Module:
    w = torch.from_numpy(np.asarray(node.weight, dtype=np.float32))
    padding = node.padding if isinstance(node.padding, str) else _pair(node.padding)
    conv = nn.Conv2d(w.shape[1] * int(node.groups), w.shape[0], tuple(w.shape[2:]), stride=_pair(node.stride),
                     padding=padding, dilation=_pair(node.dilation), groups=int(node.groups), bias=True)
    with torch.no_grad():
        conv.weight.copy_(w)
        bias = node.bias if node.bias is not None else np.zeros(w.shape[0])
        conv.bias.copy_(torch.from_numpy(np.broadcast_to(np.asarray(bias, np.float32), (w.shape[0],)).copy()))
    return conv


def _affine(node: Any, bias: bool) -> nn.Module:
    w = torch.from_numpy(np.asarray(node.weight, dtype=np.float32))
    if w.dim() != 2:
        raise NIRError(f"{type(node).__name__} with a weight of shape {tuple(w.shape)}: only 2-D weights are supported")
    lin = nn.Linear(w.shape[1], w.shape[0], bias=bias)
    with torch.no_grad():
        lin.weight.copy_(w)
        if bias:
            lin.bias.copy_(torch.from_numpy(np.asarray(node.bias, np.float32)))
    return lin


def _flatten(node: Any) -> nn.Module:
    start = int(node.start_dim)
    end = int(node.end_dim)
    return nn.Flatten(start + 1 if start >= 0 else start, end + 1 if end >= 0 else end)  # + the batch dim


def node_map(dt: float, backend: str = "torch") -> dict[type, Callable[[Any], nn.Module]]:
    """NIR node type -> a function building the snntrain module that runs it on ``[T, B, ...]`` input.

    Stateless layers run once on the folded ``[T * B, ...]`` batch (:class:`MultiStep`); neurons scan over T.
    Also usable as a ``nirtorch.nir_to_torch`` node map (each module is called once on the whole sequence).
    """
    import nir

    return {
        nir.Input: lambda n: nn.Identity(),
        nir.Output: lambda n: nn.Identity(),
        nir.Conv2d: lambda n: MultiStep(_conv(n)),
        nir.Affine: lambda n: MultiStep(_affine(n, True)),
        nir.Linear: lambda n: MultiStep(_affine(n, False)),
        nir.Flatten: lambda n: MultiStep(_flatten(n)),
        nir.SumPool2d: lambda n: MultiStep(SumPool2d(_pair(n.kernel_size), _pair(n.stride), _pair(n.padding))),
        nir.AvgPool2d: lambda n: MultiStep(AvgPool2d(_pair(n.kernel_size), _pair(n.stride), _pair(n.padding))),
        nir.Threshold: lambda n: Threshold(torch.from_numpy(np.asarray(n.threshold, np.float32))),
        nir.Scale: lambda n: Scale(torch.from_numpy(np.asarray(n.scale, np.float32))),
        nir.LIF: lambda n: neuron_from_nir(n, dt, backend),
        nir.IF: lambda n: neuron_from_nir(n, dt, backend),
        nir.CubaLIF: lambda n: neuron_from_nir(n, dt, backend),
    }


def _safe(name: str) -> str:
    return name.replace(".", "_")


class NIRNetwork(nn.Module):
    """A NIR graph run with snntrain layers over ``[T, B, ...]`` sequences.

    ``forward(x)`` takes ``[T, B, *input]`` (or ``[B, *input]``, repeated over ``T`` steps) and returns the
    single output, or a dict of outputs by name; with ``readout == "mean_over_time"`` (snntrain classifiers)
    the output is averaged over T, as the original model's logits are.
    """

    def __init__(self, layers: Mapping[str, nn.Module], order: list[str], sources: Mapping[str, list[str]],
                 inputs: list[str], outputs: list[str], T: int, readout: str | None, dt: float,
                 input_shape: tuple[int, ...] | None = None) -> None:
        super().__init__()
        self.input_shape = input_shape
        self.layers = nn.ModuleDict({_safe(k): v for k, v in layers.items()})
        self.order, self.sources = list(order), {k: list(v) for k, v in sources.items()}
        self.inputs, self.outputs = list(inputs), list(outputs)
        self.T, self.readout, self.dt = int(T), readout, float(dt)

    def forward(self, x: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        if self.input_shape is not None and x.dim() == len(self.input_shape) + 1:  # static input: every step
            x = x.unsqueeze(0).expand(self.T, *x.shape)
        if self.input_shape is not None and tuple(x.shape[2:]) != self.input_shape:
            dims = ", ".join(map(str, self.input_shape))
            raise ValueError(f"input has shape {tuple(x.shape)}; expected [T, B, {dims}] or [B, {dims}]")
        if x.dim() < 3:
            raise ValueError(f"input has shape {tuple(x.shape)}; expected [T, B, ...] or [B, ...]")
        values: dict[str, torch.Tensor] = {}
        for name in self.order:
            if name in self.inputs:
                values[name] = x
                continue
            srcs = [values[s] for s in self.sources[name]]
            y = srcs[0]
            for other in srcs[1:]:  # NIR sums the edges into a node
                y = y + other
            values[name] = self.layers[_safe(name)](y)
        outs = {name: values[name] for name in self.outputs}
        if self.readout == READOUT_MEAN:
            outs = {k: v.mean(0) for k, v in outs.items()}
        return next(iter(outs.values())) if len(outs) == 1 else outs


def _sample_shape(graph: Any, input_name: str, shape: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The per-sample input shape. nirtorch's exporter (Norse 1.1's ``to_nir``) writes the Input node with the
    sample data's batch dimension (NIRTorch#17): ``[1, C, H, W]`` before a ``Conv2d``, ``[1, N]`` before an
    ``Affine``. A leading 1 is dropped when the nodes reading the input take one dimension fewer."""
    import nir

    if shape is None:
        return None
    ranks = set()
    for a, b in graph.edges:
        node = graph.nodes.get(b) if a == input_name else None
        if isinstance(node, nir.Conv2d):
            ranks.add(3)
        elif isinstance(node, nir.Conv1d):
            ranks.add(2)
        elif isinstance(node, (nir.Affine, nir.Linear)):
            ranks.add(1)
    if len(ranks) == 1 and len(shape) == ranks.pop() + 1 and shape[0] == 1:
        return shape[1:]
    return shape


def load_nir(source: str | os.PathLike | Any, dt: float | None = None, T: int | None = None,
             backend: str = "torch") -> NIRNetwork:
    """A runnable model (eval mode) from a NIR graph or ``.nir`` file, made of snntrain layers.

    ``dt`` (seconds per step) defaults to the graph's metadata ``dt``, else :data:`DEFAULT_DT`; ``T`` (steps for
    static input) to the metadata ``T``, else 4. Node types without an snntrain layer, per-neuron parameters
    that differ, neuron settings snntrain cannot express and recurrent graphs raise :class:`NIRError`.
    """
    import nir

    graph = nir.read(str(source)) if isinstance(source, (str, os.PathLike)) else source
    if not isinstance(graph, nir.NIRGraph):
        raise NIRError(f"{source!r} is not a NIR graph (got {type(graph).__name__})")
    meta = dict(graph.metadata or {})
    dt = float(meta.get("dt", DEFAULT_DT)) if dt is None else float(dt)
    T = int(meta.get("T", 4)) if T is None else int(T)
    mapping = node_map(dt, backend)
    layers: dict[str, nn.Module] = {}
    for name, node in graph.nodes.items():
        builder = mapping.get(type(node))
        if builder is None:
            kinds = ", ".join(sorted(t.__name__ for t in mapping))
            raise NIRError(f"node {name!r} is a {type(node).__name__}, which has no snntrain layer; supported: {kinds}")
        try:
            layers[name] = builder(node)
        except NIRError as err:
            raise NIRError(f"node {name!r}: {err}") from None
    sources: dict[str, list[str]] = {n: [] for n in graph.nodes}
    for a, b in graph.edges:
        if a not in graph.nodes or b not in graph.nodes:
            raise NIRError(f"edge ({a!r}, {b!r}) names a node that is not in the graph")
        sources[b].append(a)
    inputs = [n for n, node in graph.nodes.items() if isinstance(node, nir.Input)]
    outputs = [n for n, node in graph.nodes.items() if isinstance(node, nir.Output)]
    if len(inputs) != 1 or not outputs:
        raise NIRError(f"the graph needs one Input node and at least one Output node (has {len(inputs)} inputs, "
                       f"{len(outputs)} outputs)")
    order = _topological(graph.nodes, sources)
    shape = graph.nodes[inputs[0]].input_type.get("input")
    shape = None if shape is None else tuple(int(s) for s in np.asarray(shape).reshape(-1))
    shape = _sample_shape(graph, inputs[0], shape)
    return NIRNetwork(layers, order, sources, inputs, outputs, T, meta.get("readout"), dt, shape).eval()


def _topological(nodes: Mapping[str, Any], sources: Mapping[str, list[str]]) -> list[str]:
    order: list[str] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    for root in nodes:
        stack = [(root, iter(sources[root]))]
        if state.get(root) == 2:
            continue
        state[root] = 1
        while stack:
            name, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                state[name] = 2
                order.append(name)
            elif state.get(nxt) == 1:
                raise NIRError(f"the graph is recurrent (a cycle through {nxt!r}): snntrain runs feed-forward "
                               "graphs, with the recurrence in time inside the neurons")
            elif state.get(nxt) is None:
                state[nxt] = 1
                stack.append((nxt, iter(sources[nxt])))
    return order
