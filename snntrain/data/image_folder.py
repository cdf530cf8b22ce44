"""The user's own images: one sub-folder per class, as torchvision's ImageFolder reads them.

Either ``root/train/<class>/*`` and ``root/val/<class>/*`` (ImageNet's layout), or a single
``root/<class>/*`` that is split deterministically by ``val_fraction``.

Every image becomes a box of its pixels resized to ``image_size`` squared: for training (with
``augment``) a random box (:func:`draw_resized_crop`: area ``crop_scale`` of the image, aspect ratio
3/4 to 4/3, torchvision's RandomResizedCrop) and a random left-right flip, drawn from
``(seed, epoch, index)``; for validation the central square that a resize of the shorter side to
``val_resize`` followed by a centre crop of ``image_size`` would keep (:func:`center_box`). Pixels
are then normalised by the ImageNet mean and standard deviation (grey: 0.5, 0.5).

Where that happens is ``decode``:

* ``cpu``: PIL decodes and torchvision resizes in the loader's worker processes;
* ``gpu``: the workers only read the files and draw the boxes; the batch is decoded by nvJPEG and
  cropped, resized, flipped and normalised by one kernel on the device the batch is sent to
  (:mod:`snntrain.data.device_decode`); images nvJPEG does not read (progressive or CMYK JPEGs,
  PNG and other formats) are decoded by PIL in the workers, one by one, and counted in the log;
* ``dali``: the same batches decoded and augmented by an NVIDIA DALI pipeline (``pip install
  ".[dali]"``);
* ``auto``: ``gpu`` when the trainer runs on a CUDA device, else ``cpu``.

All paths draw the same boxes and flips for the same ``(seed, epoch, index)``, so resuming, DDP
sharding and the augmentation's distribution do not depend on the path; pixel values differ only
by the decoder (libjpeg-turbo or nvJPEG) and the resize's rounding. The ``gpu`` and ``dali`` paths
deliver float32 batches, or bfloat16 under ``bf16`` precision (``dtype``), channels-last on CUDA
(``channels_last``, the run's top-level key).
"""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Subset
from torchvision.transforms import v2

from ..errors import UnavailableError
from ..validation import flag, number, one_of
from .common import (
    BadDataError,
    check_fraction,
    check_num_workers,
    eval_loader,
    item_generator,
    loader_workers,
    open_image,
    positive_int,
    split_indices,
    train_loader,
)
from .device_decode import (
    DALI_MISSING,
    DecodeAhead,
    DeviceDecoder,
    EncodedBatch,
    EncodedItem,
    check_nvjpeg,
    collate_encoded,
    dali_available,
    jpeg_info,
    pil_pixels,
)

log = logging.getLogger(__name__)

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
#: aspect ratios (width / height) of the random boxes, torchvision's RandomResizedCrop default
RATIO = (3.0 / 4.0, 4.0 / 3.0)
DECODES = ("auto", "cpu", "gpu", "dali")
DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}


def load_rgb(path: str):
    """ImageFolder's loader: the whole file decoded to RGB; an unreadable file raises an error naming it."""
    return open_image(path, "RGB")


# ------------------------------------------------------------------------------------------ augmentation


def draw_resized_crop(height: int, width: int, scale: tuple[float, float],
                      ratio: tuple[float, float] = RATIO) -> tuple[int, int, int, int]:
    """A random box ``(top, left, box_height, box_width)`` of an image of ``height x width``, drawn as
    torchvision's RandomResizedCrop does (10 tries at an area fraction uniform in ``scale`` and a
    log-uniform aspect ratio in ``ratio``, then the central box of the nearest allowed ratio), in one draw from
    the item's generator (:func:`~snntrain.data.common.item_generator`, which the loader seeds from ``(seed,
    epoch, index)``), or torch's global CPU generator outside a loader."""
    u = torch.rand(10, 4, dtype=torch.float64, generator=item_generator()).tolist()
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for a, r, y, x in u:
        target = area * (scale[0] + (scale[1] - scale[0]) * a)
        aspect = math.exp(log_lo + (log_hi - log_lo) * r)
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return min(int(y * (height - h + 1)), height - h), min(int(x * (width - w + 1)), width - w), h, w
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        h, w = height, width
    h, w = max(1, min(h, height)), max(1, min(w, width))
    return (height - h) // 2, (width - w) // 2, h, w


def center_box(height: int, width: int, size: int, resize: int) -> tuple[int, int, int, int]:
    """The central square that resizing the shorter side to ``resize`` and cropping ``size x size`` from the
    centre keeps, as ``(top, left, side, side)`` of the original image."""
    side = max(1, min(int(round(min(height, width) * size / resize)), height, width))
    return (height - side) // 2, (width - side) // 2, side, side


