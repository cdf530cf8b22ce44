"""CIFAR-10 through torchvision, downloaded into ``root`` where the network allows."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from ..errors import UnavailableError
from .common import (
    check_fraction,
    check_num_workers,
    eval_loader,
    loader_workers,
    positive_int,
    train_loader,
)

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


class CIFAR10DataModule(L.LightningDataModule):
    num_classes = 10
    in_channels = 3
    classes = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    #: torchvision's dataset class, the archive and folder it reads, the per-channel statistics, the name in messages
    dataset_class, url, folder, mean, std, title = "CIFAR10", URL, "cifar-10-batches-py", MEAN, STD, "CIFAR-10"
    files = "data_batch_1 ... test_batch"

    def __init__(
        self,
        root: str = "data/cifar10",
        image_size: int = 32,
        batch_size: int = 128,
        num_workers: int | str = 4,
        download: bool = True,
        augment: bool = True,
        seed: int = 0,
        val_fraction: float | None = None,
    ) -> None:
        super().__init__()
        self.root = Path(root).expanduser()
        self.image_size = positive_int("image_size", image_size)
        self.batch_size = positive_int("batch_size", batch_size)
        self.num_workers = check_num_workers(num_workers)
        self.download = bool(download)
        self.augment = bool(augment)
        self.seed = int(seed)
        # CIFAR-10 has an official test split; it is the validation set unless val_fraction carves one from train.
        self.val_fraction = None if val_fraction is None else check_fraction("val_fraction", val_fraction)
        self.train_set = self.val_set = None

    def _dataset(self, train: bool, transform):
        import torchvision.datasets

        dataset = getattr(torchvision.datasets, self.dataset_class)
        try:
            return dataset(str(self.root), train=train, transform=transform, download=False)
        except RuntimeError:
            if not self.download:
                raise UnavailableError(self._missing("download=false")) from None
        try:
            return dataset(str(self.root), train=train, transform=transform, download=True)
        except Exception as err:  # no network, proxy refusal, partial file...
            raise UnavailableError(self._missing(f"download failed: {err}")) from err

    def _missing(self, why: str) -> str:
        return (
            f"{self.title} is not in {self.root} ({why}). Download {self.url} and extract it there, so that "
            f"{self.root / self.folder} holds {self.files}; or point data.root at a folder that has it."
        )

    def prepare_data(self) -> None:
        self._dataset(True, None)
        self._dataset(False, None)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        resize = [v2.Resize(self.image_size, antialias=True)] if self.image_size != 32 else []
        norm = [v2.ToImage(), *resize, v2.ToDtype(torch.float32, scale=True), v2.Normalize(self.mean, self.std)]
        crop = [v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()] if self.augment else []
        train_tf = v2.Compose(crop + norm)
        eval_tf = v2.Compose(norm)
        if self.val_fraction is None:
            self.train_set = self._dataset(True, train_tf)
            self.val_set = self._dataset(False, eval_tf)
        else:
            from torch.utils.data import Subset

            from .common import split_indices

            train_idx, val_idx = split_indices(50000, self.val_fraction, self.seed)
            self.train_set = Subset(self._dataset(True, train_tf), train_idx)
            self.val_set = Subset(self._dataset(True, eval_tf), val_idx)

    def train_dataloader(self) -> DataLoader:
        workers = loader_workers(self)
        return train_loader(self, self.train_set, self.batch_size, self.seed, drop_last=True,
                            num_workers=workers, persistent_workers=workers > 0)

    def val_dataloader(self) -> DataLoader:
        return eval_loader(self, self.val_set, self.batch_size, num_workers=loader_workers(self))
