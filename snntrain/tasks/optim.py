"""Optimizers and learning-rate schedules from the ``task`` config, shared by all tasks."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..validation import one_of

OPTIMIZERS = ("sgd", "adamw")
SCHEDULERS = ("cosine", "constant")


def _param_groups(model: nn.Module, weight_decay: float, decay_norm_and_bias: bool) -> list[dict[str, Any]]:
    """Weight decay on conv/linear weights only, unless ``decay_norm_and_bias``."""
    if decay_norm_and_bias:
        return [{"params": [p for p in model.parameters() if p.requires_grad], "weight_decay": weight_decay,
                 "name": "all"}]
    decay, no_decay = [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() > 1 else no_decay).append(p)  # biases, norm affines and PLIF's w are 0-/1-d
    return [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
    ]


def _fused(groups: list[dict[str, Any]]) -> dict[str, bool]:
    """``fused=True`` when every parameter is a floating-point CUDA tensor: one kernel launch
    per step instead of one per parameter (the foreach default elsewhere)."""
    params = [p for g in groups for p in g["params"]]
    if params and all(p.is_cuda and p.is_floating_point() for p in params):
        return {"fused": True}
    return {}


def build_optimizer(model: nn.Module, cfg: Mapping[str, Any]) -> torch.optim.Optimizer:
    """SGD or AdamW over ``model``'s parameters, fused on CUDA (build it after the model is moved)."""
    cfg = dict(cfg)
    name = cfg.pop("name", "adamw")
    lr = float(cfg.pop("lr", 1e-3))
    if not lr > 0:
        raise ValueError(f"optimizer.lr={lr!r} must be > 0")
    weight_decay = float(cfg.pop("weight_decay", 0.0))
    groups = _param_groups(model, weight_decay, bool(cfg.pop("decay_norm_and_bias", False)))
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=float(cfg.pop("momentum", 0.9)),
                               nesterov=bool(cfg.pop("nesterov", False)), **_fused(groups))
    if name == "adamw":
        betas = tuple(cfg.pop("betas", (0.9, 0.999)))
        return torch.optim.AdamW(groups, lr=lr, betas=betas, **_fused(groups))
    raise ValueError(f"optimizer.name={name!r} is not valid; choose one of {', '.join(OPTIMIZERS)}")


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: Mapping[str, Any], total_steps: int, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-step schedule: linear warm-up for ``warmup_epochs``, then ``cosine`` decay or ``constant``."""
    name = cfg.get("name", "cosine")
    one_of("scheduler.name", name, SCHEDULERS)
    warmup = int(round(float(cfg.get("warmup_epochs", 0)) * steps_per_epoch))
    min_ratio = float(cfg.get("min_lr_ratio", 0.0))
    total = max(int(total_steps), 1)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if name == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
