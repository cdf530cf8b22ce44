"""The detection image: its normalisation, letterboxing to a square, reading and resizing, padding into a batch,
and boxes mapped back to the original image."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import functional as TF

from ..common import (
    open_image,
    positive_int,
)

#: Per-channel mean and standard deviation of the normalisation, on the [0, 1] pixel scale.
IMAGE_MEAN = 0.5
IMAGE_STD = 0.5
#: Fill value (uint8) for canvas grown by a zoom-out: mid grey, about 0 after normalisation.
FILL_UINT8 = 128

Target = dict[str, Any]


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
