"""The ``callbacks.checkpoint`` section and checkpoint I/O: ``last.ckpt`` after every validation, checkpoints
inside an epoch, atomic writes."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint

from ..fileio import atomic_path


class RunCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` (the best checkpoints by the monitored metric, and ``last.ckpt``),
    with ``last.ckpt`` rewritten after every validation of a fit: Lightning 2.6 rewrites it only when a
    best checkpoint was saved at the same step, which would leave a resumable run's ``last.ckpt`` behind
    the run whenever the metric did not improve."""

    def _save_last_if_missed(self, trainer: L.Trainer) -> None:
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):  # skipped: saved at this step
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_missed(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_missed(trainer)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint under a temporary name and renames it when complete."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        with atomic_path(path) as tmp:
            super().save_checkpoint(checkpoint, tmp, storage_options)


class IntervalCheckpoint(L.Callback):
    """Writes ``<dirpath>/last.ckpt`` inside an epoch every ``every_n_steps`` optimizer steps and/or
    every ``every_n_minutes`` of training, so a crash loses at most that much work.

    Each save goes through the trainer's checkpoint I/O (atomic: a temporary name, then a rename)
    and holds everything a resume needs: weights, optimizer, schedule, loop progress, the training
    loader's position and random states. The last batch of an epoch is left to the epoch-end
    checkpoint. Intervals count from the last checkpoint of any kind. ``None`` disables a trigger. With
    several processes the clock is consulted every :attr:`CLOCK_CHECK_STEPS` optimizer steps (the processes
    must agree, which costs a collective), so a time-triggered save may come that many steps late.
    """

    #: With several processes, how often (in optimizer steps) the processes agree on the clock.
    CLOCK_CHECK_STEPS = 32

    def __init__(self, dirpath, every_n_steps: int | None = None, every_n_minutes: float | None = None) -> None:
        from pathlib import Path

        from ..validation import number, positive_int

        self.dirpath = Path(dirpath)
        self.every_n_steps = None if every_n_steps is None else positive_int("checkpoint.every_n_steps", every_n_steps)
        if every_n_minutes is not None:
            every_n_minutes = number("checkpoint.every_n_minutes", every_n_minutes)
            if every_n_minutes <= 0:
                raise ValueError(f"checkpoint.every_n_minutes={every_n_minutes!r} must be > 0 (or null: off)")
        self.every_n_minutes = every_n_minutes
        self._last_step = 0
        self._last_time = 0.0

    @property
    def path(self):
        return self.dirpath / "last.ckpt"

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        import time

        self._last_step = trainer.global_step
        self._last_time = time.monotonic()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        import time

        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch or trainer.sanity_checking:
            return
        due = self.every_n_steps is not None and trainer.global_step - self._last_step >= self.every_n_steps
        if self.every_n_minutes is not None and not due:
            due = (time.monotonic() - self._last_time) >= 60.0 * self.every_n_minutes
            if trainer.world_size > 1:
                # every process must agree to save, and agreeing is a collective that waits for the devices:
                # ask every CLOCK_CHECK_STEPS steps only (rank 0's clock decides)
                if trainer.global_step % self.CLOCK_CHECK_STEPS:
                    return
                due = bool(trainer.strategy.broadcast(due))
        if due and trainer.global_step != self._last_step:
            trainer.save_checkpoint(self.path)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint) -> None:
        import time

        # any checkpoint (this callback's or an epoch-end one) starts the next interval
        self._last_step = trainer.global_step
        self._last_time = time.monotonic()
