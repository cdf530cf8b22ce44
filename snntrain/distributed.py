"""Training on several processes (GPUs, nodes) with Lightning's DDP: what snntrain adds around it.

Lightning does the distributed work: it starts one process per device, wraps the model
in ``DistributedDataParallel``, shards the training data with a ``DistributedSampler``
(the resumable training loaders of :mod:`snntrain.data.common` shard themselves, with
:class:`~snntrain.data.common.EpochSampler`, so that their position can be saved) and
writes checkpoints and logs from global rank 0 only. This module holds the few pieces
that make that right for a Hydra app and for exact validation metrics:

* :func:`ddp_job` / :func:`command_line`: Lightning starts ranks 1.. of a node by running
  the parent's command line again. Under Hydra that command line may be a sweep
  (``-m``) and its run directory may contain ``${now:...}``, so the parent hands its
  children the exact job instead: its overrides and its run directory (through the
  environment variable :data:`JOB_ENV`), and the children run that single job in the
  same directory, without a second ``.hydra`` folder, logging to ``cli_rank<N>.log``.
* :class:`EvalShardSampler` / :func:`eval_sampler`: validation data split into one
  contiguous block per process with every sample exactly once (Lightning's
  ``DistributedSampler`` pads the last block with repeated samples), so metrics
  reduced over the processes equal the single-process value over the same data.
* :func:`ddp_strategy`: the ``ddp`` config section: ``reducer`` chooses :class:`FlatGradientDDP`
  (one all-reduce of all gradients after the backward) or torch's ``DistributedDataParallel``, which
  gets ``broadcast_buffers``, ``gradient_as_bucket_view`` and ``static_graph``.
* :func:`convert_sync_batchnorm` and :class:`SyncBatchNorm`: ``trainer.sync_batchnorm``
  in one place, extendable by fused norm modules.
* :func:`defer_sigterm_check`: Lightning's per-step question "did rank 0 receive SIGTERM?" asked
  without making every process wait for its GPU at every step.

Nothing here starts processes or talks to the network itself.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
from lightning.pytorch.plugins.layer_sync import TorchSyncBatchNorm
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import nn
from torch.utils.data import Dataset, DistributedSampler

from .readback import HostCopy
from .validation import flag

#: Environment variable through which a DDP parent tells the processes it starts which job to run.
JOB_ENV = "SNNTRAIN_DDP_JOB"
# Variables Lightning's process launcher sets in the parent; restored after each job so that the next
# job of a sweep launches its own processes again (Lightning takes a set LOCAL_RANK to mean that an
# outside launcher created the processes).
_LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", JOB_ENV)
# Hydra settings a child keeps from the parent's command line (logging); everything else about Hydra's
# own run (mode, sweep, run dir, launcher) is replaced by the single job.
_HYDRA_KEPT = ("hydra/job_logging", "hydra/hydra_logging", "hydra.job_logging", "hydra.hydra_logging", "hydra.verbose")


def rank_name(environ: Mapping[str, str] | None = None) -> str | None:
    """This process's rank as the launcher announces it before any process group exists, as a name
    (``rank3``, ``node1_rank0``), or ``None`` for global rank 0.

    ``RANK`` (torchrun), ``SLURM_PROCID`` (SLURM) or ``JSM_NAMESPACE_RANK`` (LSF) give the global rank;
    otherwise ``NODE_RANK`` and ``LOCAL_RANK`` (Lightning's own launcher, one command per node) do.
    """
    env = os.environ if environ is None else environ
    for key in ("RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if env.get(key, "").strip():
            rank = int(env[key])
            return f"rank{rank}" if rank else None
    node = int(env.get("NODE_RANK", "") or env.get("GROUP_RANK", "") or 0)
    local = int(env.get("LOCAL_RANK", "") or 0)
    if node:
        return f"node{node}_rank{local}"
    return f"rank{local}" if local else None


def is_rank_zero() -> bool:
    """Whether this process is global rank 0 (the one that writes run files), before the Trainer starts."""
    return rank_name() is None


def _quote(value: str) -> str:
    """``value`` as a quoted Hydra override value."""
    if "'" not in value:
        return f"'{value}'"
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def command_line(argv: Sequence[str], environ: Mapping[str, str] | None = None, ppid: int | None = None) -> list[str]:
    """The command line this process should hand to Hydra.

    A process started by a DDP parent (:data:`JOB_ENV` names its parent process) runs the parent's
    job: the parent's overrides plus its run directory. Any other process of a non-zero rank (started
    by torchrun, SLURM or on another node, each running the whole command itself) keeps its
    arguments but writes no ``.hydra`` folder. Both log to ``cli_rank<N>.log``. Rank 0 is unchanged.
    """
    env = os.environ if environ is None else environ
    argv = list(argv)
    job = env.get(JOB_ENV)
    if job:
        spec = json.loads(job)
        if spec.get("parent") == (os.getppid() if ppid is None else ppid):
            return [argv[0], *spec["argv"], f"hydra.job.name=cli_{rank_name(env) or 'rank0'}"]
    name = rank_name(env)
    if name is not None:
        return [*argv, "hydra.output_subdir=null", f"hydra.job.name=cli_{name}"]
    return argv


def _job_argv(output_dir: str) -> list[str] | None:
    """The overrides that rerun the current Hydra job, in ``output_dir``, as a single run."""
    try:
        from hydra.core.hydra_config import HydraConfig
    except ImportError:  # pragma: no cover - hydra is a dependency
        return None
    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    kept = [o for o in hc.overrides.hydra if o.lstrip("+~").startswith(_HYDRA_KEPT)]
    return [*hc.overrides.task, *kept, f"hydra.run.dir={_quote(str(output_dir))}", "hydra.output_subdir=null"]


@contextlib.contextmanager
def ddp_job(output_dir: str | os.PathLike) -> Iterator[None]:
    """Around ``trainer.fit``/``validate``: processes Lightning starts run this job, and the next
    job of a sweep starts afresh.

    On entry, when a Hydra job is running, its overrides and ``output_dir`` are put in
    :data:`JOB_ENV` for :func:`command_line` in the children. On exit the launcher's environment
    variables are restored and a process group created during the job is destroyed (Lightning
    otherwise keeps it until the interpreter exits, and the next job would reuse it).
    """
    saved = {k: os.environ.get(k) for k in _LAUNCH_ENV}
    had_group = torch.distributed.is_available() and torch.distributed.is_initialized()
    argv = _job_argv(str(output_dir))
    if argv is not None and is_rank_zero() and JOB_ENV not in os.environ:
        os.environ[JOB_ENV] = json.dumps({"parent": os.getpid(), "argv": argv})
    try:
        yield
    finally:
        if not had_group and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# ----------------------------------------------------------------------------------------- evaluation data


class EvalShardSampler(DistributedSampler):
    """Evaluation order for several processes: process ``r`` of ``W`` reads the contiguous block
    ``[r * N // W, (r + 1) * N // W)`` of the ``N`` samples, in order.

    Every sample is read exactly once over all processes (blocks differ in length by at most one;
    nothing is repeated to even them out), so sums and counts reduced over the processes are those
    of one process reading the whole set, and rank 0 starts with the same samples as a single
    process. Subclassing ``DistributedSampler`` tells Lightning the loader is already sharded.
    """

    def __init__(self, dataset: Dataset, num_replicas: int | None = None, rank: int | None = None) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)
        n = len(dataset)  # type: ignore[arg-type]
        if n < self.num_replicas:
            raise ValueError(
                f"the evaluation set has {n} sample(s), fewer than the {self.num_replicas} processes: "
                "every process needs at least one; use fewer devices or more validation data"
            )
        self.start = n * self.rank // self.num_replicas
        self.end = n * (self.rank + 1) // self.num_replicas
        self.num_samples = self.end - self.start
        self.total_size = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end))

    def __len__(self) -> int:
        return self.num_samples


#: ``ddp`` config settings of ``torch.nn.parallel.DistributedDataParallel`` (defaults: torch's); the flat
#: reducer uses ``broadcast_buffers`` too.
DDP_SETTINGS = {"broadcast_buffers": True, "gradient_as_bucket_view": False, "static_graph": False}
#: How gradients are averaged over the processes (``trainer.ddp.reducer``): ``flat`` (:class:`FlatGradientDDP`),
#: ``buckets`` (torch's ``DistributedDataParallel``), ``auto`` (flat on one node, buckets on several).
REDUCERS = ("auto", "flat", "buckets")
# settings of torch's bucketed reducer that the flat one has no use for
_BUCKET_ONLY = ("gradient_as_bucket_view", "static_graph")


def uses_cuda(trainer_cfg: Mapping[str, Any]) -> bool:
    """Whether the Trainer of ``trainer_cfg`` (``accelerator`` auto, gpu or cuda) runs on CUDA here."""
    return torch.cuda.is_available() and str(trainer_cfg.get("accelerator", "auto")) in ("auto", "gpu", "cuda")


def _process_count(trainer_cfg: Mapping[str, Any]) -> int:
    """How many processes ``trainer.devices`` x ``trainer.num_nodes`` asks for (``-1``/``"auto"``: every
    visible GPU when the run uses CUDA, else one)."""
    devices = trainer_cfg.get("devices", 1)
    if isinstance(devices, (list, tuple)):
        count = len(devices)
    else:
        try:
            count = int(devices)
        except (TypeError, ValueError):  # "auto"
            count = -1
        if count < 1:
            count = torch.cuda.device_count() if uses_cuda(trainer_cfg) else 1
    return count * int(trainer_cfg.get("num_nodes", 1) or 1)


def ddp_strategy(trainer_cfg: Mapping[str, Any], settings: Mapping[str, Any] | None = None) -> Any:
    """The ``strategy`` argument of the Trainer, for ``trainer.strategy=ddp``, and for ``auto`` when the run
    has several processes: a :class:`FlatGradientDDP` or Lightning's ``DDPStrategy`` as the config section
    ``trainer.ddp`` says (``reducer``, one of :data:`REDUCERS`, and :data:`DDP_SETTINGS`, each a bool).
    Any other ``trainer.strategy`` unchanged.

    ``reducer=auto`` is ``flat`` on one node (GPUs of one host share a fast link: the all-reduce of all
    gradients after the backward costs less than the host work of overlapping it) and ``buckets`` on
    several nodes, or when a setting of torch's reducer (``gradient_as_bucket_view``, ``static_graph``)
    is turned on.
    """
    settings = dict(settings or {})
    reducer = settings.pop("reducer", "auto")
    unknown = sorted(set(settings) - set(DDP_SETTINGS))
    if unknown:
        raise ValueError(f"unknown trainer.ddp setting(s) {unknown}; valid: reducer, {', '.join(DDP_SETTINGS)}")
    if reducer not in REDUCERS:
        raise ValueError(f"trainer.ddp.reducer={reducer!r}; valid: {', '.join(REDUCERS)}")
    for name, value in settings.items():
        flag(f"trainer.ddp.{name}", value)
    strategy = trainer_cfg.get("strategy", "auto")
    if strategy not in ("auto", "ddp") or (strategy == "auto" and _process_count(trainer_cfg) < 2):
        return strategy
    bucket_settings = sorted(k for k in _BUCKET_ONLY if settings.get(k))
    if reducer == "auto":
        several_nodes = int(trainer_cfg.get("num_nodes", 1) or 1) > 1
        reducer = "buckets" if several_nodes or bucket_settings else "flat"
    if reducer == "flat":
        if bucket_settings:
            raise ValueError(f"trainer.ddp.{bucket_settings[0]}=true is a setting of reducer=buckets (torch's "
                             "DistributedDataParallel); with reducer=flat leave it false")
        return FlatGradientDDP(broadcast_buffers=settings.get("broadcast_buffers", True))
    return DDPStrategy(**{**DDP_SETTINGS, **settings})


def _memory_order(t: torch.Tensor) -> torch.Tensor | None:
    """A 1-D view of ``t``'s elements in memory order, for a dense tensor (contiguous or channels-last);
    ``None`` for any other layout."""
    dense = t.is_contiguous() or (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)) or (
        t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d))
    return t.as_strided((t.numel(),), (1,)) if dense else None


def _flat_groups(tensors: list[torch.Tensor]) -> Iterator[tuple[list[int], list[torch.Tensor | None], torch.Tensor]]:
    """``tensors`` grouped by dtype and device: per group, the indices of its tensors, their :func:`_memory_order`
    views and one flat copy of them all (dense ones in memory order, others in logical order)."""
    groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.dtype, t.device), []).append(i)
    for idx in groups.values():
        views = [_memory_order(tensors[i]) for i in idx]
        yield idx, views, torch.cat([v if v is not None else tensors[i].reshape(-1) for i, v in zip(idx, views)])


def _coalesced(tensors: list[torch.Tensor], collective: Callable[[torch.Tensor], Any]) -> None:
    """Run ``collective`` (in place, on one flat tensor) over ``tensors`` grouped by dtype and device: one
    copy in, one collective and one copy out per group, whatever the number and layout of the tensors."""
    for idx, views, flat in _flat_groups(tensors):
        collective(flat)
        group = [tensors[i] for i in idx]
        parts = flat.split([t.numel() for t in group])
        dense = [(v, p) for v, p in zip(views, parts) if v is not None]
        if dense:
            torch._foreach_copy_([v for v, _ in dense], [p for _, p in dense])
        for t, v, p in zip(group, views, parts):
            if v is None:
                t.copy_(p.view(t.shape))


def all_reduce_gradients(params: Iterable[torch.Tensor], world_size: int) -> None:
    """Average the gradients of ``params`` over the ``world_size`` processes of the default group: one
    all-reduce per dtype. A parameter without a gradient on this process gets zeros first (so every process
    reduces the same tensors and applies the same update, as DDP does for a parameter that another process
    used).

    The gradients are copied into one flat buffer per dtype (:func:`_flat_groups`), which is averaged in place
    (NCCL's ``AVG``; a sum and a division elsewhere) and then *becomes* the gradients: each ``p.grad`` is
    rebound to a view of it with its own shape and strides, which saves copying the average back (measured in
    docs/benchmarks.md). A gradient that is not dense gets a contiguous view."""
    owners = []
    for p in params:
        if not p.requires_grad:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        owners.append(p)
    grads = [p.grad for p in owners]
    with torch.no_grad():
        for idx, views, flat in _flat_groups(grads):
            if torch.distributed.get_backend() == "nccl":
                torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.AVG)
            else:  # gloo has no AVG
                torch.distributed.all_reduce(flat)
                flat.div_(world_size)
            for i, v, part in zip(idx, views, flat.split([grads[i].numel() for i in idx])):
                g = grads[i]
                owners[i].grad = part.as_strided(g.shape, g.stride()) if v is not None else part.view(g.shape)


def broadcast_from_rank_zero(tensors: Iterable[torch.Tensor]) -> None:
    """Copy rank 0's values of ``tensors`` to every process: one broadcast per dtype."""
    tensors = [t for t in tensors if t.numel()]
    if tensors:
        with torch.no_grad():
            _coalesced(tensors, lambda flat: torch.distributed.broadcast(flat, src=0))


class FlatGradientDDP(DDPStrategy):
    """Data-parallel training with one all-reduce of all gradients after the backward (``trainer.ddp.reducer=flat``).

    Every process runs the LightningModule itself, not wrapped in ``DistributedDataParallel``: no
    autograd hook per parameter, no bucket bookkeeping, no buffer broadcast before every forward. After
    the backward of the step that updates the weights (after gradient accumulation), the gradients are
    averaged in one all-reduce per dtype (:func:`all_reduce_gradients`), before gradient clipping and the
    optimizer step. The transfer does not overlap the backward as DDP's buckets do; on the GPUs of one
    host it is short (47 MB of SEW-ResNet-18 gradients: 0.21 ms over the NVLink of two H200s, measured by
    ``scripts/bench_ddp.py --comm``), against milliseconds of host work that DDP's reducer adds to every
    step of an eager or CUDA-graph step that the host already paces.

    As DDP: the processes start from rank 0's parameters and buffers; with ``broadcast_buffers`` rank 0's
    buffers (batch-norm running statistics, which every process updates from its own batches) are copied
    to all before every validation, which is what DDP's copy before every forward amounts to (rank 0's
    statistics are the ones saved and validated); without it each process keeps its own (precise BN
    averages them). ``sync_batchnorm`` and the other Trainer features work as with DDP.
    """

    def __init__(self, broadcast_buffers: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.broadcast_buffers = bool(broadcast_buffers)

    def configure_ddp(self) -> None:
        module = self.model
        broadcast_from_rank_zero([*module.parameters(), *module.buffers()])  # what DDP's constructor does

    @property
    def step_capturable(self) -> bool:
        """Whether one CUDA graph can hold a whole training step with this reducer's all-reduce
        (:func:`snntrain.tasks.speed.check_cuda_graph_run`): not with ``sync_batchnorm``, whose collectives
        run inside the forward."""
        return self._layer_sync is None

    def average_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Average the gradients of ``optimizer``'s parameters over the processes (:func:`all_reduce_gradients`):
        after the backward of a step that updates the weights, here or inside the captured step."""
        all_reduce_gradients((p for group in optimizer.param_groups for p in group["params"]), self.world_size)

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        def step_closure() -> Any:
            result = closure()  # forward and backward (or nothing, in manual optimization)
            self.average_gradients(optimizer)
            return result

        return super().optimizer_step(optimizer, step_closure, model, **kwargs)

    def on_validation_start(self) -> None:
        super().on_validation_start()
        if self.broadcast_buffers and self.lightning_module is not None:
            broadcast_from_rank_zero(self.lightning_module.buffers())


def process_group_shape() -> tuple[int, int]:
    """``(world size, rank)`` of the initialised default process group; ``(1, 0)`` without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


def eval_sampler(dataset: Dataset) -> EvalShardSampler | None:
    """The sampler of an evaluation loader: an :class:`EvalShardSampler` when several processes
    train together, ``None`` (the loader's own sequential order) otherwise."""
    return EvalShardSampler(dataset) if process_group_shape()[0] > 1 else None


def gather_list_states(metric: Any) -> None:
    """Replace each list state of a torchmetrics ``metric`` (one entry per image, say) by the entries of
    all processes in rank order: rank 0's first, then rank 1's, and so on. With contiguous evaluation
    shards this is the single-process order of the data, so order-sensitive results (a detection
    metric's ranking of equal scores) match one process over the same data. Works for any number of
    entries per process; torchmetrics' own sync gathers list entries index by index, which needs the
    same number on every process and interleaves them. Build the metric with ``sync_on_compute=False``.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    world = torch.distributed.get_world_size()
    if world == 1:
        return
    for name, value in metric.metric_state.items():
        if not isinstance(value, list):
            continue
        parts: list[Any] = [None] * world
        torch.distributed.all_gather_object(parts, [t.cpu() for t in value])
        setattr(metric, name, [t.to(metric.device) for part in parts for t in part])


# ----------------------------------------------------------------------------------------- SIGTERM


class _SigtermFlag:
    """Rank 0's SIGTERM flag, broadcast at every training step and read back one step later.

    ``ask(received)`` broadcasts this process's flag from rank 0 (a collective every process makes at the
    same step) from device memory and copies the answer to (pinned) host memory asynchronously: nothing
    waits for the device. It returns the answer of the previous call, waiting only for that step's
    broadcast, which finished long before on any device that is not a whole step behind its host.
    Every process reads the answer of step ``k`` at step ``k + 1``, so all stop at the same step.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.flag = torch.zeros(1, dtype=torch.int32, device=device)
        self.host = torch.zeros(1, dtype=torch.int32, pin_memory=device.type == "cuda")
        self.pending: HostCopy | None = None

    def ask(self, received: bool) -> bool:
        answer = bool(self.pending.get()[0]) if self.pending is not None else False
        self.flag.fill_(1 if received else 0)  # a kernel argument: no copy from host memory
        torch.distributed.broadcast(self.flag, src=0)
        self.pending = HostCopy(self.flag, out=self.host)
        return answer


class DeferredSigtermEpochLoop(_TrainingEpochLoop):
    """Lightning's training epoch loop whose per-step SIGTERM broadcast is a :class:`_SigtermFlag`: the same
    collective and the same outcome, one step later, without a host synchronisation."""

    def _broadcast_sigterm_tensor(self) -> None:
        device = torch.device(self.trainer.strategy.root_device)
        state = getattr(self, "_sigterm_flag", None)
        if state is None or state.device != device:
            state = self._sigterm_flag = _SigtermFlag(device)
        try:
            stop = state.ask(bool(getattr(self.trainer, "received_sigterm", False)))
        except Exception:  # noqa: BLE001 - as Lightning's own: a failed broadcast does not stop training
            return
        if stop:
            with contextlib.suppress(Exception):
                torch.distributed.barrier()  # every process is here at the same step: none is left waiting
            raise SIGTERMException()


def defer_sigterm_check(trainer: Any) -> bool:
    """Make ``trainer``'s training loop ask for rank 0's SIGTERM without a per-step host synchronisation.

    Under DDP, Lightning (2.6) broadcasts at every training step whether rank 0 received SIGTERM, from a
    tensor made from host memory and read back with ``.item()``: on CUDA every process then waits at every
    step until its GPU has finished all queued work, so the host can never queue a step ahead (with CUDA
    graphs the host work between steps is no longer hidden; in eager mode each process waits for the
    other's backward). The loop is given :class:`_SigtermFlag` instead: the same broadcast, read one step
    later. Returns whether the loop was changed (not on a Lightning without that per-step check).
    """
    loop = trainer.fit_loop.epoch_loop
    if type(loop) is not _TrainingEpochLoop or not callable(getattr(loop, "_broadcast_sigterm_tensor", None)):
        return False  # a loop of its own, or a Lightning without the per-step check
    loop.__class__ = DeferredSigtermEpochLoop
    return True


# ----------------------------------------------------------------------------------------- batch norm


def convert_sync_batchnorm(model: nn.Module, process_group: Any = None) -> nn.Module:
    """``model`` with batch statistics computed over all processes of ``process_group`` (default: all).

    ``torch.nn`` batch norms become :class:`torch.nn.SyncBatchNorm`. A module with its own batch
    statistics (a fused norm + neuron, say) takes part by defining
    ``to_sync_batchnorm(process_group) -> nn.Module`` (and ``from_sync_batchnorm() -> nn.Module``
    to undo it): it is replaced by what that returns, and its children are left to it.
    """
    if hasattr(model, "to_sync_batchnorm"):
        return model.to_sync_batchnorm(process_group)
    if isinstance(model, nn.modules.batchnorm._BatchNorm) and not isinstance(model, nn.SyncBatchNorm):
        return nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group)
    for name, child in model.named_children():
        converted = convert_sync_batchnorm(child, process_group)
        if converted is not child:
            model.add_module(name, converted)
    return model


def _revert_sync_batchnorm(model: nn.Module) -> nn.Module:
    if hasattr(model, "from_sync_batchnorm"):
        return model.from_sync_batchnorm()
    if isinstance(model, nn.SyncBatchNorm):
        # the same parameter and buffer objects, in a plain 2-d batch norm (all of snntrain's are 2-d)
        bn = nn.BatchNorm2d(model.num_features, model.eps, model.momentum, model.affine, model.track_running_stats)
        if model.affine:
            bn.weight, bn.bias = model.weight, model.bias
        bn.running_mean, bn.running_var = model.running_mean, model.running_var
        bn.num_batches_tracked = model.num_batches_tracked
        bn.train(model.training)
        return bn
    for name, child in model.named_children():
        reverted = _revert_sync_batchnorm(child)
        if reverted is not child:
            model.add_module(name, reverted)
    return model


class SyncBatchNorm(TorchSyncBatchNorm):
    """Lightning plugin for ``trainer.sync_batchnorm=true``: :func:`convert_sync_batchnorm` while
    fitting on several processes, undone when the fit ends. (A subclass of Lightning's own plugin, so
    the Trainer accepts it together with ``sync_batchnorm=True``.)"""

    def apply(self, model: nn.Module) -> nn.Module:
        return convert_sync_batchnorm(model)

    def revert(self, model: nn.Module) -> nn.Module:
        return _revert_sync_batchnorm(model)


__all__ = [
    "JOB_ENV",
    "EvalShardSampler",
    "SyncBatchNorm",
    "command_line",
    "convert_sync_batchnorm",
    "ddp_job",
    "eval_sampler",
    "gather_list_states",
    "is_rank_zero",
    "rank_name",
]
