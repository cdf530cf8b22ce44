"""The user's own images: one sub-folder per class, as torchvision's ImageFolder reads them.

Either ``root/train/<class>/*`` and ``root/val/<class>/*``, or a single ``root/<class>/*``
that is split deterministically by ``val_fraction``.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, Subset
from torchvision.transforms import v2

from .common import check_fraction, eval_sampler, open_image, positive_int, split_indices, train_loader

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def load_rgb(path: str):
    """ImageFolder's loader: the whole file decoded to RGB; an unreadable file raises an error naming it."""
    return open_image(path, "RGB")


class ImageFolderDataModule(L.LightningDataModule):
    def __init__(
        self,
        root: str | None = None,
        image_size: int = 64,
        in_channels: int = 3,
        batch_size: int = 64,
        val_fraction: float = 0.2,
        num_workers: int = 2,
        augment: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if root is None:
            raise ValueError("data=image_folder needs data.root=<folder> (one sub-folder of images per class)")
        self.root = Path(root).expanduser()
        if not self.root.is_dir():
            raise FileNotFoundError(f"data.root={str(self.root)!r} is not a folder")
        self.image_size = positive_int("image_size", image_size)
        if in_channels not in (1, 3):
            raise ValueError(f"in_channels={in_channels!r} must be 1 (grey) or 3 (RGB)")
        self.in_channels = in_channels
        self.batch_size = positive_int("batch_size", batch_size)
        self.val_fraction = check_fraction("val_fraction", val_fraction)
        self.num_workers = int(num_workers)
        self.augment = bool(augment)
        self.seed = int(seed)
        split = (self.root / "train").is_dir() and (self.root / "val").is_dir()
        self.train_root = self.root / "train" if split else self.root
        self.val_root = self.root / "val" if split else None
        self.classes = sorted(p.name for p in self.train_root.iterdir() if p.is_dir())
        if len(self.classes) < 2:
            raise ValueError(
                f"{self.train_root} has {len(self.classes)} class folder(s); an image-folder dataset needs at "
                "least two sub-folders, one per class"
            )
        self.train_set = self.val_set = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def _transform(self, train: bool) -> v2.Compose:
        ops = [v2.ToImage()]
        if self.in_channels == 1:
            ops.append(v2.Grayscale())
        if train and self.augment:
            ops += [v2.RandomResizedCrop(self.image_size, scale=(0.5, 1.0), antialias=True), v2.RandomHorizontalFlip()]
        else:
            ops += [v2.Resize(self.image_size, antialias=True), v2.CenterCrop(self.image_size)]
        mean, std = (IMAGENET_MEAN, IMAGENET_STD) if self.in_channels == 3 else ((0.5,), (0.5,))
        ops += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)]
        return v2.Compose(ops)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        from torchvision.datasets import ImageFolder

        def folder(root: Path, train: bool) -> ImageFolder:
            ds = ImageFolder(str(root), transform=self._transform(train), loader=load_rgb)
            if ds.classes != self.classes:
                raise ValueError(f"class folders of {root} ({ds.classes}) differ from {self.train_root} ({self.classes})")
            return ds

        if self.val_root is not None:
            self.train_set, self.val_set = folder(self.train_root, True), folder(self.val_root, False)
        else:
            full_train, full_eval = folder(self.train_root, True), folder(self.train_root, False)
            train_idx, val_idx = split_indices(len(full_train), self.val_fraction, self.seed)
            self.train_set, self.val_set = Subset(full_train, train_idx), Subset(full_eval, val_idx)

    def train_dataloader(self) -> DataLoader:
        return train_loader(self, self.train_set, self.batch_size, self.seed, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size, shuffle=False, num_workers=self.num_workers,
                          sampler=eval_sampler(self.val_set))
