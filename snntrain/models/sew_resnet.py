"""Spike-Element-Wise ResNet (Fang et al., "Deep Residual Learning in Spiking Neural Networks", 2021).

Multi-step throughout: every tensor between layers is ``[T, B, C, H, W]``. Convolutions
run on the folded ``[T * B, ...]`` batch (:class:`~snntrain.nn.layers.MultiStep`); each is
followed by a :class:`~snntrain.nn.norm_neuron.NormNeuron` (norm, then a spiking neuron
scanning over T), fused into one Triton op under ``backend=triton``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ..backend import check_backend
from ..nn.layers import MultiStep, check_connect, sew_connect_max
from ..nn.norm_neuron import norm_neuron_add, norm_neuron_max_pool
from ..validation import one_of, positive_int
from .common import LayerFactory, pick_variant

STEMS = ("cifar", "imagenet")


def _connect(sn: nn.Module, y: torch.Tensor, shortcut: Callable[[], torch.Tensor], connect: str) -> torch.Tensor:
    """``sew_connect(sn(y), shortcut(), connect)``, a block's last norm-neuron, its shortcut and their connection,
    formed in the fused kernel that writes the spikes where it can be (:func:`~snntrain.nn.norm_neuron_add`)."""
    return norm_neuron_add(sn, y, shortcut, connect=connect)


class BasicBlock(nn.Module):
    """``g(sn2(conv2(sn1(conv1(x)))), x or its downsampled spikes)``. ``input_max``: the block's input is integers in
    ``[0, input_max]`` (spikes, or SEW ADD's counts; None: not known), the bound its convolutions of ``x`` are built
    with (:meth:`LayerFactory.conv2d`); :attr:`output_max` is its output's."""

    expansion = 1

    def __init__(self, f: LayerFactory, cin: int, planes: int, stride: int, connect: str,
                 input_max: int | None = None) -> None:
        super().__init__()
        self.conv1 = f.conv(cin, planes, 3, stride, input_max=input_max)
        self.sn1 = f.norm_neuron(planes)
        self.conv2 = f.conv(planes, planes, 3, input_max=f.spike_max)
        self.sn2 = f.norm_neuron(planes)
        self.connect = connect
        self.downsample = None
        if stride != 1 or cin != planes:
            self.downsample = nn.Sequential(f.conv(cin, planes, 1, stride, input_max=input_max),
                                            f.norm_neuron(planes))
        self.output_max = sew_connect_max(connect, f.spike_max, input_max if self.downsample is None else f.spike_max)

    def last_norm(self) -> nn.Module:
        return self.sn2.norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.sn1(self.conv1(x)))
        return _connect(self.sn2, y, lambda: x if self.downsample is None else self.downsample(x), self.connect)


class Bottleneck(nn.Module):
    """The bottleneck block (1x1, 3x3, 1x1); ``input_max`` and :attr:`output_max` as :class:`BasicBlock`'s."""

    expansion = 4

    def __init__(self, f: LayerFactory, cin: int, planes: int, stride: int, connect: str,
                 input_max: int | None = None) -> None:
        super().__init__()
        cout = planes * self.expansion
        self.conv1 = f.conv(cin, planes, 1, input_max=input_max)
        self.sn1 = f.norm_neuron(planes)
        self.conv2 = f.conv(planes, planes, 3, stride, input_max=f.spike_max)
        self.sn2 = f.norm_neuron(planes)
        self.conv3 = f.conv(planes, cout, 1, input_max=f.spike_max)
        self.sn3 = f.norm_neuron(cout)
        self.connect = connect
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(f.conv(cin, cout, 1, stride, input_max=input_max), f.norm_neuron(cout))
        self.output_max = sew_connect_max(connect, f.spike_max, input_max if self.downsample is None else f.spike_max)

    def last_norm(self) -> nn.Module:
        return self.sn3.norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.sn1(self.conv1(x))
        y = self.conv3(self.sn2(self.conv2(out)))
        return _connect(self.sn3, y, lambda: x if self.downsample is None else self.downsample(x), self.connect)


#: State-dict names of checkpoints written before each norm and its neuron became one
#: :class:`NormNeuron` (norm inside ``MultiStep(conv, norm)``, neuron beside it) -> today's names.
_UNFUSED_NAMES = (
    (re.compile(r"^stem\.1\.(.+)$"), r"sn1.norm.\1"),
    (re.compile(r"^(.+\.)conv(\d)\.1\.(.+)$"), r"\1sn\2.norm.\3"),
    (re.compile(r"^(.+\.)downsample\.0\.1\.(.+)$"), r"\1downsample.1.norm.\2"),
    (re.compile(r"^((?:.+\.)?(?:sn\d|downsample\.1))\.w$"), r"\1.neuron.w"),
)


