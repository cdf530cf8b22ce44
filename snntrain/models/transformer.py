"""What the spiking transformers (Spikformer, Spike-driven Transformer, QKFormer) share: their default neuron,
named variants, the stem's direct encoding and the weight initialisation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..nn.norm_neuron import NormNeuron, norm_neuron_max_pool

#: SpikingJelly's neuron in these models: LIF, tau 2, hard reset to 0, threshold 1, reset detached, sigmoid
#: surrogate (alpha 4).
DEFAULT_NEURON: dict[str, Any] = {"type": "LIF", "tau": 2.0, "detach_reset": True, "surrogate": "sigmoid"}


def resolve_variant(family: str, variants: Mapping[str, Mapping[str, Any]], variant: str | None,
                    **overrides: Any) -> dict[str, Any]:
    """The architecture of ``variant`` (a key of ``variants``) with the ``overrides`` that are not None; with
    ``variant`` None every architecture argument must be given."""
    if variant is None:
        missing = [k for k, v in overrides.items() if v is None]
        if missing:
            raise ValueError(f"{family} without a variant needs {', '.join(missing)}; or give variant= one of "
                             f"{', '.join(variants)}")
        return dict(overrides)
    if not isinstance(variant, str) or variant not in variants:
        raise ValueError(f"{family} variant={variant!r} is not valid; choose one of {', '.join(variants)}")
    return {**variants[variant], **{k: v for k, v in overrides.items() if v is not None}}


def encode_stem(conv: nn.Sequential, sn: nn.Module, x: torch.Tensor, T: int,
                pool: nn.Module | None = None) -> torch.Tensor:
    """The first conv-norm-neuron stage (its spikes max-pooled by ``pool``, where given: :func:`pooled_spikes`). A
    static image ``[B, C, H, W]`` is encoded directly: the convolution (``conv[0]``) runs once and its output is the
    input current of each of the T steps (``sn(.., T=T)``, the norm sees it once), what repeating the image T times
    computes. ``[T, B, C, H, W]`` input (events) runs at every step."""
    if x.dim() == 4:
        return pooled_spikes(sn, pool, conv[0](x), T=T)
    if x.dim() == 5:
        return pooled_spikes(sn, pool, conv(x))
    raise ValueError(f"input has shape {tuple(x.shape)}; expected [B, C, H, W] or [T, B, C, H, W]")


def pooled_spikes(sn: nn.Module, pool: nn.Module | None, y: torch.Tensor, T: int | None = None) -> torch.Tensor:
    """``pool(sn(y, T=T))`` for a stem stage's norm-neuron and the max-pool of its spikes (``pool`` None or an
    ``nn.Identity``: not pooled), the two as one op where they can be (:func:`~snntrain.nn.norm_neuron_max_pool`)."""
    if pool is None or isinstance(pool, nn.Identity):
        return sn(y) if T is None else sn(y, T=T)
    if not isinstance(sn, NormNeuron):  # a module put in its place
        return pool(sn(y) if T is None else sn(y, T=T))
    return norm_neuron_max_pool(sn, pool, y, T=T)


def init_transformer(model: nn.Module) -> None:
    """Truncated-normal weights (std 0.02) and zero biases for every linear and convolution layer, unit norms:
    SpikingJelly's (and the papers') initialisation."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
