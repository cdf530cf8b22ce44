"""Handwritten digits bundled with scikit-learn: the offline default dataset.

1797 grey 8x8 images of the digits 0-9 (the UCI "optical recognition of handwritten
digits" test set, shipped inside the scikit-learn wheel), upsampled to ``image_size``
and split deterministically (stratified by class) into train and validation sets.
"""

from __future__ import annotations

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from .common import (
    check_fraction,
    check_num_workers,
    eval_loader,
    loader_workers,
    positive_int,
    train_loader,
)


class DigitsDataModule(L.LightningDataModule):
    num_classes = 10
    in_channels = 1
    classes = [str(i) for i in range(10)]

    def __init__(
        self,
        image_size: int = 16,
        batch_size: int = 64,
        val_fraction: float = 0.2,
        num_workers: int | str = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.image_size = positive_int("image_size", image_size)
        self.batch_size = positive_int("batch_size", batch_size)
        self.val_fraction = check_fraction("val_fraction", val_fraction)
        self.num_workers = check_num_workers(num_workers)
        self.seed = int(seed)
        self.train_set: TensorDataset | None = None
        self.val_set: TensorDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        digits = load_digits()
        images = torch.from_numpy(digits.images.astype(np.float32) / 16.0).unsqueeze(1)  # [N, 1, 8, 8] in [0, 1]
        labels = torch.from_numpy(digits.target.astype(np.int64))
        if self.image_size != images.shape[-1]:
            images = F.interpolate(images, size=self.image_size, mode="bilinear", align_corners=False)
        images = (images - 0.5) / 0.5
        idx = np.arange(len(labels))
        train_idx, val_idx = train_test_split(
            idx, test_size=self.val_fraction, random_state=self.seed, stratify=digits.target
        )
        train_idx, val_idx = torch.from_numpy(np.sort(train_idx)), torch.from_numpy(np.sort(val_idx))
        self.train_set = TensorDataset(images[train_idx], labels[train_idx])
        self.val_set = TensorDataset(images[val_idx], labels[val_idx])

    def train_dataloader(self) -> DataLoader:
        return train_loader(self, self.train_set, self.batch_size, self.seed, num_workers=loader_workers(self))

    def val_dataloader(self) -> DataLoader:
        return eval_loader(self, self.val_set, self.batch_size, num_workers=loader_workers(self))
