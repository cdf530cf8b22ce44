"""Spiking models, built by name from a config mapping."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from .detector import SpikingFCOS
from .qkformer import QKFormer
from .sew_resnet import SEWResNet, sew_resnet18, sew_resnet34, sew_resnet50
from .spike_driven_transformer import SpikeDrivenTransformer
from .spikformer import Spikformer

#: The spiking transformers by model name (each takes ``variant=`` one of its module's ``VARIANTS``).
TRANSFORMERS = {"spikformer": Spikformer, "spike_driven_transformer": SpikeDrivenTransformer, "qkformer": QKFormer}
MODELS = ("sew_resnet", "sew_fcos", *TRANSFORMERS)


def is_detector(cfg: Mapping[str, Any]) -> bool:
    """Whether the model config ``cfg`` describes a detector: ``sew_fcos``, or a ``sew_resnet`` config with a
    ``head`` section (how checkpoints written before the detector had a name of its own describe it)."""
    return cfg.get("name") == "sew_fcos" or (cfg.get("name") == "sew_resnet" and cfg.get("head") is not None)


def build_model(cfg: Mapping[str, Any], backend: str = "auto") -> nn.Module:
    """Build the model that ``cfg`` describes (its ``name`` picks the class, the rest are arguments):
    ``sew_resnet`` a :class:`SEWResNet` classifier, ``sew_fcos`` a :class:`SpikingFCOS` detector (also
    built for a ``sew_resnet`` config with a ``head`` section, see :func:`is_detector`), ``spikformer``,
    ``spike_driven_transformer`` and ``qkformer`` the spiking transformers (:data:`TRANSFORMERS`)."""
    cfg = dict(cfg)
    name = cfg.get("name")
    if name not in MODELS:
        raise ValueError(f"model name={name!r} is not valid; choose one of {', '.join(MODELS)}")
    cls = TRANSFORMERS.get(name) or (SpikingFCOS if is_detector(cfg) else SEWResNet)
    del cfg["name"]
    try:
        return cls(**cfg, backend=backend)
    except TypeError as err:
        raise ValueError(f"bad model setting for {name}: {err}") from None


__all__ = ["MODELS", "QKFormer", "SEWResNet", "SpikeDrivenTransformer", "SpikingFCOS", "Spikformer", "TRANSFORMERS",
           "build_model", "is_detector", "sew_resnet18", "sew_resnet34", "sew_resnet50"]
