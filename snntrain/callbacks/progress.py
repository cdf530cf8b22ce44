"""The progress bar, redrawn at most twice a second."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar


class ProgressBar(TQDMProgressBar):
    """Lightning's progress bar, redrawn at most every ``interval`` seconds (and at the end of each loop).

    Every redraw reads the logged values (``train/loss_step``, ...) back from the device, which waits for
    all the work queued on it; redrawn every step, as Lightning's bar is by default, that wait stops the
    host from running ahead of the device once per step. For the same reason the tasks log no step value
    with ``prog_bar=True`` (Lightning converts those to numbers after every step, bar or no bar): the
    :data:`STEP_VALUES` are read from the logged values here, at a redraw.
    """

    #: Step values shown in the bar (their latest logged value), read only when the bar is redrawn.
    STEP_VALUES = ("train/loss_step",)

    def __init__(self, interval: float = 0.5) -> None:
        from ..validation import number

        interval = number("progress bar interval", interval)
        if interval < 0:
            raise ValueError(f"progress bar interval={interval!r} must be >= 0 seconds")
        super().__init__(refresh_rate=1)
        self.interval = interval
        self._last_draw = float("-inf")

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        for key in self.STEP_VALUES:
            value = trainer.callback_metrics.get(key)
            if value is not None and key not in items:
                items[key.split("/")[-1].removesuffix("_step")] = float(value)
        return items

    def _should_update(self, current: int, total: int | float) -> bool:
        import time

        if not self.is_enabled:
            return False
        now = time.monotonic()
        if current == total or now - self._last_draw >= self.interval:
            self._last_draw = now
            return True
        return False
