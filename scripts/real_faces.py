"""How a face-detector checkpoint does on real photographs that ship with installed packages.

The photos and their hand-drawn face boxes are listed in ``real_faces.json`` beside this script: a group
photograph of six people (insightface's ``t1.jpg``, 1280 x 886, faces of 84-143 px among hands, cards and
glasses), scikit-image's ``astronaut`` and ``camera`` portraits and, where matplotlib is installed, its
``grace_hopper.jpg``. No snntrain dataset uses them (``data=faces`` leaves every photograph with a face or a
head out of its backgrounds, and its face crops come from other photographs). A photo whose package is not
installed is skipped and named. The boxes were drawn by hand, WIDER-style (hairline to chin, cheek to cheek),
so an IoU of 0.5 is a fair "found the face" test, but the boxes are not precise to a few pixels.

Each photo runs as ``task=predict`` runs it (:func:`snntrain.predict.detect_files`: by default the image
pyramid, ``--scales auto``; ``--scales none`` for the single pass of evaluation) with the model's own low
evaluation threshold. Reported per photo and in total: the faces found at ``--score-thresh`` (the predict
threshold: a box of at least that score with IoU >= 0.5, each box matched to at most one face, best scores
first), the boxes elsewhere at that threshold (every other box at or above it: background, a duplicate or a
badly placed box), the seconds the detector took per megapixel (wall clock, and the process's CPU time,
which a busy machine does not inflate); over all photos the recall at the
threshold and the official WIDER FACE AP at IoU 0.5 over every kept box (:mod:`snntrain.wider_eval`).

    python scripts/real_faces.py CHECKPOINT_OR_EXPORT [--out DIR] [--scales auto|none|F,F,...]
        [--max-side N] [--score-thresh 0.5] [--backend torch] [--threads N] [--photos-dir DIR]
        [--head KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ANNOTATIONS = Path(__file__).with_name("real_faces.json")
#: Inference settings of a detector's head that ``--head KEY=VALUE`` may change.
HEAD_KEYS = ("test_scales", "scale_step", "min_object", "merge", "tile_size", "nms_thresh", "flip_test",
             "object_sizes", "train_size")
IOU = 0.5


def photo_path(package: str, file: str) -> Path | None:
    """``file`` inside the installed ``package`` (found without importing it), or None."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / file
    return path if path.is_file() else None


