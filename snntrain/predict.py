"""Run a trained classifier or detector on image files; write JSON (and drawn images)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

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


def classification_input(path: Path, data: dict[str, Any], in_channels: int) -> torch.Tensor:
    """An image file as the classification data module feeds it to the model, ``[C, S, S]``."""
    from torchvision.transforms import v2

    from .data.cifar10 import MEAN as CIFAR_MEAN
    from .data.cifar10 import STD as CIFAR_STD
    from .data.common import open_image
    from .data.image_folder import IMAGENET_MEAN, IMAGENET_STD

    size = int(data.get("image_size") or 32)
    image = open_image(path, "L" if in_channels == 1 else "RGB")
    ops: list = [v2.ToImage(), v2.Resize(size, antialias=True), v2.CenterCrop(size), v2.ToDtype(torch.float32, scale=True)]
    name = data.get("name")
    if name == "digits":
        # the bundled digits are light strokes on a dark ground: dark ink on paper is inverted to match
        ops += [v2.Lambda(lambda x: 1.0 - x), v2.Normalize((0.5,), (0.5,))]
    elif name == "cifar10":
        ops.append(v2.Normalize(CIFAR_MEAN, CIFAR_STD))
    elif in_channels == 3:
        ops.append(v2.Normalize(IMAGENET_MEAN, IMAGENET_STD))
    else:
        ops.append(v2.Normalize((0.5,), (0.5,)))
    return v2.Compose(ops)(image)


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
) -> list[dict[str, Any]]:
    """Predict every image of ``inputs`` with the model in ``source``; writes ``predictions.json``
    (and, for a detector with ``draw``, ``images/<name>.png``) into ``out_dir``.

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
    files = list_images(inputs)
    if score_thresh is not None and (isinstance(score_thresh, bool) or not 0.0 <= float(score_thresh) <= 1.0):
        raise ValueError(f"predict.score_thresh={score_thresh!r} must be a number in [0, 1] or null")
    if max_side is not None:
        max_side = positive_int("predict.max_side", max_side)
    if scales is not None:
        from .models.detector import check_scales

        scales = check_scales("predict.scales", scales)
    model = load_model(source, backend)
    device = torch.device("cuda" if torch.cuda.is_available() and backend != "torch" else "cpu")
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
        records = _detect(model, files, out_dir, batch_size, draw, device, max_side, scales)
    else:
        for i in range(0, len(files), batch_size):
            chunk = files[i:i + batch_size]
            x = torch.stack([classification_input(f, config.get("data", {}), config["model"]["in_channels"])
                             for f in chunk]).to(device)
            probs = model.predict(x).cpu()
            for f, p in zip(chunk, probs):
                top = int(p.argmax())
                records.append({"file": str(f), "label": top, "class": str(model.classes[top]),
                                "probability": float(p[top]), "probabilities": [round(float(v), 6) for v in p]})
    with atomic_path(out_dir / "predictions.json") as tmp:
        tmp.write_text(json.dumps(records, indent=2))
    log.info("snntrain: predictions for %d image(s) in %s", len(files), out_dir / "predictions.json")
    return records


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
                 scales: str | Sequence[float] | None = "auto"
                 ) -> Iterator[tuple[Path, dict[str, Any], dict[str, torch.Tensor]]]:
    """Run a detector on image files as :func:`predict` does (see there for ``max_side`` and ``scales``); yields
    ``(file, meta, detections)`` per file, the boxes in the file's own pixels (``meta["orig_size"]`` is its
    ``(h, w)``), on the CPU. The images go to ``device``, by default the model's."""
    from .data.detection import boxes_to_original, load_image_for_detection, pad_images

    if device is None:
        device = next(iter(model.parameters()), torch.empty(0)).device
    data = model.config["data"]
    size, side = detection_geometry(data, max_side, pyramid=scales is not None)
    divisor = int(data.get("size_divisor") or 32)
    if scales is not None:  # a pyramid is chosen from each photo's own size: one photo at a time, unpadded
        batch_size, divisor = 1, 1
    for i in range(0, len(files), batch_size):
        chunk = files[i:i + batch_size]
        loaded = [load_image_for_detection(f, size, side) for f in chunk]
        x = pad_images([img for img, _ in loaded], 1 if size is not None else divisor).to(device)
        with torch.no_grad():
            dets = model(x, scales=[1.0] if scales is None else scales)
        for f, (_, meta), det in zip(chunk, loaded, dets):
            boxes = boxes_to_original(det["boxes"].cpu(), meta["scale"], meta["pad"], meta["orig_size"])
            yield f, meta, {"boxes": boxes, "scores": det["scores"].cpu(), "labels": det["labels"].cpu()}


def _detect(model: SpikingDetector, files: list[Path], out_dir: Path, batch_size: int, draw: bool,
            device: torch.device, max_side: int | None = None, scales: str | Sequence[float] | None = None
            ) -> list[dict[str, Any]]:
    from torchvision.io import write_png

    from .data.detection import read_rgb

    records = []
    for f, meta, det in detect_files(model, files, batch_size, device, max_side, scales):
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
