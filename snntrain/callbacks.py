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
    ``[T, B, C, ...]``). Sums stay on the device until the epoch ends; with several processes
    (DDP) the spike sums and neuron-step counts are added over all of them before dividing, so
    every process logs the rates of the whole validation set, and rank 0 writes the histograms.
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
        per_channel = per_channel.double()  # exact counts of 0/1 spikes far beyond float32's 2**24
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

    def _reduced(self, trainer: L.Trainer) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per layer: spike sums per channel and the neuron-steps behind each, added over all processes
        in one collective (every process ran the same layers in the same order)."""
        names = list(self._sums)
        sums = [self._sums[n] for n in names]
        device = sums[0].device
        flat = torch.cat([*sums, torch.tensor([float(self._counts[n]) for n in names], dtype=torch.float64,
                                              device=device)])
        flat = trainer.strategy.reduce(flat, reduce_op="sum")
        parts = flat.split([*(s.numel() for s in sums), len(names)])
        return {name: (parts[i], parts[-1][i]) for i, name in enumerate(names)}

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._detach()
        if not self._sums:
            return
        total_spikes, total_count = 0.0, 0.0
        tb = next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)
        # the values below are the same on every process; sync_dist (a mean of equal values over
        # batch_size 1) only tells Lightning that they are
        log = partial(pl_module.log, on_epoch=True, sync_dist=True, batch_size=1)
        for name, (sums, count) in self._reduced(trainer).items():
            rates = sums / count
            log(f"firing_rate/{name}", rates.mean().float())
            total_spikes = total_spikes + sums.sum()
            total_count = total_count + count * sums.numel()
            if self.histograms and tb is not None and trainer.is_global_zero:
                tb.experiment.add_histogram(f"firing_rate_per_channel/{name}", rates.float().cpu(), trainer.global_step)
        log("firing_rate/mean", (total_spikes / total_count).float())
        self._sums.clear()
        self._counts.clear()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._detach()


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint under a temporary name and renames it when complete."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        with atomic_path(path) as tmp:
            super().save_checkpoint(checkpoint, tmp, storage_options)


def _batch_size(batch: Any) -> int:
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    return int(first.shape[0]) if torch.is_tensor(first) else 0


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

    @staticmethod
    def _now(trainer: L.Trainer) -> float:
        import time

        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._steps = self._images = 0
        self._start = self._seconds = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._steps += 1
        if self._steps == self.warmup_steps:
            self._start = self._now(trainer)
        elif self._start is not None:
            self._images += _batch_size(batch)
            if batch_idx + 1 >= trainer.num_training_batches:  # the epoch's last step: stop before validation
                self._seconds = self._now(trainer) - self._start

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._start is None or self._images == 0:
            return
        if self._seconds is None:  # the loader ended before num_training_batches (an iterable of unknown length)
            self._seconds = self._now(trainer) - self._start
        device = pl_module.device
        images = trainer.strategy.reduce(torch.tensor(float(self._images), dtype=torch.float64, device=device),
                                         reduce_op="sum")
        seconds = trainer.strategy.reduce(torch.tensor(self._seconds, dtype=torch.float64, device=device),
                                          reduce_op="max")
        # the same value on every process; sync_dist (a mean of equal values) only tells Lightning so
        pl_module.log("perf/train_images_per_s", (images / seconds).float(), on_epoch=True, sync_dist=True,
                      batch_size=1)
