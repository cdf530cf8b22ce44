"""NIR (the Neuromorphic Intermediate Representation): export SEW-ResNets, import NIR graphs.

:func:`to_nir` describes a trained SEW-ResNet classifier (or a detector's backbone) as a NIR graph
for one reader (``target``: :data:`NIR_TARGETS`); :func:`load_nir` builds a runnable model from a NIR
graph, ours or another library's, out of snntrain layers. docs/nir.md gives the mapping in full and
what each reader imports; in short:

* a convolution and the BatchNorm after it become one ``Conv2d`` with the norm folded
  into its weight and bias (:func:`fold_batchnorm` gives the same network as a PyTorch
  model); layer norm has no NIR node and is refused;
* neurons map to NIR's continuous-time definitions discretised by forward Euler with
  step ``dt`` (graph metadata ``dt``): LIF/PLIF ``tau dv/dt = (v_leak - v) + r I`` with
  ``tau = tau_steps * dt``, ``v_leak = v_reset`` and ``r = 1`` (``decay_input``) or
  ``r = tau_steps`` (not); IF ``dv/dt = r I`` with ``r = 1 / dt`` (for snnTorch, whose importer
  reads IF as a leaky neuron, the same neuron as a LIF without leak: ``tau = 2**60 dt``,
  ``r = 2**60``); hard reset to ``v_reset``. Soft reset (subtract the threshold) has no NIR form
  and is refused;
* a SEW ``ADD`` is NIR's own sum: the residual branch and the shortcut both have edges into the
  nodes that read the block's output (NIR adds the edges into a node); ``AND`` and ``IAND``
  multiply spikes, which NIR cannot express, and are refused;
* max pooling of spikes is a sum over each window followed by a threshold at 0.5 (the max of
  0/1 values is 1 exactly when their sum is at least 1): ``SumPool2d`` and ``Threshold`` for
  ``spec``; for the importers, which map neither ``Threshold`` nor a padded ``SumPool2d``, a
  ``Conv2d`` of ones (with the padding) and an IF neuron, whose membrane is back at 0 after every
  step (it fires on any count >= 1 and resets, and a count of 0 leaves it at 0); global average
  pooling is an ``AvgPool2d`` over the whole map (for Norse, which maps none, a ``SumPool2d`` with
  the ``1 / (H W)`` folded into the readout's weight), then ``Flatten`` and the readout ``Affine``;
* for Norse, whose executor runs the nodes depth first from the input, each downsampling block
  gets an edge of zeros (a ``Conv2d`` with zero weights, ``layer<i>.0.order``) from the end of the
  residual branch to the start of the shortcut, so that the shortcut runs after the branch and
  before the sum that reads both.

Before anything is written the graph is checked against its reader (:func:`target_problems`):
every node it cannot import as NIR defines it is named, with the reason. The graph runs one time
step per call of its nodes; a classifier's logits are the mean over T of its output (graph
metadata ``readout: mean_over_time``), which :func:`load_nir` applies.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .nn.layers import MultiStep
from .nn.neurons import IF, LIF, BaseNeuron
from .nn.norm_neuron import NormNeuron

#: Seconds per time step of graphs written for target ``spec`` (snnTorch's convention; Norse's is 1e-3).
DEFAULT_DT = 1e-4
READOUT_MEAN = "mean_over_time"
#: A LIF with ``tau = 2**60`` steps and ``r = tau / dt`` is an IF: ``V - V / 2**60`` rounds to ``V`` in
#: float32 and float64 (and snnTorch's ``beta = 1 - dt / tau`` to 1.0).
NO_LEAK_STEPS = 2.0**60


class NIRError(ValueError):
    """A network or graph that the NIR mapping cannot express, with the reason."""


@dataclass(frozen=True)
class NIRTarget:
    """A reader of exported graphs: how it imports one, the ``dt`` it steps with and the node types it maps.

    ``fixed_dt``: the importer assumes ``dt`` whatever the graph was written for (snnTorch 1.0); otherwise
    the importer takes the graph's ``dt`` as an argument (``dt`` is the export's default)."""

    name: str
    reader: str
    dt: float
    fixed_dt: bool
    nodes: tuple[str, ...]


#: ``export.nir_target``: the readers an exported graph can be written for (docs/nir.md has a table for each).
NIR_TARGETS: dict[str, NIRTarget] = {
    "spec": NIRTarget("spec", "snntrain.load_nir(path) (NIR's node definitions)", DEFAULT_DT, False,
                      ("Input", "Output", "Conv2d", "Affine", "Linear", "Flatten", "SumPool2d", "AvgPool2d",
                       "Threshold", "Scale", "IF", "LIF", "CubaLIF")),
    "snntorch": NIRTarget("snntorch", "snntorch.import_nir.import_from_nir(nir.read(path)) (snnTorch 1.0)", 1e-4,
                          True, ("Input", "Output", "Affine", "Linear", "Conv2d", "Flatten", "AvgPool2d",
                                 "SumPool2d", "IF", "LIF", "CubaLIF")),
    "norse": NIRTarget("norse", "norse.torch.from_nir(nir.read(path), dt=dt) (Norse 1.1)", 1e-3, False,
                       ("Input", "Output", "Affine", "Linear", "Conv2d", "Flatten", "SumPool2d", "IF", "LIF",
                        "CubaLIF")),
    "spikingjelly": NIRTarget("spikingjelly", "spikingjelly.activation_based.nir_exchange.import_from_nir(path, "
                              "dt=dt) (SpikingJelly 2.0)", 1e-4, False,
                              ("Input", "Output", "Affine", "Linear", "Conv1d", "Conv2d", "AvgPool2d", "Flatten",
                               "SumPool2d", "IF", "LIF", "CubaLIF")),
}


def check_target(target: object) -> NIRTarget:
    """The :class:`NIRTarget` named ``target``, or a ValueError listing the valid names."""
    if not isinstance(target, str) or target not in NIR_TARGETS:
        raise ValueError(f"export.nir_target={target!r} is not valid; choose one of {', '.join(NIR_TARGETS)}")
    return NIR_TARGETS[target]


# ----------------------------------------------------------------------------- helpers


def _is_batchnorm(m: nn.Module) -> bool:
    """A BatchNorm by its parameters (``running_mean``, ``running_var``, ``eps``), whatever its class."""
    return all(hasattr(m, a) for a in ("running_mean", "running_var", "eps"))


def _is_neuron(m: nn.Module) -> bool:
    return isinstance(m, BaseNeuron) or hasattr(m, "params") and hasattr(m.params, "kind")


def _bn_scale_shift(bn: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``y = x * scale + shift`` of a BatchNorm in eval mode, computed in float64."""
    var = bn.running_var.detach().double()
    mean = bn.running_mean.detach().double()
    inv = 1.0 / torch.sqrt(var + float(bn.eps))
    w = bn.weight.detach().double() if getattr(bn, "weight", None) is not None else torch.ones_like(var)
    b = bn.bias.detach().double() if getattr(bn, "bias", None) is not None else torch.zeros_like(var)
    return w * inv, b - mean * w * inv


