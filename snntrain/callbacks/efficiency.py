"""The ``callbacks.efficiency`` section: firing rates and the efficiency report of every validation."""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger

from .metrics import publish
from .tensorboard import add_histograms, add_png

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
        from ..efficiency import ActivityCounter, NotSpiking, check_spiking

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
        from ..efficiency import build_report, chart_png

        self._detach()
        counter = self._counter
        flat = None if counter is None or trainer.sanity_checking else counter.totals()
        if flat is None:
            return
        # every process ran the same layers in the same order: one collective adds all counts, so every
        # process has the values of the whole validation set
        totals = counter.unpack(trainer.strategy.reduce(flat, reduce_op="sum"))
        totals["processes"] = trainer.world_size
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
