"""The command line: ``python -m snntrain [group=option ...] [key=value ...]``.

One Hydra app; ``task`` picks what it does (train a classifier or detector, export,
predict, report). :func:`run` does the work for a composed config, so tests and notebooks can
call it with a config from Hydra's compose API.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from .validation import check_time_steps

log = logging.getLogger("snntrain")


def _announce(message: str) -> None:
    log.info(message)


class _NoTips(logging.Filter):
    """Drops Lightning's advertisement for its cloud logger (an INFO record at every Trainer's start)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in str(record.msg)


def quiet_third_party() -> None:
    """Leave out of a run's output what libraries print that is not the user's to act on, each by its own
    message and origin: Lightning's tip to install its cloud logger, and the ``LeafSpec`` deprecation warning
    that Lightning's own pytree helper triggers under newer PyTorch. Other warnings stay."""
    import warnings

    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning, module=r"lightning\.pytorch\.utilities\._pytree")
    tips = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _NoTips) for f in tips.filters):
        tips.addFilter(_NoTips())


def _build_logger(cfg: DictConfig, out: Path):
    from lightning.pytorch.loggers import CSVLogger

    from .callbacks import BatchedTensorBoardLogger

    name = cfg.logger.name
    if name == "tensorboard":
        metrics = list(dict.fromkeys([cfg.task.monitor, "val/loss"]))
        return BatchedTensorBoardLogger(save_dir=str(out), name="tensorboard", version="", default_hp_metric=False,
                                        hparam_metrics=metrics)
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


def build_trainer(**kwargs: Any):
    """``lightning.Trainer(**kwargs)``; a setting Lightning refuses is reported as a ``ValueError`` naming its
    ``trainer.`` key where Lightning's message does not (an unknown one with the nearest Trainer argument)."""
    import inspect

    import lightning as L
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from .errors import closest

    try:
        return L.Trainer(**kwargs)
    except TypeError as err:
        m = re.search(r"unexpected keyword argument '(\w+)'", str(err))
        if m is None:
            raise
        near = closest(m[1], inspect.signature(L.Trainer).parameters)
        raise ValueError(f"trainer.{m[1]} is not a Trainer argument"
                         + (f"; did you mean trainer.{near}?" if near else "")) from err
    except (MisconfigurationException, ValueError) as err:
        raise ValueError(f"trainer settings: {err}") from err


