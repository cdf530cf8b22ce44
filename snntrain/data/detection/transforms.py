"""Box-aware training and evaluation transforms, per sample and (``TrainTransform``) the same recipe for a
batch on the device."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from ..common import (
    positive_int,
)
from .images import FILL_UINT8, IMAGE_MEAN, IMAGE_STD, normalize_image
from .settings import _number, float_range


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
