"""Random images for measuring training speed: ``data=synthetic`` costs next to nothing to load.

A pool of ``pool_size`` images (normal noise) and labels drawn once from ``seed``; sample ``i`` of
a split is pool entry ``i mod pool_size`` (the validation split starts half-way through the pool).
Items are views of the pool, so loading a batch is one copy into the batch tensor. The labels are
random: a model learns nothing here, and the metrics only show that the pipeline runs.
"""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from .common import eval_sampler, loader_generator, positive_int


class _Pool(Dataset):
    def __init__(self, images: torch.Tensor, labels: torch.Tensor, length: int, offset: int) -> None:
        self.images, self.labels, self.length, self.offset = images, labels, length, offset

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.length:
            raise IndexError(f"index {i} out of range for {self.length} samples")
        j = (i + self.offset) % len(self.images)
        return self.images[j], self.labels[j]


class SyntheticDataModule(L.LightningDataModule):
    def __init__(
        self,
        num_train: int = 2048,
        num_val: int = 256,
        image_size: int = 224,
        in_channels: int = 3,
        num_classes: int = 10,
        pool_size: int = 64,
        batch_size: int = 32,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.num_train = positive_int("num_train", num_train)
        self.num_val = positive_int("num_val", num_val)
        self.image_size = positive_int("image_size", image_size)
        self.in_channels = positive_int("in_channels", in_channels)
        self.num_classes = positive_int("num_classes", num_classes)
        self.pool_size = positive_int("pool_size", pool_size)
        self.batch_size = positive_int("batch_size", batch_size)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers={num_workers!r} must be an integer >= 0")
        self.num_workers = num_workers
        self.seed = int(seed)
        self.classes = [str(i) for i in range(self.num_classes)]
        self.train_set: _Pool | None = None
        self.val_set: _Pool | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        g = torch.Generator().manual_seed(self.seed)
        images = torch.randn(self.pool_size, self.in_channels, self.image_size, self.image_size, generator=g)
        labels = torch.randint(0, self.num_classes, (self.pool_size,), generator=g)
        self.train_set = _Pool(images, labels, self.num_train, 0)
        self.val_set = _Pool(images, labels, self.num_val, self.pool_size // 2)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers,
                          generator=loader_generator(self.seed))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size, shuffle=False, num_workers=self.num_workers,
                          sampler=eval_sampler(self.val_set))
