"""The command line: ``python -m snntrain [group=option ...] [key=value ...]``.

One Hydra app; ``task`` picks what it does (train a classifier or detector, export,
predict, report). :func:`run` does the work for a composed config, so tests and notebooks can
call it with a config from Hydra's compose API.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger("snntrain")


def _announce(message: str) -> None:
    log.info(message)


def _build_logger(cfg: DictConfig, out: Path):
    from lightning.pytorch.loggers import CSVLogger

    from .callbacks import BatchedTensorBoardLogger

    name = cfg.logger.name
    if name == "tensorboard":
        return BatchedTensorBoardLogger(save_dir=str(out), name="tensorboard", version="", default_hp_metric=False)
    if name == "csv":
        return CSVLogger(save_dir=str(out), name="csv", version="")
    if name == "none":
        return False
    raise ValueError(f"logger.name={name!r} is not valid; choose one of tensorboard, csv, none")


def _save_config(config: dict[str, Any], path: Path) -> None:
    from .fileio import atomic_path

    with atomic_path(path) as tmp:
        tmp.write_text(OmegaConf.to_yaml(OmegaConf.create(config)))


def resolved_config(cfg: DictConfig) -> dict[str, Any]:
    """The run config as plain Python values (what checkpoints and exports store)."""
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


def train(cfg: DictConfig, callbacks: list | None = None) -> dict[str, float]:
    """Fit (or, with ``train=false``, validate) the task's model; returns the final metrics.

    ``callbacks``: Lightning callbacks to add to the run's own (scripts/profile_step.py adds one)."""
    import lightning as L
    import torch

    from .backend import resolve_backend
    from .callbacks import (
        AtomicCheckpointIO,
        ExactResume,
        ExponentialMovingAverage,
        FiringRateMonitor,
        IntervalCheckpoint,
        PreciseBatchNorm,
        ProgressBar,
        RunCheckpoint,
        TrainingSpeedMonitor,
    )
    from .checkpoint import read_checkpoint
    from .config_keys import check_moved
    from .data import build_datamodule
    from .distributed import SyncBatchNorm, ddp_job, ddp_strategy, defer_sigterm_check, is_rank_zero, uses_cuda
    from .tasks import TASKS
    from .tasks.speed import resolve_cudnn_benchmark

    check_moved(cfg)
    out = Path(cfg.paths.output_dir)
    benchmark = resolve_cudnn_benchmark(cfg.trainer.get("benchmark", "auto"), cfg.trainer.get("deterministic"))
    task_name = cfg.task.name
    if task_name not in TASKS:
        raise ValueError(f"task={task_name!r} cannot be trained; trainable tasks: {', '.join(TASKS)}")
    if cfg.ckpt_path is not None:
        read_checkpoint(cfg.ckpt_path)  # fail now, with a clear message, on a bad checkpoint
    elif not cfg.train:
        raise ValueError("train=false validates a checkpoint: give ckpt_path=<file.ckpt>")

    L.seed_everything(cfg.seed, workers=True)
    backend = resolve_backend(cfg.backend.name, cuda=uses_cuda(cfg.trainer))
    _announce(f"snntrain: backend={cfg.backend.name} -> {backend}, T={cfg.T}")

    datamodule = build_datamodule(cfg.data, seed=cfg.seed)
    with open_dict(cfg):
        if "num_classes" in cfg.data and cfg.data.num_classes is None:
            cfg.data.num_classes = datamodule.num_classes
        if "classes" not in cfg.data and hasattr(datamodule, "classes"):
            cfg.data.classes = list(datamodule.classes)
        cfg.backend.resolved = backend
    config = resolved_config(cfg)
    if is_rank_zero():  # with DDP every process runs this; the run files are written once
        _save_config(config, out / "config.yaml")

    task_cls = TASKS[task_name]
    task = task_cls(config, backend=backend)
    monitor, mode = cfg.task.monitor, cfg.task.monitor_mode
    checkpoint = RunCheckpoint(
        dirpath=out / "checkpoints",
        filename="epoch{epoch:03d}-step{step:06d}",
        auto_insert_metric_name=False,
        monitor=monitor,
        mode=mode,
        save_top_k=1,
        save_last=True,
        enable_version_counter=False,  # last.ckpt is shared with IntervalCheckpoint: overwrite, never last-v1
    )
    run_callbacks = [checkpoint, FiringRateMonitor(efficiency=bool(cfg.callbacks.get("efficiency", True))),
                     TrainingSpeedMonitor(), ExactResume()]
    # The average first: it takes in a step before IntervalCheckpoint saves that step, and it is swapped
    # in before PreciseBatchNorm re-estimates the statistics (for the averaged weights).
    settings = cfg.callbacks
    if settings.ema.enabled:
        run_callbacks.append(ExponentialMovingAverage(decay=settings.ema.decay))
    run_callbacks.append(IntervalCheckpoint(out / "checkpoints", every_n_steps=settings.checkpoint.every_n_steps,
                                            every_n_minutes=settings.checkpoint.every_n_minutes))
    if settings.precise_bn.enabled:
        run_callbacks.append(PreciseBatchNorm(num_batches=settings.precise_bn.num_batches))
    if cfg.trainer.get("enable_progress_bar", True):
        run_callbacks.append(ProgressBar())  # redrawn twice a second, not every step (each redraw waits)
    run_callbacks += list(callbacks or [])
    logger = _build_logger(cfg, out)
    trainer_kwargs = OmegaConf.to_container(cfg.trainer, resolve=True)
    trainer_kwargs["strategy"] = ddp_strategy(trainer_kwargs, trainer_kwargs.pop("ddp", None))
    trainer_kwargs["benchmark"] = benchmark
    plugins = [AtomicCheckpointIO()]
    if trainer_kwargs.get("sync_batchnorm"):
        plugins.append(SyncBatchNorm())
    trainer = L.Trainer(
        **trainer_kwargs,
        default_root_dir=str(out),
        logger=logger,
        callbacks=run_callbacks,
        plugins=plugins,
    )
    defer_sigterm_check(trainer)  # no host synchronisation per training step under DDP
    with ddp_job(out):  # with devices x num_nodes > 1, Lightning starts the other processes in here
        if cfg.train:
            try:
                trainer.fit(task, datamodule=datamodule, ckpt_path=cfg.ckpt_path)
            finally:  # a fit that failed did not reach on_train_end: the graph goes before the process group
                task.release_step_graph()
        else:
            task = task_cls.load_from_checkpoint(cfg.ckpt_path, backend=backend, weights_only=True)
            trainer.validate(task, datamodule=datamodule)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if torch.is_tensor(v) and v.numel() == 1}
    shown = {k: round(v, 4) for k, v in sorted(metrics.items()) if k.startswith("val/")}
    _announce(f"snntrain: final metrics {shown}")
    if cfg.train and checkpoint.best_model_path:
        _announce(f"snntrain: best {monitor}={float(checkpoint.best_model_score):.4f} at {checkpoint.best_model_path}")
    return metrics


