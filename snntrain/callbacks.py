"""Lightning callbacks and checkpoint I/O used by the CLI."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar, WeightAveraging
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

from .fileio import atomic_path

log = logging.getLogger("snntrain")


class FiringRateMonitor(L.Callback):
    """Logs every spiking layer's firing rate and the efficiency report over each validation epoch.

    Scalars ``firing_rate/<layer>`` (fraction of neuron-steps that spiked) and
    ``firing_rate/mean`` (over all layers), and, with TensorBoard, a histogram
    ``firing_rate_per_channel/<layer>`` of the rates of the layer's channels (dim 2 of
    ``[T, B, C, ...]``). With ``efficiency`` (the default) the same hooks also count synaptic
    operations (:mod:`snntrain.efficiency`, NeuroBench's rules) and the epoch logs the totals per
    sample, ``efficiency/Effective_ACs``, ``efficiency/Effective_MACs``, ``efficiency/Dense``,
    ``efficiency/ActivationSparsity`` and the energy estimates ``efficiency/<model>_uJ`` with the
    same network as an ANN beside them (``efficiency/ann_<model>_uJ``), plus, with TensorBoard, a
    per-layer chart (image ``efficiency/per_layer``). The report is kept as :attr:`report` and
    written into every checkpoint saved after it (``checkpoint["efficiency"]``), from which
    exports take it into their model card.

    Counts stay on the device until the epoch ends; with several processes (DDP) every count is
    added over all of them in one collective before dividing, so every process logs the values
    of the whole validation set, and rank 0 writes the histograms and the chart.
    """

    def __init__(self, histograms: bool = True, efficiency: bool = True) -> None:
        self.histograms = histograms
        self.efficiency = efficiency
        self._counter = None
        self._refused = None  # the model whose lack of spiking layers was reported
        self.report: dict[str, Any] | None = None

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from .efficiency import ActivityCounter, NotSpiking, check_spiking

        self._detach()
        if trainer.sanity_checking:
            return
        model = getattr(pl_module, "model", pl_module)
        backend = getattr(pl_module, "backend", "auto")
        if self._counter is None or self._counter.model is not model or self._counter.backend != backend:
            try:
                check_spiking(model)
            except NotSpiking as err:  # nothing to count: said once, and the run goes on without the report
                if self._refused is not model:
                    self._refused = model
                    log.warning("snntrain: no firing rates or efficiency report for this run: %s", err)
                self._counter = None
                return
            self._counter = ActivityCounter(model, backend=backend, connections=self.efficiency)
        self._counter.attach()

    def _detach(self) -> None:
        if self._counter is not None:
            self._counter.detach()

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from .efficiency import build_report, chart_png

        self._detach()
        counter = self._counter
        flat = None if counter is None or trainer.sanity_checking else counter.totals()
        if flat is None:
            return
        # every process ran the same layers in the same order: one collective adds all counts, so every
        # process has the values of the whole validation set
        totals = counter.unpack(trainer.strategy.reduce(flat, reduce_op="sum"))
        tb = next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)
        draw = tb is not None and trainer.is_global_zero
        metrics: dict[str, float] = {}
        total_spikes, total_count = 0.0, 0.0
        histograms = {}
        for name, layer in totals["spiking"].items():
            # a layer's rate is its spikes over its neuron-steps (the mean of its channels' rates)
            metrics[f"firing_rate/{name}"] = layer["spikes"] / layer["neuron_steps"] if layer["neuron_steps"] else 0.0
            total_spikes += layer["spikes"]
            total_count += layer["neuron_steps"]
            if self.histograms and draw and layer["neuron_steps"]:
                spikes = layer["channel_spikes"]
                histograms[f"firing_rate_per_channel/{name}"] = spikes / (layer["neuron_steps"] / spikes.numel())
        if total_count:
            metrics["firing_rate/mean"] = total_spikes / total_count
        if histograms:
            add_histograms(tb.experiment, histograms, trainer.global_step)
        if self.efficiency:
            report = build_report(totals, counter.static_metrics())
            report["global_step"] = trainer.global_step
            workload = report["workload"]
            for key, value in workload["SynapticOperations"].items():
                metrics[f"efficiency/{key}"] = value
            metrics["efficiency/ActivationSparsity"] = workload["ActivationSparsity"]
            for e in report["energy"]:
                metrics[f"efficiency/{e['model']}_uJ"] = e["snn_uJ"]
                metrics[f"efficiency/ann_{e['model']}_uJ"] = e["ann_uJ"]
            if draw:
                add_png(tb.experiment, "efficiency/per_layer", *chart_png(report), trainer.global_step)
            self.report = report
        publish(trainer, metrics)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if self.report is not None:
            checkpoint["efficiency"] = self.report

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._detach()


def add_histograms(writer: Any, histograms: Mapping[str, torch.Tensor], step: int, bins: int = 30) -> None:
    """Write a histogram summary of each small CPU tensor of ``histograms`` (tag -> values) to a
    ``SummaryWriter``, all as one event: ``bins`` equal buckets from each tensor's minimum to its maximum,
    bucketed as ``numpy.histogram`` does. The statistics of all tensors come from a handful of vectorised
    operations over their concatenation (about 25 us a histogram, where ``add_histogram`` takes about 0.5 ms
    and writes an event each)."""
    import numpy as np
    from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary

    if not histograms:
        return
    arrays = [values.numpy(force=True).astype(np.float64, copy=False).ravel() for values in histograms.values()]
    sizes = np.array([a.size for a in arrays])
    if (sizes == 0).any():
        raise ValueError(f"empty values for histograms {[t for t, n in zip(histograms, sizes) if n == 0]}")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    v = np.concatenate(arrays)
    seg = np.repeat(np.arange(len(arrays)), sizes)
    lo, hi = np.minimum.reduceat(v, starts), np.maximum.reduceat(v, starts)
    top = np.where(hi > lo, hi, lo + 1.0)
    edges = lo[:, None] + (top - lo)[:, None] * (np.arange(bins + 1) / bins)  # numpy.linspace's, last = top
    edges[:, -1] = top
    idx = ((v - lo[seg]) * (bins / (top - lo))[seg]).astype(np.int64)  # numpy.histogram's, then its corrections
    idx[idx == bins] = bins - 1
    idx -= v < edges[seg, idx]
    idx += (v >= edges[seg, idx + 1]) & (idx != bins - 1)
    counts = np.bincount(seg * bins + idx, minlength=len(arrays) * bins).reshape(len(arrays), bins)
    sums, squares = np.add.reduceat(v, starts), np.add.reduceat(v * v, starts)
    _write_summary(writer, step, [Summary.Value(tag=tag, histo=HistogramProto(
        min=float(lo[i]), max=float(hi[i]), num=int(sizes[i]), sum=float(sums[i]), sum_squares=float(squares[i]),
        bucket_limit=edges[i, 1:].tolist(), bucket=counts[i].tolist())) for i, tag in enumerate(histograms)])


def add_png(writer: Any, tag: str, png: bytes, height: int, width: int, step: int) -> None:
    """Write an encoded PNG as an image summary of a ``SummaryWriter`` (what ``add_image`` writes, without its
    float conversion and RGB re-encoding of an array)."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    _write_summary(writer, step, [Summary.Value(tag=tag, image=Summary.Image(
        height=height, width=width, colorspace=3, encoded_image_string=png))])


