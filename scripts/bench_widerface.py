"""Speed and memory of the ``experiment=widerface_sew`` recipe on images of WIDER FACE's sizes.

No WIDER FACE download is needed: images are synthetic (random pixels; the network's cost does not
depend on their content) with WIDER's geometry:

* WIDER FACE images are 1024 px wide (a few are narrower); their heights vary. Heights here are drawn
  from a mix that follows the train/val split's shape: 55 % landscape 576-768 px, 30 % 768-1024 px,
  15 % portrait 1024-1536 px (uniform within each band).
* faces per image: 1 + a geometric count with mean 11 (WIDER averages about 12, with a long tail),
  at most 256 (the recipe's ``max_boxes``); side log-uniform between 6 and 400 px.

Timed, with the preset's model (SEW-ResNet-18 width 32, FPN on strides 4-32, T from the preset or
``--T``), its precision (bf16 autocast) and loss:

* ``train``: one step = forward + FCOS targets + focal/GIoU/centerness loss + backward + AdamW on a
  batch of ``--batch`` 640x640 crops (the size the square-crop transform produces);
* ``val``: one step = forward + loss + decoding (threshold, NMS, up to 750 boxes) + mapping boxes back
  to the original pixels, on batches of ``--val-batch`` full-resolution images padded to multiples of
  32 (``data.eval_max_side=null``), or with the longer side capped at ``--eval-max-side``;
* ``transform``: the CPU cost of :class:`~snntrain.data.detection.SquareCropTransform` per image in
  one process (a DataLoader worker's budget), on uint8 images of the same sizes;
* ``wider_eval``: the official easy/medium/hard evaluation (:mod:`snntrain.wider_eval`) of 3226
  images with 750 detections each, on the CPU.

Rates are images per second after warm-up steps, the GPU synchronised around the timed steps; peak
memory is ``torch.cuda.max_memory_allocated`` over the timed steps. ``epoch_minutes`` estimates one
epoch of WIDER FACE train (12,880 images) plus the validation pass (3,226 images) every
``trainer.check_val_every_n_epoch`` epochs, from the rates measured here.

    python scripts/bench_widerface.py --out DIR [--steps 20] [--backends triton torch] [--T 4]

Writes ``DIR/bench_widerface.csv`` and ``.jsonl`` (one row per case; the epoch estimates in
``bench_widerface_estimates.csv`` and ``.jsonl``) and prints a table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import bench_utils as bu  # noqa: E402

WIDER_TRAIN_IMAGES = 12880
WIDER_VAL_IMAGES = 3226


def wider_sizes(n: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """``n`` (height, width) pairs with WIDER FACE's geometry (module docstring)."""
    bands = [(576, 768), (768, 1024), (1024, 1536)]
    pick = rng.choice(3, size=n, p=[0.55, 0.30, 0.15])
    return [(int(rng.integers(*bands[k])), 1024) for k in pick]


def wider_faces(h: int, w: int, rng: np.random.Generator, max_boxes: int = 256) -> torch.Tensor:
    """Face boxes (xyxy pixels) for an ``h`` x ``w`` image: WIDER-like count and sizes."""
    n = min(max_boxes, 1 + int(rng.geometric(1 / 11)))
    side = np.exp(rng.uniform(np.log(6), np.log(min(400, h, w)), n))
    x = rng.uniform(0, w - side)
    y = rng.uniform(0, h - side)
    return torch.tensor(np.stack([x, y, x + side, y + side], 1), dtype=torch.float32)


