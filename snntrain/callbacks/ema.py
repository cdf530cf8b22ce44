"""The ``callbacks.ema`` section: an exponential moving average of the weights."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging


def ema_decay(decay: float, num_averaged: int) -> float:
    """The decay of the ``num_averaged``-th update: ``min(decay, (1 + n) / (10 + n))``. Early updates
    weigh the new weights more, so the average does not carry the initial weights for thousands
    of steps (the warm-up of timm's ``ModelEmaV2`` and of YOLOX)."""
    return min(decay, (1.0 + num_averaged) / (10.0 + num_averaged))


def _match_layout(averaged: list[torch.Tensor], current: list[torch.Tensor]) -> None:
    """Give the average's parameters and buffers the memory layout of the model's, in place (``.data``,
    values unchanged).

    The average is copied from the model before the task turns its convolutions channels-last (and a
    compiled training step may turn them back): with different strides ``torch._foreach_lerp_`` leaves
    its multi-tensor path and updates tensor by tensor, a kernel launch per parameter and buffer."""
    for a, c in zip(averaged, current):
        if a.stride() != c.stride():
            a.data = torch.empty_like(c, dtype=a.dtype, device=a.device).copy_(a)


class ExponentialMovingAverage(WeightAveraging):
    """An exponential moving average of the weights and buffers (batch-norm statistics), updated
    after every optimizer step with ``decay`` (warmed up by :func:`ema_decay`).

    Validation runs on the average, and every checkpoint's ``state_dict`` holds it (the training
    weights go to ``current_model_state`` for resuming, Lightning's ``WeightAveraging`` format), so
    exports and predictions from a checkpoint use the average; the model holds it after the fit.
    The average is swapped in at ``on_validation_start``, before :class:`PreciseBatchNorm` (which
    must come after this callback in the trainer's list) re-estimates the batch-norm statistics,
    so the statistics fit the averaged weights; and :class:`IntervalCheckpoint` must come after it
    too, so that a checkpoint written at the end of a step holds the average with that step in it.
    """

    def __init__(self, decay: float = 0.999) -> None:
        from ..validation import number

        value = number("ema.decay", decay)
        if not 0.0 < value < 1.0:
            raise ValueError(f"ema.decay={decay!r} must be in (0, 1), e.g. 0.999 (the weight of the old average)")
        self.decay = value
        super().__init__(use_buffers=True, multi_avg_fn=self._update)

    def _update(self, averaged: list[torch.Tensor], current: list[torch.Tensor], num_averaged: int) -> None:
        weight = 1.0 - ema_decay(self.decay, int(num_averaged))
        floats = [(a, c) for a, c in zip(averaged, current) if a.is_floating_point()]
        if floats:
            torch._foreach_lerp_([a for a, _ in floats], [c for _, c in floats], weight)
        counters = [(a, c) for a, c in zip(averaged, current) if not a.is_floating_point()]
        if counters:  # counters (num_batches_tracked): the current value
            torch._foreach_copy_([a for a, _ in counters], [c for _, c in counters])

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._num_updates: int | None = None  # read from the average model's counter once, when first needed
        self._pairs = None

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        super().on_load_checkpoint(trainer, pl_module, checkpoint)
        self._num_updates = None
        self._pairs = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # Lightning's update (AveragedModel.update_parameters) tests its device-side update counter twice
        # per step, and each test waits for the device; this one counts on the host as well.
        if trainer.global_step > self._latest_update_step and self.should_update(step_idx=trainer.global_step - 1):
            self._update_average(pl_module)
            self._latest_update_step = trainer.global_step

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self._pairs = None  # the tensors are looked up again at the epoch's first update

    def _tensor_pairs(self, pl_module: L.LightningModule) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The average's parameters and buffers and the model's, in the same order and memory layout: looked up
        at the first update of every epoch and kept for its other steps (walking the module tree costs the
        host about a millisecond per step). Within an epoch the tensors stay the same objects: layouts change
        (channels-last at setup, NCHW at the first compiled step) before the first update, and swapping the
        average in for validation copies values, not tensors."""
        import itertools

        pairs = getattr(self, "_pairs", None)
        if pairs is None:
            model = self._average_model
            averaged = list(itertools.chain(model.module.parameters(), model.module.buffers()))
            current = list(itertools.chain(pl_module.parameters(), pl_module.buffers()))
            _match_layout(averaged, current)
            pairs = self._pairs = (averaged, current)
        return pairs

    @torch.no_grad()
    def _update_average(self, pl_module: L.LightningModule) -> None:
        model = self._average_model
        if getattr(self, "_num_updates", None) is None:
            self._num_updates = int(model.n_averaged)  # once per fit (or resume): the checkpoint's count
        # the tensors themselves (no_grad allows in-place updates of parameters): a detached view each would
        # cost the host a few microseconds per tensor and step
        averaged, current = self._tensor_pairs(pl_module)
        if self._num_updates == 0:
            for a, c in zip(averaged, current):
                a.copy_(c)
        else:
            self._update(averaged, current, self._num_updates)
        model.n_averaged.add_(1)
        self._num_updates += 1

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._average_model is not None:
            self._swap_models(pl_module)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pass  # swapped in at on_validation_start, before the batch-norm statistics are re-estimated
