"""Search training recipes of the face detector on both of its yardsticks: the synthetic validation split and
the real photographs of ``scripts/real_faces.py``.

Each variant is a full ``python -m snntrain task=detect`` run (the defaults plus its overrides), several at a
time (``--jobs``), one run directory each under ``--out``. When a run ends, its last checkpoint (what
``task=predict`` uses) is scored on the annotated photographs, with the default image pyramid at the predict
threshold (``--score-thresh``): faces found, boxes elsewhere per photo, AP@0.5 (see ``real_faces.py``). Photos
whose package is not installed are skipped and named; without any, only the synthetic numbers are given and
the checkpoints can be scored later with ``real_faces.py``.

    python scripts/search_faces.py --out DIR [--jobs 6] [--seeds 42] [--only NAME,...] [-- COMMON OVERRIDES]

On a GPU machine add ``-- backend=triton``. Prints a table and writes ``DIR/search_faces.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: name -> overrides on the defaults of ``task=detect``
VARIANTS = {
    "default": [],
    "clutter_1_3": ["data.clutter_per_image=[1,3]"],
    "clutter_2_5": ["data.clutter_per_image=[2,5]"],
    "clutter_1_3_faces_1_5": ["data.clutter_per_image=[1,3]", "data.faces_per_image=[1,5]"],
    "clutter_1_3_sizes_8_56": ["data.clutter_per_image=[1,3]", "data.face_size=[8,56]"],
    "clutter_1_3_distractors_1_3": ["data.clutter_per_image=[1,3]", "data.distractors_per_image=[1,3]"],
}


def last_metrics(run_dir: Path) -> dict[str, float]:
    """The last logged value of each ``val/`` metric of a run (its CSV logger)."""
    files = sorted(run_dir.glob("csv/**/metrics.csv"))
    if not files:
        return {}
    values: dict[str, float] = {}
    with open(files[-1]) as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                if key.startswith("val/") and value not in ("", None):
                    values[key] = float(value)
    return values


def train(name: str, overrides: list[str], seed: int, out: Path, common: list[str]) -> dict:
    run_dir = out / f"{name}-s{seed}"
    cmd = [sys.executable, "-m", "snntrain", "task=detect", "logger=csv", f"seed={seed}",
           f"hydra.run.dir={run_dir}", "trainer.enable_progress_bar=false", *overrides, *common]
    start = time.time()
    with open(out / f"{name}-s{seed}.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    return {"name": name, "seed": seed, "overrides": overrides, "rc": rc, "seconds": round(time.time() - start, 1),
            "run_dir": str(run_dir), "val": last_metrics(run_dir)}


def main() -> None:
    argv = sys.argv[1:]
    common = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "search_faces"))
    p.add_argument("--jobs", type=int, default=6)
    p.add_argument("--seeds", default="42")
    p.add_argument("--only", default=None, help="comma-separated variant names (default: all)")
    p.add_argument("--score-thresh", type=float, default=0.5)
    args = p.parse_args(argv)
    names = list(VARIANTS) if args.only is None else args.only.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; valid: {', '.join(VARIANTS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(n, VARIANTS[n], int(s)) for s in args.seeds.split(",") for n in names]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda j: train(*j, out, common), jobs))

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch

    from real_faces import evaluate_photos, load_photos
    from snntrain.predict import load_model

    photos, missing = load_photos()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for r in results:
        ckpt = Path(r["run_dir"]) / "checkpoints" / "last.ckpt"
        if r["rc"] != 0 or not ckpt.exists() or not photos:
            continue
        model = load_model(ckpt, "torch").to(device).eval()
        real = evaluate_photos(model, photos, args.score_thresh, "auto")
        r["real"] = {k: real[k] for k in ("faces", "found", "recall", "elsewhere", "ap50")}
        r["real"]["per_photo"] = {row["photo"]: [row["found"], row["faces"], row["elsewhere"]] for row in real["photos"]}
    (out / "search_faces.json").write_text(json.dumps({"common": common, "skipped_photos": missing,
                                                        "results": results}, indent=2))
    print(f"photos not installed: {missing}" if missing else "photos: all installed")
    print("| variant | seed | s | val mAP@0.5 | mAP@[.5:.95] | real: found | elsewhere (per photo) | AP@0.5 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        v, real = r["val"], r.get("real")
        per = ", ".join(f"{k} {e}" for k, (_, _, e) in real["per_photo"].items()) if real else ""
        print(f"| {r['name']} | {r['seed']} | {r['seconds']:.0f} | {v.get('val/map_50', float('nan')):.3f} | "
              f"{v.get('val/map', float('nan')):.3f} | "
              + (f"{real['found']}/{real['faces']} | {per} | {real['ap50']:.3f} |" if real else f"rc {r['rc']} | | |"))


if __name__ == "__main__":
    main()
