"""Pieces shared by the face-detection datasets: sample format, box-aware transforms, batching.

Sample format
-------------
Every detection dataset returns ``(image, target)``:

* ``image``: float32 tensor ``[3, S, S]``, RGB, normalised as ``(pixel / 255 - 0.5) / 0.5``, so values lie
  in ``[-1, 1]`` with mid grey at about 0 (see :func:`normalize_image`). Letterbox padding is exactly 0.
* ``target``: a dict with

  - ``"boxes"``: float32 ``[n, 4]``, ``(x1, y1, x2, y2)`` in pixels of the returned image, ``x2``/``y2``
    exclusive (a box covering pixel columns 3..7 is ``x1=3, x2=8``);
  - ``"labels"``: int64 ``[n]``, all 0 (the single class "face");
  - ``"image_id"``: int, the index of the image in its dataset;
  - ``"orig_size"``: ``(h, w)`` of the image before resizing;
  - ``"scale"``, ``"pad"``: float32 ``[2]`` each, ``(x, y)``: a point of the original image maps to
    ``original * scale + pad`` in the returned one (:func:`boxes_to_original` inverts it). For randomly
    augmented training samples the mapping is not tracked and both are NaN.

Batches
-------
:func:`collate_detection` stacks images to ``[B, 3, S, S]`` and pads the boxes to ``[B, M, 4]`` (zeros,
so a padding row has ``y2 = 0``), the labels to ``[B, M]`` (-1) and adds ``"num_boxes"`` ``[B]``; every
field is a tensor, so a loss never needs to read anything back to the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from .common import (
    SeededDataset,
    check_num_workers,
    derive_seed,
    eval_loader,
    loader_device,
    loader_workers,
    open_image,
    positive_int,
    train_loader,
)

#: Per-channel mean and standard deviation of the normalisation, on the [0, 1] pixel scale.
IMAGE_MEAN = 0.5
IMAGE_STD = 0.5
#: Fill value (uint8) for canvas grown by a zoom-out: mid grey, about 0 after normalisation.
FILL_UINT8 = 128

Target = dict[str, Any]


# --------------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------------


def int_range(name: str, value: object, minimum: int = 0) -> tuple[int, int]:
    """Check that ``value`` is a pair ``[lo, hi]`` of integers with ``minimum <= lo <= hi``."""
    pair = _pair(name, value)
    if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in pair):
        raise ValueError(f"{name}={value!r} must be two integers [lo, hi]")
    lo, hi = int(pair[0]), int(pair[1])
    if not minimum <= lo <= hi:
        raise ValueError(f"{name}={value!r} must satisfy {minimum} <= lo <= hi")
    return lo, hi


def float_range(name: str, value: object, low: float, high: float) -> tuple[float, float]:
    """Check that ``value`` is a pair ``[lo, hi]`` of numbers with ``low <= lo <= hi <= high``."""
    pair = _pair(name, value)
    if any(isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) for v in pair):
        raise ValueError(f"{name}={value!r} must be two numbers [lo, hi]")
    lo, hi = float(pair[0]), float(pair[1])
    if not low <= lo <= hi <= high:
        raise ValueError(f"{name}={value!r} must satisfy {low} <= lo <= hi <= {high}")
    return lo, hi


def _pair(name: str, value: object) -> tuple[Any, Any]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{name}={value!r} must be a pair [lo, hi]")
    items = tuple(value)  # type: ignore[arg-type]
    if len(items) != 2:
        raise ValueError(f"{name}={value!r} must be a pair [lo, hi], got {len(items)} values")
    return items[0], items[1]


def _number(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= float(value) <= high:
        raise ValueError(f"{name}={value!r} must be a number in [{low}, {high}]")
    return float(value)


def optional_max_boxes(value: object) -> int | None:
    """Check a ``max_boxes`` setting: ``None`` (pad to the batch's largest count) or a positive integer."""
    return None if value is None else positive_int("max_boxes", value)


# --------------------------------------------------------------------------------------------------
# Normalisation, letterbox and mapping back
# --------------------------------------------------------------------------------------------------


def normalize_image(image: torch.Tensor) -> torch.Tensor:
    """uint8 ``[3, H, W]`` (0..255) or float in [0, 1] -> float32 ``(x - 0.5) / 0.5`` in [-1, 1]."""
    if image.dtype == torch.uint8:
        image = image.to(torch.float32) / 255.0
    return (image.to(torch.float32) - IMAGE_MEAN) / IMAGE_STD


def denormalize_image(image: torch.Tensor) -> torch.Tensor:
    """Invert :func:`normalize_image`: float in [-1, 1] -> float in [0, 1] (clamped), e.g. for display."""
    return (image * IMAGE_STD + IMAGE_MEAN).clamp(0.0, 1.0)


def _nan_pair() -> torch.Tensor:
    return torch.full((2,), float("nan"), dtype=torch.float32)


def letterbox(
    image: torch.Tensor,
    boxes: torch.Tensor,
    image_size: int,
    orig_size: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Resize keeping the aspect ratio so the longer side is ``image_size``, then pad to a centred square.

    ``image`` is uint8 ``[3, h, w]``; ``boxes`` float ``[n, 4]`` xyxy in pixels of the *original* image of
    size ``orig_size = (H, W)`` (default: the image's own size; a smaller ``image`` is a reduced decode of
    that original). Returns the normalised float32 image ``[3, S, S]`` (padding exactly 0), the boxes in
    its pixels, clipped to the resized content, and ``scale``, ``pad`` (float32 ``[2]``, ``(x, y)``) with
    ``returned = original * scale + pad``. Boxes are not dropped here, even when clipping empties them.
    """
    size = positive_int("image_size", image_size)
    height, width = (int(image.shape[-2]), int(image.shape[-1])) if orig_size is None else map(int, orig_size)
    ratio = size / max(height, width)
    new_h, new_w = max(1, round(height * ratio)), max(1, round(width * ratio))
    resized = TF.resize(image, [new_h, new_w], antialias=True)
    pad_x, pad_y = (size - new_w) // 2, (size - new_h) // 2
    out = F.pad(normalize_image(resized), (pad_x, size - new_w - pad_x, pad_y, size - new_h - pad_y), value=0.0)
    scale = torch.tensor([new_w / width, new_h / height], dtype=torch.float32)
    pad = torch.tensor([pad_x, pad_y], dtype=torch.float32)
    boxes = boxes.to(torch.float32).reshape(-1, 4)
    mapped = boxes * scale.repeat(2) + pad.repeat(2)
    mapped[:, 0::2] = mapped[:, 0::2].clamp(pad_x, pad_x + new_w)
    mapped[:, 1::2] = mapped[:, 1::2].clamp(pad_y, pad_y + new_h)
    return out, mapped, scale, pad


def boxes_to_original(
    boxes: torch.Tensor,
    scale: torch.Tensor,
    pad: torch.Tensor,
    orig_size: tuple[int, int] | torch.Tensor | None = None,
) -> torch.Tensor:
    """Map xyxy boxes ``[..., 4]`` from a returned image back to its original pixels (inverse letterbox).

    ``scale`` and ``pad`` are the target's ``(x, y)`` pairs (``[2]``, or ``[B, 2]`` for boxes ``[B, M, 4]``).
    With ``orig_size = (h, w)`` the result is clipped to the original image. Works on any device and
    never synchronises with the host.
    """
    s = torch.cat([scale, scale], dim=-1).to(device=boxes.device, dtype=boxes.dtype)
    p = torch.cat([pad, pad], dim=-1).to(device=boxes.device, dtype=boxes.dtype)
    if boxes.dim() == 3 and s.dim() == 2:
        s, p = s[:, None, :], p[:, None, :]
    out = (boxes - p) / s
    if orig_size is not None:
        hw = torch.as_tensor(orig_size, dtype=boxes.dtype, device=boxes.device)
        if boxes.dim() == 3 and hw.dim() == 2:
            hw = hw[:, None, :]
        limit = torch.stack([hw[..., 1], hw[..., 0], hw[..., 1], hw[..., 0]], dim=-1)
        out = torch.minimum(out.clamp_min(0), limit)
    return out


def read_rgb(path: str | Path, min_side: int | None = None) -> tuple[torch.Tensor, tuple[int, int]]:
    """Read an image file as a uint8 RGB tensor ``[3, h, w]`` plus its full size ``(H, W)``.

    With ``min_side``, a JPEG may be decoded at a power-of-two reduction that keeps both sides at least
    ``min_side`` (much faster for large photographs); boxes stay in the full-size pixels returned second.
    A truncated, corrupt or non-image file raises :class:`~snntrain.data.common.BadDataError` naming it.
    """
    image, full = open_image(path, "RGB", None if min_side is None else (min_side, min_side), with_size=True)
    arr = np.asarray(image)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous(), full


def fit_long_side(
    image: torch.Tensor, max_side: int | None, orig_size: tuple[int, int] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Evaluation geometry of full-resolution detectors: keep the aspect ratio, shrink only when the
    longer side of the original exceeds ``max_side`` (``None``: the original resolution), no padding.

    ``image`` is uint8 ``[3, h, w]``, possibly a reduced decode of an original of ``orig_size = (H, W)``.
    Returns the normalised float32 image, ``scale`` and ``pad`` (float32 ``[2]``, ``(x, y)``; pad is 0)
    with ``returned = original * scale``. Batches of such images are padded by :func:`collate_detection`.
    """
    height, width = (int(image.shape[-2]), int(image.shape[-1])) if orig_size is None else map(int, orig_size)
    ratio = 1.0 if max_side is None else min(1.0, positive_int("max_side", max_side) / max(height, width))
    new_h, new_w = max(1, round(height * ratio)), max(1, round(width * ratio))
    if (new_h, new_w) != tuple(image.shape[-2:]):
        image = TF.resize(image, [new_h, new_w], antialias=True)
    scale = torch.tensor([new_w / width, new_h / height], dtype=torch.float32)
    return normalize_image(image), scale, torch.zeros(2, dtype=torch.float32)


def load_image_for_detection(
    path: str | Path, image_size: int | None, max_side: int | None = None
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Load any image file the way a detector's evaluation samples are made, for running it.

    With ``image_size`` (detectors trained and evaluated on fixed squares) the image is letterboxed to
    ``[3, S, S]``; with ``image_size=None`` it keeps its aspect ratio and its longer side is shrunk to at
    most ``max_side`` (``None``: original resolution), as :func:`fit_long_side` does. Returns the
    normalised float32 image and ``meta`` with ``"orig_size"`` ``(h, w)``, ``"scale"`` and ``"pad"``
    (float32 ``[2]``, ``(x, y)``); pass the detector's boxes with them to :func:`boxes_to_original` to
    get boxes in the file's pixels.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"image {str(path)!r} does not exist")
    if image_size is None:
        image, orig = read_rgb(path, min_side=None if max_side is None else positive_int("max_side", max_side))
        out, scale, pad = fit_long_side(image, max_side, orig_size=orig)
        return out, {"orig_size": orig, "scale": scale, "pad": pad}
    size = positive_int("image_size", image_size)
    image, orig = read_rgb(path, min_side=size)
    out, _, scale, pad = letterbox(image, torch.zeros(0, 4), size, orig_size=orig)
    return out, {"orig_size": orig, "scale": scale, "pad": pad}


def pad_images(images: Sequence[torch.Tensor], size_divisor: int = 1) -> torch.Tensor:
    """Stack ``[3, h_i, w_i]`` images into ``[B, 3, H, W]``: each at the top left, padded with 0 (mid grey
    after normalisation) on the right and bottom; ``H``, ``W`` are the largest sides rounded up to a
    multiple of ``size_divisor``. Points keep their coordinates, so targets need no change."""
    div = positive_int("size_divisor", size_divisor)
    h = -(-max(int(im.shape[-2]) for im in images) // div) * div
    w = -(-max(int(im.shape[-1]) for im in images) // div) * div
    if all(tuple(im.shape[-2:]) == (h, w) for im in images):
        return torch.stack(list(images))
    out = images[0].new_zeros((len(images), images[0].shape[0], h, w))
    for i, im in enumerate(images):
        out[i, :, : im.shape[-2], : im.shape[-1]] = im
    return out


# --------------------------------------------------------------------------------------------------
# Transforms
# --------------------------------------------------------------------------------------------------


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    """Area of xyxy boxes ``[..., 4]``; boxes with x2 < x1 or y2 < y1 count as 0."""
    return (boxes[..., 2] - boxes[..., 0]).clamp_min(0) * (boxes[..., 3] - boxes[..., 1]).clamp_min(0)


class TrainTransform:
    """Random box-aware augmentation for training, built on ``torchvision.transforms.v2``.

    Steps, in order: horizontal flip (probability ``hflip``); zoom out (with probability 0.5 the image is
    placed at a random spot of a mid-grey canvas up to ``zoom_out`` times larger per side; 1 disables it);
    a random crop covering ``crop_scale`` of the area with aspect ratio in ``crop_ratio``, resized to
    ``image_size`` x ``image_size`` (``RandomResizedCrop``). The boxes travel as
    ``tv_tensors.BoundingBoxes`` (XYXY) without clamping, so their full extent is known after the crop;
    a box is then clipped to the image and dropped when less than ``min_visibility`` of its area remains
    visible, and finally ``SanitizeBoundingBoxes`` drops boxes smaller than ``min_box_size`` pixels.
    Randomness comes from torch's global generator; the training loader seeds it per sample from
    ``(seed, epoch, index)`` (:class:`~snntrain.data.common.SeededDataset`).

    Call with a uint8 image ``[3, H, W]``, boxes float ``[n, 4]`` (xyxy, its pixels) and labels int64
    ``[n]``; returns the normalised float32 image ``[3, S, S]``, boxes float32 ``[n', 4]``, labels ``[n']``.
    """

    def __init__(
        self,
        image_size: int,
        hflip: float = 0.5,
        zoom_out: float = 1.5,
        crop_scale: Sequence[float] = (0.5, 1.0),
        crop_ratio: Sequence[float] = (0.75, 4 / 3),
        min_visibility: float = 0.5,
        min_box_size: float = 2.0,
    ) -> None:
        self.image_size = positive_int("image_size", image_size)
        self.hflip = _number("hflip", hflip, 0.0, 1.0)
        self.zoom_out = _number("zoom_out", zoom_out, 1.0, 8.0)
        self.crop_scale = float_range("crop_scale", crop_scale, 1e-3, 1.0)
        if self.crop_scale[0] <= 0:
            raise ValueError(f"crop_scale={crop_scale!r} must be above 0")
        self.crop_ratio = float_range("crop_ratio", crop_ratio, 0.1, 10.0)
        self.min_visibility = _number("min_visibility", min_visibility, 0.0, 1.0)
        self.min_box_size = _number("min_box_size", min_box_size, 1.0, float(self.image_size))
        ops: list[v2.Transform] = []
        if self.hflip > 0:
            ops.append(v2.RandomHorizontalFlip(p=self.hflip))
        if self.zoom_out > 1.0:
            ops.append(v2.RandomZoomOut(fill=FILL_UINT8, side_range=(1.0, self.zoom_out), p=0.5))
        ops.append(v2.RandomResizedCrop(self.image_size, scale=self.crop_scale, ratio=self.crop_ratio, antialias=True))
        self.geometric = v2.Compose(ops)
        self.sanitize = v2.SanitizeBoundingBoxes(min_size=self.min_box_size, min_area=1.0)

    def __call__(
        self, image: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        canvas = (int(image.shape[-2]), int(image.shape[-1]))
        target = {
            "boxes": tv_tensors.BoundingBoxes(
                boxes.to(torch.float32).reshape(-1, 4), format="XYXY", canvas_size=canvas, clamping_mode=None
            ),
            "labels": labels,
        }
        img, target = self.geometric(tv_tensors.Image(image), target)
        full = target["boxes"].as_subclass(torch.Tensor)
        size = float(self.image_size)
        clipped = full.clone()
        clipped[:, 0::2] = clipped[:, 0::2].clamp(0.0, size)
        clipped[:, 1::2] = clipped[:, 1::2].clamp(0.0, size)
        visible = box_area(clipped) >= self.min_visibility * box_area(full)
        visible &= box_area(full) > 0
        target = {
            "boxes": tv_tensors.BoundingBoxes(
                clipped[visible], format="XYXY", canvas_size=(self.image_size, self.image_size), clamping_mode="hard"
            ),
            "labels": target["labels"][visible],
        }
        img, target = self.sanitize(img, target)
        return (
            normalize_image(img.as_subclass(torch.Tensor)),
            target["boxes"].as_subclass(torch.Tensor).to(torch.float32),
            target["labels"],
        )

    # ------------------------------------------------------------------ the same recipe for a batch on the device

    def draw(self, rng: np.random.Generator, n: int, height: int, width: int) -> np.ndarray:
        """Parameters of ``n`` random augmentations of ``height x width`` images, drawn as ``__call__`` draws
        them (flip, then zoom out onto a canvas ``r`` times larger, ``r`` uniform in ``[1, zoom_out]``, half the
        time, then ``RandomResizedCrop``'s ten tries and its centre-crop fallback): float64 ``[n, 5]``, each row
        ``flip (0 or 1), x0, y0, x1, y1``, the crop's box in the pixels of the (flipped) image, where the
        zoom-out's grey canvas lies beyond the image's edges. :meth:`apply_batch` applies them."""
        u = rng.random
        flip = (u(n) < self.hflip).astype(np.float64)
        ratio = np.ones(n)
        if self.zoom_out > 1.0:
            zoom = u(n) < 0.5
            ratio = np.where(zoom, 1.0 + u(n) * (self.zoom_out - 1.0), 1.0)
        cw, ch = np.floor(width * ratio), np.floor(height * ratio)
        left, top = np.floor((cw - width) * u(n)), np.floor((ch - height) * u(n))
        tries = 10
        area = (cw * ch)[:, None] * (self.crop_scale[0] + u((n, tries)) * (self.crop_scale[1] - self.crop_scale[0]))
        log_r = np.log(self.crop_ratio)
        aspect = np.exp(log_r[0] + u((n, tries)) * (log_r[1] - log_r[0]))
        w, h = np.rint(np.sqrt(area * aspect)), np.rint(np.sqrt(area / aspect))
        ok = (w > 0) & (w <= cw[:, None]) & (h > 0) & (h <= ch[:, None])
        i = np.floor(u((n, tries)) * (ch[:, None] - h + 1))
        j = np.floor(u((n, tries)) * (cw[:, None] - w + 1))
        first = ok.argmax(1)
        rows = np.arange(n)
        w, h, i, j = w[rows, first], h[rows, first], i[rows, first], j[rows, first]
        # no try fitted: the centre crop of the largest box with an aspect ratio in range (torchvision's fallback)
        in_ratio = cw / ch
        fw = np.where(in_ratio < self.crop_ratio[0], cw, np.where(in_ratio > self.crop_ratio[1],
                                                                   np.rint(ch * self.crop_ratio[1]), cw))
        fh = np.where(in_ratio < self.crop_ratio[0], np.rint(cw / self.crop_ratio[0]), ch)
        found = ok.any(1)
        w, h = np.where(found, w, fw), np.where(found, h, fh)
        i, j = np.where(found, i, np.floor((ch - h) / 2)), np.where(found, j, np.floor((cw - w) / 2))
        x0, y0 = j - left, i - top
        return np.stack([flip, x0, y0, x0 + w, y0 + h], 1)

    def apply_batch(self, images: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor, counts: torch.Tensor,
                    params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`draw`'s augmentations applied to a batch, on whatever device it is on, with tensor operations
        only (nothing read back to the host): uint8 ``images [B, 3, H, W]``, boxes ``[B, M, 4]`` (xyxy, their
        pixels; the first ``counts[b]`` rows of image ``b`` real), labels ``[B, M]`` and ``params [B, 5]``.
        The crop is resampled with ``roi_align`` (bilinear, averaging ``ceil(crop / image_size)`` samples per
        pixel and axis where it shrinks, the zoom-out's grey beyond the image); a box is clipped and kept as
        ``__call__`` keeps it (at least ``min_visibility`` of its area visible, sides of at least
        ``min_box_size``). Returns the normalised float32 images ``[B, 3, S, S]`` and the kept boxes, labels and
        counts in :func:`collate_detection`'s padded form (kept boxes first, in their order; padding rows 0
        and label -1)."""
        from torchvision.ops import roi_align

        n, _, height, width = images.shape
        size = self.image_size
        params = params.to(device=images.device, dtype=torch.float32)
        flip, crop = params[:, 0] > 0.5, params[:, 1:]
        # 0 outside the image is the fill after this shift; one pixel of it around the image makes the bilinear
        # samples just outside an edge blend towards the fill, as the grey canvas of the zoom-out does
        x = images.to(torch.float32) - FILL_UINT8
        x = F.pad(torch.where(flip[:, None, None, None], x.flip(-1), x), (1, 1, 1, 1))
        rois = torch.cat([torch.arange(n, device=x.device, dtype=x.dtype)[:, None], crop + 1.0], 1)
        out = roi_align(x, rois, (size, size), spatial_scale=1.0, sampling_ratio=-1, aligned=True)
        out = ((out + FILL_UINT8) / 255.0 - IMAGE_MEAN) / IMAGE_STD
        # boxes: flipped with the pixels, then into the crop's frame, scaled to size x size
        boxes = boxes.to(device=images.device, dtype=torch.float32)
        mirrored = torch.stack([width - boxes[..., 2], boxes[..., 1], width - boxes[..., 0], boxes[..., 3]], -1)
        boxes = torch.where(flip[:, None, None], mirrored, boxes)
        origin = crop[:, None, :2].repeat(1, 1, 2)
        scale = (size / (crop[:, 2:] - crop[:, :2]))[:, None].repeat(1, 1, 2)
        full = (boxes - origin) * scale
        clipped = full.clamp(0.0, float(size))
        side = clipped[..., 2:] - clipped[..., :2]
        rows = boxes.shape[1]
        real = torch.arange(rows, device=boxes.device) < counts.to(boxes.device)[:, None]
        keep = (real & (box_area(full) > 0) & (box_area(clipped) >= self.min_visibility * box_area(full))
                & (side >= self.min_box_size).all(-1) & (box_area(clipped) >= 1.0))
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)  # kept rows first, in their order
        kept = keep.sum(1)
        first = torch.arange(rows, device=boxes.device) < kept[:, None]
        boxes = torch.where(first[..., None], clipped.gather(1, order[..., None].expand(-1, -1, 4)), 0.0)
        labels = torch.where(first, labels.to(boxes.device).gather(1, order), -1)
        return out, boxes, labels, kept


class SquareCropTransform:
    """The face-detection training recipe of RetinaFace and SCRFD: a random square crop, resized.

    Steps, in order: a square of side ``scale * min(H, W)``, ``scale`` uniform in ``crop_scale``
    (values above 1 reach past the image, which is then surrounded by mid grey), at a uniformly random
    position (the square stays inside the image where it fits); the faces whose centre lies inside the
    square are kept, clipped to it. Up to ``max_tries`` squares are drawn until one holds a face; if none
    does, the whole image placed in a square (top left) is used, which keeps every face. The square is
    resized to ``image_size`` (one scale factor for both axes, so the boxes move exactly with the
    pixels); then a horizontal flip (probability ``hflip``) and, with ``photometric``, brightness /
    contrast / saturation / hue jitter, each applied with probability 0.5 (:meth:`colour_jitter`). Boxes smaller than
    ``min_box_size`` pixels on either side after resizing are dropped. Randomness comes from torch's
    global generator (seeded per DataLoader worker).

    Call with a uint8 image ``[3, H, W]``, boxes float ``[n, 4]`` (xyxy, its pixels) and labels int64
    ``[n]``; returns the normalised float32 image ``[3, S, S]``, boxes float32 ``[n', 4]``, labels ``[n']``.
    """

    def __init__(
        self,
        image_size: int = 640,
        crop_scale: Sequence[float] = (0.3, 1.0),
        hflip: float = 0.5,
        photometric: bool = True,
        min_box_size: float = 2.0,
        max_tries: int = 50,
    ) -> None:
        self.image_size = positive_int("image_size", image_size)
        self.crop_scale = float_range("crop_scale", crop_scale, 1e-3, 4.0)
        self.hflip = _number("hflip", hflip, 0.0, 1.0)
        self.photometric = bool(photometric)
        self.min_box_size = _number("min_box_size", min_box_size, 0.0, float(self.image_size))
        self.max_tries = positive_int("max_tries", max_tries)

    @staticmethod
    def colour_jitter(image: torch.Tensor) -> torch.Tensor:
        """Photometric distortion of a float RGB image ``[3, H, W]`` in [0, 1], each part with probability
        0.5: brightness (an offset of up to 32/255), contrast (x0.5-1.5 around the image's mean grey),
        saturation (x0.5-1.5 away from each pixel's grey) and hue (a rotation of up to 18 degrees about
        the grey axis in YIQ space). All four are affine in RGB, so they are composed into one 3x3 matrix
        and offset and applied in a single pass (cheap enough for a DataLoader worker at 640x640)."""
        luma = torch.tensor([0.299, 0.587, 0.114])
        matrix, offset = torch.eye(3), torch.zeros(3)
        mean = image.mean(dim=(1, 2))
        if float(torch.rand(())) < 0.5:  # brightness
            offset = offset + (float(torch.rand(())) * 2 - 1) * 32 / 255
        if float(torch.rand(())) < 0.5:  # contrast: alpha * x + (1 - alpha) * mean grey of the current image
            alpha = 0.5 + float(torch.rand(()))
            grey = float(luma @ (matrix @ mean + offset))
            matrix, offset = alpha * matrix, alpha * offset + (1 - alpha) * grey
        if float(torch.rand(())) < 0.5:  # saturation: s * x + (1 - s) * grey(x)
            sat = 0.5 + float(torch.rand(()))
            blend = sat * torch.eye(3) + (1 - sat) * luma.expand(3, 3)
            matrix, offset = blend @ matrix, blend @ offset
        if float(torch.rand(())) < 0.5:  # hue: rotate the chroma (I, Q) of YIQ
            angle = (float(torch.rand(())) * 2 - 1) * torch.pi / 10
            to_yiq = torch.tensor([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
            c, s = torch.cos(torch.tensor(angle)), torch.sin(torch.tensor(angle))
            rot = torch.tensor([[1.0, 0.0, 0.0], [0.0, float(c), float(-s)], [0.0, float(s), float(c)]])
            hue = torch.linalg.inv(to_yiq) @ rot @ to_yiq
            matrix, offset = hue @ matrix, hue @ offset
        out = torch.einsum("ij,jhw->ihw", matrix, image) + offset[:, None, None]
        return out.clamp_(0.0, 1.0)

    def _square(self, height: int, width: int, boxes: torch.Tensor) -> tuple[int, int, int, torch.Tensor]:
        """``(x0, y0, side, kept)``: the square's corner and side, and which boxes have their centre in it."""
        cx = (boxes[:, 0] + boxes[:, 2]) / 2
        cy = (boxes[:, 1] + boxes[:, 3]) / 2
        lo, hi = self.crop_scale
        short = min(height, width)
        for _ in range(self.max_tries):
            scale = lo + (hi - lo) * float(torch.rand(()))
            side = max(1, int(round(scale * short)))
            x0 = int(torch.randint(min(0, width - side), max(0, width - side) + 1, ()))
            y0 = int(torch.randint(min(0, height - side), max(0, height - side) + 1, ()))
            kept = (cx >= x0) & (cx < x0 + side) & (cy >= y0) & (cy < y0 + side)
            if boxes.shape[0] == 0 or bool(kept.any()):
                return x0, y0, side, kept
        return 0, 0, max(height, width), torch.ones(boxes.shape[0], dtype=torch.bool)

    def __call__(
        self, image: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        height, width = int(image.shape[-2]), int(image.shape[-1])
        boxes = boxes.to(torch.float32).reshape(-1, 4)
        x0, y0, side, kept = self._square(height, width, boxes)
        canvas = torch.full((image.shape[0], side, side), FILL_UINT8, dtype=torch.uint8)
        ix0, iy0 = max(x0, 0), max(y0, 0)
        ix1, iy1 = min(x0 + side, width), min(y0 + side, height)
        canvas[:, iy0 - y0:iy1 - y0, ix0 - x0:ix1 - x0] = image[:, iy0:iy1, ix0:ix1]
        size = self.image_size
        if side != size:
            canvas = TF.resize(canvas, [size, size], antialias=True)
        factor = size / side
        out = (boxes[kept] - torch.tensor([x0, y0, x0, y0], dtype=torch.float32)).clamp(0.0, float(side)) * factor
        labels = labels[kept]
        if self.hflip > 0 and float(torch.rand(())) < self.hflip:
            canvas = canvas.flip(-1)
            out = torch.stack([size - out[:, 2], out[:, 1], size - out[:, 0], out[:, 3]], dim=1)
        image = canvas.to(torch.float32) / 255.0
        if self.photometric:
            image = self.colour_jitter(image)
        big = ((out[:, 2] - out[:, 0]) >= self.min_box_size) & ((out[:, 3] - out[:, 1]) >= self.min_box_size)
        big &= (out[:, 2] > out[:, 0]) & (out[:, 3] > out[:, 1])
        return normalize_image(image), out[big].reshape(-1, 4), labels[big]


# --------------------------------------------------------------------------------------------------
# Batching
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# A training set kept on the device
# --------------------------------------------------------------------------------------------------

#: ``on_device: auto`` keeps a training set on a CUDA device when its images take at most this many bytes.
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


# --------------------------------------------------------------------------------------------------
# DataModule base
# --------------------------------------------------------------------------------------------------


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


__all__ = [
    "IMAGE_MEAN",
    "IMAGE_STD",
    "DetectionCollate",
    "DetectionDataModule",
    "SquareCropTransform",
    "TrainTransform",
    "box_area",
    "boxes_to_original",
    "collate_detection",
    "denormalize_image",
    "fit_long_side",
    "letterbox",
    "load_image_for_detection",
    "make_target",
    "normalize_image",
    "pad_images",
    "read_rgb",
    "select_boxes",
]
