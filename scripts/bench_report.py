"""Validation time with and without the efficiency report, for the default classifier and detector.

One fit per task, whose validations (one per epoch, after a few training steps, as in any run) rotate through
three monitors:

* ``none``: no monitor at all;
* ``firing-rates``: ``FiringRateMonitor(efficiency=False)``: firing rates and per-channel histograms only
  (what every run logged before the report);
* ``report``: ``FiringRateMonitor()``: the same plus synaptic operations, sparsity, energy estimates and the
  per-layer chart (the default of every run now, ``efficiency=true``).

Each validation is timed from ``on_validation_start`` to ``on_validation_end`` with the device synchronised
at both ends, so hook registration, the end-of-epoch report (its one synchronisation, the collective, the
TensorBoard histograms and chart) are inside the window. The first round of the three is a warm-up (Triton
compilation, cuDNN autotuning, data caches) and is not counted. The model, its device, the loaders and their
processes stay the same for every validation, as in a run. Models are freshly initialised unless
``--ckpt task=path`` gives weights; the counting does not depend on training except through the spike density.

    python scripts/bench_report.py --out DIR [--tasks classify detect] [--repeats 8] [--batches N]
        [--train-batches 2] [--ckpt classify=<file.ckpt>] [-- key=value ...]     # Hydra overrides for both tasks

Prints a table and writes ``bench_report.csv`` and ``bench_report.jsonl`` into ``--out`` (the schema of
``scripts/bench_utils.write_rows``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import tempfile
from pathlib import Path

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_utils as bu  # noqa: E402

VARIANTS = ("none", "firing-rates", "report")


class Rotation(L.Callback):
    """Runs the monitors of the epoch's variant (``VARIANTS[epoch % 3]``) and times every validation of the fit
    (device synchronised at both ends), per variant."""

    def __init__(self, monitors: dict[str, list]) -> None:
        self.monitors = monitors
        self.seconds: dict[str, list[float]] = {v: [] for v in monitors}
        self._start = 0.0

    @staticmethod
    def variant(trainer) -> str:
        return VARIANTS[trainer.current_epoch % len(VARIANTS)]

    def on_validation_start(self, trainer, pl_module) -> None:
        from snntrain.callbacks import synchronized_clock

        self._start = synchronized_clock(trainer)

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        for monitor in self.monitors[self.variant(trainer)]:
            monitor.on_validation_epoch_start(trainer, pl_module)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        for monitor in self.monitors[self.variant(trainer)]:
            monitor.on_validation_epoch_end(trainer, pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        from snntrain.callbacks import synchronized_clock

        self.seconds[self.variant(trainer)].append(synchronized_clock(trainer) - self._start)

    def on_exception(self, trainer, pl_module, exception) -> None:
        for monitors in self.monitors.values():
            for monitor in monitors:
                monitor.on_exception(trainer, pl_module, exception)


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


def fit(cfg, task, datamodule, rotation: Rotation, rounds: int, batches, train_batches: int, logdir: Path) -> None:
    try:  # the run's logger
        from snntrain.callbacks import BatchedTensorBoardLogger
    except ImportError:  # versions before it (timed for comparison): Lightning's
        from lightning.pytorch.loggers import TensorBoardLogger as BatchedTensorBoardLogger

    trainer = L.Trainer(accelerator=cfg.trainer.accelerator, devices=1, precision=cfg.trainer.precision,
                        max_epochs=rounds * len(VARIANTS), limit_train_batches=train_batches,
                        limit_val_batches=batches if batches else 1.0, num_sanity_val_steps=0,
                        logger=BatchedTensorBoardLogger(str(logdir), name="bench"), callbacks=[rotation],
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(task, datamodule=datamodule)


def main() -> None:
    argv = sys.argv[1:]
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_results", help="folder for bench_report.csv / .jsonl")
    p.add_argument("--tasks", nargs="+", default=["classify", "detect"], choices=["classify", "detect"])
    p.add_argument("--repeats", type=int, default=8, help="timed validations per variant (after one warm-up)")
    p.add_argument("--batches", type=int, default=None, help="validation batches per run (default: all)")
    p.add_argument("--ckpt", nargs="*", default=[], help="task=checkpoint: trained weights for that task")
    p.add_argument("--train-batches", type=int, default=2, help="training steps before each validation")
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
            # one monitor per variant for all its validations, as one monitor serves every validation of a fit
            rotation = Rotation({"none": [], "firing-rates": [FiringRateMonitor(efficiency=False)],
                                 "report": [FiringRateMonitor()]})
            fit(cfg, task, datamodule, rotation, args.repeats + 1, args.batches, args.train_batches,
                Path(tmp) / "tb")
            clocks = rotation.seconds
            base = {v: statistics.median(clocks[v][1:]) for v in VARIANTS}
            for v in VARIANTS:
                times = clocks[v][1:]
                paired = statistics.median(t / n - 1 for t, n in zip(times, clocks["none"][1:]))  # same round
                rows.append({"task": task_name, "variant": v, "median_s": base[v], "min_s": min(times),
                             "runs": len(times), "vs_none": base[v] / base["none"] - 1, "vs_none_paired": paired,
                             "vs_firing_rates": base[v] / base["firing-rates"] - 1, "backend": backend,
                             "precision": str(cfg.trainer.precision), "batches": args.batches or "all",
                             "weights": ckpts.get(task_name, "initial"), "device": gpu,
                             "date": dt.date.today().isoformat(), "overrides": " ".join(overrides)})
            del task, datamodule
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    print(f"\nvalidation time per run on {gpu} (median of {args.repeats}; overhead = median / median - 1; "
          "paired: median over rounds of the ratio to that round's validation without a monitor)")
    print(f"{'task':10s} {'variant':14s} {'median s':>10s} {'min s':>10s} {'vs none':>9s} {'paired':>9s} "
          f"{'vs rates':>9s}")
    for row in rows:
        print(f"{row['task']:10s} {row['variant']:14s} {row['median_s']:10.4f} {row['min_s']:10.4f} "
              f"{row['vs_none']:+9.1%} {row['vs_none_paired']:+9.1%} {row['vs_firing_rates']:+9.1%}")
    csv_path, jsonl_path = bu.write_rows(rows, out, "bench_report")
    print(f"written {csv_path} and {jsonl_path}")


if __name__ == "__main__":
    main()
