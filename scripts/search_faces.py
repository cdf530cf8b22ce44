"""Search training recipes of the face detector on both of its yardsticks: the synthetic validation split and
the real photographs of ``scripts/real_faces.py``.

Each variant is a full ``python -m snntrain task=detect`` run (the defaults plus its overrides, see
:data:`VARIANTS`), several at a time (``--jobs``), one run directory each under ``--out``; each run's
``last.ckpt`` (what ``task=predict`` uses) is also copied to ``--out/<variant>-s<seed>.ckpt`` (run
directories and logs go to ``--runs-dir``, by default ``--out/runs``). Then every
checkpoint is scored on the annotated photographs with the default image pyramid at the predict threshold
(``--score-thresh``): faces found, boxes elsewhere per photo, AP@0.5 (see ``real_faces.py``). Photos are
looked for in ``--photos-dir`` (copies by file name) and then in the installed packages; those found nowhere
are skipped and named. ``--score-only`` skips training and scores the checkpoints already in ``--out``
(e.g. on a CPU machine with the photos, after the GPU trained them).

    python scripts/search_faces.py --out DIR [--runs-dir DIR] [--jobs 7] [--seeds 42] [--only NAME,...]
        [--photos-dir DIR] [--score-only] [-- COMMON OVERRIDES]

On a GPU machine add ``-- backend=triton``. Prints a table and writes ``DIR/search_faces.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: name -> overrides on the defaults of ``task=detect``
VARIANTS = {
    "default": [],
    "clutter13": ["data.clutter_per_image=[1,3]"],
    "clutter25": ["data.clutter_per_image=[2,5]"],
    "clutter13_faces15": ["data.clutter_per_image=[1,3]", "data.faces_per_image=[1,5]"],
    "clutter13_sizes856": ["data.clutter_per_image=[1,3]", "data.face_size=[8,56]"],
    "clutter25_distract13": ["data.clutter_per_image=[2,5]", "data.distractors_per_image=[1,3]"],
    "clutter13_square96": ["data.clutter_per_image=[1,3]", "data.image_size=96", "data.face_size=[12,64]"],
    "clutter25_distract13_square96": ["data.clutter_per_image=[2,5]", "data.distractors_per_image=[1,3]",
                                      "data.image_size=96", "data.face_size=[12,64]"],
    # four times the scenes and 14 epochs (9 by default): minutes on a GPU, where the training set stays on the device
    "long": ["data.num_train=8000", "trainer.max_epochs=14"],
    "long_clutter25_distract13": ["data.num_train=8000", "trainer.max_epochs=14", "data.clutter_per_image=[2,5]",
                                  "data.distractors_per_image=[1,3]"],
    "long_clutter25_distract13_square96": ["data.num_train=8000", "trainer.max_epochs=14",
                                           "data.clutter_per_image=[2,5]", "data.distractors_per_image=[1,3]",
                                           "data.image_size=96", "data.face_size=[12,64]"],
    "long_clutter36_distract24_square96": ["data.num_train=8000", "trainer.max_epochs=14",
                                           "data.clutter_per_image=[3,6]", "data.distractors_per_image=[2,4]",
                                           "data.image_size=96", "data.face_size=[12,64]"],
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


def train(name: str, seed: int, out: Path, runs: Path, common: list[str], threads: int) -> dict:
    run = f"{name}-s{seed}"
    run_dir = runs / run
    cmd = [sys.executable, "-m", "snntrain", "task=detect", "logger=csv", f"seed={seed}", f"hydra.run.dir={run_dir}",
           "trainer.enable_progress_bar=false", *VARIANTS[name], *common]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    start = time.time()
    with open(runs / f"{run}.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    if rc == 0 and ckpt.exists():
        shutil.copyfile(ckpt, out / f"{run}.ckpt")
    return {"run": run, "name": name, "seed": seed, "overrides": VARIANTS[name], "rc": rc,
            "seconds": round(time.time() - start, 1), "val": last_metrics(run_dir)}


def main() -> None:
    argv = sys.argv[1:]
    common = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "search_faces"))
    p.add_argument("--jobs", type=int, default=7)
    p.add_argument("--threads", type=int, default=2, help="CPU threads per training run")
    p.add_argument("--seeds", default="42")
    p.add_argument("--only", default=None, help="comma-separated variant names (default: all)")
    p.add_argument("--score-thresh", type=float, default=0.5)
    p.add_argument("--photos-dir", type=Path, default=None)
    p.add_argument("--score-only", action="store_true", help="score the checkpoints already in --out")
    p.add_argument("--runs-dir", type=Path, default=None, help="run directories and logs (default: --out/runs)")
    args = p.parse_args(argv)
    names = list(VARIANTS) if args.only is None else args.only.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; valid: {', '.join(VARIANTS)}")
    out = Path(args.out)
    runs = args.runs_dir or out / "runs"
    out.mkdir(parents=True, exist_ok=True)
    runs.mkdir(parents=True, exist_ok=True)
    report = out / "search_faces.json"
    if args.score_only:
        results = json.loads(report.read_text())["results"] if report.exists() else [
            {"run": c.stem, "name": c.stem.rsplit("-s", 1)[0], "seed": c.stem.rsplit("-s", 1)[1], "rc": 0, "val": {},
             "seconds": 0.0} for c in sorted(out.glob("*.ckpt"))]
    else:
        jobs = [(n, int(s)) for s in args.seeds.split(",") for n in names]
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(lambda j: train(*j, out, runs, common, args.threads), jobs))

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch

    from real_faces import evaluate_photos, load_photos
    from snntrain.predict import load_model

    photos, missing = load_photos(folder=args.photos_dir)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for r in results:
        ckpt = out / f"{r['run']}.ckpt"
        if not ckpt.exists() or not photos:
            continue
        model = load_model(ckpt, "torch").to(device).eval()
        real = evaluate_photos(model, photos, args.score_thresh, "auto")
        r["real"] = {k: real[k] for k in ("faces", "found", "recall", "elsewhere", "ap50")}
        r["real"]["per_photo"] = {row["photo"]: [row["found"], row["faces"], row["elsewhere"]]
                                  for row in real["photos"]}
    report.write_text(json.dumps({"common": common, "skipped_photos": missing, "results": results}, indent=2))
    print(f"photos not found: {missing}" if missing else "photos: all found")
    print("| variant | seed | s | val mAP@0.5 | mAP@[.5:.95] | real: found | elsewhere per photo | AP@0.5 |")
    print("|---|---|---|---|---|---|---|---|")
    nan = float("nan")
    for r in results:
        v, real = r["val"], r.get("real")
        per = ", ".join(f"{k} {e}" for k, (_, _, e) in real["per_photo"].items()) if real else ""
        print(f"| {r['name']} | {r['seed']} | {r['seconds']:.0f} | {v.get('val/map_50', nan):.3f} | "
              f"{v.get('val/map', nan):.3f} | "
              + (f"{real['found']}/{real['faces']} | {per} | {real['ap50']:.3f} |" if real else f"rc {r['rc']} | | |"))


if __name__ == "__main__":
    main()