class Augment:
    """The box and flip of a sample: random (:func:`draw_resized_crop`, flip with probability 1/2, both
    from the item's generator) when ``random``, else the :func:`center_box` without a flip."""

    def __init__(self, size: int, random: bool, scale: tuple[float, float], resize: int) -> None:
        self.size, self.random, self.scale, self.resize = size, random, scale, resize

    def __call__(self, height: int, width: int) -> tuple[tuple[int, int, int, int], bool]:
        if not self.random:
            return center_box(height, width, self.size, self.resize), False
        box = draw_resized_crop(height, width, self.scale)
        return box, bool(torch.rand((), generator=item_generator()) < 0.5)


class ResizedCrop:
    """The CPU path's geometric transform of a ``[C, H, W]`` image tensor: the :class:`Augment` box resized
    to ``size`` squared (antialiased bilinear), flipped if drawn so."""

    def __init__(self, augment: Augment) -> None:
        self.augment = augment

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        (top, left, h, w), flip = self.augment(int(image.shape[-2]), int(image.shape[-1]))
        size = self.augment.size
        out = v2.functional.resized_crop(image, top, left, h, w, [size, size], antialias=True)
        return v2.functional.horizontal_flip(out) if flip else out


def image_size(path: str, data: bytes) -> tuple[int, int]:
    """``(height, width)`` from an image file's header (PIL), or :class:`BadDataError` naming the file."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.height, img.width
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise BadDataError(f"image {path} cannot be read ({type(err).__name__}: {err}): the file is truncated, "
                           "corrupt or not an image; replace or remove it") from err


class EncodedImages(Dataset):
    """The GPU path's samples: item ``i`` of ``samples`` (``(path, label)``) as an :class:`EncodedItem`: the
    file's bytes (or, for an image the device decoder does not read, its pixels decoded by PIL) with its
    box and flip from ``augment`` (drawn from the image's size as the CPU path draws them).

    ``engine``: ``nvjpeg`` (JPEGs that nvJPEG's batched decoder reads travel encoded, everything else as
    pixels) or ``dali`` (every readable file travels encoded; DALI decodes all common formats)."""

    #: items draw only from the item's generator (see SeededDataset): the fetch thread of the GPU path reads them
    #: beside the training loop
    reads_numpy_random = False
    reads_global_torch_random = False

    def __init__(self, samples: Sequence[tuple[str, int]], augment: Augment, channels: int, engine: str) -> None:
        self.samples, self.augment, self.channels, self.engine = list(samples), augment, channels, engine

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> EncodedItem:
        path, label = self.samples[i]
        with open(path, "rb") as f:
            data = f.read()
        info = jpeg_info(data)
        pixels, reason, payload = None, None, data
        if info is not None and info.complete and (info.fallback is None or self.engine == "dali"):
            height, width = info.height, info.width
        elif self.engine == "dali" and info is None:
            height, width = image_size(path, data)  # DALI reads PNG and the rest; PIL checks it is an image
        else:  # decoded here by PIL, which names a truncated or corrupt file
            pixels = pil_pixels(path, self.channels)
            height, width, payload = int(pixels.shape[1]), int(pixels.shape[2]), None
            reason = "not a JPEG" if info is None else info.fallback or "other JPEG"
        box, flip = self.augment(height, width)
        return EncodedItem(payload, pixels, reason, box, flip, label, path)


# ------------------------------------------------------------------------------------------ datamodule


class ImageFolderDataModule(L.LightningDataModule):
    def __init__(
        self,
        root: str | None = None,
        image_size: int = 64,
        in_channels: int = 3,
        batch_size: int = 64,
        val_fraction: float = 0.2,
        num_workers: int | str = 2,
        augment: bool = True,
        crop_scale: Sequence[float] = (0.5, 1.0),
        val_resize: int | None = None,
        decode: str = "auto",
        decode_ahead: bool = True,
        dtype: str = "auto",
        channels_last: str | bool = "auto",
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
        self.num_workers = check_num_workers(num_workers)
        self.augment = bool(augment)
        self.crop_scale = _crop_scale(crop_scale)
        self.val_resize = self.image_size if val_resize is None else positive_int("val_resize", val_resize)
        if self.val_resize < self.image_size:
            raise ValueError(f"val_resize={val_resize!r} must be at least image_size={self.image_size} (or null)")
        self.decode = one_of("decode", decode, DECODES)
        self.decode_ahead = flag("decode_ahead", decode_ahead)
        if self.decode == "dali" and not dali_available():
            raise UnavailableError(DALI_MISSING)
        self.dtype = one_of("dtype", dtype, DTYPES)
        if channels_last not in ("auto", True, False):
            raise ValueError(f"channels_last={channels_last!r} is not valid; choose auto (on with CUDA), true or false")
        self.channels_last = channels_last
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
        #: the path in use (``cpu``, ``gpu`` or ``dali``), settled by :meth:`setup`
        self.path: str | None = None
        #: decodes and augments ``gpu`` / ``dali`` batches on their device (built by :meth:`setup`)
        self.decoder: DeviceDecoder | None = None
        self._ahead: DecodeAhead | None = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def _augment(self, train: bool) -> Augment:
        return Augment(self.image_size, train and self.augment, self.crop_scale, self.val_resize)

    def _transform(self, train: bool) -> v2.Compose:
        ops = [v2.ToImage()]
        if self.in_channels == 1:
            ops.append(v2.Grayscale())
        mean, std = self._mean_std()
        ops += [ResizedCrop(self._augment(train)), v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)]
        return v2.Compose(ops)

    def _mean_std(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        return (IMAGENET_MEAN, IMAGENET_STD) if self.in_channels == 3 else ((0.5,), (0.5,))

    def _device(self) -> torch.device:
        return self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")

    def _resolve_path(self) -> str:
        if self.decode != "auto":
            return self.decode
        return "gpu" if self._device().type == "cuda" else "cpu"

    def _build_decoder(self) -> DeviceDecoder:
        device = self._device()
        dtype = DTYPES[self.dtype]
        if dtype is None:
            bf16 = self.trainer is not None and "bf16" in str(self.trainer.precision)
            dtype = torch.bfloat16 if bf16 else torch.float32
        channels_last = device.type == "cuda" if self.channels_last == "auto" else self.channels_last
        mean, std = self._mean_std()
        return DeviceDecoder(self.image_size, self.in_channels, mean, std,
                             engine="dali" if self.path == "dali" else "nvjpeg", dtype=dtype,
                             channels_last=channels_last, threads=max(1, loader_workers(self)), batch_size=self.batch_size)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        from torchvision.datasets import ImageFolder

        self.path = self._resolve_path()
        if self.path == "gpu" and self._device().type == "cuda":
            try:
                check_nvjpeg(self._device())
            except RuntimeError as err:
                if self.decode == "gpu":
                    raise RuntimeError(f"data.decode=gpu: torchvision cannot decode JPEGs on {self._device()} ({err}); "
                                       "use data.decode=cpu (or dali)") from err
                log.warning("snntrain: data.decode=auto: torchvision cannot decode JPEGs on %s (%s): decoding on the "
                            "CPU", self._device(), err)
                self.path = "cpu"
        encoded = self.path != "cpu"

        def folder(root: Path, train: bool) -> Dataset:
            ds = ImageFolder(str(root), transform=self._transform(train), loader=load_rgb)
            # ResizedCrop draws from the item's generator, the other transforms draw nothing (see SeededDataset)
            ds.reads_numpy_random = ds.reads_global_torch_random = False
            if ds.classes != self.classes:
                raise ValueError(f"class folders of {root} ({ds.classes}) differ from {self.train_root} "
                                 f"({self.classes})")
            if encoded:
                return EncodedImages(ds.samples, self._augment(train), self.in_channels,
                                     "dali" if self.path == "dali" else "nvjpeg")
            return ds

        if self.val_root is not None:
            self.train_set, self.val_set = folder(self.train_root, True), folder(self.val_root, False)
        else:
            full_train, full_eval = folder(self.train_root, True), folder(self.train_root, False)
            train_idx, val_idx = split_indices(len(full_train), self.val_fraction, self.seed)  # type: ignore[arg-type]
            self.train_set, self.val_set = Subset(full_train, train_idx), Subset(full_eval, val_idx)
        if encoded and self.decoder is None:
            self.decoder = self._build_decoder()
            log.info("snntrain: image_folder decodes on %s with %s", self._device(),
                     "DALI" if self.path == "dali" else "nvJPEG" if self._device().type == "cuda" else "torchvision")

    def _collate(self):
        return collate_encoded if self.path in ("gpu", "dali") else None

    def train_dataloader(self) -> DataLoader:
        loader = train_loader(self, self.train_set, self.batch_size, self.seed, num_workers=loader_workers(self),
                              collate_fn=self._collate())
        if self.path in ("gpu", "dali") and self.decode_ahead and self.trainer is not None:
            if self.decoder is None:
                self.decoder = self._build_decoder()
            if self._ahead is None or self._ahead.decoder is not self.decoder:
                if self._ahead is not None:
                    self._ahead.close()
                self._ahead = DecodeAhead(self.decoder, self._device())
            loader.wrap = self._ahead.wrap
        return loader

    def val_dataloader(self) -> DataLoader:
        return eval_loader(self, self.val_set, self.batch_size, num_workers=loader_workers(self),
                           collate_fn=self._collate())

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """A ``gpu`` / ``dali`` batch arrives encoded on its device: decode and augment it there."""
        if isinstance(batch, EncodedBatch):
            if self.decoder is None:
                self.decoder = self._build_decoder()
            return self.decoder(batch)
        return batch

    def teardown(self, stage: str | None = None) -> None:
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None
        if self.decoder is not None and self.decoder.stats["images"]:
            log.info("snntrain: image_folder: %s", self.decoder.summary())


def _crop_scale(value: Any) -> tuple[float, float]:
    try:
        lo, hi = (number("crop_scale", v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"crop_scale={value!r} must be two numbers [min, max] with 0 < min <= max <= 1") from None
    if not 0.0 < lo <= hi <= 1.0:
        raise ValueError(f"crop_scale={value!r} must be two numbers [min, max] with 0 < min <= max <= 1")
    return lo, hi
