"""What every detection datamodule shares: targets, the loaders, the training set on the device."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from ..common import (
    check_num_workers,
    eval_loader,
    loader_device,
    loader_workers,
    positive_int,
    train_loader,
)
from .collate import DetectionCollate
from .images import Target, _nan_pair
from .resident import RESIDENT_BYTES, ResidentBatches, ResidentKeys, keep_batch
from .settings import optional_max_boxes
from .transforms import TrainTransform


def make_target(
    boxes: torch.Tensor,
    image_id: int,
    orig_size: tuple[int, int],
    scale: torch.Tensor | None = None,
    pad: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
) -> Target:
    """Build a target dict in the documented format (labels default to all 0; scale/pad to NaN)."""
    boxes = boxes.to(torch.float32).reshape(-1, 4)
    return {
        "boxes": boxes,
        "labels": torch.zeros(boxes.shape[0], dtype=torch.int64) if labels is None else labels.to(torch.int64),
        "image_id": int(image_id),
        "orig_size": (int(orig_size[0]), int(orig_size[1])),
        "scale": _nan_pair() if scale is None else scale.to(torch.float32),
        "pad": _nan_pair() if pad is None else pad.to(torch.float32),
    }


class DetectionDataModule(L.LightningDataModule):
    """Loaders shared by the face-detection datamodules; subclasses fill ``train_set``/``val_set``/``test_set``.

    ``num_classes = 1`` (face), ``in_channels = 3`` (RGB). The training loader
    (:func:`~snntrain.data.common.train_loader`) shuffles by ``(seed, epoch)``, can resume mid-epoch, and pads boxes to ``max_boxes`` (dropping the smallest extras); evaluation loaders
    never drop a ground-truth box.
    """

    num_classes = 1
    in_channels = 3
    classes = ["face"]
    #: Evaluation batches of images with different sizes are padded to a multiple of this.
    size_divisor = 1
    #: ``data.on_device`` of a datamodule whose training set can live on the device (:meth:`resident_arrays`)
    on_device: bool | str = False

    def __init__(self, image_size: int, batch_size: int, num_workers: int | str, max_boxes: int | None,
                 seed: int) -> None:
        super().__init__()
        self.image_size = positive_int("image_size", image_size)
        self.batch_size = positive_int("batch_size", batch_size)
        self.num_workers = check_num_workers(num_workers)
        self.max_boxes = optional_max_boxes(max_boxes)
        self.seed = int(seed)
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self._resident: ResidentBatches | None = None  # the training set on the device, made at its first loader

    def resident_arrays(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The whole training set as uint8 images ``[N, 3, H, W]``, boxes ``[N, M, 4]``, labels ``[N, M]`` and
        counts ``[N]`` (CPU tensors), for a datamodule whose training set can live on the device; None (the
        default) where it cannot."""
        return None

    def resident_transform(self) -> TrainTransform | None:
        """The augmentation of a training set on the device (:meth:`TrainTransform.apply_batch`), or None."""
        return None

    def resident_bytes(self) -> int | None:
        """Bytes of the training images on the device (``on_device: auto`` keeps them there up to
        :data:`RESIDENT_BYTES`); None where the set cannot live there."""
        return None

    def keeps_on_device(self) -> bool:
        """Whether the training loader keeps the training set on the training device (``on_device``; ``auto``:
        on a CUDA device, for a set of at most :data:`RESIDENT_BYTES`)."""
        size = self.resident_bytes()
        if size is None or self.on_device is False:
            return False
        if self.on_device is True:
            return True
        device = loader_device(self)
        return device is not None and device.type == "cuda" and size <= RESIDENT_BYTES

    def _resident_loader(self) -> DataLoader:
        if self._resident is None:
            arrays = self.resident_arrays()
            self._resident = ResidentBatches(*arrays, transform=self.resident_transform())
        images = self._resident.cpu[0]
        keys = ResidentKeys(images.shape[0], images.shape[-2], images.shape[-1], self._resident.transform, self.seed)
        return train_loader(self, keys, self.batch_size, self.seed, num_workers=0, collate_fn=keep_batch,
                            device_transform=self._resident)

    def _loader(self, dataset: Dataset | None, train: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() must run before asking for a dataloader")
        if train and self.keeps_on_device():
            return self._resident_loader()
        workers = loader_workers(self)
        if train:
            return train_loader(self, dataset, self.batch_size, self.seed, num_workers=workers,
                                persistent_workers=workers > 0,
                                collate_fn=DetectionCollate(self.max_boxes, drop=True))
        return eval_loader(self, dataset, self.batch_size, num_workers=workers,
                           collate_fn=DetectionCollate(self.max_boxes, drop=False, size_divisor=self.size_divisor))

    def train_dataloader(self) -> DataLoader:
        """Shuffled (by ``seed``), augmented training batches with fixed ``max_boxes`` when set."""
        return self._loader(self.train_set, True)

    def val_dataloader(self) -> DataLoader:
        """Validation batches in dataset order; no ground-truth box is dropped."""
        return self._loader(self.val_set, False)

    def test_dataloader(self) -> DataLoader:
        """Test batches in dataset order; no ground-truth box is dropped."""
        return self._loader(self.test_set, False)
