"""How a face-detector checkpoint does on real photographs that ship with installed packages.

Three portraits that no snntrain dataset uses (``data=faces`` excludes them from its backgrounds, and
its face crops come from other LFW photographs): scikit-image's ``astronaut`` (colour, a frontal face
of about 90 x 110 px in 512 x 512) and ``camera`` (grey, a profile of about 80 x 110 px), and
matplotlib's ``grace_hopper.jpg`` (colour, a frontal face of about 195 x 200 px in 512 x 600). Their face
boxes below were drawn by hand, WIDER-style (forehead to chin, cheek to cheek), so an IoU of 0.5 with
them is a fair "found the face" test but the numbers are not precise to a few pixels.

For each photo the checkpoint runs as ``task=predict`` would (its evaluation geometry, or
``--max-side``) with its own low evaluation threshold; reported: the number of boxes at or above
``--score-thresh`` (what a user sees), the best IoU of any box with the face and that box's score and
rank, and over the three photos the official WIDER FACE AP at IoU 0.5 (:mod:`snntrain.wider_eval`).

    python scripts/real_faces.py CHECKPOINT_OR_EXPORT [--out DIR] [--max-side N] [--score-thresh 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import torch

#: name -> (how to find the file, face box xyxy in its pixels, drawn by hand)
PHOTOS = {
    "astronaut": ("skimage", "astronaut.png", [178, 60, 268, 170]),
    "camera": ("skimage", "camera.png", [172, 88, 255, 200]),
    "grace_hopper": ("matplotlib", "grace_hopper.jpg", [165, 130, 360, 330]),
}


def photo_path(package: str, name: str) -> Path | None:
    if package == "skimage":
        import skimage

        path = Path(skimage.__file__).parent / "data" / name
    else:
        import matplotlib

        path = Path(matplotlib.get_data_path()) / "sample_data" / name
    return path if path.is_file() else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="a .ckpt file or an export folder of a detector")
    p.add_argument("--out", default=os.environ.get("OUT", "real_faces"))
    p.add_argument("--max-side", type=int, default=None)
    p.add_argument("--score-thresh", type=float, default=0.5)
    p.add_argument("--backend", default="torch")
    args = p.parse_args()

    from snntrain.data.detection import boxes_to_original, load_image_for_detection
    from snntrain.predict import detection_geometry, draw_boxes, load_model
    from snntrain.wider_eval import box_overlap, evaluate

    model = load_model(args.checkpoint, args.backend).eval()
    size, side = detection_geometry(model.config["data"], args.max_side)
    out = Path(args.out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rows, all_boxes, all_scores, gts = [], [], [], []
    for name, (package, file, face) in PHOTOS.items():
        path = photo_path(package, file)
        if path is None:
            print(f"{name}: {package} does not ship {file}; skipped")
            continue
        image, meta = load_image_for_detection(path, size, side)
        with torch.no_grad():
            det = model(image[None])[0]
        boxes = boxes_to_original(det["boxes"], meta["scale"], meta["pad"], meta["orig_size"])
        scores = det["scores"]
        ious = box_overlap(np.asarray([face], float), boxes.numpy()) if len(boxes) else np.zeros((0, 1))
        ious = ious.reshape(-1)
        best = int(np.argmax(ious)) if ious.size else -1
        shown = scores >= args.score_thresh
        rows.append({
            "photo": name, "size": list(meta["orig_size"]), "face": face, "boxes": int(len(boxes)),
            "boxes_shown": int(shown.sum()), "top_score": float(scores.max()) if len(scores) else None,
            "best_iou": float(ious[best]) if best >= 0 else 0.0,
            "best_iou_score": float(scores[best]) if best >= 0 else None,
            "best_iou_rank": int((scores > scores[best]).sum()) + 1 if best >= 0 else None,
            "found_at_thresh": bool(best >= 0 and ious[best] >= 0.5 and scores[best] >= args.score_thresh),
        })
        all_boxes.append(boxes.numpy())
        all_scores.append(scores.numpy())
        gts.append(np.asarray([face], float))
        from snntrain.data.detection import read_rgb

        pixels, _ = read_rgb(path)
        drawn = draw_boxes(pixels, boxes[shown], scores[shown].tolist())
        drawn = draw_boxes(drawn, torch.tensor([face], dtype=torch.float32), ["face"], colour=(40, 220, 40))
        from torchvision.io import write_png

        write_png(drawn, str(out / "images" / f"{name}.png"))
    ap = evaluate(all_boxes, all_scores, gts, {"all": [np.ones(1, bool)] * len(gts)})["all"].ap if gts else None
    result = {"checkpoint": str(args.checkpoint), "training_data": model.config["data"].get("name"),
              "geometry": {"image_size": size, "max_side": side}, "score_thresh": args.score_thresh,
              "photos": rows, "wider_protocol_ap50": ap}
    (out / "real_faces.json").write_text(json.dumps(result, indent=2))
    for r in rows:
        print(f"{r['photo']:13s} boxes {r['boxes']:4d}  shown (>= {args.score_thresh}) {r['boxes_shown']:3d}  "
              f"top score {r['top_score'] or 0:.3f}  best IoU {r['best_iou']:.2f} (score "
              f"{r['best_iou_score'] or 0:.3f}, rank {r['best_iou_rank']})  found: {r['found_at_thresh']}")
    print(f"AP@0.5 over the photos (official WIDER protocol): {ap}")


if __name__ == "__main__":
    main()
