"""Run a trained classifier or detector on image files; write JSON (and drawn images)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .backend import backend_device, resolve_backend
from .export import SpikingDetector, load_checkpoint, load_exported, training_data_summary
from .fileio import atomic_path
from .validation import positive_int

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


def list_images(source: str | os.PathLike) -> list[Path]:
    """The image files named by ``source``: one file, or every image in a folder (sorted, not recursive)."""
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix.lower() not in IMAGE_SUFFIXES:
            raise ValueError(f"input={str(path)!r} is not an image ({', '.join(IMAGE_SUFFIXES)})")
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ValueError(f"input={str(path)!r} holds no images ({', '.join(IMAGE_SUFFIXES)})")
        return files
    raise FileNotFoundError(f"input={str(path)!r} does not exist")


def load_model(source: str | os.PathLike, backend: str = "auto") -> nn.Module:
    """A checkpoint file or an export folder, loaded for inference."""
    path = Path(source).expanduser()
    return load_exported(path, backend) if path.is_dir() else load_checkpoint(path, backend)


#: predict.polarity: how a digits classifier reads an image's strokes (see :func:`classification_input`)
POLARITIES = ("auto", "light_on_dark", "dark_on_light")
#: predict.bad_files: what an unreadable image does to a prediction run
BAD_FILES = ("error", "skip")


def digit_polarity(image: torch.Tensor) -> str:
    """``light_on_dark`` or ``dark_on_light``: the strokes of a grey image ``[1, H, W]`` in [0, 1] against its
    ground, judged by the median of its outermost rows and columns (the ground around a digit)."""
    border = torch.cat([image[..., 0, :], image[..., -1, :], image[..., :, 0], image[..., :, -1]], -1)
    return "dark_on_light" if float(border.median()) > 0.5 else "light_on_dark"


def classification_input(path: Path, data: dict[str, Any], in_channels: int, polarity: str = "auto"
                         ) -> torch.Tensor:
    """An image file as the classification data module feeds it to the model, ``[C, S, S]``.

    ``polarity`` is for models trained on the bundled digits (``data=digits``), whose strokes are light on a
    dark ground: ``dark_on_light`` images (ink on paper) are inverted to match, ``light_on_dark`` ones are
    not, and ``auto`` decides per image by the ground around it (:func:`digit_polarity`)."""
    return _classification_input(path, data, in_channels, polarity)[0]


def _classification_input(path: Path, data: dict[str, Any], in_channels: int, polarity: str = "auto"
                          ) -> tuple[torch.Tensor, str | None]:
    """:func:`classification_input` and, for a digits model, the polarity it read the image with."""
    from torchvision.transforms import v2

    from .data.cifar10 import MEAN as CIFAR_MEAN
    from .data.cifar10 import STD as CIFAR_STD
    from .data.common import open_image
    from .data.image_folder import IMAGENET_MEAN, IMAGENET_STD

    size = int(data.get("image_size") or 32)
    image = open_image(path, "L" if in_channels == 1 else "RGB")
    ops: list = [v2.ToImage(), v2.Resize(size, antialias=True), v2.CenterCrop(size), v2.ToDtype(torch.float32, scale=True)]
    x = v2.Compose(ops)(image)
    name = data.get("name")
    if name == "digits":
        found = digit_polarity(x) if polarity == "auto" else polarity
        if found == "dark_on_light":
            x = 1.0 - x
        return v2.Normalize((0.5,), (0.5,))(x), found
    if name == "cifar10":
        return v2.Normalize(CIFAR_MEAN, CIFAR_STD)(x), None
    if in_channels == 3:
        return v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)(x), None
    return v2.Normalize((0.5,), (0.5,))(x), None


class _Unreadable:
    """Unreadable images during a prediction run: with ``predict.bad_files=error`` the first one stops it (its
    error says how to skip them); with ``skip`` each is logged and left out, and :meth:`summary` counts them."""

    def __init__(self, bad_files: str, total: int) -> None:
        self.skip = bad_files == "skip"
        self.total = total
        self.files: list[tuple[Path, str]] = []

    def __call__(self, path: Path, err: Exception) -> None:
        from .data.common import BadDataError

        if not self.skip:
            raise BadDataError(f"{err} (or predict.bad_files=skip skips unreadable images)") from err
        self.files.append((path, str(err)))
        log.warning("snntrain: skipped %s: %s", path, err)

    def summary(self) -> None:
        if self.files:
            log.warning("snntrain: skipped %d of %d image(s) that cannot be read (predict.bad_files=skip): %s",
                        len(self.files), self.total, ", ".join(str(p) for p, _ in self.files))


def predict(
    source: str | os.PathLike,
    inputs: str | os.PathLike,
    out_dir: str | os.PathLike,
    backend: str = "auto",
    batch_size: int = 16,
    score_thresh: float | None = 0.5,
    draw: bool = True,
    max_side: int | None = None,
    scales: str | Sequence[float] | None = "auto",
    tile_size: int | None = None,
    bad_files: str = "error",
    polarity: str = "auto",
) -> list[dict[str, Any]]:
    """Predict every image of ``inputs`` with the model in ``source``; writes ``predictions.json``
    (and, for a detector with ``draw``, ``images/<name>.png``) into ``out_dir``.

    An image that cannot be read stops the run (``bad_files="error"``, naming it) or, with ``"skip"``, is left
    out: each one is logged with its reason, then how many were skipped and their names. ``polarity``: how a
    classifier of the bundled digits reads strokes (:func:`classification_input`); each record says which
    it used (``polarity``), and the log counts them.

    Detectors: only boxes scoring at least ``score_thresh`` are written and drawn (``None``: the
    model's own evaluation threshold, which is low on purpose and keeps many weak boxes). With ``scales``
    (``auto``, the default, or a list of factors) each photo is read at its original resolution (its longer
    side shrunk to at most ``max_side`` when given) and run as an image pyramid
    (:meth:`~snntrain.models.SpikingFCOS.detect`): ``auto`` maps faces of any size into the sizes the
    detector was trained on, in tiles of at most ``tile_size`` pixels a side (None: the model's). With
    ``scales=None`` each photo gets the single pass of evaluation: letterboxed to the training square for
    detectors trained on fixed squares (data=faces), at the original resolution (or the data's
    ``eval_max_side``) for full-resolution detectors (data=widerface); ``max_side`` overrides both.
    """
    from .data.common import BadDataError
    from .validation import one_of

    files = list_images(inputs)
    one_of("predict.bad_files", bad_files, BAD_FILES)
    one_of("predict.polarity", polarity, POLARITIES)
    unreadable = _Unreadable(bad_files, len(files))
    if score_thresh is not None and (isinstance(score_thresh, bool) or not 0.0 <= float(score_thresh) <= 1.0):
        raise ValueError(f"predict.score_thresh={score_thresh!r} must be a number in [0, 1] or null")
    if max_side is not None:
        max_side = positive_int("predict.max_side", max_side)
    if scales is not None:
        from .models.detector import check_scales

        scales = check_scales("predict.scales", scales)
    backend = resolve_backend(backend)
    model = load_model(source, backend)
    device = backend_device(backend)
    model = model.to(device)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = model.config
    records: list[dict[str, Any]] = []
    if isinstance(model, SpikingDetector):
        log.info("snntrain: %s", training_data_summary(config))
        if config.get("data", {}).get("name") == "faces":
            log.warning("snntrain: this detector was trained only on synthetic images (small grey face crops "
                        "pasted on backgrounds); expect it to miss or misplace faces in photographs")
        if score_thresh is not None:
            model.model.score_thresh = float(score_thresh)
        if tile_size is not None:
            tile_size = positive_int("predict.tile_size", tile_size)
            if tile_size < 64:
                raise ValueError(f"predict.tile_size={tile_size!r} must be at least 64 pixels")
            model.model.tile_size = tile_size
        records = _detect(model, files, out_dir, batch_size, draw, device, max_side, scales, unreadable)
    else:
        data, channels = config.get("data", {}), config["model"]["in_channels"]
        for i in range(0, len(files), batch_size):
            chunk, inputs_, read_as = [], [], []
            for f in files[i:i + batch_size]:
                try:
                    x, found = _classification_input(f, data, channels, polarity)
                except BadDataError as err:
                    unreadable(f, err)
                    continue
                chunk.append(f)
                inputs_.append(x)
                read_as.append(found)
            if not chunk:
                continue
            probs = model.predict(torch.stack(inputs_).to(device)).cpu()
            for f, p, found in zip(chunk, probs, read_as):
                top = int(p.argmax())
                records.append({"file": str(f), "label": top, "class": str(model.classes[top]),
                                "probability": float(p[top]), "probabilities": [round(float(v), 6) for v in p],
                                **({"polarity": found} if found else {})})
        _log_polarities(records, polarity)
    with atomic_path(out_dir / "predictions.json") as tmp:
        tmp.write_text(json.dumps(records, indent=2))
    log.info("snntrain: predictions for %d image(s) in %s", len(records), out_dir / "predictions.json")
    unreadable.summary()
    return records


def _log_polarities(records: list[dict[str, Any]], polarity: str) -> None:
    """How a digits classifier read the images' strokes, counted (its training digits are light on dark)."""
    found = [r["polarity"] for r in records if "polarity" in r]
    if not found:
        return
    light, dark = found.count("light_on_dark"), found.count("dark_on_light")
    how = ("judged by the ground around each image; predict.polarity=light_on_dark or dark_on_light sets it"
           if polarity == "auto" else f"predict.polarity={polarity}")
    log.info("snntrain: digits read as %d light on dark (as trained) and %d dark on light (inverted) (%s)",
             light, dark, how)


def detection_geometry(data: dict[str, Any], max_side: int | None = None, pyramid: bool = False
                       ) -> tuple[int | None, int | None]:
    """``(image_size, max_side)`` for :func:`~snntrain.data.detection.load_image_for_detection`: how a
    detector trained with the data config ``data`` sees a photograph (see :func:`predict`): with
    ``pyramid`` (multi-scale inference) at its original resolution, else as the model was evaluated."""
    if max_side is not None:
        return None, max_side
    if pyramid:  # the photo's own pixels, or what a full-resolution detector's evaluation caps them at
        return None, data.get("eval_max_side")
    if "eval_max_side" in data:
        return None, data["eval_max_side"]
    return int(data["image_size"]), None


def draw_boxes(image: torch.Tensor, boxes: torch.Tensor, scores: Sequence[float | str],
               colour: tuple[int, int, int] = (255, 40, 40)) -> torch.Tensor:
    """Boxes ``[n, 4]`` (xyxy pixels) with their scores (or text labels) drawn on a uint8 image ``[3, H, W]``,
    legibly at any size: line width and text height follow the image's shorter side (2 px and 12 px at least),
    and each score sits on a filled label above its box (inside it when the box touches the top)."""
    from PIL import Image, ImageDraw, ImageFont

    pil = Image.fromarray(image.permute(1, 2, 0).cpu().numpy())
    short = min(pil.size)
    width = max(2, round(short / 250))
    font_size = max(12, round(short / 40))
    try:
        font = ImageFont.load_default(size=font_size)
    except TypeError:  # Pillow < 10.1 has one fixed-size bitmap font
        font = ImageFont.load_default()
    draw = ImageDraw.Draw(pil)
    for box, score in zip(boxes.tolist(), scores):
        x1, y1, x2, y2 = box
        draw.rectangle([x1, y1, x2, y2], outline=colour, width=width)
        text = score if isinstance(score, str) else f"{score:.2f}"
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        tw, th = right - left + 2 * width, bottom - top + 2 * width
        ty = y1 - th if y1 - th >= 0 else y1
        draw.rectangle([x1, ty, x1 + tw, ty + th], fill=colour)
        draw.text((x1 + width - left, ty + width - top), text, fill=(255, 255, 255), font=font)
    return torch.from_numpy(np.asarray(pil).copy()).permute(2, 0, 1).contiguous()


def detect_files(model: SpikingDetector, files: Sequence[Path], batch_size: int = 16,
                 device: torch.device | None = None, max_side: int | None = None,
                 scales: str | Sequence[float] | None = "auto",
                 unreadable: Callable[[Path, Exception], None] | None = None,
                 ) -> Iterator[tuple[Path, dict[str, Any], dict[str, torch.Tensor]]]:
    """Run a detector on image files as :func:`predict` does (see there for ``max_side`` and ``scales``); yields
    ``(file, meta, detections)`` per file, the boxes in the file's own pixels (``meta["orig_size"]`` is its
    ``(h, w)``), on the CPU. The images go to ``device``, by default the model's. A file that cannot be read
    raises :class:`~snntrain.data.common.BadDataError`, or, given ``unreadable``, goes to it and is left out."""
    from .data.common import BadDataError
    from .data.detection import boxes_to_original, load_image_for_detection, pad_images

    if device is None:
        device = next(iter(model.parameters()), torch.empty(0)).device
    data = model.config["data"]
    size, side = detection_geometry(data, max_side, pyramid=scales is not None)
    divisor = int(data.get("size_divisor") or 32)
    if scales is not None:  # a pyramid is chosen from each photo's own size: one photo at a time, unpadded
        batch_size, divisor = 1, 1
    for i in range(0, len(files), batch_size):
        chunk, loaded = [], []
        for f in files[i:i + batch_size]:
            try:
                loaded.append(load_image_for_detection(f, size, side))
            except BadDataError as err:
                if unreadable is None:
                    raise
                unreadable(f, err)
                continue
            chunk.append(f)
        if not chunk:
            continue
        x = pad_images([img for img, _ in loaded], 1 if size is not None else divisor).to(device)
        with torch.no_grad():
            dets = model(x, scales=[1.0] if scales is None else scales)
        for f, (_, meta), det in zip(chunk, loaded, dets):
            boxes = boxes_to_original(det["boxes"].cpu(), meta["scale"], meta["pad"], meta["orig_size"])
            yield f, meta, {"boxes": boxes, "scores": det["scores"].cpu(), "labels": det["labels"].cpu()}


def _detect(model: SpikingDetector, files: list[Path], out_dir: Path, batch_size: int, draw: bool,
            device: torch.device, max_side: int | None = None, scales: str | Sequence[float] | None = None,
            unreadable: Callable[[Path, Exception], None] | None = None) -> list[dict[str, Any]]:
    from torchvision.io import write_png

    from .data.detection import read_rgb

    records = []
    for f, meta, det in detect_files(model, files, batch_size, device, max_side, scales, unreadable):
        boxes = det["boxes"]
        h, w = meta["orig_size"]
        rec = {"file": str(f), "width": int(w), "height": int(h), "detections": [
            {"box": [round(float(v), 2) for v in b], "score": round(float(s), 5),
             "label": str(model.classes[int(c)]) if int(c) < len(model.classes) else int(c)}
            for b, s, c in zip(boxes, det["scores"], det["labels"])]}
        records.append(rec)
        if draw:
            image, _ = read_rgb(f)
            if len(boxes):
                image = draw_boxes(image, boxes, [d["score"] for d in rec["detections"]])
            (out_dir / "images").mkdir(exist_ok=True)
            with atomic_path(out_dir / "images" / f"{f.stem}.png") as tmp:
                write_png(image, str(tmp))
    return records
