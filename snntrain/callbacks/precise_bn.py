"""The ``callbacks.precise_bn`` section: batch-norm statistics re-estimated at the current weights."""

from __future__ import annotations

import lightning as L
import torch


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
        from ..validation import positive_int

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
