"""What every snntrain LightningModule shares: the model from the config, optimizer and schedule."""

from __future__ import annotations

from typing import Any

import lightning as L

from .. import __version__
from ..models import build_model
from .optim import build_optimizer, build_scheduler


class SpikingTask(L.LightningModule):
    """Base task. ``config`` is the whole resolved run config as plain Python values; it is
    saved in every checkpoint, so a checkpoint alone rebuilds its model.

    ``backend`` (``auto``, ``torch`` or ``triton``) is how this process computes the
    spiking layers; it is not part of the model and not saved.
    """

    def __init__(self, config: dict[str, Any], backend: str = "auto") -> None:
        super().__init__()
        self.save_hyperparameters({"config": config})
        self.config = config
        self.backend = backend
        self.model = build_model(config["model"], backend=backend)

    def forward(self, x):
        return self.model(x)

    def configure_optimizers(self):
        task = self.config["task"]
        optimizer = build_optimizer(self.model, task["optimizer"])
        total = int(self.trainer.estimated_stepping_batches)
        epochs = self.trainer.max_epochs if self.trainer.max_epochs and self.trainer.max_epochs > 0 else 1
        scheduler = build_scheduler(optimizer, task["scheduler"], total, max(1, total // epochs))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        # every parameter group follows the same schedule: log the first one's rate
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], on_step=True, on_epoch=False)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        metrics = {k: float(v) for k, v in self.trainer.callback_metrics.items()
                   if hasattr(v, "numel") and v.numel() == 1 and "/" in k and not k.startswith("firing_rate")}
        checkpoint["snntrain"] = {"version": __version__, "backend": self.backend, "task": self.config["task"]["name"],
                                  "metrics": metrics}
