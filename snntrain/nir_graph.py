"""NIR (the Neuromorphic Intermediate Representation): export SEW-ResNets, import NIR graphs.

:func:`to_nir` describes a trained SEW-ResNet classifier (or a detector's backbone) as a
NIR graph; :func:`load_nir` builds a runnable model from a NIR graph, ours or another
library's, out of snntrain layers. docs/nir.md gives the mapping in full; in short:

* a convolution and the BatchNorm after it become one ``Conv2d`` with the norm folded
  into its weight and bias (:func:`fold_batchnorm` gives the same network as a PyTorch
  model); layer norm has no NIR node and is refused;
* neurons map to NIR's continuous-time definitions discretised by forward Euler with
  step ``dt`` (graph metadata ``dt``): LIF/PLIF ``tau dv/dt = (v_leak - v) + r I`` with
  ``tau = tau_steps * dt``, ``v_leak = v_reset`` and ``r = 1`` (``decay_input``) or
  ``r = tau_steps`` (not); IF ``dv/dt = r I`` with ``r = 1 / dt``; hard reset to
  ``v_reset``. Soft reset (subtract the threshold) has no NIR form and is refused;
* max pooling of spikes is a ``SumPool2d`` followed by ``Threshold(0.5)`` (the max of
  0/1 values is 1 exactly when their sum is at least 1); global average pooling is an
  ``AvgPool2d`` over the whole map, then ``Flatten`` and the readout ``Affine``;
* a SEW ``ADD`` block ends in a summing node (``Scale`` by ones) with an edge from the
  residual branch and one from the shortcut (NIR sums the edges into a node); ``AND``
  and ``IAND`` multiply spikes, which NIR cannot express, and are refused.

The graph runs one time step per call of its nodes; a classifier's logits are the mean
over T of its output (graph metadata ``readout: mean_over_time``), which :func:`load_nir`
applies.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .nn.layers import MultiStep
from .nn.neurons import IF, LIF, BaseNeuron
from .nn.norm_neuron import NormNeuron

#: Seconds per time step written into exported graphs (snnTorch's convention; Norse uses 1e-3).
DEFAULT_DT = 1e-4
READOUT_MEAN = "mean_over_time"


class NIRError(ValueError):
    """A network or graph that the NIR mapping cannot express, with the reason."""


# ----------------------------------------------------------------------------- helpers


def _is_batchnorm(m: nn.Module) -> bool:
    """A BatchNorm by its parameters (``running_mean``, ``running_var``, ``eps``), whatever its class."""
    return all(hasattr(m, a) for a in ("running_mean", "running_var", "eps"))


def _is_neuron(m: nn.Module) -> bool:
    return isinstance(m, BaseNeuron) or hasattr(m, "params") and hasattr(getattr(m, "params"), "kind")


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
        for a, b in zip(names, names[1:]):
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


def neuron_to_nir(m: nn.Module, shape: tuple[int, ...], dt: float, name: str = "neuron") -> Any:
    """The NIR node (``LIF`` or ``IF``) of an snntrain neuron over a layer of ``shape``."""
    import nir

    p = m.params
    if p.v_reset is None:
        raise NIRError(
            f"{name}: soft reset (v_reset=None, subtract the threshold) has no NIR form: NIR's neurons reset to "
            "v_reset. Train with a hard reset (model.neuron.v_reset=0.0) to export to NIR")
    thr, v_reset = _full(shape, p.v_threshold), _full(shape, p.v_reset)
    if p.kind == "if":
        return nir.IF(r=_full(shape, 1.0 / dt), v_threshold=thr, v_reset=v_reset)
    tau_steps = _neuron_tau_steps(m)
    r = 1.0 if p.decay_input else tau_steps
    return nir.LIF(tau=_full(shape, tau_steps * dt), r=_full(shape, r), v_leak=v_reset.copy(), v_threshold=thr,
                   v_reset=v_reset)


# ----------------------------------------------------------------------------- export


class _GraphBuilder:
    """Walks a SEW-ResNet and collects NIR nodes and edges; shapes are per sample and step, ``[C, H, W]``."""

    def __init__(self, dt: float) -> None:
        import nir

        self.nir = nir
        self.dt = dt
        self.nodes: dict[str, Any] = {}
        self.edges: list[tuple[str, str]] = []

    def add(self, name: str, node: Any, sources: list[str]) -> str:
        if name in self.nodes:
            raise RuntimeError(f"duplicate NIR node name {name!r}")
        self.nodes[name] = node
        self.edges += [(s, name) for s in sources]
        return name

    def sequence(self, prefix: str, modules: list[tuple[str, nn.Module]], src: str, shape: tuple[int, ...],
                 spikes: bool) -> tuple[str, tuple[int, ...], bool]:
        """Add the layers of ``modules`` (in forward order) after node ``src``; returns the last node, its
        output shape and whether it emits spikes."""
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
                    raise NIRError(f"{name}: a BatchNorm that does not follow a convolution has no NIR form")
                src, shape = self.conv(pending[0], fold_conv_bn(pending[1], m), src, shape)
                spikes, pending = False, None
                if not _is_neuron(m):
                    continue
            flush()
            if _is_neuron(m):
                src = self.add(name, neuron_to_nir(m, shape, self.dt, name), [src])
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
                src = self.add(name, node, [src])
                shape = tuple(int(s) for s in node.output_type["output"])
            elif isinstance(m, nn.Linear):
                w = m.weight.detach().double().numpy()
                node = (self.nir.Affine(weight=w, bias=m.bias.detach().double().numpy()) if m.bias is not None
                        else self.nir.Linear(weight=w))
                src, shape = self.add(name, node, [src]), (m.out_features,)
                spikes = False
            else:
                raise NIRError(f"{name}: {type(m).__name__} has no NIR equivalent (NIR has convolutions, affine maps, "
                               "sum/average pooling, flatten, scaling and IF/LIF neurons; layer norm is not among "
                               "them: export models trained with model.norm=batchnorm)")
        flush()
        return src, shape, spikes

    def conv(self, name: str, conv: nn.Conv2d, src: str, shape: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
        if conv.padding_mode != "zeros":
            raise NIRError(f"{name}: padding_mode={conv.padding_mode!r} has no NIR form (zeros only)")
        node = self.nir.Conv2d(
            input_shape=tuple(shape[1:]), weight=conv.weight.detach().double().numpy(), stride=tuple(conv.stride),
            padding=tuple(conv.padding) if not isinstance(conv.padding, str) else conv.padding,
            dilation=tuple(conv.dilation), groups=conv.groups, bias=conv.bias.detach().double().numpy())
        with torch.no_grad():
            out = conv(torch.zeros(1, *shape, dtype=conv.weight.dtype, device=conv.weight.device))
        return self.add(name, node, [src]), tuple(out.shape[1:])

    def maxpool(self, name: str, m: nn.MaxPool2d, src: str, shape: tuple[int, ...], spikes: bool):
        if not spikes:
            raise NIRError(f"{name}: max pooling of non-spike values has no NIR form (only of spikes, as a sum "
                           "pool followed by a threshold)")
        if m.dilation not in (1, (1, 1)) or m.ceil_mode:
            raise NIRError(f"{name}: max pooling with dilation or ceil_mode has no NIR form")
        k, s, p = (np.array(nn.modules.utils._pair(v)) for v in (m.kernel_size, m.stride or m.kernel_size, m.padding))
        with torch.no_grad():
            out_shape = tuple(m(torch.zeros(1, *shape)).shape[1:])
        sum_name = self.add(f"{name}.sum", self.nir.SumPool2d(kernel_size=k, stride=s, padding=p), [src])
        thr_name = self.add(f"{name}.threshold", self.nir.Threshold(threshold=_full(out_shape, 0.5)), [sum_name])
        return thr_name, out_shape

    def avgpool(self, name: str, m: nn.Module, src: str, shape: tuple[int, ...]):
        if isinstance(m, nn.AdaptiveAvgPool2d):
            if nn.modules.utils._pair(m.output_size) != (1, 1):
                raise NIRError(f"{name}: adaptive average pooling to {m.output_size} has no NIR form (only to 1x1)")
            k = s = np.array(shape[1:])
            p = np.zeros(2, dtype=np.int64)
        else:
            if m.ceil_mode or not m.count_include_pad or m.divisor_override is not None:
                raise NIRError(f"{name}: average pooling with ceil_mode, count_include_pad=False or a divisor "
                               "override has no NIR form")
            k, s, p = (np.array(nn.modules.utils._pair(v)) for v in (m.kernel_size, m.stride or m.kernel_size,
                                                                       m.padding))
        with torch.no_grad():
            out_shape = tuple(m(torch.zeros(1, *shape)).shape[1:])
        return self.add(name, self.nir.AvgPool2d(kernel_size=k, stride=s, padding=p), [src]), out_shape


def _backbone(model: nn.Module) -> tuple[nn.Module, bool]:
    """The SEW-ResNet inside ``model`` and whether ``model`` is a detector (only its backbone is exported)."""
    from .models import SEWResNet, SpikingFCOS

    inner = getattr(model, "model", model)  # SpikingClassifier / SpikingDetector wrappers
    if isinstance(inner, SpikingFCOS):
        return inner.backbone, True
    if isinstance(inner, SEWResNet):
        return inner, False
    raise NIRError(f"NIR export covers SEW-ResNet classifiers and detector backbones, not {type(inner).__name__}")


def to_nir(model: nn.Module, input_shape: tuple[int, int, int], dt: float = DEFAULT_DT) -> Any:
    """The NIR graph of a SEW-ResNet classifier (output: per-step logits, ``readout: mean_over_time``) or of a
    detector's backbone (outputs ``stage1`` ... ``stage4``: spike maps). ``input_shape`` is ``(C, H, W)``."""
    import nir

    from .nn.layers import check_connect

    if not (isinstance(dt, (int, float)) and math.isfinite(dt) and dt > 0):
        raise NIRError(f"dt={dt!r} must be a positive number of seconds per time step")
    net, detector = _backbone(model)
    for name, m in net.named_modules():
        if hasattr(m, "connect") and isinstance(m.connect, str) and check_connect(m.connect) != "ADD":
            raise NIRError(
                f"{name}: connect={m.connect} multiplies spikes (AND: A*S, IAND: (1-A)*S), which NIR cannot express "
                "(its graphs only add the edges into a node). Export models trained with model.connect=ADD")
    g = _GraphBuilder(float(dt))
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
                short, short_shape, _ = g.sequence(f"{prefix}.downsample", [("", block.downsample)], src, shape,
                                                   spikes)
            if out_shape != short_shape:
                raise NIRError(f"{prefix}: residual shapes differ ({out_shape} vs {short_shape})")
            src = g.add(f"{prefix}.add", nir.Scale(scale=np.ones(out_shape)), [out, short])
            shape = out_shape
        stage_outputs.append((src, shape))
    metadata: dict[str, Any] = {"dt": float(dt), "T": int(net.T), "producer": "snntrain"}
    if detector or not net.num_classes:
        for i, (name, shp) in enumerate(stage_outputs, start=1):
            g.add(f"stage{i}", nir.Output(output_type={"output": np.array(shp)}), [name])
        metadata["readout"] = "spikes per step"
    else:
        src, shape, _ = g.sequence("", [("avgpool", net.avgpool), ("fc", net.fc)], src, shape, spikes)
        g.add("output", nir.Output(output_type={"output": np.array(shape)}), [src])
        metadata["readout"] = READOUT_MEAN
    from . import __version__

    metadata["snntrain_version"] = __version__
    return nir.NIRGraph(nodes=g.nodes, edges=g.edges, metadata=metadata, type_check=False)


