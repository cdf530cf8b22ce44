"""MS-ResNet, the membrane-shortcut ResNet (Hu et al., "Advancing Spiking Neural Networks towards Deep Residual
Learning", arXiv:2112.08954), as SpikingJelly's ``ms_resnet18`` / ``ms_resnet34`` build it.

The shortcut carries membrane currents: each block fires first and convolves the spikes (neuron -> conv ->
norm, twice), and its output, a current, is added to the block's input current; no neuron sits between
blocks, only at the start of every residual branch and before the classifier. Multi-step throughout
(``[T, B, C, H, W]``); the branch's middle norm and the neuron after it are one
:class:`~snntrain.nn.NormNeuron` (fused under Triton). The stem is a convolution and a norm without a
neuron; for a static image it runs once and its output is the input current of every step (a stride-0 view
over T), and the first block's shortcut is computed once too.

The paper's neuron (SpikingJelly's default here) is a LIF with decay 0.25 per step (``tau = 4/3``), the input
added undecayed (``decay_input: false``), threshold 0.5, hard reset to 0 and the reset detached; its
rectangular surrogate gradient (half-width 0.25, height 2 in SpikingJelly) is replaced by the triangular
``piecewise_quadratic`` surrogate of the same support and area (``alpha: 2``), the nearest that snntrain's
kernels implement. Norms start at weight 0.5, the branch's last norm at 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..nn.layers import MultiStep
from ..nn.norm import LayerNorm2d
from ..validation import one_of, positive_int
from .common import ClassifierHead, LayerFactory, check_run_settings, over_time, pick_variant

STEMS = ("imagenet", "cifar")
#: The paper's neuron (see the module's description).
MS_NEURON: dict[str, Any] = {"type": "LIF", "tau": 4.0 / 3.0, "v_threshold": 0.5, "v_reset": 0.0,
                             "decay_input": False, "detach_reset": True, "surrogate": "piecewise_quadratic",
                             "alpha": 2.0}
#: The initial weight of every norm but the branches' last (which start at 0).
NORM_WEIGHT = 0.5
#: ``model.variant`` -> blocks per stage: SpikingJelly's constructor names.
VARIANTS: dict[str, tuple[int, int, int, int]] = {"ms_resnet18": (2, 2, 2, 2), "ms_resnet34": (3, 4, 6, 3)}


class MSBlock(nn.Module):
    """``neuron -> conv3x3 -> norm -> neuron -> conv3x3 -> norm``, added to the (downsampled) input current."""

    def __init__(self, f: LayerFactory, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.sn1 = f.neuron(cin)
        self.conv1 = f.conv(cin, cout, 3, stride, input_max=f.spike_max)
        self.sn2 = f.norm_neuron(cout)
        self.conv2 = f.conv(cout, cout, 3, input_max=f.spike_max)
        self.bn2 = MultiStep(f.norm(cout))
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = MultiStep(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), f.norm(cout))

    def forward(self, x: torch.Tensor, T: int | None = None) -> torch.Tensor:
        """``x``: input currents ``[T, B, C, H, W]``, or, with ``T``, a static ``[B, C, H, W]`` current that is
        the same at each of the ``T`` steps (the shortcut is then computed once and broadcast over T)."""
        if T is None:
            identity = x if self.downsample is None else self.downsample(x)
            spikes = self.sn1(x)
        else:
            identity = x if self.downsample is None else self.downsample.folded(x)
            spikes = self.sn1(over_time(x, T))
        out = self.bn2(self.conv2(self.sn2(self.conv1(spikes))))
        return out + identity


class MSResNet(nn.Module):
    """MS-ResNet classifier.

    Args:
        variant: ``ms_resnet18`` or ``ms_resnet34`` (:data:`VARIANTS`).
        num_classes, in_channels, T, neuron, backend: the run settings (:mod:`snntrain.models.common`); ``neuron``
            None is the paper's (:data:`MS_NEURON`).
        stem: ``imagenet`` (the paper's and SpikingJelly's: a 7x7 stride-2 convolution, and the first stage
            downsamples too) or ``cifar`` (a 3x3 stride-1 convolution and a first stage at full size, for 32x32
            and smaller images).
        width: channels of the stem and the first stage (64 in the paper); later stages double it.
        norm: ``batchnorm`` or ``layernorm``.
        spike_bytes: the blocks' convolutions (of spikes) keep their input for the backward packed in bits
            (:class:`~snntrain.nn.layers.SpikeConv2d`: the same results, 1 bit an element for spikes, 2 for sums up to 3,
            4 up to 15, 8 up to 255, instead of bfloat16's 16); False: ``torch.nn.Conv2d`` everywhere. The stem and the
            shortcuts read currents and are always ``Conv2d``.

    ``forward`` returns logits averaged over T, ``[B, num_classes]``.
    """

    def __init__(
        self,
        variant: str = "ms_resnet18",
        num_classes: int = 10,
        in_channels: int = 3,
        T: int = 4,
        stem: str = "imagenet",
        width: int = 64,
        neuron: Mapping[str, Any] | None = None,
        norm: str = "batchnorm",
        backend: str = "auto",
        spike_bytes: bool = False,
    ) -> None:
        super().__init__()
        layers = pick_variant(variant, VARIANTS)
        self.T, num_classes, in_channels = check_run_settings(T, num_classes, in_channels)
        one_of("stem", stem, STEMS)
        width = positive_int("width", width)
        f = LayerFactory(MS_NEURON if neuron is None else neuron, norm, backend, T=self.T, spike_bytes=spike_bytes)

        k, stride = (7, 2) if stem == "imagenet" else (3, 1)
        self.stem = MultiStep(nn.Conv2d(in_channels, width, k, stride=stride, padding=k // 2, bias=False),
                              f.norm(width))
        cin = width
        stages = []
        for i, n in enumerate(layers):
            cout = width * 2**i
            first_stride = 2 if (i > 0 or stem == "imagenet") else 1
            blocks = []
            for j in range(n):
                blocks.append(MSBlock(f, cin, cout, first_stride if j == 0 else 1))
                cin = cout
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.head_sn = f.neuron(cin)
        self.num_classes = num_classes
        self.head = ClassifierHead(cin, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.BatchNorm2d, LayerNorm2d)):
                nn.init.constant_(m.weight, NORM_WEIGHT)
        for m in self.modules():
            if isinstance(m, MSBlock):
                nn.init.zeros_(m.bn2[0].weight)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The last stage's output currents ``[T, B, C, H, W]``."""
        stages = (self.layer1, self.layer2, self.layer3, self.layer4)
        if x.dim() == 4:  # direct encoding: the stem and the first block's shortcut run once
            first = stages[0]
            x = first[0](self.stem.folded(x), T=self.T)
            for block in first[1:]:
                x = block(x)
            stages = stages[1:]
        else:
            x = self.stem(over_time(x, self.T))
        for stage in stages:
            x = stage(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.head_sn(self.forward_features(x)))
