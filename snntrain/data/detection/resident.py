"""A training set kept on the device (``data.on_device``): keys drawn by the sampler, each batch gathered and
augmented on the GPU."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..common import (
    SeededDataset,
    derive_seed,
)
from .images import _nan_pair, normalize_image
from .transforms import TrainTransform

RESIDENT_BYTES = 1 << 30


def check_on_device(value: object) -> bool | str:
    """``data.on_device``: ``auto``, true or false."""
    if value == "auto" or isinstance(value, bool):
        return value
    raise ValueError(f"data.on_device={value!r} must be auto, true or false (keep the training images on the "
                     "training device and augment them there)")


class ResidentKeys(SeededDataset):
    """The training sampler's side of a training set kept on the device (:class:`ResidentBatches`): a batch of
    keys ``(epoch, index)`` (:class:`~snntrain.data.common.EpochSampler`) becomes, in one call
    (``__getitems__``, in the training process), the images' indices and, with ``transform``, the parameters of
    their augmentations (:meth:`TrainTransform.draw`) from a generator seeded by ``(seed, epoch, indices)``: a
    batch is augmented the same way whenever it comes again (a resumed epoch)."""

    def __init__(self, size: int, height: int, width: int, transform: TrainTransform | None, seed: int) -> None:
        self.dataset, self.seed, self.numpy_random = None, int(seed), False
        self.size, self.height, self.width, self.transform = int(size), int(height), int(width), transform

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: int | tuple[int, int]) -> dict[str, torch.Tensor]:
        return self.__getitems__([key])

    def __getitems__(self, keys: Sequence[int | tuple[int, int]]) -> dict[str, torch.Tensor]:
        pairs = [k if isinstance(k, tuple) else (0, k) for k in keys]
        index = [int(i) for _, i in pairs]
        for i in index:
            if not 0 <= i < self.size:
                raise IndexError(f"index {i} is out of range for {self.size} training images")
        out = {"index": torch.tensor(index, dtype=torch.int64)}
        if self.transform is not None:
            rng = np.random.default_rng(derive_seed(self.seed, pairs[0][0], *index))
            out["params"] = torch.from_numpy(self.transform.draw(rng, len(index), self.height, self.width))
        return out


def keep_batch(batch: Any) -> Any:
    """``collate_fn`` of :class:`ResidentKeys`, whose ``__getitems__`` returns the batch already."""
    return batch


class ResidentBatches:
    """The training images kept on the device, and the loader's ``device_transform`` that turns a batch of
    :class:`ResidentKeys` into a training batch there: the images and their boxes gathered by index, augmented
    by :meth:`TrainTransform.apply_batch` (normalised only, without ``transform``), in
    :func:`collate_detection`'s format. No loader process, no image through the host: per step the host draws
    the augmentations' parameters and launches a few dozen small kernels. ``images`` uint8 ``[N, 3, H, W]``,
    ``boxes [N, M, 4]``, ``labels [N, M]``, ``counts [N]`` (CPU tensors, moved to a batch's device at its first
    batch)."""

    def __init__(self, images: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor, counts: torch.Tensor,
                 transform: TrainTransform | None) -> None:
        self.cpu = (images, boxes, labels, counts)
        self.transform = transform
        self._on: tuple[torch.device, tuple[torch.Tensor, ...]] | None = None
        self._seen: set[int] = set()  # batch sizes built once eagerly
        self._graphs: dict[int, tuple[Any, dict[str, torch.Tensor], Any]] = {}  # batch size: graph, inputs, outputs

    def tensors(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """The set's tensors on ``device`` (copied at the first batch there), and the constant fields of its
        batches' targets: ``orig_size``, ``scale`` and ``pad`` of one image (built once: a tensor made from host
        values at every step would wait for the device)."""
        if self._on is None or self._on[0] != device:
            # as the per-sample loader's targets: an augmented image's mapping is not tracked (NaN)
            scale, pad = (_nan_pair(), _nan_pair()) if self.transform is not None else (torch.ones(2), torch.zeros(2))
            fields = (torch.tensor(self.cpu[0].shape[-2:], dtype=torch.int64), scale, pad)
            self._on = (device, tuple(t.to(device) for t in (*self.cpu, *fields)))
        return self._on[1]

    def __call__(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The training batch of ``batch`` (:class:`ResidentKeys`'s indices and parameters, on the set's device).
        On a CUDA device the few dozen kernels that make it run as one CUDA graph per batch size (captured at the
        second batch of that size; the first runs eagerly): one launch instead of their host work, then a copy
        of the graph's outputs, which the next replay overwrites, so every batch owns its tensors."""
        if batch["index"].device.type != "cuda":
            return self.build(batch)
        n = int(batch["index"].shape[0])
        if n not in self._graphs:
            if n not in self._seen:
                self._seen.add(n)
                return self.build(batch)
            static = {k: v.clone() for k, v in batch.items()}
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                made = self.build(static)
            self._graphs[n] = (graph, static, made)
        graph, static, made = self._graphs[n]
        for key, value in static.items():
            value.copy_(batch[key], non_blocking=True)
        graph.replay()
        images, targets = made
        return images.clone(), {k: v.clone() for k, v in targets.items()}

    def build(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """:meth:`__call__`'s work, eagerly."""
        index = batch["index"]
        *data, orig, scale, pad = self.tensors(index.device)
        images, boxes, labels, counts = (t.index_select(0, index) for t in data)
        if self.transform is not None:
            images, boxes, labels, counts = self.transform.apply_batch(images, boxes, labels, counts,
                                                                       batch["params"])
        else:
            images = normalize_image(images)
        n = index.shape[0]
        return images, {"boxes": boxes, "labels": labels, "num_boxes": counts, "image_id": index,
                        "orig_size": orig.expand(n, 2), "scale": scale.expand(n, 2), "pad": pad.expand(n, 2)}