def recipe_config(T: int | None, overrides: list[str]) -> dict:
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    extra = [f"T={T}"] if T is not None else []
    with initialize_config_module(config_module="snntrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=widerface_sew", "paths.output_dir=/tmp/bench_wider",
                                                       *extra, *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(step, steps: int, warmup: int, device: torch.device) -> tuple[float, float | None]:
    """Seconds per step and peak GPU memory (GiB) over the timed steps."""
    for _ in range(warmup):
        step(0)
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for k in range(steps):
        step(k)
    synchronize(device)
    sec = (time.perf_counter() - t0) / steps
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    return sec, peak


def autocast(device: torch.device, precision: str):
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return torch.autocast(device.type, enabled=False)


def train_case(cfg: dict, backend: str, precision: str, batch: int, steps: int, warmup: int,
               device: torch.device, rng: np.random.Generator) -> dict:
    from snntrain.data.detection import collate_detection, make_target
    from snntrain.losses import fcos_loss
    from snntrain.models import build_model

    size = int(cfg["data"]["image_size"])
    torch.manual_seed(0)
    model = build_model(cfg["model"], backend=backend).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = []
    for _ in range(4):  # a few different batches: different numbers of faces
        samples = [(torch.randn(3, size, size), make_target(wider_faces(size, size, rng), i, (size, size)))
                   for i in range(batch)]
        images, t = collate_detection(samples, cfg["data"]["max_boxes"], drop=True)
        batches.append((images.to(device), {k: v.to(device) for k, v in t.items()}))

    def step(k: int) -> None:
        images, t = batches[k % len(batches)]
        with autocast(device, precision):
            out = model(images)
            assigned = model.targets(out, t["boxes"], t["labels"], t["num_boxes"])
            loss = fcos_loss(out, assigned, **cfg["task"]["loss"], backend=backend)["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    sec, peak = timed(step, steps, warmup, device)
    return {"case": "train", "backend": backend, "precision": precision, "batch": batch,
            "shape": [batch, 3, size, size], "T": cfg["T"], "ms_per_step": sec * 1e3, "images_per_s": batch / sec,
            "peak_memory_gib": peak}


def val_case(cfg: dict, backend: str, precision: str, batch: int, steps: int, warmup: int,
             device: torch.device, rng: np.random.Generator, eval_max_side: int | None) -> dict:
    from snntrain.data.detection import boxes_to_original, collate_detection, make_target
    from snntrain.losses import fcos_loss
    from snntrain.models import build_model

    torch.manual_seed(0)
    model = build_model(cfg["model"], backend=backend).to(device).eval()
    batches, shapes = [], []
    for _ in range(max(4, min(steps, 16))):
        samples = []
        for i, (h, w) in enumerate(wider_sizes(batch, rng)):
            boxes = wider_faces(h, w, rng)
            ratio = 1.0 if eval_max_side is None else min(1.0, eval_max_side / max(h, w))
            nh, nw = round(h * ratio), round(w * ratio)
            scale = torch.tensor([nw / w, nh / h])
            samples.append((torch.randn(3, nh, nw), make_target(boxes * scale.repeat(2), i, (h, w), scale,
                                                                torch.zeros(2))))
        images, t = collate_detection(samples, cfg["data"]["max_boxes"], drop=False,
                                      size_divisor=int(cfg["data"]["size_divisor"]))
        shapes.append(list(images.shape))
        batches.append((images.to(device), {k: v.to(device) for k, v in t.items()}))

    @torch.no_grad()
    def step(k: int) -> None:
        images, t = batches[k % len(batches)]
        with autocast(device, precision):
            out = model(images)
            assigned = model.targets(out, t["boxes"], t["labels"], t["num_boxes"])
            fcos_loss(out, assigned, **cfg["task"]["loss"], backend=backend)
        for i, det in enumerate(model.decode(out, image_size=tuple(images.shape[-2:]))):
            boxes_to_original(det["boxes"].float(), t["scale"][i], t["pad"][i], t["orig_size"][i]).cpu()

    sec, peak = timed(step, steps, warmup, device)
    mean_hw = np.mean([s[-2] * s[-1] for s in shapes])
    return {"case": "val", "backend": backend, "precision": precision, "batch": batch,
            "shape": f"padded batches, mean H*W {mean_hw:.0f} (e.g. {shapes[0]})",
            "eval_max_side": eval_max_side, "T": cfg["T"], "ms_per_step": sec * 1e3,
            "images_per_s": batch / sec, "peak_memory_gib": peak}


def transform_case(cfg: dict, rng: np.random.Generator, n: int = 40) -> dict:
    from snntrain.data.detection import SquareCropTransform

    d = cfg["data"]
    aug = SquareCropTransform(d["image_size"], d["crop_scale"], d["hflip"], d["photometric"], d["min_box_size"])
    items = []
    for h, w in wider_sizes(8, rng):
        items.append((torch.from_numpy(rng.integers(0, 255, (3, h, w), dtype=np.uint8)), wider_faces(h, w, rng)))
    torch.manual_seed(0)
    t0 = time.perf_counter()
    for k in range(n):
        img, boxes = items[k % len(items)]
        aug(img, boxes, torch.zeros(boxes.shape[0], dtype=torch.int64))
    sec = (time.perf_counter() - t0) / n
    return {"case": "transform", "backend": "cpu", "precision": "uint8", "batch": 1, "shape": "1024 x H uint8",
            "ms_per_step": sec * 1e3, "images_per_s": 1 / sec, "peak_memory_gib": None}


def wider_eval_case(rng: np.random.Generator, images: int = WIDER_VAL_IMAGES, dets: int = 750) -> dict:
    from snntrain.wider_eval import evaluate

    gts, boxes, scores, keep = [], [], [], {"easy": [], "medium": [], "hard": []}
    for h, w in wider_sizes(images, rng):
        g = wider_faces(h, w, rng).numpy()
        gts.append(g)
        jitter = g[rng.integers(0, len(g), dets)] + rng.normal(0, 4, (dets, 4))
        jitter[:, 2:] = np.maximum(jitter[:, 2:], jitter[:, :2] + 1)
        boxes.append(jitter)
        scores.append(rng.uniform(0, 1, dets))
        for i, level in enumerate(keep):
            keep[level].append(rng.random(len(g)) < 0.3 + 0.3 * i)
    t0 = time.perf_counter()
    evaluate(boxes, scores, gts, keep)
    sec = time.perf_counter() - t0
    return {"case": "wider_eval", "backend": "cpu", "precision": "fp64", "batch": images,
            "shape": f"{images} images x {dets} detections, 3 levels", "ms_per_step": sec * 1e3,
            "images_per_s": images / sec, "peak_memory_gib": None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "bench_results"))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--T", type=int, default=None, help="time steps (default: the preset's, 4)")
    p.add_argument("--batch", type=int, default=None, help="training batch (default: the preset's data.batch_size)")
    p.add_argument("--val-batch", type=int, default=None, help="validation batch (default: as --batch)")
    p.add_argument("--eval-max-side", type=int, default=None, help="cap on the validation images' longer side")
    p.add_argument("--backends", nargs="+", default=["triton", "torch"], choices=["triton", "torch"])
    p.add_argument("--precisions", nargs="+", default=["bf16"], choices=["fp32", "bf16"])
    p.add_argument("--cases", nargs="+", default=["train", "val", "transform", "wider_eval"],
                   choices=["train", "val", "transform", "wider_eval"])
    p.add_argument("--device", default="cuda", help="cuda (timings to report) or cpu (a smoke test)")
    p.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides, e.g. model.width=8")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("this benchmark needs a CUDA GPU (or --device cpu for a smoke test)")
    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    cfg = recipe_config(args.T, args.override)
    batch = args.batch or int(cfg["data"]["batch_size"])
    val_batch = args.val_batch or batch
    rng = np.random.default_rng(0)
    rows: list[dict] = []
    for precision in args.precisions:
        for backend in args.backends:
            if "train" in args.cases:
                rows.append(train_case(cfg, backend, precision, batch, args.steps, args.warmup, device, rng))
                print(rows[-1], flush=True)
            if "val" in args.cases:
                rows.append(val_case(cfg, backend, precision, val_batch, args.steps, args.warmup, device, rng,
                                     args.eval_max_side))
                print(rows[-1], flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if "transform" in args.cases:
        rows.append(transform_case(cfg, rng))
    if "wider_eval" in args.cases:
        rows.append(wider_eval_case(rng))
    every = int(cfg["trainer"]["check_val_every_n_epoch"])
    estimates = []
    for precision in args.precisions:
        for backend in args.backends:
            tr = next((r for r in rows if r["case"] == "train" and r["backend"] == backend
                       and r["precision"] == precision), None)
            va = next((r for r in rows if r["case"] == "val" and r["backend"] == backend
                       and r["precision"] == precision), None)
            if tr and va:
                minutes = (WIDER_TRAIN_IMAGES / tr["images_per_s"] + WIDER_VAL_IMAGES / va["images_per_s"] / every) / 60
                estimates.append({"backend": backend, "precision": precision, "epoch_minutes": minutes,
                                  "val_every_n_epochs": every, "max_epochs": cfg["trainer"]["max_epochs"],
                                  "run_hours": minutes * cfg["trainer"]["max_epochs"] / 60})
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    result = {"gpu": gpu, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "T": cfg["T"]}
    out = Path(args.out)
    bu.write_rows(rows, out, "bench_widerface", gpu=gpu, T=cfg["T"])
    if estimates:
        bu.write_rows(estimates, out, "bench_widerface_estimates", gpu=gpu, T=cfg["T"])
    print(f"\nGPU: {gpu}  torch {torch.__version__}  date {result['date']}  T={cfg['T']}")
    print(f"{'case':10s} {'backend':7s} {'prec':5s} {'batch':>5s} {'ms/step':>9s} {'images/s':>9s} {'peak GiB':>8s}")
    for r in rows:
        peak = "" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.2f}"
        print(f"{r['case']:10s} {r['backend']:7s} {r['precision']:5s} {r['batch']:5d} {r['ms_per_step']:9.1f} "
              f"{r['images_per_s']:9.1f} {peak:>8s}")
    for e in estimates:
        print(f"epoch estimate ({e['backend']}, {e['precision']}): {e['epoch_minutes']:.1f} min per epoch "
              f"(val every {e['val_every_n_epochs']}), {e['run_hours']:.1f} h for {e['max_epochs']} epochs")


if __name__ == "__main__":
    main()