def _rename_unfused_keys(state_dict, prefix, *args) -> None:
    """Load-time hook: a SEW-ResNet state dict in the older unfused naming (``stem.1.weight``,
    ``layer1.0.conv1.1.running_mean``, ``layer1.0.sn1.w``, ...) is renamed in place to today's
    (``sn1.norm.weight``, ``layer1.0.sn1.norm.running_mean``, ``layer1.0.sn1.neuron.w``), so
    checkpoints and exports written before the fused layout still load."""
    ours = [k for k in state_dict if k.startswith(prefix)]
    if not any(k[len(prefix):].startswith("stem.1.") for k in ours):
        return  # today's naming (the stem's norm is sn1.norm)
    for key in ours:
        rel = key[len(prefix):]
        for pattern, repl in _UNFUSED_NAMES:
            new, n = pattern.subn(repl, rel)
            if n:
                state_dict[prefix + new] = state_dict.pop(key)
                break


ARCHS: dict[int, tuple[type[nn.Module], tuple[int, int, int, int]]] = {
    18: (BasicBlock, (2, 2, 2, 2)),
    34: (BasicBlock, (3, 4, 6, 3)),
    50: (Bottleneck, (3, 4, 6, 3)),
}

#: SpikingJelly's constructor names of the depths (``model.variant``).
VARIANTS = {f"sew_resnet{depth}": depth for depth in ARCHS}


def resolve_depth(depth: int | None, variant: str | None) -> int:
    """The depth that ``depth`` and ``variant`` (either, both in agreement, or neither: 18) describe."""
    if depth is not None and depth not in ARCHS:
        raise ValueError(f"depth={depth!r} is not valid; choose one of {', '.join(map(str, ARCHS))}")
    if variant is None:
        return 18 if depth is None else depth
    named = pick_variant(variant, VARIANTS)
    if depth is not None and depth != named:
        raise ValueError(f"variant={variant!r} is depth {named} but depth={depth!r}; set one of them (the other "
                         "to null)")
    return named


