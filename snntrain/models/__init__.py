"""Spiking models, built by name from a config mapping."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from .detector import SpikingFCOS
from .sew_resnet import SEWResNet, sew_resnet18, sew_resnet34, sew_resnet50

MODELS = ("sew_resnet",)


def build_model(cfg: Mapping[str, Any], backend: str = "auto") -> nn.Module:
    """Build the model that ``cfg`` describes (its ``name`` picks the class, the rest are arguments).

    A ``sew_resnet`` config with a ``head`` section is a detector: :class:`SpikingFCOS` on that backbone.
    """
    cfg = dict(cfg)
    name = cfg.pop("name", None)
    if name == "sew_resnet":
        cls = SpikingFCOS if cfg.get("head") is not None else SEWResNet
    else:
        raise ValueError(f"model name={name!r} is not valid; choose one of {', '.join(MODELS)}")
    try:
        return cls(**cfg, backend=backend)
    except TypeError as err:
        raise ValueError(f"bad model setting for {name}: {err}") from None


__all__ = ["MODELS", "SEWResNet", "SpikingFCOS", "build_model", "sew_resnet18", "sew_resnet34", "sew_resnet50"]