def load_photos(annotations: Path = ANNOTATIONS, folder: Path | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """The annotated photos that are installed (each with its ``path`` and ``faces`` ``[n, 4]``), and the
    names of those that are not. A ``folder`` holding copies of the files (by their own names) is looked in
    first, for machines without the packages."""
    spec = json.loads(Path(annotations).read_text())
    found, missing = [], []
    for photo in spec["photos"]:
        copy = None if folder is None else Path(folder) / Path(photo["file"]).name
        path = copy if copy is not None and copy.is_file() else photo_path(photo["package"], photo["file"])
        if path is None:
            missing.append(f"{photo['name']} ({photo['package']}: {photo['file']})")
        else:
            found.append({**photo, "path": path, "faces": np.asarray(photo["faces"], dtype=np.float64).reshape(-1, 4)})
    return found, missing


def match(faces: np.ndarray, boxes: np.ndarray, scores: np.ndarray, thresh: float) -> tuple[int, int, list[float]]:
    """``(faces found, boxes elsewhere, best IoU per face)`` among the boxes scoring at least ``thresh``:
    boxes in order of score each take the unmatched face they overlap most, when the IoU is at least 0.5."""
    from snntrain.wider_eval import box_overlap

    shown = np.flatnonzero(scores >= thresh)
    shown = shown[np.argsort(-scores[shown], kind="stable")]
    taken = np.zeros(len(faces), bool)
    elsewhere = 0
    iou = box_overlap(faces, boxes[shown]).reshape(len(shown), len(faces)) if len(shown) else np.zeros((0, len(faces)))
    for row in iou:
        free = np.where(taken, -1.0, row)
        best = int(np.argmax(free)) if len(free) else -1
        if best >= 0 and free[best] >= IOU:
            taken[best] = True
        else:
            elsewhere += 1
    all_iou = box_overlap(faces, boxes).reshape(len(boxes), len(faces)) if len(boxes) else np.zeros((0, len(faces)))
    best_iou = all_iou.max(0).tolist() if len(boxes) else [0.0] * len(faces)
    return int(taken.sum()), elsewhere, best_iou


def evaluate_photos(model, photos: list[dict[str, Any]], score_thresh: float, scales, max_side: int | None = None,
                    out: Path | None = None) -> dict[str, Any]:
    """Run ``model`` (a loaded detector) on ``photos`` (:func:`load_photos`); the per-photo rows, the totals,
    the recall at ``score_thresh`` and the WIDER-protocol AP@0.5. With ``out``, each photo is drawn into
    ``out/images`` (boxes at the threshold red, the hand-drawn faces green)."""
    from snntrain.predict import detect_files, draw_boxes
    from snntrain.wider_eval import evaluate

    rows, all_boxes, all_scores, gts = [], [], [], []
    for photo in photos:
        start, cpu = time.perf_counter(), time.process_time()
        (_, meta, det), = detect_files(model, [photo["path"]], max_side=max_side, scales=scales)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        boxes, scores = det["boxes"].numpy().astype(np.float64), det["scores"].numpy().astype(np.float64)
        found, elsewhere, best_iou = match(photo["faces"], boxes, scores, score_thresh)
        h, w = meta["orig_size"]
        rows.append({"photo": photo["name"], "size": [int(h), int(w)], "faces": len(photo["faces"]),
                     "found": found, "elsewhere": elsewhere, "boxes_kept": len(boxes),
                     "best_iou": [round(v, 3) for v in best_iou], "seconds": round(seconds, 3),
                     "seconds_per_megapixel": round(seconds / (h * w / 1e6), 3),
                     "cpu_seconds_per_megapixel": round(cpu / (h * w / 1e6), 3)})
        all_boxes.append(boxes)
        all_scores.append(scores)
        gts.append(photo["faces"])
        if out is not None:
            from torchvision.io import write_png

            from snntrain.data.detection import read_rgb

            pixels, _ = read_rgb(photo["path"])
            shown = det["scores"] >= score_thresh
            drawn = draw_boxes(pixels, det["boxes"][shown], det["scores"][shown].tolist())
            drawn = draw_boxes(drawn, torch.as_tensor(photo["faces"], dtype=torch.float32), [""] * len(photo["faces"]),
                               colour=(40, 220, 40))
            (out / "images").mkdir(parents=True, exist_ok=True)
            write_png(drawn, str(out / "images" / f"{photo['name']}.png"))
    ap = None
    if gts:
        ap = float(evaluate(all_boxes, all_scores, gts, {"all": [np.ones(len(g), bool) for g in gts]})["all"].ap)
    faces = sum(r["faces"] for r in rows)
    found = sum(r["found"] for r in rows)
    return {"photos": rows, "faces": faces, "found": found, "recall": found / faces if faces else None,
            "elsewhere": sum(r["elsewhere"] for r in rows), "ap50": ap}


def parse_scales(text: str):
    if text == "auto":
        return "auto"
    if text in ("none", "null", "single"):
        return None
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--scales {text!r}: give auto, none or comma-separated factors") from None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="a .ckpt file or an export folder of a detector")
    p.add_argument("--out", default=os.environ.get("OUT", "real_faces"))
    p.add_argument("--scales", type=parse_scales, default="auto",
                   help="auto (the image pyramid, as task=predict), none (one pass as evaluated), or factors")
    p.add_argument("--max-side", type=int, default=None)
    p.add_argument("--score-thresh", type=float, default=0.5, help="the predict threshold (predict.score_thresh)")
    p.add_argument("--backend", default="torch")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (timings)")
    p.add_argument("--annotations", type=Path, default=ANNOTATIONS)
    p.add_argument("--photos-dir", type=Path, default=None, help="a folder with copies of the photos (looked in first)")
    p.add_argument("--head", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override an inference setting of the detector's head ({', '.join(HEAD_KEYS)}); repeatable")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from snntrain.predict import load_model

    model = load_model(args.checkpoint, args.backend).eval()
    for item in args.head:
        key, _, value = item.partition("=")
        if key not in HEAD_KEYS:
            p.error(f"--head {item!r}: {key!r} is not one of {', '.join(HEAD_KEYS)}")
        import yaml

        from snntrain.models import SpikingFCOS

        head = {k: getattr(model.model, k) for k in HEAD_KEYS}
        head[key] = yaml.safe_load(value)
        probe = SpikingFCOS(width=4, T=1, head={"fpn_levels": model.model.levels, **head}, backend="torch")
        setattr(model.model, key, getattr(probe, key))  # validated as the head validates it
    photos, missing = load_photos(args.annotations, args.photos_dir)
    for name in missing:
        print(f"not installed, skipped: {name}")
    out = Path(args.out)
    result = evaluate_photos(model, photos, args.score_thresh, args.scales, args.max_side, out)
    result = {"checkpoint": str(args.checkpoint), "training_data": model.config["data"].get("name"),
              "head": args.head, "scales": args.scales, "max_side": args.max_side, "score_thresh": args.score_thresh,
              "threads": torch.get_num_threads(), "skipped": missing, **result}
    (out / "real_faces.json").write_text(json.dumps(result, indent=2))
    for r in result["photos"]:
        print(f"{r['photo']:13s} {r['size'][1]:5d} x {r['size'][0]:<5d} faces found {r['found']}/{r['faces']}  "
              f"elsewhere {r['elsewhere']:3d}  (score >= {args.score_thresh})  best IoU per face "
              f"{r['best_iou']}  {r['seconds']:.2f} s ({r['seconds_per_megapixel']:.2f} s/MP, CPU time "
              f"{r['cpu_seconds_per_megapixel']:.2f} s/MP)")
    print(f"all photos: {result['found']}/{result['faces']} faces found (recall {result['recall']:.3f}), "
          f"{result['elsewhere']} boxes elsewhere at score >= {args.score_thresh}; "
          f"AP@0.5 (official WIDER protocol, all kept boxes) {result['ap50']:.3f}")


if __name__ == "__main__":
    main()