def write_nir(model: nn.Module, path: str | os.PathLike, input_shape: tuple[int, int, int],
              dt: float = DEFAULT_DT) -> Any:
    """Write the NIR graph of ``model`` to ``path`` (written under a temporary name, then renamed)."""
    import nir

    from .fileio import atomic_path

    graph = to_nir(model, input_shape, dt)
    with atomic_path(Path(path)) as tmp:
        nir.write(str(tmp), graph)
    return graph


# ----------------------------------------------------------------------------- import


def _uniform(node_name: str, field: str, value: Any) -> float:
    arr = np.asarray(value, dtype=np.float64)
    if arr.size == 0:
        raise NIRError(f"{node_name}: {field} is empty")
    first = float(arr.reshape(-1)[0])
    if not np.all(arr == first):
        raise NIRError(f"{node_name}: {field} differs between neurons ({arr.min():g} to {arr.max():g}); snntrain "
                       "neurons share one value per layer")
    return first


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def neuron_from_nir(node: Any, dt: float, backend: str = "torch", name: str = "neuron") -> BaseNeuron:
    """The snntrain neuron of a NIR ``LIF`` or ``IF`` node (the inverse of :func:`neuron_to_nir`)."""
    import nir

    v_th = _uniform(name, "v_threshold", node.v_threshold)
    v_reset = _uniform(name, "v_reset", node.v_reset)
    r = _uniform(name, "r", node.r)
    if isinstance(node, nir.IF):
        if not _close(r * dt, 1.0):
            raise NIRError(f"{name}: IF with r={r:g} at dt={dt:g}: snntrain's IF adds its input unscaled, which "
                           f"needs r = 1/dt = {1 / dt:g} (pass the dt the graph was written for)")
        return IF(v_threshold=v_th, v_reset=v_reset, backend=backend)
    tau_steps = _uniform(name, "tau", node.tau) / dt
    v_leak = _uniform(name, "v_leak", node.v_leak)
    if not _close(v_leak, v_reset):
        raise NIRError(f"{name}: LIF with v_leak={v_leak:g} != v_reset={v_reset:g}: snntrain's LIF leaks towards "
                       "its reset potential")
    if not tau_steps > 1.0:
        raise NIRError(f"{name}: LIF with tau={tau_steps * dt:g} s at dt={dt:g} s is {tau_steps:g} steps; "
                       "snntrain's LIF needs more than one step")
    if _close(r, 1.0):
        decay_input = True
    elif _close(r, tau_steps):
        decay_input = False
    else:
        raise NIRError(f"{name}: LIF with r={r:g}: snntrain's LIF takes r = 1 (input divided by tau) or r = tau/dt "
                       f"= {tau_steps:g} (input added unscaled)")
    return LIF(tau=tau_steps, v_threshold=v_th, v_reset=v_reset, decay_input=decay_input, backend=backend)


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
            raise ValueError(f"input has shape {tuple(x.shape)}; expected [T, B, {', '.join(map(str, self.input_shape))}]"
                             f" or [B, {', '.join(map(str, self.input_shape))}]")
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
