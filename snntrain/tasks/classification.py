"""Image classification with a spiking network: cross-entropy on T-averaged logits."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..models import is_detector
from .base import SpikingTask
from .metrics import TopOneAccuracy, WeightedMean


class ClassificationTask(SpikingTask):
    """Trains ``config["model"]`` on (image, label) batches.

    Logs ``train/loss_step`` (this process's batch), ``train/loss_epoch``, ``train/acc``,
    ``val/loss``, ``val/acc`` (top-1) and, through the scheduler, ``train/lr``. Epoch values are
    torchmetrics states summed over all processes, so with DDP they are those of the whole data.
    """

    def __init__(self, config: dict[str, Any], backend: str = "auto") -> None:
        if is_detector(config["model"]):
            raise ValueError(f"model={config['model']['name']} is a detector: train it with task=detect")
        super().__init__(config, backend)
        self.label_smoothing = float(config["task"].get("label_smoothing", 0.0))
        # sums kept on the device: a training step never waits for the host (snntrain.tasks.metrics)
        self.train_acc, self.val_acc = TopOneAccuracy(), TopOneAccuracy()
        self.train_loss, self.val_loss = WeightedMean(), WeightedMean()

    def training_step(self, batch, batch_idx: int) -> torch.Tensor | None:
        if self.partial_batch(batch):
            return None  # skipped: static shapes under compile
        _, y = batch
        out = self.train_objective(batch)
        loss = out["loss"]
        self.train_acc.update(out["logits"], y)
        self.train_loss.update(loss.detach(), len(y))
        self.log_step_values({"train/loss_step": loss})
        return loss

    def training_inputs(self, batch) -> tuple[torch.Tensor, ...]:
        return tuple(batch)

    def objective(self, model, x, y) -> dict[str, torch.Tensor]:
        """Cross-entropy (with ``task.label_smoothing``) of the model's logits; the logits for the accuracy."""
        logits = model(x)
        return {"loss": F.cross_entropy(logits, y, label_smoothing=self.label_smoothing), "logits": logits.detach()}

    def epoch_metrics(self):
        return {"train/loss_epoch": (self.train_loss, False), "train/acc": (self.train_acc, True)}

    def validation_step(self, batch, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.val_acc.update(logits, y)
        self.val_loss.update(loss, len(y))
        self.log("val/loss", self.val_loss, prog_bar=True, on_epoch=True)
        self.log("val/acc", self.val_acc, prog_bar=True, on_epoch=True)

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(x).softmax(-1)
