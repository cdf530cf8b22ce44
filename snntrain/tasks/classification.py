"""Image classification with a spiking network: cross-entropy on T-averaged logits."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy

from .base import SpikingTask


class ClassificationTask(SpikingTask):
    """Trains ``config["model"]`` on (image, label) batches.

    Logs ``train/loss``, ``train/acc``, ``val/loss``, ``val/acc`` (top-1) and, through the
    scheduler, ``train/lr``.
    """

    def __init__(self, config: dict[str, Any], backend: str = "auto") -> None:
        super().__init__(config, backend)
        num_classes = int(config["model"]["num_classes"])
        self.label_smoothing = float(config["task"].get("label_smoothing", 0.0))
        # no input validation in the training step: it synchronises with the host every step
        self.train_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")

    def training_step(self, batch, batch_idx: int) -> torch.Tensor | None:
        if self.partial_batch(batch):
            return None  # skipped: static shapes under compile
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y, label_smoothing=self.label_smoothing)
        self.train_acc(logits.detach(), y)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=len(y))
        self.log("train/acc", self.train_acc, prog_bar=True, on_step=False, on_epoch=True, batch_size=len(y))
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.val_acc(logits, y)
        self.log("val/loss", loss, prog_bar=True, on_epoch=True, batch_size=len(y))
        self.log("val/acc", self.val_acc, prog_bar=True, on_epoch=True, batch_size=len(y))

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(x).softmax(-1)
