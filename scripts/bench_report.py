"""Validation time with and without the efficiency report, for the default classifier and detector.

The same model, data and Lightning validation loop run under three monitors:

* ``none``: no monitor at all;
* ``firing-rates``: ``FiringRateMonitor(efficiency=False)``: firing rates and per-channel histograms only
  (what every run logged before the report);
* ``report``: ``FiringRateMonitor()``: the same plus synaptic operations, sparsity, energy estimates and the
  per-layer chart (the default of every run now, ``efficiency=true``).

Each validation is timed from ``on_validation_start`` to ``on_validation_end`` with the device synchronised
at both ends, so hook registration, the end-of-epoch report (its one synchronisation, the collective, the
TensorBoard histograms and chart) are inside the window; the variants alternate (rotated order) after one
untimed warm-up validation each (Triton compilation, cuDNN autotuning, data caches). Models are freshly
initialised unless ``--ckpt task=path`` gives weights; the counting does not depend on training except
through the spike density.

    python scripts/bench_report.py --out DIR [--tasks classify detect] [--repeats 8] [--batches N]
        [--ckpt classify=<file.ckpt>] [-- key=value ...]     # Hydra overrides for both tasks

Prints a table and writes ``bench_report.csv`` and ``bench_report.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import statistics
import sys
import tempfile
from pathlib import Path

import lightning as L
import torch

VARIANTS = ("none", "firing-rates", "report")


class Clock(L.Callback):
    """Seconds of every validation run, from ``on_validation_start`` to ``on_validation_end`` (synchronised)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._start = 0.0

    def on_validation_start(self, trainer, pl_module) -> None:
        from snntrain.callbacks import synchronized_clock

        self._start = synchronized_clock(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        from snntrain.callbacks import synchronized_clock

        self.seconds.append(synchronized_clock(trainer) - self._start)


def build(task_name: str, overrides: list[str], ckpt: str | None, out: Path):
    from hydra import compose, initialize_config_module
    from omegaconf import open_dict

    from snntrain.backend import resolve_backend
    from snntrain.cli import resolved_config
    from snntrain.data import build_datamodule
    from snntrain.distributed import uses_cuda
    from snntrain.tasks import TASKS

    with initialize_config_module(config_module="snntrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"task={task_name}", *overrides, f"paths.output_dir={out}"])
    backend = resolve_backend(cfg.backend.name, cuda=uses_cuda(cfg.trainer))
    datamodule = build_datamodule(cfg.data, seed=cfg.seed)
    with open_dict(cfg):
        cfg.backend.resolved = backend
    if ckpt:
        task = TASKS[task_name].load_from_checkpoint(ckpt, backend=backend, weights_only=True)
    else:
        L.seed_everything(cfg.seed)
        task = TASKS[task_name](resolved_config(cfg), backend=backend)
    return cfg, backend, datamodule, task


def validate(cfg, task, datamodule, variant: str, clock: Clock, monitors: list, batches, logdir: Path) -> None:
    from snntrain.callbacks import BatchedTensorBoardLogger  # the run's logger

    trainer = L.Trainer(accelerator=cfg.trainer.accelerator, devices=1, precision=cfg.trainer.precision,
                        logger=BatchedTensorBoardLogger(str(logdir), name=variant), callbacks=[clock, *monitors],
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=batches if batches else 1.0)
    trainer.validate(task, datamodule=datamodule, verbose=False)


def main() -> None:
    argv = sys.argv[1:]
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_results", help="folder for bench_report.csv / .json")
    p.add_argument("--tasks", nargs="+", default=["classify", "detect"], choices=["classify", "detect"])
    p.add_argument("--repeats", type=int, default=8, help="timed validations per variant (after one warm-up)")
    p.add_argument("--batches", type=int, default=None, help="validation batches per run (default: all)")
    p.add_argument("--ckpt", nargs="*", default=[], help="task=checkpoint: trained weights for that task")
    args = p.parse_args(argv)
    from snntrain.callbacks import FiringRateMonitor

    ckpts = dict(item.split("=", 1) for item in args.ckpt)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for task_name in args.tasks:
            cfg, backend, datamodule, task = build(task_name, overrides, ckpts.get(task_name), Path(tmp) / task_name)
            clocks = {v: Clock() for v in VARIANTS}
            # one monitor per variant for all its runs, as one monitor serves every validation of a fit
            monitors = {"none": [], "firing-rates": [FiringRateMonitor(efficiency=False)],
                        "report": [FiringRateMonitor()]}
            for r in range(args.repeats + 1):
                order = VARIANTS[r % 3:] + VARIANTS[: r % 3]
                for variant in order:
                    validate(cfg, task, datamodule, variant, clocks[variant], monitors[variant], args.batches,
                             Path(tmp) / "tb")
            base = {v: statistics.median(clocks[v].seconds[1:]) for v in VARIANTS}
            for v in VARIANTS:
                times = clocks[v].seconds[1:]
                rows.append({"task": task_name, "variant": v, "median_s": base[v], "min_s": min(times),
                             "runs": len(times), "vs_none": base[v] / base["none"] - 1,
                             "vs_firing_rates": base[v] / base["firing-rates"] - 1, "backend": backend,
                             "precision": str(cfg.trainer.precision), "batches": args.batches or "all",
                             "weights": ckpts.get(task_name, "initial"), "device": gpu,
                             "date": dt.date.today().isoformat(), "overrides": " ".join(overrides)})
            del task, datamodule
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    print(f"\nvalidation time per run on {gpu} (median of {args.repeats}; overhead = median / median - 1)")
    print(f"{'task':10s} {'variant':14s} {'median s':>10s} {'min s':>10s} {'vs none':>9s} {'vs rates':>9s}")
    for row in rows:
        print(f"{row['task']:10s} {row['variant']:14s} {row['median_s']:10.4f} {row['min_s']:10.4f} "
              f"{row['vs_none']:+9.1%} {row['vs_firing_rates']:+9.1%}")
    with open(out / "bench_report.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "bench_report.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    print(f"written {out / 'bench_report.csv'} and bench_report.json")


if __name__ == "__main__":
    main()
