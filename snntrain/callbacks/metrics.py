"""Values written to the loggers without ``LightningModule.log``, and the batch size they count."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch


def log_position(trainer: L.Trainer) -> tuple[int, int]:
    """``(step, epoch)``: the step Lightning writes logged values at now, and the current epoch."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped, trainer.current_epoch


def publish(trainer: L.Trainer, metrics: dict[str, float], epoch: bool = False,
            at: tuple[int, int] | None = None) -> None:
    """Values that every process already holds (a validation's, or this process's training step values), written
    as LearningRateMonitor writes its own: to every logger (rank 0) at the step Lightning logs at, with the
    ``epoch`` as Lightning adds it to step values when ``epoch``, and into ``trainer.callback_metrics``. Not
    through ``LightningModule.log``, which builds, moves and reduces a metric object per key (about a
    millisecond each, dozens of keys per validation) and reads each value back from the device on its own.
    ``at``: the ``(step, epoch)`` the values belong to (:func:`log_position` when they were made), for values
    written later than that; by default the trainer's position now."""
    if not metrics:
        return
    if trainer.is_global_zero:
        step, current_epoch = at if at is not None else log_position(trainer)
        row = {**metrics, "epoch": current_epoch} if epoch else metrics
        for logger in trainer.loggers:
            logger.log_metrics(row, step=step)
    trainer.callback_metrics.update({k: torch.tensor(float(v)) for k, v in metrics.items()})


def batch_size(batch: Any) -> int:
    """The number of samples in a batch ``(inputs, targets)`` or ``inputs``: inputs ``[B, C, H, W]``, or
    time-first ``[T, B, C, H, W]`` (event frames)."""
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    if not torch.is_tensor(first):
        return 0
    return int(first.shape[1] if first.dim() == 5 else first.shape[0])