def fast_record_checksums() -> bool:
    """Make TensorBoard's event files checksum their records with ``google-crc32c`` (C) instead of the CRC32C in
    pure Python that TensorBoard uses without TensorFlow: the same checksums, about a thousand times faster. The
    pure-Python one takes about 0.1 us a byte (1.4 ms for a 12 KB event, the per-layer chart several times that)
    on the writer's thread, holding the interpreter lock the training loop needs. Returns whether it is on."""
    try:
        import google_crc32c
        from tensorboard.summary.writer import record_writer
    except ImportError:
        return False
    if getattr(record_writer.masked_crc32c, "native", False):
        return True
    if google_crc32c.implementation != "c":
        return False

    def masked_crc32c(data: bytes) -> int:
        x = google_crc32c.value(data)
        return (((x >> 15) | ((x << 17) & 0xFFFFFFFF)) + 0xA282EAD8) & 0xFFFFFFFF

    masked_crc32c.native = True  # type: ignore[attr-defined]
    record_writer.masked_crc32c = masked_crc32c
    return True


class BatchedTensorBoardLogger(TensorBoardLogger):
    """Lightning's ``TensorBoardLogger`` that writes the scalars of one ``log_metrics`` call as one event (one
    summary holding every value), where Lightning's writes an event per value through ``add_scalar`` (about
    0.1 ms each on a 2-core CPU: 4 ms for the 40 values of a validation with the efficiency report, against
    0.25 ms as one event). TensorBoard reads both the same way; dict values still go through ``add_scalars``.
    Its records are checksummed in C (:func:`fast_record_checksums`).

    The run's config goes to TensorBoard's HPARAMS dashboard (one value per key, ``model.depth``, ...) beside
    ``hparams.yaml``, with ``hparam_metrics`` (the logged scalars it shows in the table, e.g. ``val/acc``)."""

    def __init__(self, *args: Any, hparam_metrics: Sequence[str] = (), **kwargs: Any) -> None:
        fast_record_checksums()
        super().__init__(*args, **kwargs)
        self.hparam_metrics = tuple(hparam_metrics)

    @rank_zero_only
    def log_hyperparams(self, params: Any, metrics: Any = None) -> None:
        super().log_hyperparams(params, metrics)  # hparams.yaml
        if metrics is not None or not self.hparam_metrics:
            return
        from torch.utils.tensorboard.summary import hparams

        params = dict(params)
        config = params.pop("config", None)
        flat = {**hparam_values(config if isinstance(config, Mapping) else {}), **hparam_values(params)}
        # the metrics' values are the run's own scalars of those tags: none is written here
        writer = self.experiment._get_file_writer()
        for summary in hparams(flat, dict.fromkeys(self.hparam_metrics, 0.0)):
            writer.add_summary(summary)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        from lightning.fabric.utilities.logger import _add_prefix
        from tensorboard.compat.proto.summary_pb2 import Summary

        values, nested = [], {}
        for k, v in _add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items():
            if isinstance(v, dict):
                nested[k] = v
                continue
            try:
                values.append(Summary.Value(tag=k, simple_value=float(v.item() if torch.is_tensor(v) else v)))
            except (TypeError, ValueError, RuntimeError) as ex:
                raise ValueError(f"metric {k}={v!r} cannot be logged: log a number, a one-element tensor or a "
                                 "dict of them") from ex
        if values:
            _write_summary(self.experiment, step, values)
        for k, v in nested.items():
            self.experiment.add_scalars(k, v, step)


