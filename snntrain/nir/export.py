"""A trained SEW-ResNet classifier (or a detector's backbone) as a NIR graph: BatchNorm folded into the
convolutions, neurons mapped to NIR's continuous-time definitions (:func:`to_nir`, :func:`write_nir`)."""

from __future__ import annotations

import functools
import itertools
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..nn.neurons import BaseNeuron, is_neuron
from ..nn.norm_neuron import NormNeuron
from .targets import NO_LEAK_STEPS, READOUT_MEAN, NIRError, check_target, format_problems, target_problems


def _is_batchnorm(m: nn.Module) -> bool:
    """A BatchNorm by its parameters (``running_mean``, ``running_var``, ``eps``), whatever its class."""
    return all(hasattr(m, a) for a in ("running_mean", "running_var", "eps"))


def _is_neuron(m: nn.Module) -> bool:
    return is_neuron(m) or hasattr(m, "params") and hasattr(m.params, "kind")


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


def _per_channel(shape: tuple[int, ...], value: float | torch.Tensor) -> np.ndarray:
    """``value`` (a number, or one per channel: dim 0 of the per-sample ``shape``) over ``shape``."""
    if isinstance(value, torch.Tensor):
        v = value.detach().double().cpu().numpy().reshape(-1, *([1] * (len(shape) - 1)))
        return np.broadcast_to(v, shape).copy()
    return _full(shape, float(value))


def _step_neuron_node(m: nn.Module, shape: tuple[int, ...], dt: float) -> Any:
    """The NIR node of a neuron that describes itself (``nir_form``, :class:`~snntrain.nn.StepNeuron`): ``LIF``
    as the built-in LIF maps; ``CubaLIF`` ``c <- c_decay c + x``, ``H = v_decay V + c`` (the current of the same
    step) as ``tau_syn = dt / (1 - c_decay)``, ``w_in = 1 / (1 - c_decay)``, ``tau_mem = dt / (1 - v_decay)``,
    ``r = 1 / (1 - v_decay)``, ``v_leak = 0``, stepped by forward Euler."""
    import nir

    try:
        kind, p = m.nir_form()
    except ValueError as err:
        raise NIRError(str(err)) from None
    full = functools.partial(_per_channel, shape)
    if kind == "LIF":
        return nir.LIF(tau=full(p["tau_steps"]) * dt, r=full(p["r"]), v_leak=full(p["v_reset"]),
                       v_threshold=full(p["v_threshold"]), v_reset=full(p["v_reset"]))
    c_in, v_in = 1.0 - full(p["c_decay"]), 1.0 - full(p["v_decay"])
    if np.any(c_in <= 0) or np.any(v_in <= 0):
        raise NIRError(f"{type(m).__name__} with c_decay or v_decay >= 1 (no decay) has no CubaLIF time constant")
    return nir.CubaLIF(tau_syn=dt / c_in, tau_mem=dt / v_in, r=1.0 / v_in, v_leak=_full(shape, 0.0),
                       v_threshold=full(p["v_threshold"]), v_reset=full(p["v_reset"]), w_in=1.0 / c_in)


def _neuron_node(m: nn.Module, shape: tuple[int, ...], dt: float, target: str) -> Any:
    import nir

    if not isinstance(m, BaseNeuron) and hasattr(m, "nir_form"):
        return _step_neuron_node(m, shape, dt)
    if not isinstance(m, BaseNeuron) and getattr(m, "nir_refusal", None):  # a neuron that says why it has none
        raise NIRError(f"{type(m).__name__} has no NIR equivalent: {m.nir_refusal}")
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
            elif getattr(m, "nir_refusal", None):  # a layer that says why it has no NIR form
                self.problem(name, f"{type(m).__name__} has no NIR equivalent: {m.nir_refusal}")
                shape = _output_shape(m, shape)
                spikes = True
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
    from ..models import SEWResNet, SpikingFCOS

    inner = getattr(model, "model", model)  # SpikingClassifier / SpikingDetector wrappers
    if isinstance(inner, SpikingFCOS):
        return inner.backbone, True
    if isinstance(inner, SEWResNet):
        return inner, False
    reason = getattr(inner, "nir_refusal", None)  # a model that says why it has no NIR form
    if reason:
        raise NIRError(f"{type(inner).__name__} has no NIR graph: {reason}")
    raise NIRError(f"NIR export covers SEW-ResNet classifiers and detector backbones, not {type(inner).__name__}")


def to_nir(model: nn.Module, input_shape: tuple[int, int, int], dt: float | None = None, target: str = "spec") -> Any:
    """The NIR graph of a SEW-ResNet classifier (output: per-step logits, ``readout: mean_over_time``) or of a
    detector's backbone (outputs ``stage1`` ... ``stage4``: spike maps), written for ``target`` (a key of
    :data:`NIR_TARGETS`). ``input_shape`` is ``(C, H, W)``; ``dt`` (seconds per step) defaults to the target's.

    Raises :class:`NIRError` naming every layer or node that the target cannot read, and why."""
    import nir

    from ..nn.layers import check_connect

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
    from ..version import __version__

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

    from ..fileio import atomic_path

    with atomic_path(Path(path)) as tmp:
        nir.write(str(tmp), graph)
