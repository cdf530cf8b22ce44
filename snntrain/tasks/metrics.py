"""Metrics that a training step updates without waiting for the host.

torchmetrics' aggregators turn a Python weight into a device tensor (a blocking host-to-device copy)
and its classification metrics count classes with ``torch.bincount`` (which reads the largest label
back to the host): on a GPU each of those stops the host until the device has finished every queued
kernel, so the host can no longer run ahead of the device. These keep their sums on the device,
updated with tensor operations and Python scalars only; ``compute`` (at the epoch's end, where
Lightning logs them) adds the states over all processes, like any torchmetrics ``Metric``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric


class WeightedMean(Metric):
    """The weighted mean of values: ``sum(value * weight) / sum(weight)``, of one scalar or, with ``names``,
    of several at once: one update adds a vector of values (one per name) with a vector of weights, so a step
    that logs several means launches a handful of kernels, not a handful per mean, and ``compute`` returns
    ``{name: mean}``.

    ``weight`` is a Python number or a tensor on the value's device (a scalar, or one weight per name).
    Accumulated in float64.
    """

    full_state_update = False
    higher_is_better = None

    def __init__(self, names: Sequence[str] | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.names = None if names is None else tuple(names)
        if self.names is not None and (not self.names or len(set(self.names)) != len(self.names)):
            raise ValueError(f"names={list(self.names)} is not valid: give one or more distinct names")
        shape = () if self.names is None else (len(self.names),)
        self.add_state("total", default=torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight", default=torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, value: Tensor, weight: Tensor | float = 1.0) -> None:
        if value.shape != self.total.shape:
            raise ValueError(f"value has shape {tuple(value.shape)}; this mean takes shape {tuple(self.total.shape)}"
                             + ("" if self.names is None else f" (one value per name of {list(self.names)})"))
        value = value.detach().to(torch.float64)
        if isinstance(weight, Tensor):
            weight = weight.detach().to(torch.float64)
        self.total += value * weight
        self.weight += weight

    def compute(self) -> Tensor | dict[str, Tensor]:
        mean = (self.total / self.weight).float()
        return mean if self.names is None else dict(zip(self.names, mean.unbind()))


class TopOneAccuracy(Metric):
    """Top-1 accuracy of logits ``[B, K]`` against labels ``[B]``: the fraction of argmax hits."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("correct", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, logits: Tensor, target: Tensor) -> None:
        if logits.dim() != 2 or target.shape != logits.shape[:1]:
            raise ValueError(f"expected logits [B, K] and labels [B]; got {tuple(logits.shape)} and "
                             f"{tuple(target.shape)}")
        self.correct += (logits.detach().argmax(-1) == target).sum()
        self.total += target.numel()

    def compute(self) -> Tensor:
        return self.correct.double().div(self.total).float()