def _is_zero(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value == 0


def refuse_idle_run(trainer: Any, train: bool, ckpt: dict[str, Any] | None = None, ckpt_path: Any = None) -> None:
    """Refuse trainer settings with which a run would do nothing (and exit as if it had worked): no epochs,
    no steps or no batches to train, nothing to validate with ``train=false``, or a checkpoint to resume that
    has already reached ``trainer.max_epochs`` / ``trainer.max_steps``."""
    if not train:
        if _is_zero(trainer.get("limit_val_batches")):
            raise ValueError("trainer.limit_val_batches=0 validates nothing, and train=false only validates; give "
                             "a number of batches >= 1, a fraction in (0, 1], or null for all of them")
        return
    if _is_zero(trainer.get("max_epochs")):
        raise ValueError("trainer.max_epochs=0 trains nothing; give a number of epochs >= 1 (or -1 to train "
                         "until trainer.max_steps)")
    if _is_zero(trainer.get("max_steps")):
        raise ValueError("trainer.max_steps=0 trains nothing; give a number of steps >= 1, or -1 (no limit: "
                         "trainer.max_epochs decides)")
    if _is_zero(trainer.get("limit_train_batches")):
        raise ValueError("trainer.limit_train_batches=0 trains nothing; give a number of batches >= 1, a fraction "
                         "in (0, 1], or null for all of them")
    if ckpt is None:
        return
    progress = ckpt.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current", {})
    epochs, max_epochs = progress.get("processed"), trainer.get("max_epochs")
    if isinstance(epochs, int) and isinstance(max_epochs, int) and 0 < max_epochs <= epochs:
        raise ValueError(f"trainer.max_epochs={max_epochs} is reached already: ckpt_path={ckpt_path} has trained "
                         f"{epochs} epoch(s); give more to continue (trainer.max_epochs={epochs + max_epochs})")
    steps, max_steps = ckpt.get("global_step"), trainer.get("max_steps")
    if isinstance(steps, int) and isinstance(max_steps, int) and 0 < max_steps <= steps:
        raise ValueError(f"trainer.max_steps={max_steps} is reached already: ckpt_path={ckpt_path} has trained "
                         f"{steps} steps; give more to continue, or -1 for no limit")


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

    quiet_third_party()
    check_moved(cfg)
    out = Path(cfg.paths.output_dir)
    benchmark = resolve_cudnn_benchmark(cfg.trainer.get("benchmark", "auto"), cfg.trainer.get("deterministic"))
    task_name = cfg.task.name
    if task_name not in TASKS:
        raise ValueError(f"task={task_name!r} cannot be trained; trainable tasks: {', '.join(TASKS)}")
    ckpt = None
    if cfg.ckpt_path is not None:
        ckpt = read_checkpoint(cfg.ckpt_path)  # fail now, with a clear message, on a bad checkpoint
    elif not cfg.train:
        raise ValueError("train=false validates a checkpoint: give ckpt_path=<file.ckpt>")
    refuse_idle_run(cfg.trainer, bool(cfg.train), ckpt, cfg.ckpt_path)
    del ckpt
    check_time_steps(cfg.data, cfg.model)

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
    trainer = build_trainer(
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
    if cfg.train and checkpoint.best_model_path and checkpoint.best_model_score is not None:
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
                             nir_target=cfg.export.get("nir_target", "spec"),
                             overwrite=cfg.export.get("overwrite", False))
    _announce(f"snntrain: export folder {out.resolve()}: {', '.join(card['files'])} (formats: "
              f"{', '.join(card['formats'])})")
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
                          tile_size=cfg.predict.get("tile_size"), bad_files=cfg.predict.get("bad_files", "error"),
                          polarity=cfg.predict.get("polarity", "auto"))
    _announce(f"snntrain: {len(records)} prediction(s) in {(out / 'predictions.json').resolve()}")
    return records


def report(cfg: DictConfig) -> dict[str, Any]:
    """The efficiency report of ``ckpt_path`` on its validation data (the data section of its config, with
    ``report.data`` replacing keys): ``report.json``, ``report.md`` and the per-layer chart ``report.png`` in
    ``report.dir`` (default ``<run dir>/report``). See :mod:`snntrain.efficiency`."""
    import json

    import torch

    from .backend import resolve_backend
    from .callbacks import FiringRateMonitor
    from .checkpoint import checkpoint_config, read_checkpoint
    from .data import build_datamodule
    from .distributed import uses_cuda
    from .efficiency import chart_png, check_spiking, markdown
    from .fileio import atomic_path
    from .tasks import TASKS
    from .validation import positive_int

    quiet_third_party()
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
    check_time_steps(data, config["model"])
    out = Path(cfg.report.dir) if cfg.report.dir else Path(cfg.paths.output_dir) / "report"
    backend = resolve_backend(cfg.backend.name, cuda=uses_cuda(cfg.trainer))
    _announce(f"snntrain: efficiency report of {cfg.ckpt_path} on data={data['name']} (backend={backend})")
    datamodule = build_datamodule(data, seed=int(config.get("seed", 0)))
    task = TASKS[task_name].load_from_checkpoint(cfg.ckpt_path, backend=backend, weights_only=True)
    check_spiking(task.model)  # a network without snntrain spiking layers is refused, with the reason
    monitor = FiringRateMonitor(histograms=False)
    trainer = build_trainer(accelerator=cfg.trainer.accelerator, devices=1, precision=cfg.trainer.precision,
                            logger=False, callbacks=[monitor], enable_checkpointing=False, limit_val_batches=limit,
                            enable_progress_bar=cfg.trainer.enable_progress_bar, enable_model_summary=False,
                            default_root_dir=str(out.parent))
    trainer.validate(task, datamodule=datamodule, verbose=False)
    if monitor.report is None:
        raise ValueError(f"no validation batch ran for data={data['name']}: nothing to report")
    metrics = {k: float(v) for k, v in sorted(trainer.callback_metrics.items())
               if k.startswith("val/") and torch.is_tensor(v) and v.numel() == 1}
    model = {k: config["model"][k] for k in ("name", "_target_", "variant", "depth", "width", "connect", "stem",
                                             "norm", "T") if k in config["model"]}
    model["neuron"] = dict(config["model"].get("neuron") or {}).get("type")
    model["detector_head"] = config["model"].get("head") is not None
    result = {"checkpoint": str(cfg.ckpt_path), "task": task_name, "data": data["name"], "backend": backend,
              "model": model, "metrics": metrics, "chart": "report.png", **monitor.report}
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "report.png") as tmp:
        tmp.write_bytes(chart_png(result, width=760)[0])
    with atomic_path(out / "report.json") as tmp:
        tmp.write_text(json.dumps(result, indent=2))
    text = markdown(result, title=f"Efficiency report: {task_name}, {Path(str(cfg.ckpt_path)).name}")
    text += "\nPer layer: [report.png](report.png) (synaptic operations and firing rates).\n"
    if metrics:
        text += "\nValidation metrics: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()) + "\n"
    with atomic_path(out / "report.md") as tmp:
        tmp.write_text(text)
    _announce(f"snntrain: efficiency report in {(out / 'report.json').resolve()}, report.md and report.png")
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


