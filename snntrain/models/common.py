"""What the model families share: how a network receives its run settings, builds its layers, takes its
input over time and reads out class scores.

Every classifier in :mod:`snntrain.models` takes the same run settings as keyword arguments, filled in by
the model config (``conf/model/<family>.yaml``) from the run: ``T`` (time steps for a static image),
``num_classes`` and ``in_channels`` (from the data), ``neuron`` (a mapping for
:func:`snntrain.nn.build_neuron`, so that every neuron type it knows works in every family) and
``backend`` (``auto``, ``torch`` or ``triton``, from the run's ``backend`` group). A family picks its
architecture with ``variant``, named as SpikingJelly names its constructors (``spiking_vgg11_bn``,
``ms_resnet18``, ...).

* :class:`LayerFactory` makes the layers with the network-wide settings: convolutions over the folded
  ``[T * B, ...]`` batch (a :class:`~snntrain.nn.layers.SpikeConv2d`, keeping its input for the backward in one
  byte, where the network declares the input spikes or a bounded sum of them and ``spike_bytes`` is on), a norm
  and the neuron after it as one :class:`~snntrain.nn.NormNeuron` (fused under Triton), a norm alone where a residual sum comes between the norm and the neuron, max pooling of
  spike maps (:class:`~snntrain.nn.SpikeMaxPool2d`, Triton kernels under Triton).
* :func:`over_time` and :func:`encode` are the input convention: a static image ``[B, C, H, W]`` is
  encoded directly (the first convolution runs once and its output is the input current of every step,
  a stride-0 view over T that the neuron kernels read without copying); ``[T, B, C, H, W]`` input (event
  or temporal data) is used as it is.
* :class:`ClassifierHead` reads out: global average pooling, a linear layer on every step, the mean of
  the steps' logits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..backend import check_backend
from ..nn.layers import MultiStep, make_conv2d
from ..nn.neurons import build_neuron, config_neuron, spike_max
from ..nn.norm import build_norm2d
from ..nn.norm_neuron import NormNeuron, norm_neuron_max_pool
from ..nn.pool import SpikeMaxPool2d
from ..validation import flag, one_of, positive_int

#: The neuron of a network built without a ``neuron`` setting (and of ``conf/model/sew_resnet.yaml``).
DEFAULT_NEURON: dict[str, Any] = {"type": "LIF", "tau": 2.0, "detach_reset": True, "surrogate": "atan"}


def check_run_settings(T: object, num_classes: object, in_channels: object) -> tuple[int, int, int]:
    """``(T, num_classes, in_channels)`` validated (positive integers); the backend is the :class:`LayerFactory`'s
    to check, once for the network."""
    return positive_int("T", T), positive_int("num_classes", num_classes), positive_int("in_channels", in_channels)


def pick_variant(variant: object, variants: Mapping[str, Any]) -> Any:
    """The architecture of ``variant`` in a family's table ``variants``; an unknown name lists the valid ones."""
    return variants[one_of("variant", variant, variants)]


