"""What every snntrain LightningModule shares: the model from the config, optimizer and schedule."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from functools import partial
from typing import Any

import lightning as L
import torch

from ..models import build_model
from ..readback import HostCopy
from ..version import __version__
from . import speed
from .optim import build_optimizer, build_scheduler
from .speed import check_channels_last, check_compile, to_channels_last, use_channels_last
from .step_graph import StepGraph, plain_optimizer_state, plain_scheduler_state, training_step_fn

log = logging.getLogger("snntrain")


class SpikingTask(L.LightningModule):
    """Base task. ``config`` is the whole resolved run config as plain Python values; it is
    saved in every checkpoint, so a checkpoint alone rebuilds its model.

    ``backend`` (``auto``, ``torch`` or ``triton``) is how this process computes the
    spiking layers; it is not part of the model. The CLI records a run's resolved backend
    in the config (``backend.resolved``), so checkpoints store it once, with the config.

    Speed settings from the config's top level (:mod:`snntrain.tasks.speed`): with
    ``channels_last`` the model's weights are NHWC on CUDA; with ``compile`` the training
    objective (forward and loss, :meth:`train_objective`) runs through ``torch.compile``
    (validation and prediction stay eager), and a last partial training batch is skipped so
    that shapes stay static. With ``cuda_graph`` the whole training step (objective, backward, optimizer
    update) is one CUDA graph (:mod:`snntrain.tasks.step_graph`): the task then optimizes manually
    (``automatic_optimization`` off) and steps the schedule itself.
    """

    def __init__(self, config: dict[str, Any], backend: str = "auto") -> None:
        super().__init__()
        self.save_hyperparameters({"config": config})
        self.config = config
        self.backend = backend
        self.model = build_model(config["model"], backend=backend)
        self.channels_last = check_channels_last(config.get("channels_last", "auto"))
        self.compile_mode = check_compile(config.get("compile"))
        # True, False or "auto" (resolved when a fit starts: setup); self.cuda_graph is whether the step is captured
        self.cuda_graph_setting = speed.check_cuda_graph(config.get("cuda_graph", "auto"))
        self.cuda_graph = False
        # Outside the module tree: the compiled objective shares the model's parameters, and
        # checkpoints keep the model's own keys.
        self.__dict__["_train_objective"] = None
        self.__dict__["_step_graph"] = None
        self._train_batch: int | None = None
        self._compile_started: float | None = None  # wall clock at the first compiled step
        self._step_lr: float | torch.Tensor | None = None  # this step's learning rate, on the steps that log
        self._pending_values: list[tuple] = []  # step values on their way from the GPU (log_step_values)

    def setup(self, stage: str) -> None:
        device = self.trainer.strategy.root_device
        if stage == "fit":
            speed.check_accumulation(self.compile_mode, int(self.trainer.accumulate_grad_batches))
            speed.check_compile_device(self.compile_mode, device)
            from ..distributed import FlatGradientDDP

            trainer = self.trainer
            # several processes: the flat reducer's all-reduce can be captured with the step
            flat = isinstance(trainer.strategy, FlatGradientDDP) and trainer.strategy.step_capturable
            self.cuda_graph = speed.resolve_cuda_graph(self.cuda_graph_setting, self.compile_mode, device,
                                                       trainer.world_size, int(trainer.accumulate_grad_batches),
                                                       trainer.gradient_clip_val, trainer.precision, flat)
            # the optimizer's update is inside the captured step: Lightning leaves it (and the schedule) to the task
            self.automatic_optimization = not self.cuda_graph
        if use_channels_last(self.channels_last, device):
            to_channels_last(self.model)

    def forward(self, x):
        return self.model(x)

    def training_inputs(self, batch) -> tuple[torch.Tensor, ...]:
        """The tensors of a training batch that :meth:`objective` reads, the model's input first."""
        raise NotImplementedError

    def objective(self, model: torch.nn.Module, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """A training step's computation from ``inputs`` (:meth:`training_inputs`) to the loss (``"loss"``) and
        the values the step logs, all on the device and without host synchronisation. With ``compile`` this
        whole function, not the model alone, is what gets compiled (:meth:`train_objective`)."""
        raise NotImplementedError

    def train_objective(self, batch) -> dict[str, torch.Tensor]:
        """:meth:`objective` of a training batch: eagerly, or with ``compile`` as one compiled graph (with
        CUDA graphs one replay forward and one backward) that holds the loss and what it needs beside the
        network (the detector's target assignment, the focal and GIoU terms). Validation, batch-norm
        re-estimation and prediction run the model eagerly and never recompile it."""
        inputs = self.training_inputs(batch)
        if self.cuda_graph:
            return self._graph_step(inputs)
        if self.compile_mode is None:
            return self.objective(self.model, *inputs)
        return self._compiled(inputs[0])(*inputs)

    def _graph_step(self, inputs: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        """With ``cuda_graph``: the objective, its backward (with several processes, the gradients' all-reduce) and
        the optimizer's update as one CUDA graph
        (:class:`StepGraph`, made at the first training step), then the schedule's step and Lightning's count of
        optimizer steps (``global_step``), which manual optimization leaves to the task. The outputs are the
        graph's: the next step overwrites them."""
        graph = self.__dict__["_step_graph"]
        if graph is None:
            if self.compile_mode is None:
                def objective(*x):
                    return self.objective(self.model, *x)
            else:
                objective = self._compiled(inputs[0])
            optimizer = self.optimizers(use_pl_optimizer=False)
            # several processes: the flat reducer's all-reduce, inside the step (setup allowed only FlatGradientDDP)
            reduce = partial(self.trainer.strategy.average_gradients, optimizer) if self.trainer.world_size > 1 \
                else None
            graph = StepGraph(training_step_fn(objective, optimizer, reduce), optimizer)
            self.__dict__["_step_graph"] = graph
        out = graph(*inputs)
        for progress in self._step_counts():
            progress.increment_ready()
            progress.increment_completed()
        scheduler = self.lr_schedulers()
        for s in scheduler if isinstance(scheduler, list) else [scheduler] if scheduler is not None else []:
            s.step()
        return out

    def _compiled(self, x: torch.Tensor) -> torch.nn.Module:
        """The compiled training objective, made at the first training step, when the input's size is known:
        compiled channels-last convolutions whose maps shrink to 1x1 fail in PyTorch's compiled backward
        (a stride assertion), so such a model is compiled in NCHW (:func:`speed.compile_layout`)."""
        compiled = self.__dict__["_train_objective"]
        if compiled is None:
            if speed.is_channels_last(self.model) and not speed.compile_layout(self.model, x):
                speed.to_contiguous(self.model)
                log.info("snntrain: compile: feature maps reach 1x1 at this input size, where compiled "
                         "channels-last convolutions fail; this model trains in NCHW")
            compiled = speed.compile_model(speed.TrainingObjective(self.model, self.objective), self.compile_mode)
            self.__dict__["_train_objective"] = compiled
        return compiled

    def _step_counts(self) -> tuple:
        """Lightning's counts of optimizer steps (``global_step``): manual optimization's, which ``cuda_graph`` runs
        read, and automatic optimization's, which runs without it read. A ``cuda_graph`` run keeps both, so that its
        checkpoints resume with either setting."""
        loop = self.trainer.fit_loop.epoch_loop
        return loop.manual_optimization.optim_step_progress, loop.automatic_optimization.optim_progress.optimizer.step

    def on_train_start(self) -> None:
        if self.cuda_graph:  # resumed from a checkpoint of a run without the graph: its count of steps goes on
            manual, automatic = self._step_counts()
            if manual.total.completed < automatic.total.completed:
                manual.load_state_dict(automatic.state_dict())

    def configure_optimizers(self):
        task = self.config["task"]
        optimizer = build_optimizer(self.model, task["optimizer"])
        total = int(self.trainer.estimated_stepping_batches)
        epochs = self.trainer.max_epochs if self.trainer.max_epochs and self.trainer.max_epochs > 0 else 1
        scheduler = build_scheduler(optimizer, task["scheduler"], total, max(1, total // epochs))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def partial_batch(self, batch) -> bool:
        """With ``compile``, True for a training batch smaller than the first one (the last,
        partial batch of an epoch), which the training step skips: shapes stay static, and a
        new shape would compile (or capture) the step again."""
        if self.compile_mode is None and not self.cuda_graph:
            return False
        from ..callbacks import batch_size

        size = batch_size(batch)
        if self._train_batch is None:
            self._train_batch = size
        return size != self._train_batch

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        self.write_step_values(wait=False)
        if self.compile_mode in speed.GRAPH_MODES:
            # a new training iteration: the CUDA graphs may reuse the last step's output memory
            torch.compiler.cudagraph_mark_step_begin()
        if (self.compile_mode is not None or self.cuda_graph) and self._compile_started is None:
            self._compile_started = time.perf_counter()
        # every parameter group follows the same schedule: the first one's rate, logged with the step's values
        # (log_step_values); with cuda_graph a device tensor that the schedule fills in place: a copy of its value
        self._step_lr = None
        if self.logs_this_step():
            lr = self.trainer.optimizers[0].param_groups[0]["lr"]
            self._step_lr = lr.detach().clone() if torch.is_tensor(lr) else float(lr)

    def epoch_metrics(self) -> dict[str, tuple[Any, bool]]:
        """The training epoch's metrics (``name: (torchmetrics Metric, show in the progress bar)``), updated
        by every training step and logged once, at the epoch's end (:meth:`log_epoch`): a ``log`` call per step
        would cost host time on every step for a value written once per epoch."""
        return {}

    def on_train_epoch_end(self) -> None:
        self.write_step_values(wait=True)
        for name, (metric, prog_bar) in self.epoch_metrics().items():
            self.log_epoch(name, metric, prog_bar)

    def on_train_end(self) -> None:
        self.write_step_values(wait=True)  # a run that stopped inside an epoch (max_steps)
        self.release_step_graph()

    def release_step_graph(self) -> None:
        """Drop the captured training step (``cuda_graph``) and the memory it holds, once its last replay has
        run; the next fit captures afresh, for its own optimizer. Under DDP this must happen before the process
        group is destroyed: the graph holds an NCCL all-reduce, and NCCL (2.26 and later) waits, forever, for
        every graph that uses a communicator to be destroyed before it destroys the communicator."""
        graph = self.__dict__.get("_step_graph")
        if graph is None:
            return
        if graph.captured:
            torch.cuda.current_stream(graph.inputs[0].device).synchronize()
        self.__dict__["_step_graph"] = None

    def log_epoch(self, name: str, metric: Any, prog_bar: bool | Collection[str] = False) -> None:
        """Log ``metric``'s value for the epoch, if anything updated it (with every batch skipped there is nothing
        to report). A :class:`~snntrain.tasks.metrics.WeightedMean` of several ``names`` logs one value per name
        under ``name.format(name_i)``, shown in the progress bar where ``prog_bar`` holds ``name_i``; its
        ``compute`` adds the states of all processes, so every process logs the same values."""
        if not metric.update_called:
            return
        names = getattr(metric, "names", None)
        if names is None:
            self.log(name, metric, on_step=False, on_epoch=True, prog_bar=bool(prog_bar))
            return
        values = metric.compute()
        metric.reset()
        for key, value in values.items():
            show = key in prog_bar if isinstance(prog_bar, Collection) else bool(prog_bar)
            # equal on every process already: sync_dist (a mean of equal values) only tells Lightning so
            self.log(name.format(key), value, on_step=False, on_epoch=True, prog_bar=show, sync_dist=True,
                     batch_size=1)

    def log_step_values(self, values: dict[str, torch.Tensor]) -> None:
        """On the training steps the logger writes (:meth:`logs_this_step`), ``values`` (one-element tensors of this
        process's step) and ``train/lr``, read back from the device together (one transfer) and written to the
        loggers and ``trainer.callback_metrics`` (:func:`snntrain.callbacks.publish`) at the step Lightning writes
        step values at: ``LightningModule.log`` costs about a millisecond of host time per key and reads each
        value back on its own. None of them is shown through Lightning's progress-bar values (those are read
        after every step); snntrain's progress bar shows ``train/loss_step`` when it redraws.

        On a GPU the transfer does not wait for the device: the values are copied to pinned host memory behind
        the step's work and written once they have arrived (:meth:`write_step_values`, at a later step's start
        or at the epoch's end), under the step they belong to. Reading them at once would make the host wait
        for every step queued before, and leave the GPU idle while the host prepares the next one."""
        if not self.logs_this_step():
            return
        from ..callbacks import log_position

        if self._step_lr is not None:
            values = {**values, "train/lr": self._step_lr}
        on_device = {k: v for k, v in values.items() if torch.is_tensor(v)}
        numbers = {k: float(v) for k, v in values.items() if not torch.is_tensor(v)}
        at = log_position(self.trainer)
        copy = HostCopy(torch.stack([v.detach().float().reshape(()) for v in on_device.values()])) if on_device \
            else None
        self._pending_values.append((numbers, list(on_device), copy, at))
        self.write_step_values(wait=False)  # on a CPU at once; on a GPU at a later step, once they have arrived

    def write_step_values(self, wait: bool) -> None:
        """Write the step values that :meth:`log_step_values` left on their way from the GPU, in their order, as far
        as they have arrived; with ``wait`` all of them, waiting for those still on their way (only for their copy
        and the work queued before it)."""
        from ..callbacks import publish

        while self._pending_values:
            numbers, keys, copy, at = self._pending_values[0]
            if copy is not None and not wait and not copy.arrived:
                return
            self._pending_values.pop(0)
            values = dict(zip(keys, copy.get().tolist())) if copy is not None else {}
            publish(self.trainer, {**numbers, **values}, epoch=True, at=at)

    def logs_this_step(self) -> bool:
        """Whether the logger writes this training step's values (every ``trainer.log_every_n_steps``).
        Values of a single step (``on_step`` only) are logged on those steps alone: Lightning's ``log`` costs
        host time on every call, and the values of the other steps are never written."""
        connector = getattr(self.trainer, "_logger_connector", None)
        return connector is None or connector.should_update_logs or bool(self.trainer.fast_dev_run)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if self._compile_started is not None and self._compile_started > 0:
            # the first step compiles: report how long it took (one synchronisation, once)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            seconds = time.perf_counter() - self._compile_started
            self._compile_started = 0.0
            if self.compile_mode is not None:
                graph = "; with cuda_graph the third step is captured" if self.cuda_graph else ""
                log.info(f"snntrain: first training step with compile={self.compile_mode} took {seconds:.1f} s "
                         f"(compilation included{graph})")
            else:
                log.info(f"snntrain: first training step took {seconds:.1f} s (eager; with cuda_graph the third "
                         "step is captured)")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.cuda_graph:  # saved as without graphs (numbers for learning rates): resumes anywhere
            checkpoint["optimizer_states"] = [plain_optimizer_state(s) for s in checkpoint.get("optimizer_states", [])]
            if "lr_schedulers" in checkpoint:
                checkpoint["lr_schedulers"] = [plain_scheduler_state(s) for s in checkpoint["lr_schedulers"]]
        metrics = {k: float(v) for k, v in self.trainer.callback_metrics.items()
                   if hasattr(v, "numel") and v.numel() == 1 and "/" in k
                   and not k.startswith(("firing_rate", "efficiency"))}
        checkpoint["snntrain"] = {"version": __version__, "task": self.config["task"]["name"], "metrics": metrics}