# ----------------------------------------------------------------------------- the command line and its failures

_FULL_ERROR = "HYDRA_FULL_ERROR"
#: main() has Hydra re-raise what it catches (HYDRA_FULL_ERROR=1 while Hydra runs) and words failures itself;
#: the user's own setting (or --debug) is kept here and restored for the job and the processes it starts.
_reraising = {"on": False, "user": None}

#: What a run folder holds that is not worth keeping once the run failed: Hydra's record, the logs, the resolved
#: config and the logger's files (a run that saved a checkpoint, or wrote results, keeps its folder).
_BOOKKEEPING = re.compile(r"^(\.hydra/.*|[^/]+\.log|config\.yaml|(tensorboard|csv)/.*)$")


class _Reported(Exception):
    """A job's failure, already reported: a sweep runs its other jobs, then the command line exits with 1."""


def _traceback_wanted() -> bool:
    value = _reraising["user"] if _reraising["on"] else os.environ.get(_FULL_ERROR)
    return value == "1"


@contextlib.contextmanager
def _user_environment() -> Iterator[None]:
    """The job, and the processes it starts (DDP), see HYDRA_FULL_ERROR as the user set it."""
    if not _reraising["on"]:
        yield
        return
    _set_env(_FULL_ERROR, _reraising["user"])
    try:
        yield
    finally:
        os.environ[_FULL_ERROR] = "1"