def fold_conv_bn(conv: nn.Conv2d, bn: nn.Module | None) -> nn.Conv2d:
    """A ``Conv2d`` with bias equal to ``bn(conv(x))`` (eval mode); ``bn`` None gives the conv with a bias."""
    weight = conv.weight.detach().double()
    bias = conv.bias.detach().double() if conv.bias is not None else torch.zeros(weight.shape[0], dtype=torch.float64)
    if bn is not None:
        scale, shift = _bn_scale_shift(bn)
        weight = weight * scale.view(-1, 1, 1, 1)
        bias = bias * scale + shift
    out = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride, padding=conv.padding,
                    dilation=conv.dilation, groups=conv.groups, bias=True)
    with torch.no_grad():
        out.weight.copy_(weight.to(conv.weight.dtype))
        out.bias.copy_(bias.to(conv.weight.dtype))
    return out.to(conv.weight.device)


def fold_batchnorm(model: nn.Module) -> nn.Module:
    """A copy of ``model`` (eval mode) with every BatchNorm that follows a convolution folded into that
    convolution: the network that an exported NIR graph describes, as a PyTorch model.

    A BatchNorm follows a convolution when it comes next in an ``nn.Sequential``, or when it is the norm
    of a :class:`~snntrain.nn.norm_neuron.NormNeuron` whose preceding sibling modules (in registration
    order, which is the forward order of SEW-ResNet's stem and blocks) end with that convolution; the
    folded NormNeuron keeps its neuron behind an ``nn.Identity`` norm."""
    import copy

    model = copy.deepcopy(model).eval()
    for seq in [m for m in model.modules() if isinstance(m, nn.Sequential)]:
        names = list(seq._modules)
        for a, b in itertools.pairwise(names):
            conv, bn = seq._modules[a], seq._modules[b]
            if isinstance(conv, nn.Conv2d) and _is_batchnorm(bn) and not _is_neuron(bn):
                seq._modules[a] = fold_conv_bn(conv, bn)
                seq._modules[b] = nn.Identity()
    for parent in list(model.modules()):
        last_conv: tuple[nn.Module, str] | None = None  # (module holding the conv, its attribute name)
        for child in parent.children():
            if isinstance(child, NormNeuron):
                if last_conv is not None and _is_batchnorm(child.norm):
                    holder, key = last_conv
                    holder._modules[key] = fold_conv_bn(holder._modules[key], child.norm)
                    child.norm = nn.Identity()
                last_conv = None
            elif isinstance(child, nn.Conv2d):
                last_conv = (parent, next(k for k, v in parent._modules.items() if v is child))
            elif isinstance(child, nn.Sequential) and len(child) and isinstance(child[-1], nn.Conv2d):
                last_conv = (child, list(child._modules)[-1])
            elif isinstance(child, nn.Sequential) and len(child) and isinstance(child[-1], NormNeuron):
                last_conv = None
    return model


