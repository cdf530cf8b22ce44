"""Training throughput: ``perf/train_images_per_s``."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from .metrics import batch_size


def synchronized_clock(trainer: L.Trainer) -> float:
    """``time.perf_counter()`` once the trainer's device has finished the work queued so far."""
    import time

    device = trainer.strategy.root_device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class TrainingSpeedMonitor(L.Callback):
    """Logs ``perf/train_images_per_s``: training images per second over all processes, each epoch.

    The window runs from the end of the epoch's ``warmup_steps``-th training step to the end of its
    last, with the device synchronised at those two points only, so the steps in between run as they
    always do; start-up, the first steps (compilation, autotuning, allocator growth) and validation
    fall outside it. With DDP the images of all processes are added and divided by the longest
    process's window. Nothing is logged for an epoch of ``warmup_steps`` steps or fewer.
    """

    def __init__(self, warmup_steps: int = 5) -> None:
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 1:
            raise ValueError(f"warmup_steps={warmup_steps!r} must be an integer >= 1")
        self.warmup_steps = warmup_steps
        self._steps = self._images = 0
        self._start: float | None = None
        self._seconds: float | None = None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._steps = self._images = 0
        self._start = self._seconds = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._steps += 1
        if self._steps == self.warmup_steps:
            self._start = synchronized_clock(trainer)
        elif self._start is not None:
            self._images += batch_size(batch)
            if batch_idx + 1 >= trainer.num_training_batches:  # the epoch's last step: stop before validation
                self._seconds = synchronized_clock(trainer) - self._start

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._start is None or self._images == 0:
            return
        if self._seconds is None:  # the loader ended before num_training_batches (an iterable of unknown length)
            self._seconds = synchronized_clock(trainer) - self._start
        device = pl_module.device
        images = trainer.strategy.reduce(torch.tensor(float(self._images), dtype=torch.float64, device=device),
                                         reduce_op="sum")
        seconds = trainer.strategy.reduce(torch.tensor(self._seconds, dtype=torch.float64, device=device),
                                          reduce_op="max")
        # the same value on every process; sync_dist (a mean of equal values) only tells Lightning so
        pl_module.log("perf/train_images_per_s", (images / seconds).float(), on_epoch=True, sync_dist=True,
                      batch_size=1)