def export(cfg: DictConfig) -> dict[str, Any]:
    """Export ``ckpt_path`` into ``export.dir`` (default ``<run dir>/export``)."""
    from .export import export_checkpoint

    if cfg.ckpt_path is None:
        raise ValueError("task=export needs ckpt_path=<file.ckpt>")
    out = Path(cfg.export.dir) if cfg.export.dir else Path(cfg.paths.output_dir) / "export"
    _announce(f"snntrain: exporting {cfg.ckpt_path} to {out.resolve()}")
    card = export_checkpoint(cfg.ckpt_path, out, formats=list(cfg.export.formats), backend=cfg.backend.name,
                             opset=int(cfg.export.opset), nir_dt=cfg.export.get("nir_dt"),
                             nir_target=cfg.export.get("nir_target", "spec"))
    _announce(f"snntrain: export written to {out.resolve()}: {', '.join(card['files'])}")
    return card


def predict(cfg: DictConfig) -> list[dict[str, Any]]:
    """Predict ``input`` (an image or a folder) with ``ckpt_path`` (a checkpoint or an export folder)."""
    from .predict import predict as run_predict

    if cfg.ckpt_path is None:
        raise ValueError("task=predict needs ckpt_path=<file.ckpt or export folder>")
    out = Path(cfg.predict.output_dir) if cfg.predict.output_dir else Path(cfg.paths.output_dir) / "predictions"
    _announce(f"snntrain: predicting {cfg.input} with {cfg.ckpt_path} into {out.resolve()}")
    records = run_predict(cfg.ckpt_path, cfg.input, out, backend=cfg.backend.name,
                          batch_size=int(cfg.predict.batch_size), score_thresh=cfg.predict.score_thresh,
                          draw=bool(cfg.predict.draw), max_side=cfg.predict.get("max_side"),
                          scales=OmegaConf.to_object(cfg.predict).get("scales", "auto"),
                          tile_size=cfg.predict.get("tile_size"))
    _announce(f"snntrain: {len(records)} prediction(s) in {(out / 'predictions.json').resolve()}")
    return records


