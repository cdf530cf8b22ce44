"""Spiking ResNet: He et al.'s ResNet with spiking neurons in place of ReLU, as SpikingJelly's
``spiking_resnet*`` constructors build it (the network that tdBN, Zheng et al. 2021, trained directly).

Multi-step throughout (``[T, B, C, H, W]``). Inside a block every norm that feeds a neuron is one
:class:`~snntrain.nn.NormNeuron` with it (fused under Triton); the block's last norm is added to the shortcut
before its neuron fires (a spiking ResNet's residual sum is of currents, not of spikes: compare
:mod:`snntrain.models.sew_resnet`, which adds spikes, and :mod:`snntrain.models.ms_resnet`, which adds membrane
potentials), so that norm, the addition and the neuron are separate modules, run as one fused batch-norm neuron
with the shortcut added to its input under Triton (:func:`~snntrain.nn.norm_add_neuron`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..nn.layers import MultiStep
from ..nn.norm_neuron import norm_add_neuron
from ..validation import one_of, positive_int
from .common import ClassifierHead, LayerFactory, check_run_settings, encode, kaiming_init, pick_variant

STEMS = ("imagenet", "cifar")


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, f: LayerFactory, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = f.conv(cin, planes, 3, stride, input_max=f.spike_max)
        self.sn1 = f.norm_neuron(planes)
        self.conv2 = f.conv(planes, planes, 3, input_max=f.spike_max)
        self.bn2 = MultiStep(f.norm(planes))
        self.downsample = _downsample(f, cin, planes, stride)
        self.sn2 = f.neuron(planes)

    def last_norm(self) -> nn.Module:
        return self.bn2[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.sn1(self.conv1(x)))
        return norm_add_neuron(self.bn2, self.sn2, y, lambda: x if self.downsample is None else self.downsample(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, f: LayerFactory, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        cout = planes * self.expansion
        self.conv1 = f.conv(cin, planes, 1, input_max=f.spike_max)
        self.sn1 = f.norm_neuron(planes)
        self.conv2 = f.conv(planes, planes, 3, stride, input_max=f.spike_max)
        self.sn2 = f.norm_neuron(planes)
        self.conv3 = f.conv(planes, cout, 1, input_max=f.spike_max)
        self.bn3 = MultiStep(f.norm(cout))
        self.downsample = _downsample(f, cin, cout, stride)
        self.sn3 = f.neuron(cout)

    def last_norm(self) -> nn.Module:
        return self.bn3[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv3(self.sn2(self.conv2(self.sn1(self.conv1(x)))))
        return norm_add_neuron(self.bn3, self.sn3, y, lambda: x if self.downsample is None else self.downsample(x))


def _downsample(f: LayerFactory, cin: int, cout: int, stride: int) -> MultiStep | None:
    """The shortcut's 1x1 convolution of the block's input spikes and norm, where the block changes the map's size or
    channels."""
    if stride == 1 and cin == cout:
        return None
    return MultiStep(f.conv2d(cin, cout, 1, stride, input_max=f.spike_max), f.norm(cout))


#: ``model.variant`` -> (block, blocks per stage): SpikingJelly's constructor names.
VARIANTS: dict[str, tuple[type[nn.Module], tuple[int, int, int, int]]] = {
    "spiking_resnet18": (BasicBlock, (2, 2, 2, 2)),
    "spiking_resnet34": (BasicBlock, (3, 4, 6, 3)),
    "spiking_resnet50": (Bottleneck, (3, 4, 6, 3)),
}


class SpikingResNet(nn.Module):
    """Spiking ResNet classifier.

    Args:
        variant: ``spiking_resnet18``, ``spiking_resnet34`` or ``spiking_resnet50`` (:data:`VARIANTS`).
        num_classes, in_channels, T, neuron, backend: the run settings (:mod:`snntrain.models.common`).
        stem: ``imagenet`` (SpikingJelly's: 7x7 stride-2 convolution and a 3x3 stride-2 max-pool) or ``cifar``
            (a 3x3 stride-1 convolution, no pooling: for 32x32 and smaller images).
        width: channels of the first stage (64 in ResNet); later stages double it.
        norm: ``batchnorm`` or ``layernorm``.
        zero_init_residual: start each block's last norm at zero weight.
        spike_bytes: convolutions of spikes keep their input for the backward packed in bits
            (:class:`~snntrain.nn.layers.SpikeConv2d`: the same results, 1 bit an element for spikes, 2 for sums up to 3,
            4 up to 15, 8 up to 255, instead of bfloat16's 16); False: ``torch.nn.Conv2d`` everywhere.

    ``forward`` returns logits averaged over T, ``[B, num_classes]``.
    """

    def __init__(
        self,
        variant: str = "spiking_resnet18",
        num_classes: int = 10,
        in_channels: int = 3,
        T: int = 4,
        stem: str = "imagenet",
        width: int = 64,
        neuron: Mapping[str, Any] | None = None,
        norm: str = "batchnorm",
        zero_init_residual: bool = False,
        backend: str = "auto",
        spike_bytes: bool = False,
    ) -> None:
        super().__init__()
        block, layers = pick_variant(variant, VARIANTS)
        self.T, num_classes, in_channels = check_run_settings(T, num_classes, in_channels)
        one_of("stem", stem, STEMS)
        width = positive_int("width", width)
        f = LayerFactory(neuron, norm, backend, T=self.T, spike_bytes=spike_bytes)

        if stem == "imagenet":
            self.conv1 = f.conv(in_channels, width, 7, stride=2)
            self.maxpool = f.max_pool(3, stride=2, padding=1)
        else:
            self.conv1 = f.conv(in_channels, width, 3)
            self.maxpool = nn.Identity()
        self.sn1 = f.norm_neuron(width)
        cin = width
        stages = []
        for i, n in enumerate(layers):
            planes = width * 2**i
            blocks = []
            for j in range(n):
                blocks.append(block(f, cin, planes, 2 if (i > 0 and j == 0) else 1))
                cin = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.num_classes = num_classes
        self.head = ClassifierHead(cin, num_classes)
        kaiming_init(self)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, (BasicBlock, Bottleneck)):
                    nn.init.zeros_(m.last_norm().weight)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The last stage's spike map ``[T, B, C, H, W]``."""
        x = encode(self.conv1, self.sn1, x, self.T, pool=self.maxpool)
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))