def _set_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def _shown(path: Path) -> str:
    """``path`` relative to the working folder when it lies inside it, else absolute."""
    path = path.absolute()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _log_files(out: Path) -> list[Path]:
    """The log files this job writes in ``out`` (Hydra's job log, ``cli.log``)."""
    files = [Path(h.baseFilename) for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    return [f for f in files if f.parent.resolve() == out.resolve()]


def _own_run_folder(out: Path) -> bool:
    """Whether ``out`` is this run's own folder: named by Hydra's pattern (no ``hydra.run.dir`` or
    ``hydra.sweep.dir`` given), in the process that writes the run files, and holding nothing yet but
    Hydra's record and the log. Only such a folder is ever removed."""
    from hydra.core.hydra_config import HydraConfig

    from .distributed import is_rank_zero

    if not HydraConfig.initialized() or not is_rank_zero():
        return False
    given = {o.lstrip("+~").split("=")[0] for o in HydraConfig.get().overrides.hydra}
    if given & {"hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir"}:
        return False
    return all(p.name == ".hydra" or p.suffix == ".log" for p in out.iterdir())


def _after_failure(out: Path, own: bool) -> str:
    """Where the failed run's log is. A run folder of the run's own that holds nothing worth keeping (no
    checkpoint, no result: see ``_BOOKKEEPING``) is removed, its log kept beside it as ``<folder>.failed.log``."""
    logs = _log_files(out)
    worth_keeping = any(p.is_file() and not _BOOKKEEPING.match(p.relative_to(out).as_posix()) for p in out.rglob("*"))
    if not own or worth_keeping or not out.is_dir() or any(out.glob("cli_rank*.log")):  # DDP: others log there
        return f"the run's log: {_shown(logs[0])}" if logs else f"the run folder: {_shown(out)}"
    kept = out.with_name(f"{out.name}.failed.log")
    if logs:
        os.replace(logs[0], kept)  # the log handler keeps writing to the moved file
    shutil.rmtree(out, ignore_errors=True)
    return ("nothing was saved, so the run folder is removed"
            + (f"; its log: {_shown(kept)}" if logs else ""))


def _log_failure(message: str, err: BaseException) -> None:
    """The failure and its traceback into the run's log file (only: the console gets the short message)."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, f"snntrain: error: {message}", None,
                            (type(err), err, err.__traceback__))
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _job_failed(err: Exception, cfg: DictConfig, out: Path, own: bool) -> BaseException:
    """Report a job's failure: a user error as one message (:mod:`snntrain.errors`), anything else, or anything
    under ``--debug`` / ``HYDRA_FULL_ERROR=1``, with its traceback; then where the log is. Returns what to raise:
    an exit with code 1 or, in a sweep, :class:`_Reported` (the sweep's other jobs run first)."""
    import sys
    import traceback

    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from .errors import describe, is_user_error

    user = is_user_error(err)
    message = describe(err, cfg) if user else f"{type(err).__name__}: {err}"
    _log_failure(message, err)
    where = _after_failure(out, own)
    if _traceback_wanted() or not user:
        traceback.print_exception(err)
    if user:
        print("snntrain: error: " + message.replace("\n", "\n  "), file=sys.stderr)
    hint = "" if _traceback_wanted() or not user else " (--debug shows the traceback)"
    print(f"snntrain: {where}{hint}", file=sys.stderr, flush=True)
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return _Reported(message)
    return SystemExit(1)


@hydra.main(version_base="1.3", config_path="pkg://snntrain.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> Any:
    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    own = _own_run_folder(out)
    _announce(f"snntrain: run directory {out.resolve()}")
    with _user_environment():
        try:
            result = run(cfg)
        except Exception as err:
            raise _job_failed(err, cfg, out, own) from err
    _announce(f"snntrain: run directory {out.resolve()}")
    return result


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
    job (same overrides, same run directory); see :func:`snntrain.distributed.command_line`.

    A user error ends the command with one message and exit code 1 (:mod:`snntrain.errors`); ``--debug`` or
    ``HYDRA_FULL_ERROR=1`` shows its traceback too."""
    import sys
    import traceback

    from .config_keys import upgrade_overrides
    from .distributed import command_line
    from .errors import describe, is_user_error

    args = target_overrides(sys.argv[1:])
    if "--debug" in args:
        args = [a for a in args if a != "--debug"]
        os.environ[_FULL_ERROR] = "1"  # also for the processes the run starts
    args, notes = upgrade_overrides(args)  # keys that moved keep working on the command line
    for note in notes:
        print(f"snntrain: {note}", file=sys.stderr)
    sys.argv = command_line([sys.argv[0], *args])
    _reraising.update(on=True, user=os.environ.get(_FULL_ERROR))
    os.environ[_FULL_ERROR] = "1"
    try:
        return _hydra_main()
    except _Reported:
        raise SystemExit(1) from None
    except Exception as err:  # before any job ran: composing the config, parsing an override, --cfg
        if not is_user_error(err):
            raise
        if _traceback_wanted():
            traceback.print_exception(err)
        print("snntrain: error: " + describe(err).replace("\n", "\n  "), file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        _set_env(_FULL_ERROR, _reraising["user"])
        _reraising.update(on=False, user=None)
