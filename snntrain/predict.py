"""Run a trained classifier or detector on image files; write JSON (and drawn images)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .export import SpikingDetector, load_checkpoint, load_exported
from .fileio import atomic_path

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
    from .data.common import open_image
    from .data.cifar10 import STD as CIFAR_STD
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
    score_thresh: float | None = None,
    draw: bool = True,
) -> list[dict[str, Any]]:
    """Predict every image of ``inputs`` with the model in ``source``; writes ``predictions.json``
    (and, for a detector with ``draw``, ``images/<name>.png``) into ``out_dir``."""
    files = list_images(inputs)
    model = load_model(source, backend)
    device = torch.device("cuda" if torch.cuda.is_available() and backend != "torch" else "cpu")
    model = model.to(device)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = model.config
    records: list[dict[str, Any]] = []
    if isinstance(model, SpikingDetector):
        if score_thresh is not None:
            model.model.score_thresh = float(score_thresh)
        records = _detect(model, files, out_dir, batch_size, draw, device)
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


def _detect(model: SpikingDetector, files: list[Path], out_dir: Path, batch_size: int, draw: bool,
            device: torch.device) -> list[dict[str, Any]]:
    from torchvision.io import write_png
    from torchvision.utils import draw_bounding_boxes

    from .data.detection import boxes_to_original, load_image_for_detection, read_rgb

    size = int(model.config["data"]["image_size"])
    records = []
    for i in range(0, len(files), batch_size):
        chunk = files[i:i + batch_size]
        loaded = [load_image_for_detection(f, size) for f in chunk]
        x = torch.stack([img for img, _ in loaded]).to(device)
        with torch.no_grad():
            dets = model(x)
        for f, (_, meta), det in zip(chunk, loaded, dets):
            boxes = boxes_to_original(det["boxes"].cpu(), meta["scale"], meta["pad"], meta["orig_size"])
            h, w = meta["orig_size"]
            rec = {"file": str(f), "width": int(w), "height": int(h), "detections": [
                {"box": [round(float(v), 2) for v in b], "score": round(float(s), 5),
                 "label": str(model.classes[int(c)]) if int(c) < len(model.classes) else int(c)}
                for b, s, c in zip(boxes, det["scores"].cpu(), det["labels"].cpu())]}
            records.append(rec)
            if draw:
                image, _ = read_rgb(f)
                if len(boxes):
                    labels = [f"{d['score']:.2f}" for d in rec["detections"]]
                    image = draw_bounding_boxes(image, boxes, labels=labels, colors="red", width=2)
                (out_dir / "images").mkdir(exist_ok=True)
                with atomic_path(out_dir / "images" / f"{f.stem}.png") as tmp:
                    write_png(image, str(tmp))
    return records