class LayerFactory:
    """Creates layers with the network-wide settings: ``neuron`` (keyword arguments of
    :func:`snntrain.nn.build_neuron`), ``norm`` (``batchnorm`` or ``layernorm``, :data:`snntrain.nn.NORMS`),
    ``backend``, ``T`` (the time steps, for neuron types that take them) and ``spike_bytes`` (convolutions of spikes
    keep their input for the backward packed in bits, :meth:`conv2d`). The settings are checked once, when the factory is
    made.

    :attr:`spike_max` is the largest value the network's neurons fire (1: binary spikes; None: not known integers,
    :func:`snntrain.nn.neurons.spike_max`): a model passes it, or the bound of a sum of spikes
    (:func:`snntrain.nn.layers.sew_connect_max`), as ``input_max`` of a convolution that reads them."""

    def __init__(self, neuron: Mapping[str, Any] | None = None, norm: str = "batchnorm",
                 backend: str = "auto", T: int | None = None, spike_bytes: bool = False) -> None:
        self.neuron_cfg = config_neuron(DEFAULT_NEURON if neuron is None else neuron)
        self.norm_name = norm
        self.backend = check_backend(backend)
        self.T = T
        self.spike_bytes = flag("spike_bytes", spike_bytes)
        self.spike_max = spike_max(self.neuron(channels=1))  # also validates the neuron settings once, up front
        build_norm2d(norm, 1, backend)

    def neuron(self, channels: int | None = None) -> nn.Module:
        """A spiking neuron over ``[T, ...]`` input with ``channels`` channels (dim 2; for types with per-channel
        parameters)."""
        return build_neuron(**self.neuron_cfg, backend=self.backend, channels=channels, T=self.T)

    def conv2d(self, cin: int, cout: int, k: int, stride: int = 1, bias: bool = False,
               input_max: int | None = None) -> nn.Conv2d:
        """A ``k x k`` convolution (padding ``k // 2``): a :class:`~snntrain.nn.layers.SpikeConv2d` where
        ``spike_bytes`` is on and ``input_max`` (the input is integers in ``[0, input_max]`` by construction: the
        neurons' spikes, :attr:`spike_max`, or a sum of them; None: any values, an image or currents) is at most 255,
        else a :class:`torch.nn.Conv2d` (:func:`~snntrain.nn.layers.make_conv2d`)."""
        return make_conv2d(cin, cout, k, stride, bias, input_max=input_max, spike_bytes=self.spike_bytes,
                           backend=self.backend)

    def conv(self, cin: int, cout: int, k: int, stride: int = 1, bias: bool = False,
             input_max: int | None = None) -> MultiStep:
        """:meth:`conv2d` over the folded ``[T * B, ...]`` batch."""
        return MultiStep(self.conv2d(cin, cout, k, stride, bias, input_max))

    def norm_neuron(self, channels: int) -> NormNeuron:
        """The norm and neuron after a convolution (fused under the Triton backend)."""
        return NormNeuron(build_norm2d(self.norm_name, channels, self.backend), self.neuron(channels), self.backend)

    def max_pool(self, kernel_size: int, stride: int | None = None, padding: int = 0,
                 ceil_mode: bool = False) -> MultiStep:
        """Max pooling of spike maps ``[T, B, C, H, W]`` over the folded batch (PyTorch's results; one Triton
        kernel each way under the Triton backend)."""
        return MultiStep(SpikeMaxPool2d(kernel_size, stride, padding, ceil_mode=ceil_mode, backend=self.backend))

    def norm(self, channels: int) -> nn.Module:
        """A norm over ``[N, C, H, W]`` maps alone (wrapped in ``MultiStep`` for ``[T, B, ...]``), where its output
        is not a neuron's input: a residual sum comes first."""
        return build_norm2d(self.norm_name, channels, self.backend)


def over_time(x: torch.Tensor, T: int) -> torch.Tensor:
    """``[T, B, ...]`` input: a static image ``[B, C, H, W]`` repeated over ``T`` steps as a stride-0 view (no
    copy), or ``[T', B, C, H, W]`` as it is."""
    if x.dim() == 4:
        return x.unsqueeze(0).expand(T, *x.shape)
    if x.dim() == 5:
        return x
    raise ValueError(f"input has shape {tuple(x.shape)}; expected [B, C, H, W] or [T, B, C, H, W]")


def encode(conv: MultiStep, spiking: nn.Module, x: torch.Tensor, T: int, pool: nn.Module | None = None) -> torch.Tensor:
    """Spikes ``[T, B, C, H, W]`` of a network's first convolution ``conv`` and the spiking layer after it
    (a :class:`~snntrain.nn.NormNeuron` or a neuron), max-pooled by ``pool`` where given (the ImageNet stem; a
    ``NormNeuron`` and its pool run as one op under Triton, :func:`~snntrain.nn.norm_neuron_max_pool`). For a
    static image ``[B, C, H, W]`` (direct encoding) the convolution runs once and its output is the input current
    of each of the ``T`` steps (the norm of a ``NormNeuron`` sees it once); ``[T, B, C, H, W]`` input runs through
    both as it is."""
    if pool is not None and isinstance(pool, nn.Identity):
        pool = None
    if isinstance(spiking, NormNeuron):
        y, steps = (conv.folded(x), T) if x.dim() == 4 else (conv(over_time(x, T)), None)
        if pool is not None:
            return norm_neuron_max_pool(spiking, pool, y, T=steps)
        return spiking(y, T=steps)
    y = over_time(conv.folded(x), T) if x.dim() == 4 else conv(over_time(x, T))
    return spiking(y) if pool is None else pool(spiking(y))


class ClassifierHead(nn.Module):
    """Class scores from spiking features: global average pooling of ``[T, B, C, H, W]`` maps (``[T, B, C]``
    features pass as they are), a linear layer on every step, the mean over T. Returns ``[B, num_classes]``."""

    def __init__(self, channels: int, num_classes: int) -> None:
        super().__init__()
        self.avgpool = MultiStep(nn.AdaptiveAvgPool2d(1), nn.Flatten(1))
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 5:
            x = self.avgpool(x)
        elif x.dim() != 3:
            raise ValueError(f"ClassifierHead expects [T, B, C, H, W] or [T, B, C] input, got shape {tuple(x.shape)}")
        return self.fc(x).mean(0)


def kaiming_init(model: nn.Module) -> None:
    """torchvision's ResNet and VGG initialisation, which SpikingJelly's constructors keep: convolutions
    Kaiming-normal (fan out, ReLU gain) with zero bias, norms at weight 1 and bias 0."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