def hparam_values(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as TensorBoard hyper-parameters: dotted keys, each value a number, a bool or a string
    (lists and null as their YAML text)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(hparam_values(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = "null" if value is None else str(list(value) if isinstance(value, tuple) else value)
    return out


def _write_summary(writer: Any, step: int, values: list) -> None:
    """Summary values (``Summary.Value``: scalars, histograms, images) into a ``SummaryWriter``'s event file as one
    event."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    writer._get_file_writer().add_summary(Summary(value=values), step)


class ProgressBar(TQDMProgressBar):
    """Lightning's progress bar, redrawn at most every ``interval`` seconds (and at the end of each loop).

    Every redraw reads the logged values (``train/loss_step``, ...) back from the device, which waits for
    all the work queued on it; redrawn every step, as Lightning's bar is by default, that wait stops the
    host from running ahead of the device once per step. For the same reason the tasks log no step value
    with ``prog_bar=True`` (Lightning converts those to numbers after every step, bar or no bar): the
    :data:`STEP_VALUES` are read from the logged values here, at a redraw.
    """

    #: Step values shown in the bar (their latest logged value), read only when the bar is redrawn.
    STEP_VALUES = ("train/loss_step",)

    def __init__(self, interval: float = 0.5) -> None:
        from .validation import number

        interval = number("progress bar interval", interval)
        if interval < 0:
            raise ValueError(f"progress bar interval={interval!r} must be >= 0 seconds")
        super().__init__(refresh_rate=1)
        self.interval = interval
        self._last_draw = float("-inf")

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        for key in self.STEP_VALUES:
            value = trainer.callback_metrics.get(key)
            if value is not None and key not in items:
                items[key.split("/")[-1].removesuffix("_step")] = float(value)
        return items

    def _should_update(self, current: int, total: int | float) -> bool:
        import time

        if not self.is_enabled:
            return False
        now = time.monotonic()
        if current == total or now - self._last_draw >= self.interval:
            self._last_draw = now
            return True
        return False


class RunCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` (the best checkpoints by the monitored metric, and ``last.ckpt``),
    with ``last.ckpt`` rewritten after every validation of a fit: Lightning 2.6 rewrites it only when a
    best checkpoint was saved at the same step, which would leave a resumable run's ``last.ckpt`` behind
    the run whenever the metric did not improve."""

    def _save_last_if_missed(self, trainer: L.Trainer) -> None:
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):  # skipped: saved at this step
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_missed(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_missed(trainer)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint under a temporary name and renames it when complete."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        with atomic_path(path) as tmp:
            super().save_checkpoint(checkpoint, tmp, storage_options)


def log_position(trainer: L.Trainer) -> tuple[int, int]:
    """``(step, epoch)``: the step Lightning writes logged values at now, and the current epoch."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped, trainer.current_epoch


def publish(trainer: L.Trainer, metrics: dict[str, float], epoch: bool = False,
            at: tuple[int, int] | None = None) -> None:
    """Values that every process already holds (a validation's, or this process's training step values), written
    as LearningRateMonitor writes its own: to every logger (rank 0) at the step Lightning logs at, with the
    ``epoch`` as Lightning adds it to step values when ``epoch``, and into ``trainer.callback_metrics``. Not
    through ``LightningModule.log``, which builds, moves and reduces a metric object per key (about a
    millisecond each, dozens of keys per validation) and reads each value back from the device on its own.
    ``at``: the ``(step, epoch)`` the values belong to (:func:`log_position` when they were made), for values
    written later than that; by default the trainer's position now."""
    if not metrics:
        return
    if trainer.is_global_zero:
        step, current_epoch = at if at is not None else log_position(trainer)
        row = {**metrics, "epoch": current_epoch} if epoch else metrics
        for logger in trainer.loggers:
            logger.log_metrics(row, step=step)
    trainer.callback_metrics.update({k: torch.tensor(float(v)) for k, v in metrics.items()})


def batch_size(batch: Any) -> int:
    """The number of samples in a batch ``(inputs, targets)`` or ``inputs``: inputs ``[B, C, H, W]``, or
    time-first ``[T, B, C, H, W]`` (event frames)."""
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    if not torch.is_tensor(first):
        return 0
    return int(first.shape[1] if first.dim() == 5 else first.shape[0])


def synchronized_clock(trainer: L.Trainer) -> float:
    """``time.perf_counter()`` once the trainer's device has finished the work queued so far."""
    import time

    device = trainer.strategy.root_device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class TrainingSpeedMonitor(L.Callback):
    """Logs ``perf/train_images_per_s``: training images per second over all processes, each epoch.

    The window runs from the end of the epoch's ``warmup_steps``-th training step to the end of its
    last, with the device synchronised at those two points only, so the steps in between run as they
    always do; start-up, the first steps (compilation, autotuning, allocator growth) and validation
    fall outside it. With DDP the images of all processes are added and divided by the longest
    process's window. Nothing is logged for an epoch of ``warmup_steps`` steps or fewer.
    """

    def __init__(self, warmup_steps: int = 5) -> None:
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 1:
            raise ValueError(f"warmup_steps={warmup_steps!r} must be an integer >= 1")
        self.warmup_steps = warmup_steps
        self._steps = self._images = 0
        self._start: float | None = None
        self._seconds: float | None = None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._steps = self._images = 0
        self._start = self._seconds = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._steps += 1
        if self._steps == self.warmup_steps:
            self._start = synchronized_clock(trainer)
        elif self._start is not None:
            self._images += batch_size(batch)
            if batch_idx + 1 >= trainer.num_training_batches:  # the epoch's last step: stop before validation
                self._seconds = synchronized_clock(trainer) - self._start

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._start is None or self._images == 0:
            return
        if self._seconds is None:  # the loader ended before num_training_batches (an iterable of unknown length)
            self._seconds = synchronized_clock(trainer) - self._start
        device = pl_module.device
        images = trainer.strategy.reduce(torch.tensor(float(self._images), dtype=torch.float64, device=device),
                                         reduce_op="sum")
        seconds = trainer.strategy.reduce(torch.tensor(self._seconds, dtype=torch.float64, device=device),
                                          reduce_op="max")
        # the same value on every process; sync_dist (a mean of equal values) only tells Lightning so
        pl_module.log("perf/train_images_per_s", (images / seconds).float(), on_epoch=True, sync_dist=True,
                      batch_size=1)
# ------------------------------------------------------------------------------------ batch-norm statistics


def running_stat_modules(module: torch.nn.Module) -> list[torch.nn.Module]:
    """Every sub-module that keeps batch-norm running statistics: instances of torch's ``_BatchNorm``,
    and any other module (a fused norm->neuron layer, for example) that exposes ``running_mean``,
    ``running_var``, ``momentum`` and ``reset_running_stats()`` with the same meaning."""
    found = []
    for m in module.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            tracked = m.track_running_stats and m.running_mean is not None
        else:
            tracked = (all(torch.is_tensor(getattr(m, k, None)) for k in ("running_mean", "running_var"))
                       and hasattr(m, "momentum") and callable(getattr(m, "reset_running_stats", None)))
        if tracked:
            found.append(m)
    return found


@torch.no_grad()
def recompute_batchnorm(model: torch.nn.Module, batches, forward=None) -> int:
    """Replace the running statistics of every batch-norm layer of ``model`` (see
    :func:`running_stat_modules`) by their equal-weight average over ``batches``.

    Each layer is reset and run with ``momentum=None`` (a cumulative average: after ``k`` batches the
    running mean is the mean of the ``k`` batch means, and likewise the unbiased variances), the model
    in training mode and without gradients; momentum and every module's training flag are restored
    afterwards. ``forward(batch)`` runs the model on one batch (default ``model(batch)``). Returns the
    number of batches used; with none, the statistics are left as they were.
    """
    layers = running_stat_modules(model)
    if not layers:
        return 0
    iterator = iter(batches)
    try:
        first = next(iterator)
    except StopIteration:
        return 0
    modes = {m: m.training for m in model.modules()}
    momenta = {m: m.momentum for m in layers}
    forward = forward or model
    count = 0
    try:
        for m in layers:
            m.reset_running_stats()
            m.momentum = None
        model.train()
        for batch in _chain(first, iterator):
            forward(batch)
            count += 1
    finally:
        for m, momentum in momenta.items():
            m.momentum = momentum
        for m, mode in modes.items():
            m.training = mode
    return count


def _chain(first, rest):
    yield first
    yield from rest


class PreciseBatchNorm(L.Callback):
    """Re-estimates batch-norm running statistics from ``num_batches`` training batches (at most the
    trainer's batches per epoch) before every validation of a fit, and at the end of an epoch whose
    weights changed since (for the epoch-end checkpoint when no validation ran).

    During training each batch-norm layer keeps an exponential average (momentum 0.1) of batch
    statistics taken while the weights moved; after a short run it is still close to its initial
    value (variance 1) and the validated network barely spikes. This callback replaces those
    statistics by the cumulative average over a fixed set of training batches at the current
    weights (like detectron2's PreciseBN hook and ``torch.optim.swa_utils.update_bn``), so
    validation, the checkpoints written after it and the exports made from them see statistics that
    match the weights. The batches come from a fresh training loader with the training transforms
    (the distribution the statistics were meant to track) and a fixed order per epoch, drawn without
    touching the training loader's position or any global random state. With several processes each
    one reads ``num_batches`` batches of its own share of the data and the statistics are then
    averaged over the processes (every process has the same number of batches), so every process,
    and the checkpoint, holds the average over all of them.
    """

    def __init__(self, num_batches: int = 50) -> None:
        from .validation import positive_int

        self.num_batches = positive_int("precise_bn.num_batches", num_batches)
        self._fresh_step: int | None = None
        self.last_count = 0

    def _loader(self, trainer: L.Trainer, pl_module: L.LightningModule):
        source = trainer.datamodule if trainer.datamodule is not None else pl_module
        loader = source.train_dataloader()
        if hasattr(loader, "sampler") and hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(trainer.current_epoch)
        return loader

    def recompute(self, trainer: L.Trainer, pl_module: L.LightningModule) -> int:
        from itertools import islice

        from lightning.pytorch.utilities.seed import isolate_rng

        loader = self._loader(trainer, pl_module)
        device = pl_module.device

        def forward(batch) -> None:
            # the trainer's own transfer: the datamodule's hooks too (data=image_folder decodes there)
            batch = trainer.strategy.batch_to_device(batch, device)
            x = batch[0] if isinstance(batch, (tuple, list)) else batch
            with trainer.precision_plugin.forward_context():
                pl_module(x)

        with isolate_rng():
            limit = min(self.num_batches, trainer.num_training_batches)  # limit_train_batches caps it too
            self.last_count = recompute_batchnorm(pl_module, islice(loader, limit), forward)
        if trainer.world_size > 1:
            self._average_over_processes(trainer, pl_module)
        self._fresh_step = trainer.global_step
        return self.last_count

    @staticmethod
    def _average_over_processes(trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        stats = [t for m in running_stat_modules(pl_module) for t in (m.running_mean, m.running_var)
                 if t is not None]
        if not stats:
            return
        flat = torch.cat([t.detach().float().flatten() for t in stats])
        flat = trainer.strategy.reduce(flat, reduce_op="mean")
        for t, part in zip(stats, flat.split([t.numel() for t in stats])):
            t.copy_(part.view_as(t))

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        if self._fresh_step != trainer.global_step:
            self.recompute(trainer, pl_module)  # leaves every module in the mode validation set

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._fresh_step != trainer.global_step:
            self.recompute(trainer, pl_module)


# ------------------------------------------------------------------------------------ weight average


def ema_decay(decay: float, num_averaged: int) -> float:
    """The decay of the ``num_averaged``-th update: ``min(decay, (1 + n) / (10 + n))``. Early updates
    weigh the new weights more, so the average does not carry the initial weights for thousands
    of steps (the warm-up of timm's ``ModelEmaV2`` and of YOLOX)."""
    return min(decay, (1.0 + num_averaged) / (10.0 + num_averaged))


def _match_layout(averaged: list[torch.Tensor], current: list[torch.Tensor]) -> None:
    """Give the average's parameters and buffers the memory layout of the model's, in place (``.data``,
    values unchanged).

    The average is copied from the model before the task turns its convolutions channels-last (and a
    compiled training step may turn them back): with different strides ``torch._foreach_lerp_`` leaves
    its multi-tensor path and updates tensor by tensor, a kernel launch per parameter and buffer."""
    for a, c in zip(averaged, current):
        if a.stride() != c.stride():
            a.data = torch.empty_like(c, dtype=a.dtype, device=a.device).copy_(a)


class ExponentialMovingAverage(WeightAveraging):
    """An exponential moving average of the weights and buffers (batch-norm statistics), updated
    after every optimizer step with ``decay`` (warmed up by :func:`ema_decay`).

    Validation runs on the average, and every checkpoint's ``state_dict`` holds it (the training
    weights go to ``current_model_state`` for resuming, Lightning's ``WeightAveraging`` format), so
    exports and predictions from a checkpoint use the average; the model holds it after the fit.
    The average is swapped in at ``on_validation_start``, before :class:`PreciseBatchNorm` (which
    must come after this callback in the trainer's list) re-estimates the batch-norm statistics,
    so the statistics fit the averaged weights; and :class:`IntervalCheckpoint` must come after it
    too, so that a checkpoint written at the end of a step holds the average with that step in it.
    """

    def __init__(self, decay: float = 0.999) -> None:
        from .validation import number

        value = number("ema.decay", decay)
        if not 0.0 < value < 1.0:
            raise ValueError(f"ema.decay={decay!r} must be in (0, 1), e.g. 0.999 (the weight of the old average)")
        self.decay = value
        super().__init__(use_buffers=True, multi_avg_fn=self._update)

    def _update(self, averaged: list[torch.Tensor], current: list[torch.Tensor], num_averaged: int) -> None:
        weight = 1.0 - ema_decay(self.decay, int(num_averaged))
        floats = [(a, c) for a, c in zip(averaged, current) if a.is_floating_point()]
        if floats:
            torch._foreach_lerp_([a for a, _ in floats], [c for _, c in floats], weight)
        counters = [(a, c) for a, c in zip(averaged, current) if not a.is_floating_point()]
        if counters:  # counters (num_batches_tracked): the current value
            torch._foreach_copy_([a for a, _ in counters], [c for _, c in counters])

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._num_updates: int | None = None  # read from the average model's counter once, when first needed
        self._pairs = None

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        super().on_load_checkpoint(trainer, pl_module, checkpoint)
        self._num_updates = None
        self._pairs = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # Lightning's update (AveragedModel.update_parameters) tests its device-side update counter twice
        # per step, and each test waits for the device; this one counts on the host as well.
        if trainer.global_step > self._latest_update_step and self.should_update(step_idx=trainer.global_step - 1):
            self._update_average(pl_module)
            self._latest_update_step = trainer.global_step

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self._pairs = None  # the tensors are looked up again at the epoch's first update

    def _tensor_pairs(self, pl_module: L.LightningModule) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The average's parameters and buffers and the model's, in the same order and memory layout: looked up
        at the first update of every epoch and kept for its other steps (walking the module tree costs the
        host about a millisecond per step). Within an epoch the tensors stay the same objects: layouts change
        (channels-last at setup, NCHW at the first compiled step) before the first update, and swapping the
        average in for validation copies values, not tensors."""
        import itertools

        pairs = getattr(self, "_pairs", None)
        if pairs is None:
            model = self._average_model
            averaged = list(itertools.chain(model.module.parameters(), model.module.buffers()))
            current = list(itertools.chain(pl_module.parameters(), pl_module.buffers()))
            _match_layout(averaged, current)
            pairs = self._pairs = (averaged, current)
        return pairs

    @torch.no_grad()
    def _update_average(self, pl_module: L.LightningModule) -> None:
        model = self._average_model
        if getattr(self, "_num_updates", None) is None:
            self._num_updates = int(model.n_averaged)  # once per fit (or resume): the checkpoint's count
        # the tensors themselves (no_grad allows in-place updates of parameters): a detached view each would
        # cost the host a few microseconds per tensor and step
        averaged, current = self._tensor_pairs(pl_module)
        if self._num_updates == 0:
            for a, c in zip(averaged, current):
                a.copy_(c)
        else:
            self._update(averaged, current, self._num_updates)
        model.n_averaged.add_(1)
        self._num_updates += 1

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._average_model is not None:
            self._swap_models(pl_module)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pass  # swapped in at on_validation_start, before the batch-norm statistics are re-estimated


# ------------------------------------------------------------------------------------ checkpoints, resume


class IntervalCheckpoint(L.Callback):
    """Writes ``<dirpath>/last.ckpt`` inside an epoch every ``every_n_steps`` optimizer steps and/or
    every ``every_n_minutes`` of training, so a crash loses at most that much work.

    Each save goes through the trainer's checkpoint I/O (atomic: a temporary name, then a rename)
    and holds everything a resume needs: weights, optimizer, schedule, loop progress, the training
    loader's position and random states. The last batch of an epoch is left to the epoch-end
    checkpoint. Intervals count from the last checkpoint of any kind. ``None`` disables a trigger. With
    several processes the clock is consulted every :attr:`CLOCK_CHECK_STEPS` optimizer steps (the processes
    must agree, which costs a collective), so a time-triggered save may come that many steps late.
    """

    #: With several processes, how often (in optimizer steps) the processes agree on the clock.
    CLOCK_CHECK_STEPS = 32

    def __init__(self, dirpath, every_n_steps: int | None = None, every_n_minutes: float | None = None) -> None:
        from pathlib import Path

        from .validation import number, positive_int

        self.dirpath = Path(dirpath)
        self.every_n_steps = None if every_n_steps is None else positive_int("checkpoint.every_n_steps", every_n_steps)
        if every_n_minutes is not None:
            every_n_minutes = number("checkpoint.every_n_minutes", every_n_minutes)
            if every_n_minutes <= 0:
                raise ValueError(f"checkpoint.every_n_minutes={every_n_minutes!r} must be > 0 (or null: off)")
        self.every_n_minutes = every_n_minutes
        self._last_step = 0
        self._last_time = 0.0

    @property
    def path(self):
        return self.dirpath / "last.ckpt"

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        import time

        self._last_step = trainer.global_step
        self._last_time = time.monotonic()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        import time

        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch or trainer.sanity_checking:
            return
        due = self.every_n_steps is not None and trainer.global_step - self._last_step >= self.every_n_steps
        if self.every_n_minutes is not None and not due:
            due = (time.monotonic() - self._last_time) >= 60.0 * self.every_n_minutes
            if trainer.world_size > 1:
                # every process must agree to save, and agreeing is a collective that waits for the devices:
                # ask every CLOCK_CHECK_STEPS steps only (rank 0's clock decides)
                if trainer.global_step % self.CLOCK_CHECK_STEPS:
                    return
                due = bool(trainer.strategy.broadcast(due))
        if due and trainer.global_step != self._last_step:
            trainer.save_checkpoint(self.path)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint) -> None:
        import time

        # any checkpoint (this callback's or an epoch-end one) starts the next interval
        self._last_step = trainer.global_step
        self._last_time = time.monotonic()


def _rng_state() -> dict[str, Any]:
    """The global random states as plain values and tensors (loadable with ``weights_only``)."""
    import random

    import numpy as np

    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": [version, list(mt), gauss],
             "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import random

    import numpy as np

    torch.set_rng_state(state["torch"])
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class ExactResume(L.Callback):
    """What a resumed run needs beyond Lightning's own state to continue exactly.

    * The global random states (torch, CUDA, NumPy, Python) are saved in every checkpoint and
      restored on resume, so anything that draws from them continues as in the uninterrupted run.
    * The training loader's position is restored. Lightning saves a stateful loader's
      ``state_dict`` with the loops and loads it when the fit loop sets up its data -- but a task
      whose ``configure_optimizers`` reads ``trainer.estimated_stepping_batches`` makes the loop
      set up (and start iterating) its loader before the checkpoint is restored. When resuming,
      that early loader is dropped at ``on_fit_start``, so the loop builds a fresh one and
      restores its position.
    """

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.ckpt_path is not None and trainer.fit_loop._combined_loader is not None:
            trainer.fit_loop._combined_loader = None

    def state_dict(self) -> dict[str, Any]:
        return _rng_state()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict:
            _set_rng_state(state_dict)