def _full(shape: tuple[int, ...], value: float) -> np.ndarray:
    return np.full(shape, value, dtype=np.float64)


def _neuron_tau_steps(m: nn.Module) -> float | None:
    p = m.params
    if p.kind == "lif":
        return float(p.tau)
    if p.kind == "plif":
        # the time constant the forward uses: 1 / sigmoid(w) with sigmoid in float32
        return 1.0 / float(torch.sigmoid(m.w.detach().float()))
    return None


def _if_node(shape: tuple[int, ...], v_threshold: float, v_reset: float, dt: float, target: str) -> Any:
    """An IF neuron (``V + X``, hard reset) for ``target``: NIR's ``IF`` with ``r = 1 / dt``, or for snnTorch
    a LIF whose leak is below float precision (:data:`NO_LEAK_STEPS`)."""
    import nir

    thr, v_r = _full(shape, v_threshold), _full(shape, v_reset)
    if target == "snntorch":
        return nir.LIF(tau=_full(shape, NO_LEAK_STEPS * dt), r=_full(shape, NO_LEAK_STEPS), v_leak=v_r.copy(),
                       v_threshold=thr, v_reset=v_r)
    return nir.IF(r=_full(shape, 1.0 / dt), v_threshold=thr, v_reset=v_r)


def _neuron_node(m: nn.Module, shape: tuple[int, ...], dt: float, target: str) -> Any:
    import nir

    p = m.params
    if p.v_reset is None:
        raise NIRError("soft reset (v_reset=None, subtract the threshold) has no NIR form: NIR's neurons reset to "
                       "v_reset. Train with a hard reset (model.neuron.v_reset=0.0) to export to NIR")
    if p.kind == "if":
        return _if_node(shape, p.v_threshold, p.v_reset, dt, target)
    tau_steps = _neuron_tau_steps(m)
    v_reset = _full(shape, p.v_reset)
    return nir.LIF(tau=_full(shape, tau_steps * dt), r=_full(shape, 1.0 if p.decay_input else tau_steps),
                   v_leak=v_reset.copy(), v_threshold=_full(shape, p.v_threshold), v_reset=v_reset)


def neuron_to_nir(m: nn.Module, shape: tuple[int, ...], dt: float, name: str = "neuron", target: str = "spec") -> Any:
    """The NIR node (``LIF`` or ``IF``) of an snntrain neuron over a layer of ``shape``, written for ``target``."""
    check_target(target)
    try:
        return _neuron_node(m, shape, dt, target)
    except NIRError as err:
        raise NIRError(f"{name}: {err}") from None


# ----------------------------------------------------------------------------- export


