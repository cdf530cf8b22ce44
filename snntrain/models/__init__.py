"""Spiking models, built from a model config: a family by ``name`` (:data:`MODELS`), or your own network by
``_target_`` (:mod:`snntrain.models.custom`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from ..nn.layers import set_spike_fp8
from ..validation import flag, unknown_setting
from .common import DEFAULT_NEURON, ClassifierHead, LayerFactory
from .custom import TARGET, build_target
from .detector import SpikingFCOS
from .ms_resnet import MSResNet
from .qkformer import QKFormer
from .sew_resnet import SEWResNet, sew_resnet18, sew_resnet34, sew_resnet50
from .spike_driven_transformer import SpikeDrivenTransformer
from .spikformer import Spikformer
from .spiking_resnet import SpikingResNet
from .spiking_vgg import SpikingVGG

#: The model registry: ``model.name`` -> the builder of that family, called with the model config's other keys
#: and ``backend``. One entry per family (``conf/model/<name>.yaml`` is its config); a family's ``variant``
#: picks its size.
MODELS: dict[str, Callable[..., nn.Module]] = {
    "sew_resnet": SEWResNet,
    "sew_fcos": SpikingFCOS,
    "spiking_vgg": SpikingVGG,
    "spiking_resnet": SpikingResNet,
    "ms_resnet": MSResNet,
    "spikformer": Spikformer,
    "spike_driven_transformer": SpikeDrivenTransformer,
    "qkformer": QKFormer,
}
#: The families that are detectors (``task=detect``); every other one is a classifier.
DETECTORS = ("sew_fcos",)


def is_detector(cfg: Mapping[str, Any]) -> bool:
    """Whether the model config ``cfg`` describes a detector: a family in :data:`DETECTORS`, or a ``sew_resnet``
    config with a ``head`` section (how checkpoints written before the detector had a name of its own describe
    it)."""
    name = cfg.get("name")
    return name in DETECTORS or (name == "sew_resnet" and cfg.get("head") is not None)


def model_label(cfg: Mapping[str, Any]) -> str:
    """How messages name the model of ``cfg``: ``model=<name>`` or ``model._target_=<path>``."""
    return f"model._target_={cfg[TARGET]}" if TARGET in cfg else f"model={cfg.get('name')}"


def build_model(cfg: Mapping[str, Any], backend: str = "auto") -> nn.Module:
    """Build the model that ``cfg`` describes: with ``_target_``, that network
    (:func:`snntrain.models.custom.build_target`); otherwise the family :data:`MODELS` ``[cfg["name"]]`` with the
    other keys as its arguments (a ``sew_resnet`` config with a ``head`` section builds the detector, see
    :func:`is_detector`)."""
    if TARGET in cfg:
        return build_target(cfg, backend)
    cfg = dict(cfg)
    name = cfg.pop("name", None)
    if name not in MODELS:
        raise ValueError(f"model name={name!r} is not valid; choose one of {', '.join(MODELS)} (or give your own "
                         "network as model._target_=<package.Class>)")
    builder = SpikingFCOS if is_detector({**cfg, "name": name}) else MODELS[name]
    fp8 = flag("spike_fp8", cfg.pop("spike_fp8", False))
    if fp8:  # FP8 runs in the convolutions of spikes that spike_bytes builds
        cfg["spike_bytes"] = True
    try:
        model = builder(**cfg, backend=backend)
    except TypeError as err:
        raise unknown_setting("model", f"model={name}", err, builder) from None
    if fp8 and not set_spike_fp8(model):
        raise ValueError(f"spike_fp8=true: model={name} with these neuron settings has no convolution whose input is "
                         "known to be spikes (its neurons do not declare the integers they fire), so nothing would "
                         "run in FP8; set spike_fp8=false")
    return model


__all__ = ["DEFAULT_NEURON", "DETECTORS", "MODELS", "ClassifierHead", "LayerFactory", "MSResNet", "QKFormer",
           "SEWResNet", "SpikeDrivenTransformer", "SpikingFCOS", "SpikingResNet", "SpikingVGG", "Spikformer",
           "build_model", "is_detector", "model_label", "sew_resnet18", "sew_resnet34", "sew_resnet50"]