class SEWResNet(nn.Module):
    """SEW-ResNet classifier.

    Args:
        depth: 18, 34 (basic blocks) or 50 (bottlenecks); None: the variant's, or 18.
        variant: SpikingJelly's name of the depth, ``sew_resnet18``, ``sew_resnet34`` or ``sew_resnet50``
            (:data:`VARIANTS`); None: ``depth`` decides. Given both, they must agree.
        num_classes: classifier outputs; 0 builds the backbone only (no pooling and classifier),
            for detectors that read :meth:`forward_features`.
        in_channels: image channels.
        T: time steps for static ``[B, C, H, W]`` input (direct encoding: the image is
            the input current at every step). ``[T, B, C, H, W]`` input is used as is.
        connect: ``ADD``, ``AND`` or ``IAND`` spike-element-wise residual.
        stem: ``cifar`` (3x3 conv, no pooling) or ``imagenet`` (7x7 stride 2 + max-pool).
        width: channels of the first stage (64 in the paper); later stages double it.
        neuron: neuron settings, e.g. ``{"type": "LIF", "tau": 2.0, "surrogate": "atan"}``.
        norm: ``batchnorm`` or ``layernorm`` (:data:`snntrain.nn.norm.NORMS`); ``layernorm`` follows ``backend``.
        zero_init_residual: start each block's last norm at zero weight.
        spike_bytes: every convolution after the stem keeps its input (spikes, or ADD's spike counts) for the
            backward packed in bits (:class:`~snntrain.nn.layers.SpikeConv2d`: the same results, 1 bit an element for spikes, 2 for sums up to 3,
            4 up to 15, 8 up to 255, instead of bfloat16's 16); False: ``torch.nn.Conv2d`` everywhere.
        backend: ``auto``, ``torch`` or ``triton`` for every spiking layer.

    ``forward`` returns logits averaged over T, ``[B, num_classes]``.
    """

    def __init__(
        self,
        depth: int | None = None,
        num_classes: int = 10,
        in_channels: int = 3,
        T: int = 4,
        connect: str = "ADD",
        stem: str = "cifar",
        width: int = 64,
        neuron: Mapping[str, Any] | None = None,
        norm: str = "batchnorm",
        zero_init_residual: bool = False,
        backend: str = "auto",
        variant: str | None = None,
        spike_bytes: bool = False,
    ) -> None:
        super().__init__()
        depth = resolve_depth(depth, variant)
        one_of("stem", stem, STEMS)
        self.T = positive_int("T", T)
        if num_classes != 0:
            num_classes = positive_int("num_classes", num_classes)
        in_channels = positive_int("in_channels", in_channels)
        width = positive_int("width", width)
        connect = check_connect(connect)
        check_backend(backend)
        f = LayerFactory(neuron, norm, backend, T=self.T, spike_bytes=spike_bytes)
        block, layers = ARCHS[depth]

        if stem == "cifar":
            self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1, bias=False))
            self.pool = nn.Identity()
        else:
            self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False))
            self.pool = f.max_pool(3, stride=2, padding=1)
        self.sn1 = f.norm_neuron(width)

        cin = width
        bound = f.spike_max  # the stem's spikes, max-pooled or not
        stages = []
        self.stage_channels: list[int] = []
        #: each stage's output is integers in [0, stage_max[i]] (None: not known): SEW ADD sums spikes
        self.stage_max: list[int | None] = []
        for i, n in enumerate(layers):
            planes = width * 2**i
            blocks = []
            for j in range(n):
                blocks.append(block(f, cin, planes, 2 if (i > 0 and j == 0) else 1, connect, input_max=bound))
                cin, bound = planes * block.expansion, blocks[-1].output_max
            stages.append(nn.Sequential(*blocks))
            self.stage_channels.append(cin)
            self.stage_max.append(bound)
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.num_classes = num_classes
        if num_classes:
            self.avgpool = MultiStep(nn.AdaptiveAvgPool2d(1), nn.Flatten(1))
            self.fc = nn.Linear(cin, num_classes)
        self._init_weights(zero_init_residual)
        self._register_load_state_dict_pre_hook(_rename_unfused_keys)

    def _init_weights(self, zero_init_residual: bool) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, (BasicBlock, Bottleneck)):
                    norm = m.last_norm()
                    if getattr(norm, "weight", None) is not None:
                        nn.init.zeros_(norm.weight)

    def encode(self, x: torch.Tensor, pool: bool = False) -> torch.Tensor:
        """Stem spikes ``[T, B, C, H, W]``; direct encoding for ``[B, C, H, W]`` input. With ``pool``, max-pooled
        by ``self.pool`` (the ImageNet stem).

        A static image gives the same stem convolution output at every step, so the
        convolution runs once and its output is the input current at each of the T steps
        (``T`` of :class:`~snntrain.nn.norm_neuron.NormNeuron`: the norm sees it once). The pooled stem's norm,
        neuron and pool run as one op under Triton (:func:`~snntrain.nn.norm_neuron_max_pool`; ``sn1`` and
        ``pool`` keep their names and state).
        """
        if x.dim() == 4:
            y, T = self.stem(x), self.T
        elif x.dim() == 5:
            y, T = self.stem(x.flatten(0, 1)).unflatten(0, x.shape[:2]), None
        else:
            raise ValueError(f"input has shape {tuple(x.shape)}; expected [B, C, H, W] or [T, B, C, H, W]")
        if pool and not isinstance(self.pool, nn.Identity):
            return norm_neuron_max_pool(self.sn1, self.pool, y, T=T)
        return self.sn1(y, T=T)

    @property
    def stage_strides(self) -> list[int]:
        """Downsampling factor of each stage's output relative to the input."""
        first = 1 if isinstance(self.pool, nn.Identity) else 4
        return [first * 2**i for i in range(4)]

    def forward_features(self, x: torch.Tensor, num_stages: int = 4) -> list[torch.Tensor]:
        """Spike maps ``[T, B, C, H, W]`` after each of the first ``num_stages`` (of four) stages that
        are built (a detector removes the stages above its pyramid's top level)."""
        x = self.encode(x, pool=True)
        feats = []
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4)[:num_stages]:
            if stage is None:
                break
            x = stage(x)
            feats.append(x)
        return feats

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.num_classes:
            raise RuntimeError("this SEWResNet was built with num_classes=0 (backbone only): use forward_features")
        x = self.forward_features(x)[-1]
        logits = self.fc(self.avgpool(x))  # [T, B, num_classes]
        return logits.mean(0)


def sew_resnet18(**kwargs: Any) -> SEWResNet:
    return SEWResNet(depth=18, **kwargs)


def sew_resnet34(**kwargs: Any) -> SEWResNet:
    return SEWResNet(depth=34, **kwargs)


def sew_resnet50(**kwargs: Any) -> SEWResNet:
    return SEWResNet(depth=50, **kwargs)
