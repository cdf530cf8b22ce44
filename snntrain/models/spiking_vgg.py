"""Spiking VGG: Simonyan and Zisserman's VGG ("Very Deep Convolutional Networks for Large-Scale Image
Recognition", 2015) with spiking neurons in place of ReLU, as SpikingJelly's ``spiking_vgg*`` constructors
build it.

Multi-step throughout (``[T, B, C, H, W]``). Each 3x3 convolution is followed by a
:class:`~snntrain.nn.NormNeuron` (a norm and the neuron, fused under Triton) in the ``_bn`` variants and by
the neuron alone in the others; the stages end in 2x2 max-pooling. The classifier is SpikingJelly's (and
torchvision's): average pooling to 7x7, two hidden linear layers of 4096 spiking units with dropout (one mask
for all T steps), and the output layer; ``classifier=linear`` replaces it with global average pooling and one
linear layer, the usual head for CIFAR-size images. Convolutions keep their bias in the ``_bn`` variants too,
as SpikingJelly's do, so that the parameter counts are equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..nn.layers import MultiStep, TemporalDropout
from ..validation import number, one_of, positive_int
from .common import ClassifierHead, LayerFactory, check_run_settings, encode, kaiming_init, pick_variant

#: Output channels of each convolution (``M``: a 2x2 max-pool) at width 64, per depth (VGG's A, B, D, E).
LAYERS: dict[int, tuple[int | str, ...]] = {
    11: (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    13: (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    16: (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    19: (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"),
}
#: ``model.variant`` -> (depth, batch norm): SpikingJelly's constructor names.
VARIANTS: dict[str, tuple[int, bool]] = {
    f"spiking_vgg{depth}{'_bn' if bn else ''}": (depth, bn) for depth in LAYERS for bn in (False, True)
}
#: ``vgg``: 7x7 average pooling, two hidden layers with dropout, the output layer (SpikingJelly's);
#: ``linear``: global average pooling and one linear layer.
CLASSIFIERS = ("vgg", "linear")


class SpikingVGG(nn.Module):
    """Spiking VGG classifier.

    Args:
        variant: ``spiking_vgg11``, ``spiking_vgg13``, ``spiking_vgg16``, ``spiking_vgg19``, each also with
            ``_bn`` (:data:`VARIANTS`).
        num_classes, in_channels, T, neuron, backend: the run settings (:mod:`snntrain.models.common`).
        width: channels of the first convolutions (64 in VGG); the later ones scale with it (up to 8 x width).
        classifier: ``vgg`` or ``linear`` (:data:`CLASSIFIERS`).
        hidden: units of the ``vgg`` classifier's two hidden layers (4096 in VGG).
        dropout: dropout probability before the ``vgg`` classifier's second and third linear layers.
        norm: ``batchnorm`` or ``layernorm``, the norm of the ``_bn`` variants.
        spike_bytes: every convolution after the first (they read spikes) keeps their input for the backward packed in bits
            (:class:`~snntrain.nn.layers.SpikeConv2d`: the same results, 1 bit an element for spikes, 2 for sums up to 3,
            4 up to 15, 8 up to 255, instead of bfloat16's 16); False: ``torch.nn.Conv2d`` everywhere.

    The max-pools round up (``ceil_mode``), so that images smaller than 32 pixels (the embedded 8x8 and
    16x16 digits) keep a 1x1 map through all five; at sizes divisible by 32 nothing changes. ``forward``
    returns logits averaged over T, ``[B, num_classes]``.
    """

    def __init__(
        self,
        variant: str = "spiking_vgg11_bn",
        num_classes: int = 10,
        in_channels: int = 3,
        T: int = 4,
        width: int = 64,
        classifier: str = "vgg",
        hidden: int = 4096,
        dropout: float = 0.5,
        neuron: Mapping[str, Any] | None = None,
        norm: str = "batchnorm",
        backend: str = "auto",
        spike_bytes: bool = False,
    ) -> None:
        super().__init__()
        depth, bn = pick_variant(variant, VARIANTS)
        self.T, num_classes, in_channels = check_run_settings(T, num_classes, in_channels)
        width = positive_int("width", width)
        one_of("classifier", classifier, CLASSIFIERS)
        hidden = positive_int("hidden", hidden)
        dropout = number("dropout", dropout)
        f = LayerFactory(neuron, norm, backend, T=self.T, spike_bytes=spike_bytes)

        layers: list[nn.Module] = []
        cin, bound = in_channels, None  # the image, then spikes
        for v in LAYERS[depth]:
            if v == "M":
                layers.append(f.max_pool(2, stride=2, ceil_mode=True))
                continue
            cout = v * width // 64
            layers.append(f.conv(cin, cout, 3, bias=True, input_max=bound))
            bound = f.spike_max
            layers.append(f.norm_neuron(cout) if bn else f.neuron(cout))
            cin = cout
        self.features = nn.Sequential(*layers)
        self.num_classes = num_classes
        if classifier == "vgg":
            self.avgpool = MultiStep(nn.AdaptiveAvgPool2d(7), nn.Flatten(1))
            self.classifier = nn.Sequential(
                nn.Linear(cin * 49, hidden), f.neuron(hidden), TemporalDropout(dropout),
                nn.Linear(hidden, hidden), f.neuron(hidden), TemporalDropout(dropout),
                nn.Linear(hidden, num_classes),
            )
        else:
            self.head = ClassifierHead(cin, num_classes)
        kaiming_init(self)
        for m in self.modules():
            if isinstance(m, nn.Linear):  # VGG's: small normal weights, zero bias
                nn.init.normal_(m.weight, 0.0, 0.01)
                nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The last max-pool's spike map ``[T, B, C, H, W]``."""
        features = self.features
        x = encode(features[0], features[1], x, self.T)
        for layer in features[2:]:
            x = layer(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.forward_features(x)
        if "head" in self._modules:
            return self.head(x)
        return self.classifier(self.avgpool(x)).mean(0)

