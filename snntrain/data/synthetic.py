"""Random images for measuring training speed: ``data=synthetic`` costs next to nothing to load.

A pool of ``pool_size`` images (normal noise) and labels drawn once from ``seed``; sample ``i`` of
a split is pool entry ``i mod pool_size`` (the validation split starts half-way through the pool).
The training loader yields whole batches, samples ``k*B .. k*B+B-1`` for batch ``k`` (batches in a
shuffled order), each a view of the pool: loading a batch copies nothing on the host (a
per-sample collate of 32 images of 224 x 224 took 22 ms, half of a GPU training step). Validation
reads samples one by one, sharded exactly as every dataset is. The labels are random: a model
learns nothing here, and the metrics only show that the pipeline runs. With ``frames=T`` every sample
is a sequence of T different images and batches are time-first ``[T, B, C, H, W]``, as the event-camera
loaders deliver them (the stem then runs T times).
"""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from .common import (
    DeviceLoader,
    check_num_workers,
    eval_loader,
    loader_device,
    loader_generator,
    loader_workers,
    positive_int,
)


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


class _BatchPool(Dataset):
    """Item ``k``: batch ``k`` of a split of ``length`` samples, samples ``k*B ..`` as views of the pool
    (which is extended by its first ``B`` entries so that a batch never wraps around)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, length: int, batch_size: int) -> None:
        n = len(images)
        wrap = torch.arange(n + batch_size) % n
        self.images, self.labels = images[wrap], labels[wrap]
        self.pool, self.length, self.batch_size = n, length, batch_size

    def __len__(self) -> int:
        return -(-self.length // self.batch_size)

    def __getitem__(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= k < len(self):
            raise IndexError(f"batch {k} out of range for {len(self)} batches")
        start = k * self.batch_size
        j, n = start % self.pool, min(self.batch_size, self.length - start)
        return self.images[j:j + n], self.labels[j:j + n]


def _time_first(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = batch
    return images.transpose(0, 1).contiguous(), labels


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
        num_workers: int | str = 0,
        seed: int = 0,
        frames: int | None = None,
    ) -> None:
        super().__init__()
        self.num_train = positive_int("num_train", num_train)
        self.num_val = positive_int("num_val", num_val)
        self.image_size = positive_int("image_size", image_size)
        self.in_channels = positive_int("in_channels", in_channels)
        self.num_classes = positive_int("num_classes", num_classes)
        self.pool_size = positive_int("pool_size", pool_size)
        self.batch_size = positive_int("batch_size", batch_size)
        self.num_workers = check_num_workers(num_workers)
        self.seed = int(seed)
        self.frames = None if frames is None else positive_int("frames", frames)
        self.classes = [str(i) for i in range(self.num_classes)]
        self.train_set: _Pool | None = None
        self.train_batches: _BatchPool | None = None
        self.val_set: _Pool | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        g = torch.Generator().manual_seed(self.seed)
        sample = (self.in_channels, self.image_size, self.image_size)
        if self.frames is not None:  # event-like input: every sample a sequence [T, C, H, W]
            sample = (self.frames, *sample)
        images = torch.randn(self.pool_size, *sample, generator=g)
        labels = torch.randint(0, self.num_classes, (self.pool_size,), generator=g)
        self.train_set = _Pool(images, labels, self.num_train, 0)
        self.train_batches = _BatchPool(images, labels, self.num_train, self.batch_size)
        self.val_set = _Pool(images, labels, self.num_val, self.pool_size // 2)

    def train_dataloader(self) -> DataLoader:
        device = loader_device(self)
        if device is not None and device.type == "cuda" and not self.train_batches.images.is_pinned():
            # batches are views of the pool: pinned once, they go to the GPU asynchronously, copied nowhere else
            self.train_batches.images = self.train_batches.images.pin_memory()
            self.train_batches.labels = self.train_batches.labels.pin_memory()
        # batch_size=None: the items are whole batches (with DDP, each process gets its share of them)
        # sequences: a batch [B, T, C, H, W] of the pool turned time-first where it lands (on the GPU: the host
        # copies nothing)
        time_first = _time_first if self.frames is not None else None
        return DeviceLoader(self.train_batches, batch_size=None, shuffle=True,
                            num_workers=loader_workers(self),
                            generator=loader_generator(self.seed), device=device, pin_memory=False,
                            device_transform=time_first)

    def val_dataloader(self) -> DataLoader:
        from .events import collate_time_first

        return eval_loader(self, self.val_set, self.batch_size, num_workers=loader_workers(self),
                           collate_fn=collate_time_first if self.frames is not None else None)