class _GraphBuilder:
    """Walks a SEW-ResNet and collects NIR nodes and edges for one target; shapes are per sample and step,
    ``[C, H, W]``. A value flowing between nodes is a list of node names: NIR sums the edges into a node, so
    a SEW ``ADD`` is the list of its two terms. What the target cannot express is collected in ``problems``
    (node name, reason), so that every such node is named at once."""

    def __init__(self, dt: float, target: str) -> None:
        import nir

        self.nir = nir
        self.dt = dt
        self.target = target
        self.nodes: dict[str, Any] = {}
        self.edges: list[tuple[str, str]] = []
        self.problems: list[tuple[str, str]] = []
        self.readout_scale = 1.0  # Norse's global pool: the 1 / (H W) that the readout's weight takes

    def problem(self, name: str, reason: str) -> None:
        self.problems.append((name, reason))

    def add(self, name: str, node: Any, sources: list[str]) -> list[str]:
        if name in self.nodes:
            raise RuntimeError(f"duplicate NIR node name {name!r}")
        self.nodes[name] = node
        self.edges += [(s, name) for s in sources]
        return [name]

    def sequence(self, prefix: str, modules: list[tuple[str, nn.Module]], src: list[str], shape: tuple[int, ...],
                 spikes: bool) -> tuple[list[str], tuple[int, ...], bool]:
        """Add the layers of ``modules`` (in forward order) after the terms ``src``; returns the output terms,
        their shape and whether they are spikes."""
        flat: list[tuple[str, nn.Module]] = []

        def expand(name: str, m: nn.Module) -> None:
            if isinstance(m, NormNeuron):  # the norm (folded into the convolution before it), then the neuron
                if not isinstance(m.norm, nn.Identity):
                    flat.append((f"{name}.norm", m.norm))
                flat.append((name, m.neuron))
            elif isinstance(m, nn.Sequential):
                for child_name, child in m.named_children():
                    expand(f"{name}.{child_name}" if name else child_name, child)
            else:
                flat.append((name, m))

        for name, m in modules:
            expand(".".join(part for part in (prefix, name) if part), m)
        pending: tuple[str, nn.Conv2d] | None = None  # a convolution waiting for a BatchNorm to fold

        def flush() -> None:
            nonlocal pending, src, shape, spikes
            if pending is not None:
                src, shape = self.conv(pending[0], fold_conv_bn(pending[1], None), src, shape)
                spikes, pending = False, None

        for name, m in flat:
            if isinstance(m, nn.Conv2d):
                flush()
                pending = (name, m)
                continue
            if _is_batchnorm(m):
                if pending is None:
                    self.problem(name, "a BatchNorm that does not follow a convolution has no NIR form")
                    continue
                src, shape = self.conv(pending[0], fold_conv_bn(pending[1], m), src, shape)
                spikes, pending = False, None
                if not _is_neuron(m):
                    continue
            flush()
            if _is_neuron(m):
                try:
                    src = self.add(name, _neuron_node(m, shape, self.dt, self.target), src)
                except NIRError as err:
                    self.problem(name, str(err))
                spikes = True
            elif isinstance(m, nn.Identity):
                continue
            elif isinstance(m, nn.MaxPool2d):
                src, shape = self.maxpool(name, m, src, shape, spikes)
                spikes = True
            elif isinstance(m, (nn.AdaptiveAvgPool2d, nn.AvgPool2d)):
                src, shape = self.avgpool(name, m, src, shape)
                spikes = False
            elif isinstance(m, nn.Flatten):
                start, end = m.start_dim - 1, m.end_dim if m.end_dim < 0 else m.end_dim - 1  # per sample: no batch
                node = self.nir.Flatten(input_type={"input": np.array(shape)}, start_dim=start, end_dim=end)
                src = self.add(name, node, src)
                shape = tuple(int(s) for s in node.output_type["output"])
            elif isinstance(m, nn.Linear):
                w = m.weight.detach().double().numpy() * self.readout_scale
                self.readout_scale = 1.0
                node = (self.nir.Affine(weight=w, bias=m.bias.detach().double().numpy()) if m.bias is not None
                        else self.nir.Linear(weight=w))
                src, shape = self.add(name, node, src), (m.out_features,)
                spikes = False
            else:
                self.problem(name, f"{type(m).__name__} has no NIR equivalent (NIR has convolutions, affine "
                                            "maps, sum/average pooling, flatten, scaling and IF/LIF neurons; layer "
                                            "norm is not among them: export models trained with "
                                            "model.norm=batchnorm)")
                shape = _output_shape(m, shape)  # carry on, to name everything else that cannot be exported
        flush()
        return src, shape, spikes

    def conv(self, name: str, conv: nn.Conv2d, src: list[str], shape: tuple[int, ...]
             ) -> tuple[list[str], tuple[int, ...]]:
        if conv.padding_mode != "zeros":
            self.problem(name, f"padding_mode={conv.padding_mode!r} has no NIR form (zeros only)")
        node = self.nir.Conv2d(
            input_shape=tuple(shape[1:]), weight=conv.weight.detach().double().numpy(), stride=tuple(conv.stride),
            padding=tuple(conv.padding) if not isinstance(conv.padding, str) else conv.padding,
            dilation=tuple(conv.dilation), groups=conv.groups, bias=conv.bias.detach().double().numpy())
        return self.add(name, node, src), (conv.out_channels, *_conv_out_size(conv, shape[1:]))

    def maxpool(self, name: str, m: nn.MaxPool2d, src: list[str], shape: tuple[int, ...], spikes: bool):
        if not spikes:
            self.problem(name, "max pooling of non-spike values has no NIR form (only of spikes, as a sum "
                                        "over each window followed by a threshold)")
        if m.dilation not in (1, (1, 1)) or m.ceil_mode:
            self.problem(name, "max pooling with dilation or ceil_mode has no NIR form")
        k, s, p = (tuple(nn.modules.utils._pair(v)) for v in (m.kernel_size, m.stride or m.kernel_size, m.padding))
        with torch.no_grad():
            out_shape = tuple(m(torch.zeros(1, *shape)).shape[1:])
        if self.target == "spec":
            total = self.add(f"{name}.sum", self.nir.SumPool2d(kernel_size=np.array(k), stride=np.array(s),
                                                                padding=np.array(p)), src)
            return self.add(f"{name}.threshold", self.nir.Threshold(threshold=_full(out_shape, 0.5)), total), out_shape
        # importers: the window sums as a convolution of ones (each channel from itself; groups=1, which every
        # importer builds), padding included, then a neuron that fires on any count >= 1 and is back at 0
        channels = shape[0]
        weight = np.zeros((channels, channels, *k))
        weight[np.arange(channels), np.arange(channels)] = 1.0
        total = self.add(f"{name}.sum", self.nir.Conv2d(input_shape=tuple(shape[1:]), weight=weight, stride=s,
                                                         padding=p, dilation=(1, 1), groups=1,
                                                         bias=np.zeros(channels)), src)
        return self.add(f"{name}.threshold", _if_node(out_shape, 0.5, 0.0, self.dt, self.target), total), out_shape

    def avgpool(self, name: str, m: nn.Module, src: list[str], shape: tuple[int, ...]):
        if isinstance(m, nn.AdaptiveAvgPool2d):
            if nn.modules.utils._pair(m.output_size) != (1, 1):
                self.problem(name, f"adaptive average pooling to {m.output_size} has no NIR form "
                                            "(only to 1x1)")
            k = s = tuple(shape[1:])
            p = (0, 0)
        else:
            if m.ceil_mode or not m.count_include_pad or m.divisor_override is not None:
                self.problem(name, "average pooling with ceil_mode, count_include_pad=False or a divisor "
                                            "override has no NIR form")
            k, s, p = (tuple(nn.modules.utils._pair(v)) for v in (m.kernel_size, m.stride or m.kernel_size,
                                                                   m.padding))
        with torch.no_grad():
            out_shape = tuple(m(torch.zeros(1, *shape)).shape[1:])
        if self.target == "norse":  # Norse maps no AvgPool2d: the window sum, and the readout divides
            if k != tuple(shape[1:]) or any(p):
                self.problem(name, "average pooling other than over the whole map: Norse 1.1 maps no "
                                            "AvgPool2d (only a global pool, whose 1 / (H W) the readout takes)")
            self.readout_scale = 1.0 / (k[0] * k[1])
            node = self.nir.SumPool2d(kernel_size=np.array(k), stride=np.array(s), padding=np.array(p))
        else:
            node = self.nir.AvgPool2d(kernel_size=np.array(k), stride=np.array(s), padding=np.array(p))
        return self.add(name, node, src), out_shape

    def order_edge(self, name: str, src: str, shape: tuple[int, ...], to_shape: tuple[int, ...]) -> str:
        """A ``Conv2d`` of zeros from ``src`` (``shape``) to a node of input shape ``to_shape``: it adds exactly 0,
        and makes a depth-first executor (Norse's) reach ``src`` before the node it feeds."""
        ks, pads = [], []
        for n_in, n_out in zip(shape[1:], to_shape[1:]):
            pad = max(0, -(-(n_out - n_in) // 2))
            ks.append(n_in + 2 * pad + 1 - n_out)  # out = n_in + 2 pad - k + 1
            pads.append(pad)
        weight = np.zeros((to_shape[0], shape[0], *ks))
        node = self.nir.Conv2d(input_shape=tuple(shape[1:]), weight=weight, stride=(1, 1), padding=tuple(pads),
                               dilation=(1, 1), groups=1, bias=np.zeros(to_shape[0]))
        return self.add(name, node, [src])[0]


def _conv_out_size(conv: nn.Conv2d, size: tuple[int, ...]) -> tuple[int, ...]:
    """The spatial size of ``conv``'s output for an input of spatial ``size``."""
    if conv.padding == "same":
        return tuple(size)
    padding = (0, 0) if conv.padding == "valid" else conv.padding
    return tuple((n + 2 * p - d * (k - 1) - 1) // s + 1
                 for n, p, d, k, s in zip(size, padding, conv.dilation, conv.kernel_size, conv.stride))


def _output_shape(m: nn.Module, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The per-sample output shape of a layer, given one sample (``[1, ...]``) or one step of one (``[1, 1, ...]``);
    the input shape when it takes neither (a norm)."""
    for lead in (1, 2):
        try:
            with torch.no_grad():
                return tuple(m(torch.zeros(*(1,) * lead, *shape)).shape[lead:])
        except Exception:  # noqa: BLE001, S112  (another layout: try the next)
            continue
    return shape


def _backbone(model: nn.Module) -> tuple[nn.Module, bool]:
    """The SEW-ResNet inside ``model`` and whether ``model`` is a detector (only its backbone is exported)."""
    from .models import SEWResNet, SpikingFCOS

    inner = getattr(model, "model", model)  # SpikingClassifier / SpikingDetector wrappers
    if isinstance(inner, SpikingFCOS):
        return inner.backbone, True
    if isinstance(inner, SEWResNet):
        return inner, False
    reason = getattr(inner, "nir_refusal", None)  # a model that says why it has no NIR form
    if reason:
        raise NIRError(f"{type(inner).__name__} has no NIR graph: {reason}")
    raise NIRError(f"NIR export covers SEW-ResNet classifiers and detector backbones, not {type(inner).__name__}")


def format_problems(target: str, problems: list[tuple[str, str]]) -> str:
    """One line per reason, naming every node it applies to."""
    by_reason: dict[str, list[str]] = {}
    for node, reason in problems:
        by_reason.setdefault(reason, []).append(node)
    reader = NIR_TARGETS[target].reader if target in NIR_TARGETS else target
    lines = [f"the model has no NIR graph that {reader} reads (export.nir_target={target}):"]
    for reason, nodes in by_reason.items():
        lines.append(f"  - {reason} (nodes: {', '.join(dict.fromkeys(nodes))})")
    return "\n".join(lines)


def to_nir(model: nn.Module, input_shape: tuple[int, int, int], dt: float | None = None, target: str = "spec") -> Any:
    """The NIR graph of a SEW-ResNet classifier (output: per-step logits, ``readout: mean_over_time``) or of a
    detector's backbone (outputs ``stage1`` ... ``stage4``: spike maps), written for ``target`` (a key of
    :data:`NIR_TARGETS`). ``input_shape`` is ``(C, H, W)``; ``dt`` (seconds per step) defaults to the target's.

    Raises :class:`NIRError` naming every layer or node that the target cannot read, and why."""
    import nir

    from .nn.layers import check_connect

    spec = check_target(target)
    dt = spec.dt if dt is None else dt
    if not (isinstance(dt, (int, float)) and math.isfinite(dt) and dt > 0):
        raise NIRError(f"dt={dt!r} must be a positive number of seconds per time step")
    net, detector = _backbone(model)
    g = _GraphBuilder(float(dt), target)
    for name, m in net.named_modules():
        if hasattr(m, "connect") and isinstance(m.connect, str) and check_connect(m.connect) != "ADD":
            g.problem(name, f"connect={m.connect} multiplies spikes (AND: A*S, IAND: (1-A)*S), which NIR cannot "
                            "express (its graphs only add the edges into a node). Export models trained with "
                            "model.connect=ADD")
    shape = tuple(int(s) for s in input_shape)
    src = g.add("input", nir.Input(input_type={"input": np.array(shape)}), [])
    src, shape, spikes = g.sequence("", [("stem", net.stem), ("sn1", net.sn1), ("pool", net.pool)], src, shape, False)
    stage_outputs = []
    for si, stage in enumerate((net.layer1, net.layer2, net.layer3, net.layer4), start=1):
        if stage is None:  # a detector builds only the stages its pyramid reads
            break
        for bi, block in enumerate(stage):
            prefix = f"layer{si}.{bi}"
            main = [(n, getattr(block, n)) for n in ("conv1", "sn1", "conv2", "sn2", "conv3", "sn3")
                    if getattr(block, n, None) is not None]
            out, out_shape, _ = g.sequence(prefix, main, src, shape, spikes)
            short, short_shape = src, shape
            if block.downsample is not None:
                into = list(src)
                if target == "norse" and len(out) == 1:  # the branch first, then the shortcut, then their sum
                    into.append(g.order_edge(f"{prefix}.order", out[0], out_shape, shape))
                short, short_shape, _ = g.sequence(f"{prefix}.downsample", [("", block.downsample)], into, shape,
                                                   spikes)
            if out_shape != short_shape:
                raise NIRError(f"{prefix}: residual shapes differ ({out_shape} vs {short_shape})")
            src, shape = out + short, out_shape  # SEW ADD: both terms feed whatever reads the block's output
        stage_outputs.append((src, shape))
    metadata: dict[str, Any] = {"dt": float(dt), "T": int(net.T), "producer": "snntrain", "target": target}
    if detector or not net.num_classes:
        for i, (terms, shp) in enumerate(stage_outputs, start=1):
            g.add(f"stage{i}", nir.Output(output_type={"output": np.array(shp)}), terms)
        metadata["readout"] = "spikes per step"
    else:
        src, shape, _ = g.sequence("", [("avgpool", net.avgpool), ("fc", net.fc)], src, shape, spikes)
        g.add("output", nir.Output(output_type={"output": np.array(shape)}), src)
        metadata["readout"] = READOUT_MEAN
    from .version import __version__

    metadata["snntrain_version"] = __version__
    graph = nir.NIRGraph(nodes=g.nodes, edges=g.edges, metadata=metadata, type_check=False)
    problems = g.problems + target_problems(graph, target, dt)
    if problems:
        raise NIRError(format_problems(target, problems))
    return graph


def write_nir(model: nn.Module, path: str | os.PathLike, input_shape: tuple[int, int, int],
              dt: float | None = None, target: str = "spec") -> Any:
    """Write the NIR graph of ``model`` for ``target`` to ``path`` (written under a temporary name, then
    renamed; nothing is written when the target cannot read the graph)."""
    graph = to_nir(model, input_shape, dt, target)
    save_nir(graph, path)
    return graph


def save_nir(graph: Any, path: str | os.PathLike) -> None:
    """``nir.write`` under a temporary name, then renamed."""
    import nir

    from .fileio import atomic_path

    with atomic_path(Path(path)) as tmp:
        nir.write(str(tmp), graph)


# ----------------------------------------------------------------------------- what each reader imports


def _values(node: Any, field: str) -> np.ndarray:
    value = getattr(node, field, None)
    return np.zeros(1) if value is None else np.asarray(value, dtype=np.float64).reshape(-1)


def _one(values: np.ndarray) -> float | None:
    """The value every element has, or None when they differ."""
    return float(values[0]) if values.size and np.all(values == values[0]) else None


def _fmt(values: np.ndarray) -> str:
    one = _one(values)
    return f"{one:g}" if one is not None else f"{values.min():g} to {values.max():g}"


_GROUPED = ("a grouped convolution (groups={g}): the importer builds torch.nn.Conv2d(in_channels=weight.shape[1], "
            "groups={g}), which fails (in_channels is weight.shape[1] * groups)")


def _snntorch_node(node: Any, dt: float) -> list[str]:
    import nir

    out = []
    if isinstance(node, nir.Conv2d) and int(node.groups) != 1:
        out.append(_GROUPED.format(g=int(node.groups)))
    if isinstance(node, nir.SumPool2d) and np.any(np.asarray(node.padding) != 0):
        out.append("a padded SumPool2d: snnTorch 1.0 runs nirtorch's default, an LPPool2d without padding "
                   "(NIRTorch#44)")
    if isinstance(node, nir.IF):
        out.append("IF: snnTorch 1.0 imports it as a Leaky neuron with beta=0.9 and subtractive reset, and only "
                   "with r=1 (snnTorch#416, fixed after 1.0 by snnTorch#452); target=snntorch writes IF as a LIF "
                   "without leak")
    if isinstance(node, (nir.LIF, nir.CubaLIF)):
        kind = type(node).__name__
        v_leak, v_reset = _values(node, "v_leak"), _values(node, "v_reset")
        if np.any(v_leak != 0.0) or np.any(v_reset != 0.0):
            out.append(f"{kind} with v_leak={_fmt(v_leak)}, v_reset={_fmt(v_reset)}: snnTorch 1.0 asserts v_leak = 0 "
                       "and ignores v_reset (its neurons start at 0 and reset to 0); export models trained with "
                       "model.neuron.v_reset=0.0")
        if _one(_values(node, "v_threshold")) is None:
            out.append(f"{kind} thresholds differ between neurons: snnTorch 1.0 asserts one value per layer")
        if not math.isclose(dt, 1e-4, rel_tol=1e-9):
            out.append(f"dt={dt:g} s: snnTorch 1.0 steps with dt = 1e-4 s whatever the graph was written for "
                       "(beta = 1 - 1e-4 / tau); export with export.nir_dt=null or 0.0001")
    if isinstance(node, nir.LIF) and _one(_values(node, "r") / _values(node, "tau")) is None:
        out.append("LIF with r / tau that differs between neurons: snnTorch 1.0 takes one input scale per layer")
    return out


def _norse_node(node: Any, dt: float) -> list[str]:
    import nir

    out = []
    if isinstance(node, nir.Conv2d) and int(node.groups) != 1:
        out.append(_GROUPED.format(g=int(node.groups)))
    if isinstance(node, nir.SumPool2d) and np.any(np.asarray(node.padding) != 0):
        out.append("a padded SumPool2d: Norse 1.1 maps it to an LPPool2d without padding")
    if isinstance(node, (nir.IF, nir.LIF)) and np.any(_values(node, "v_reset") != 0.0):
        out.append(f"{type(node).__name__} with v_reset={_fmt(_values(node, 'v_reset'))}: Norse 1.1's from_nir passes "
                   "no v_reset (its neurons reset to 0); export models trained with model.neuron.v_reset=0.0")
    if isinstance(node, nir.IF):
        r = _values(node, "r")
        if not (np.allclose(r * dt, 1.0) or np.allclose(r, 1.0)):
            out.append(f"IF with r={_fmt(r)}: Norse 1.1's IAFCell adds the input unscaled whatever r, which is "
                       "NIR's IF only for r = 1/dt")
    if isinstance(node, nir.LIF) and not np.allclose(_values(node, "r"), 1.0):
        out.append(f"LIF with r={_fmt(_values(node, 'r'))}: Norse 1.1's LIFBoxCell ignores r (it warns) and scales "
                   "the input by dt/tau as for r = 1; export models trained with model.neuron.decay_input=true")
    return out


def _spikingjelly_node(node: Any, dt: float) -> list[str]:
    import nir

    out = []
    if isinstance(node, (nir.Conv1d, nir.Conv2d)) and int(node.groups) != 1:
        out.append(f"a grouped convolution (groups={int(node.groups)}): SpikingJelly 2.0 refuses groups != 1")
    if isinstance(node, nir.SumPool2d) and np.any(np.asarray(node.padding) != 0):
        out.append("a padded SumPool2d: SpikingJelly 2.0 runs nirtorch's default, an LPPool2d without padding "
                   "(NIRTorch#44)")
    if isinstance(node, (nir.IF, nir.LIF)) and _one(_values(node, "v_threshold")) is None:
        out.append(f"{type(node).__name__} thresholds differ between neurons: SpikingJelly takes one per layer")
    if isinstance(node, nir.IF) and not np.allclose(_values(node, "r") * dt, 1.0):
        out.append(f"IF with r={_fmt(_values(node, 'r'))}: SpikingJelly 2.0 requires r = 1/dt = {1 / dt:g}")
    if isinstance(node, nir.LIF):
        tau_steps, r = _values(node, "tau") / dt, _values(node, "r")
        if not np.all(tau_steps > 1.0):
            out.append(f"LIF with tau/dt={_fmt(tau_steps)}: SpikingJelly 2.0 requires more than one step")
        elif not (np.allclose(r, 1.0) or np.allclose(r, tau_steps)):
            out.append(f"LIF with r={_fmt(r)}: SpikingJelly 2.0 requires r = 1 or tau/dt")
        if not np.allclose(_values(node, "v_leak"), _values(node, "v_reset")):
            out.append("LIF with v_leak != v_reset: SpikingJelly 2.0 requires them equal")
    return out


_NODE_RULES: dict[str, Callable[[Any, float], list[str]]] = {
    "snntorch": _snntorch_node, "norse": _norse_node, "spikingjelly": _spikingjelly_node}


def depth_first_order(graph: Any) -> list[str]:
    """The order in which nirtorch's ``GraphExecutor`` (``nirtorch.load``, which Norse 1.1's ``from_nir`` and
    Sinabs' run on) calls the nodes: depth first from the node without inputs, each node's successors in the
    order of the graph's edges, every node at its first visit."""
    children: dict[str, list[str]] = {n: [] for n in graph.nodes}
    has_input = set()
    for a, b in graph.edges:
        if b not in children[a]:
            children[a].append(b)
        has_input.add(b)
    roots = [n for n in graph.nodes if n not in has_input]
    if not roots:
        return []
    order, seen = [roots[0]], {roots[0]}
    stack = [iter(children[roots[0]])]
    while stack:
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
        elif nxt not in seen:
            seen.add(nxt)
            order.append(nxt)
            stack.append(iter(children[nxt]))
    return order


def _order_problems(graph: Any) -> list[tuple[str, str]]:
    order = depth_first_order(graph)
    position = {n: i for i, n in enumerate(order)}
    out = []
    for a, b in graph.edges:
        if b in position and a in position and position[a] > position[b]:
            reason = (f"Norse 1.1 runs its nodes depth first (nirtorch.load) and would run it before its input {a}, "
                      "whose previous step it would read instead")
            out.append((b, reason))
    out += [(n, "not reached from the input depth first: Norse 1.1 would never run it")
            for n in graph.nodes if n not in position]
    return out


def target_problems(graph: Any, target: str, dt: float | None = None) -> list[tuple[str, str]]:
    """``(node, reason)`` for every node of ``graph`` that ``target``'s importer cannot read as NIR defines it
    (empty: it reads the whole graph). ``dt`` defaults to the graph's metadata ``dt``, else the target's."""
    import nir

    spec = check_target(target)
    if dt is None:
        dt = float((graph.metadata or {}).get("dt", spec.dt))
    out: list[tuple[str, str]] = []
    inputs = [n for n, node in graph.nodes.items() if isinstance(node, nir.Input)]
    outputs = [n for n, node in graph.nodes.items() if isinstance(node, nir.Output)]
    if len(inputs) != 1:
        out += [(n, f"one of {len(inputs)} Input nodes: the readers take one input") for n in inputs or ["graph"]]
    if target == "spec":
        mapping = node_map(dt)
        for name, node in graph.nodes.items():
            if type(node) not in mapping:
                out.append((name, f"{type(node).__name__} has no snntrain layer"))
                continue
            try:
                mapping[type(node)](node)
            except NIRError as err:
                out.append((name, str(err)))
        return out
    if len(outputs) != 1 and target in ("snntorch", "spikingjelly"):
        reason = (f"one of {len(outputs)} Output nodes: nirtorch.nir_to_torch (nirtorch 2.6), which {target} imports "
                  "with, loops forever on a graph with more than one Output node; export a classifier, or use "
                  "export.nir_target=norse or spec for a detector's backbone")
        out += [(n, reason) for n in outputs]
    for name, node in graph.nodes.items():
        kind = type(node).__name__
        if kind not in spec.nodes:
            out.append((name, f"{kind}: {target}'s importer maps no {kind} (it maps {', '.join(spec.nodes)})"))
            continue
        out += [(name, reason) for reason in _NODE_RULES[target](node, dt)]
    if target == "norse":
        out += _order_problems(graph)
    return out


# ----------------------------------------------------------------------------- import


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
