"""Lightning callbacks and checkpoint I/O used by the CLI."""

from __future__ import annotations

from functools import partial
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.loggers import TensorBoardLogger

from .fileio import atomic_path
from .nn.neurons import BaseNeuron
from .nn.norm_neuron import NormNeuron


class FiringRateMonitor(L.Callback):
    """Logs every spiking layer's firing rate over each validation epoch.

    Scalars ``firing_rate/<layer>`` (fraction of neuron-steps that spiked) and
    ``firing_rate/mean`` (over all layers), and, with TensorBoard, a histogram
    ``firing_rate_per_channel/<layer>`` of the rates of the layer's channels (dim 2 of
    ``[T, B, C, ...]``). Sums stay on the device until the epoch ends.
    """

    def __init__(self, histograms: bool = True) -> None:
        self.histograms = histograms
        self._handles: list[Any] = []
        self._sums: dict[str, torch.Tensor] = {}
        self._counts: dict[str, int] = {}

    def _hook(self, name: str, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        s = (output[0] if isinstance(output, tuple) else output).detach()
        if s.dim() >= 3:
            per_channel = s.sum(dim=[d for d in range(s.dim()) if d != 2], dtype=torch.float32)
        else:
            per_channel = s.sum(dim=0, dtype=torch.float32)
        count = s.numel() // per_channel.numel()
        if name in self._sums and self._sums[name].shape == per_channel.shape:
            self._sums[name] += per_channel
            self._counts[name] += count
        else:
            self._sums[name], self._counts[name] = per_channel, count

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sums.clear()
        self._counts.clear()
        if trainer.sanity_checking:
            return
        fused = [name for name, m in pl_module.named_modules() if isinstance(m, NormNeuron)]
        for name, m in pl_module.named_modules():
            # a NormNeuron's spikes are its output (its neuron module is bypassed when fused)
            inner = any(name.startswith(f + ".") for f in fused)
            if isinstance(m, NormNeuron) or (isinstance(m, BaseNeuron) and not inner):
                short = name.removeprefix("model.")
                self._handles.append(m.register_forward_hook(partial(self._hook, short)))

    def _detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._detach()
        if not self._sums:
            return
        total_spikes, total_count = 0.0, 0
        tb = next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)
        for name, sums in self._sums.items():
            rates = sums / self._counts[name]
            pl_module.log(f"firing_rate/{name}", rates.mean(), on_epoch=True)
            total_spikes = total_spikes + sums.sum()
            total_count += self._counts[name] * sums.numel()
            if self.histograms and tb is not None and trainer.is_global_zero:
                tb.experiment.add_histogram(f"firing_rate_per_channel/{name}", rates.cpu(), trainer.global_step)
        pl_module.log("firing_rate/mean", total_spikes / total_count, on_epoch=True)
        self._sums.clear()
        self._counts.clear()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._detach()


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint under a temporary name and renames it when complete."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        with atomic_path(path) as tmp:
            super().save_checkpoint(checkpoint, tmp, storage_options)
