"""Batching: images stacked, boxes and labels padded, every field a tensor."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..common import (
    positive_int,
)
from .images import Target, pad_images
from .settings import optional_max_boxes
from .transforms import box_area


def select_boxes(boxes: torch.Tensor, max_boxes: int) -> torch.Tensor:
    """Indices of the ``max_boxes`` largest boxes by area (ties: earlier first), in their original order."""
    if boxes.shape[0] <= max_boxes:
        return torch.arange(boxes.shape[0])
    order = torch.sort(box_area(boxes), descending=True, stable=True).indices[:max_boxes]
    return torch.sort(order).values


def collate_detection(
    batch: Sequence[tuple[torch.Tensor, Target]], max_boxes: int | None = None, drop: bool = True,
    size_divisor: int = 1,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Stack detection samples into tensors with padded boxes.

    Returns ``images`` float32 ``[B, 3, H, W]`` (images of different sizes are padded at the bottom and
    right by :func:`pad_images`, to a multiple of ``size_divisor``) and a dict:

    * ``"boxes"`` float32 ``[B, M, 4]`` (xyxy pixels), padding rows all 0 (so ``y2 <= 0`` marks padding);
    * ``"labels"`` int64 ``[B, M]``, padding -1;
    * ``"num_boxes"`` int64 ``[B]``: real boxes per image (they come first in each row);
    * ``"image_id"`` int64 ``[B]``; ``"orig_size"`` int64 ``[B, 2]`` (h, w);
      ``"scale"``, ``"pad"`` float32 ``[B, 2]`` (x, y; NaN for randomly augmented samples).

    ``M`` is the largest count in the batch when ``max_boxes`` is None. With ``max_boxes`` and ``drop``
    (training), ``M = max_boxes`` always (fixed shapes) and an image with more boxes keeps its
    ``max_boxes`` largest by area. With ``drop=False`` (evaluation) no box is ever dropped:
    ``M = max(max_boxes, largest count)``.
    """
    if len(batch) == 0:
        raise ValueError("collate_detection got an empty batch")
    max_boxes = optional_max_boxes(max_boxes)
    images = pad_images([img for img, _ in batch], size_divisor)
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    for _, target in batch:
        boxes = target["boxes"].to(torch.float32).reshape(-1, 4)
        labels = target["labels"].to(torch.int64).reshape(-1)
        if max_boxes is not None and drop and boxes.shape[0] > max_boxes:
            idx = select_boxes(boxes, max_boxes)
            boxes, labels = boxes[idx], labels[idx]
        kept.append((boxes, labels))
    largest = max(b.shape[0] for b, _ in kept)
    if max_boxes is None:
        m = largest
    else:
        m = max_boxes if drop else max(max_boxes, largest)
    out_boxes = torch.zeros(len(batch), m, 4, dtype=torch.float32)
    out_labels = torch.full((len(batch), m), -1, dtype=torch.int64)
    counts = torch.zeros(len(batch), dtype=torch.int64)
    for i, (boxes, labels) in enumerate(kept):
        n = boxes.shape[0]
        out_boxes[i, :n] = boxes
        out_labels[i, :n] = labels
        counts[i] = n

    def pairs(key: str) -> torch.Tensor:
        return torch.stack([torch.as_tensor(t[key], dtype=torch.float32).reshape(2) for _, t in batch])

    targets = {
        "boxes": out_boxes,
        "labels": out_labels,
        "num_boxes": counts,
        "image_id": torch.tensor([int(t["image_id"]) for _, t in batch], dtype=torch.int64),
        "orig_size": torch.tensor([tuple(int(v) for v in t["orig_size"]) for _, t in batch], dtype=torch.int64),
        "scale": pairs("scale"),
        "pad": pairs("pad"),
    }
    return images, targets


class DetectionCollate:
    """A picklable ``collate_fn`` (works with worker processes): :func:`collate_detection` with settings."""

    def __init__(self, max_boxes: int | None = None, drop: bool = True, size_divisor: int = 1) -> None:
        self.max_boxes = optional_max_boxes(max_boxes)
        self.drop = bool(drop)
        self.size_divisor = positive_int("size_divisor", size_divisor)

    def __call__(self, batch: Sequence[tuple[torch.Tensor, Target]]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return collate_detection(batch, self.max_boxes, self.drop, self.size_divisor)