def report(cfg: DictConfig) -> dict[str, Any]:
    """The efficiency report of ``ckpt_path`` on its validation data (the data section of its config, with
    ``report.data`` replacing keys): ``report.json`` and ``report.md`` in ``report.dir`` (default
    ``<run dir>/report``). See :mod:`snntrain.efficiency`."""
    import json

    import lightning as L
    import torch

    from .backend import resolve_backend
    from .callbacks import FiringRateMonitor
    from .checkpoint import checkpoint_config, read_checkpoint
    from .data import build_datamodule
    from .distributed import uses_cuda
    from .efficiency import check_spiking, markdown
    from .fileio import atomic_path
    from .tasks import TASKS
    from .validation import positive_int

    if cfg.ckpt_path is None:
        raise ValueError("task=report needs ckpt_path=<file.ckpt>")
    ckpt = read_checkpoint(cfg.ckpt_path)
    config = checkpoint_config(ckpt)
    task_name = config["task"]["name"]
    if task_name not in TASKS:
        raise ValueError(f"{cfg.ckpt_path} holds a task={task_name!r} model; reports cover {', '.join(TASKS)}")
    limit = cfg.report.limit_batches
    limit = 1.0 if limit is None else positive_int("report.limit_batches", limit)
    data = {**config["data"], **OmegaConf.to_container(cfg.report.data, resolve=True)}
    out = Path(cfg.report.dir) if cfg.report.dir else Path(cfg.paths.output_dir) / "report"
    backend = resolve_backend(cfg.backend.name, cuda=uses_cuda(cfg.trainer))
    _announce(f"snntrain: efficiency report of {cfg.ckpt_path} on data={data['name']} (backend={backend})")
    datamodule = build_datamodule(data, seed=int(config.get("seed", 0)))
    task = TASKS[task_name].load_from_checkpoint(cfg.ckpt_path, backend=backend, weights_only=True)
    check_spiking(task.model)  # a network without snntrain spiking layers is refused, with the reason
    monitor = FiringRateMonitor(histograms=False)
    trainer = L.Trainer(accelerator=cfg.trainer.accelerator, devices=1, precision=cfg.trainer.precision,
                        logger=False, callbacks=[monitor], enable_checkpointing=False, limit_val_batches=limit,
                        enable_progress_bar=cfg.trainer.enable_progress_bar, enable_model_summary=False,
                        default_root_dir=str(out.parent))
    trainer.validate(task, datamodule=datamodule, verbose=False)
    if monitor.report is None:
        raise RuntimeError(f"no validation batch ran for data={data['name']}: nothing to report")
    metrics = {k: float(v) for k, v in sorted(trainer.callback_metrics.items())
               if k.startswith("val/") and torch.is_tensor(v) and v.numel() == 1}
    model = {k: config["model"][k] for k in ("name", "_target_", "variant", "depth", "width", "connect", "stem",
                                             "norm", "T") if k in config["model"]}
    model["neuron"] = dict(config["model"].get("neuron") or {}).get("type")
    model["detector_head"] = config["model"].get("head") is not None
    result = {"checkpoint": str(cfg.ckpt_path), "task": task_name, "data": data["name"], "backend": backend,
              "model": model, "metrics": metrics, **monitor.report}
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "report.json") as tmp:
        tmp.write_text(json.dumps(result, indent=2))
    text = markdown(result, title=f"Efficiency report: {task_name}, {Path(str(cfg.ckpt_path)).name}")
    if metrics:
        text += "\nValidation metrics: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()) + "\n"
    with atomic_path(out / "report.md") as tmp:
        tmp.write_text(text)
    _announce(f"snntrain: efficiency report in {(out / 'report.json').resolve()} and report.md")
    return result


def run(cfg: DictConfig) -> Any:
    """Dispatch on ``cfg.task.name``: classify / detect train; export, predict and report use a checkpoint."""
    name = cfg.task.name
    if name in ("classify", "detect"):
        metrics = train(cfg)
        return metrics.get(cfg.task.monitor)
    if name == "export":
        return export(cfg)
    if name == "predict":
        return predict(cfg)
    if name == "report":
        return report(cfg)
    raise ValueError(f"task={name!r} is not valid; choose one of classify, detect, export, predict, report")


@hydra.main(version_base="1.3", config_path="pkg://snntrain.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> Any:
    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    _announce(f"snntrain: run directory {out.resolve()}")
    try:
        return run(cfg)
    finally:
        _announce(f"snntrain: run directory {out.resolve()}")


def target_overrides(args: list[str]) -> list[str]:
    """Hydra's convention for one's own network on the command line: ``model._target_=package.Class`` (with or
    without ``+``) picks ``model=custom`` (``conf/model/custom.yaml``, where ``_target_`` is a key) unless a
    ``model=`` option is given too."""
    import re

    targets = {i for i, a in enumerate(args) if re.match(r"^\+{0,2}model\._target_=", a)}
    if not targets:
        return list(args)
    out = [a.lstrip("+") if i in targets else a for i, a in enumerate(args)]
    return out if any(a.startswith("model=") for a in args) else ["model=custom", *out]


def main() -> Any:
    """``python -m snntrain`` / ``snntrain``. A process that Lightning starts for DDP runs its parent's
    job (same overrides, same run directory); see :func:`snntrain.distributed.command_line`."""
    import sys

    from .config_keys import upgrade_overrides
    from .distributed import command_line

    args, notes = upgrade_overrides(target_overrides(sys.argv[1:]))  # keys that moved keep working
    for note in notes:
        print(f"snntrain: {note}", file=sys.stderr)
    sys.argv = command_line([sys.argv[0], *args])
    return _hydra_main()
