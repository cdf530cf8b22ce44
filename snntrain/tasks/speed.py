"""Training-step speed settings applied by the task: memory layout and ``torch.compile``.

Neither changes what is computed (up to floating-point summation order) nor what is
saved: checkpoints keep the model's own state-dict keys and row-major tensors.

* ``channels_last``: ``auto`` (on with CUDA), ``true`` or ``false``. Convolution weights
  are stored NHWC, so convolutions, batch norms, pooling and the neuron kernels all read
  and write NHWC maps in place and cuDNN never transposes.
* ``compile``: ``null`` (eager), ``default``, ``reduce-overhead`` (CUDA graphs) or
  ``max-autotune``, the ``mode`` of ``torch.compile`` for the training objective, the forward
  with the loss (:class:`TrainingObjective`; and, through AOTAutograd, its backward). Shapes are
  static: the task skips a last partial batch.
* ``cuda_graph``: ``auto`` (default), ``true`` or ``false``: the whole training step (forward, loss,
  backward, optimizer update) captured once in one CUDA graph and replayed (:mod:`snntrain.tasks.step_graph`),
  over the eager objective or a ``compile=default`` one. One CUDA device, no gradient accumulation, clipping
  or fp16 loss scaling (:func:`check_cuda_graph_run`); ``auto`` turns it on wherever these hold
  (:func:`resolve_cuda_graph`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

log = logging.getLogger("snntrain")

#: ``compile`` modes; None (``null`` in YAML) runs eagerly.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CHANNELS_LAST = ("auto", True, False)


def check_compile(value: Any) -> str | None:
    """The compile mode, or None for eager; anything else is refused by name."""
    if value is None or value is False:
        return None
    if not isinstance(value, str) or value not in COMPILE_MODES:
        raise ValueError(f"compile={value!r} is not valid; choose null (eager) or one of {', '.join(COMPILE_MODES)}")
    return value


def check_cuda_graph(value: Any) -> str | bool:
    if isinstance(value, bool) or value == "auto":
        return value
    raise ValueError(f"cuda_graph={value!r} is not valid; choose auto (default: on where the run allows it), true "
                     "(the whole training step captured in one CUDA graph) or false")


def resolve_cudnn_benchmark(value: Any, deterministic: Any) -> bool:
    """``trainer.benchmark`` as Lightning takes it (``torch.backends.cudnn.benchmark``): with ``auto`` (the default)
    on unless ``trainer.deterministic``. cuDNN then times its convolution algorithms at the first call of each input
    shape and keeps the fastest (a training step's shapes repeat: the time is spent once); without it cuDNN picks
    by heuristics, 10 % slower for the event-data SEW-ResNet-18 step on an H200 (docs/benchmarks.md). Timed
    choices may differ from one process to the next, which ``deterministic`` runs rule out."""
    if value == "auto":
        return not bool(deterministic)
    if not isinstance(value, bool):
        raise ValueError(f"trainer.benchmark={value!r} is not valid; choose auto (default: on unless "
                         "trainer.deterministic=true), true (cuDNN times its convolution algorithms per input shape) "
                         "or false (cuDNN's heuristic choice)")
    if value and deterministic:
        raise ValueError("trainer.benchmark=true picks convolution algorithms by timing them, which can differ "
                         "between runs; trainer.deterministic=true rules that out. Use trainer.benchmark=auto or false")
    return value


def check_channels_last(value: Any) -> str | bool:
    if isinstance(value, bool) or value == "auto":
        return value
    raise ValueError(f"channels_last={value!r} is not valid; choose auto (on with CUDA), true or false")


def use_channels_last(value: Any, device: torch.device | str) -> bool:
    """Whether to run channels-last on ``device``: ``auto`` means on CUDA, where it is faster."""
    value = check_channels_last(value)
    if value == "auto":
        return torch.device(device).type == "cuda"
    return value


def _row_major_state(module: nn.Module, state_dict: dict, prefix: str, local_metadata: Any) -> None:
    for key, value in state_dict.items():
        if key.startswith(prefix) and isinstance(value, torch.Tensor) and not value.is_contiguous():
            state_dict[key] = value.contiguous()


def to_channels_last(model: nn.Module) -> nn.Module:
    """Store ``model``'s 4-d weights NHWC, in place; its state-dict stays row-major."""
    model.to(memory_format=torch.channels_last)
    if not getattr(model, "_snntrain_row_major_state", False):
        model._register_state_dict_hook(_row_major_state)
        model._snntrain_row_major_state = True
    return model


def is_channels_last(model: nn.Module) -> bool:
    """Whether ``model``'s convolution weights are stored NHWC."""
    return any(m.weight.is_contiguous(memory_format=torch.channels_last) and not m.weight.is_contiguous()
               for m in model.modules() if isinstance(m, nn.Conv2d))


def to_contiguous(model: nn.Module) -> nn.Module:
    """Store ``model``'s weights row-major (NCHW) again, in place."""
    return model.to(memory_format=torch.contiguous_format)


@torch.no_grad()
def smallest_map(model: nn.Module, x: torch.Tensor) -> int:
    """The fewest positions (H * W) of any 4-d map a convolution or max-pooling layer of ``model`` reads or
    writes for input ``x`` (one sample of it is run, in eval mode, without gradients). The global average
    pool's 1x1 output does not count: no convolution follows it."""
    sizes: list[int] = []

    def hook(module, inputs, output) -> None:
        for t in (*inputs, output):
            if torch.is_tensor(t) and t.dim() >= 4:
                sizes.append(t.shape[-1] * t.shape[-2])

    kinds = (nn.Conv2d, nn.MaxPool2d)
    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, kinds)]
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        model(x[:, :1] if x.dim() == 5 else x[:1])  # [T, B, ...] event input: one sample of every step
    finally:
        for h in handles:
            h.remove()
        for m, mode in modes.items():
            m.training = mode
    return min(sizes) if sizes else 0


def compile_layout(model: nn.Module, x: torch.Tensor) -> bool:
    """Whether a channels-last ``model`` can be compiled for input ``x`` as it is: False when a convolution
    map reaches 1x1 (PyTorch 2.11's compiled ``convolution_backward`` asserts on the strides of
    such maps with channels-last tensors; torchvision's ResNet-18 fails the same way)."""
    return smallest_map(model, x) > 1


#: ``torch.compile`` backend of the training step. Inductor generates Triton kernels for CUDA; the tests swap
#: in ``aot_eager`` (AOTAutograd without code generation) to exercise the compiled path on a CPU.
BACKEND = "inductor"


def check_compile_device(mode: str | None, device: torch.device | str) -> None:
    """Refuse ``compile`` up front where it does not pay: inductor on a CPU generates and builds C++ for
    every fused kernel of the network's forward and backward, which took longer than 15 minutes for the
    default model on two cores, to save little on a step the eager PyTorch backend already runs well."""
    if mode is not None and BACKEND == "inductor" and torch.device(device).type != "cuda":
        raise ValueError(
            f"compile={mode} compiles the training step with inductor for CUDA GPUs, and this run trains on "
            f"{torch.device(device).type}: compiling the network for the CPU takes many minutes for little gain. "
            "Train eagerly there (compile=null, the default), or on a GPU (trainer.accelerator=gpu)")


#: ``compile`` modes that capture the step in CUDA graphs.
GRAPH_MODES = ("reduce-overhead", "max-autotune")


def check_accumulation(mode: str | None, accumulate_grad_batches: int) -> None:
    """Refuse CUDA graphs with gradient accumulation: the backward graph's outputs become the parameters'
    ``.grad`` tensors, and the next micro-batch's replay writes into the same memory, so the accumulated
    gradient is lost (PyTorch 2.11 raises "accessing tensor output of CUDAGraphs that has been overwritten"
    or, where nothing reads it first, sums the wrong values; pytorch/pytorch#169545)."""
    if mode in GRAPH_MODES and accumulate_grad_batches > 1:
        raise ValueError(
            f"compile={mode} captures the training step in CUDA graphs, which cannot accumulate gradients "
            f"(trainer.accumulate_grad_batches={accumulate_grad_batches}): each micro-batch's replay overwrites the "
            "gradients of the one before (pytorch/pytorch#169545). Use compile=default (compiled, no CUDA graphs) "
            "or trainer.accumulate_grad_batches=1 with a larger data.batch_size")


def check_cuda_graph_run(mode: str | None, device: torch.device | str, world_size: int, accumulate_grad_batches: int,
                         gradient_clip_val: Any, precision: str, flat_reducer: bool = False) -> None:
    """Refuse ``cuda_graph=true`` where one graph cannot hold the step, naming what to change: on a device that is
    not a CUDA GPU, under several processes unless their gradients are averaged by the flat reducer (its one
    all-reduce after the backward is then captured with the step; ``flat_reducer``: the run's strategy is
    :class:`snntrain.distributed.FlatGradientDDP`, without ``sync_batchnorm``), with gradient accumulation (each
    replay writes the gradients afresh), gradient clipping (Lightning clips between the backward and the optimizer,
    outside the graph), fp16 loss scaling (the scaler checks for infinities on the host every step) and with a
    ``compile`` mode that already captures CUDA graphs."""
    device = torch.device(device)
    what = "cuda_graph=true captures the whole training step in one CUDA graph"
    if device.type != "cuda":
        raise ValueError(f"{what}, and this run trains on {device.type}: use it on a CUDA GPU "
                         "(trainer.accelerator=gpu), or cuda_graph=false")
    if world_size > 1 and not flat_reducer:
        raise ValueError(f"{what}; of a run of {world_size} processes, only with the flat reducer, whose one "
                         "all-reduce of the gradients is captured with the step (trainer.ddp.reducer=flat, the default "
                         "on one node), and without trainer.sync_batchnorm. Use those settings, or "
                         "compile=reduce-overhead (CUDA graphs of the forward and the backward)")
    if accumulate_grad_batches > 1:
        raise ValueError(f"{what}, where each replay writes the gradients afresh: it cannot accumulate them "
                         f"(trainer.accumulate_grad_batches={accumulate_grad_batches}). Use "
                         "trainer.accumulate_grad_batches=1 with a larger data.batch_size, or cuda_graph=false")
    if gradient_clip_val not in (None, 0, 0.0):
        raise ValueError(f"{what}, with the optimizer's update inside it: Lightning's clipping "
                         f"(trainer.gradient_clip_val={gradient_clip_val}) would run outside it. Set "
                         "trainer.gradient_clip_val=null, or cuda_graph=false")
    if str(precision).startswith("16"):
        raise ValueError(f"{what}; fp16 training (trainer.precision={precision}) scales the loss and checks the "
                         "gradients for infinities on the host every step. Use trainer.precision=bf16-mixed or "
                         "32-true, or cuda_graph=false")
    if mode in GRAPH_MODES:
        raise ValueError(f"{what}; compile={mode} already captures the forward and the backward in CUDA graphs. "
                         "Use compile=default (its objective is then captured whole) or compile=null")


def resolve_cuda_graph(setting: Any, mode: str | None, device: torch.device | str, world_size: int,
                       accumulate_grad_batches: int, gradient_clip_val: Any, precision: str,
                       flat_reducer: bool = False) -> bool:
    """Whether a fit captures its training step whole: ``true`` where :func:`check_cuda_graph_run` allows it (and
    its error otherwise), ``false`` never, ``auto`` wherever it is allowed; on a CUDA device where it is not,
    the log says why."""
    setting = check_cuda_graph(setting)
    if setting is False:
        return False
    try:
        check_cuda_graph_run(mode, device, world_size, accumulate_grad_batches, gradient_clip_val, precision,
                             flat_reducer)
    except ValueError as why:
        if setting is True:
            raise
        if torch.device(device).type == "cuda":
            log.info("snntrain: cuda_graph=auto stays off: %s", str(why).replace("cuda_graph=true", "cuda_graph", 1))
        return False
    return True


def autograd_cache_knows_autocast_dtype() -> bool:
    """Whether this PyTorch's AOTAutograd compile cache tells a graph traced under fp16 autocast from one
    traced under bf16 autocast. Before pytorch/pytorch#181564 its key held only whether autocast was on, so
    a step compiled under ``16-mixed`` after one under ``bf16-mixed`` (in one process, or through the cache
    on disk) silently ran the bf16 graph."""
    import inspect

    try:
        from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCacheDetails

        return "get_autocast_dtype" in inspect.getsource(AOTAutogradCacheDetails._record_runtime_state)
    except (ImportError, AttributeError, OSError, TypeError):
        return False


def _functorch_config():
    import torch._functorch.config as functorch_config

    return functorch_config


def guard_autograd_cache() -> None:
    """Turn the AOTAutograd compile cache off where its key misses the autocast dtype
    (:func:`autograd_cache_knows_autocast_dtype`); where it knows it (or the setting no longer exists), leave
    it alone."""
    if autograd_cache_knows_autocast_dtype():
        return
    config = _functorch_config()
    try:
        enabled = config.enable_autograd_cache
    except AttributeError:
        return
    if enabled:
        config.enable_autograd_cache = False
        log.info("torch %s: the AOTAutograd compile cache is off (its key misses the autocast dtype)",
                 torch.__version__)


class TrainingObjective(nn.Module):
    """``objective(model, *inputs)`` as a module over ``model``: a training step's forward and loss, which
    :func:`compile_model` turns into one graph (the loss and what it needs beside the network run inside it,
    not as eager kernels around a compiled network)."""

    def __init__(self, model: nn.Module, objective: Callable[..., Any]) -> None:
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.objective(self.model, *inputs)


def compile_model(model: nn.Module, mode: str | None, backend: str | None = None) -> nn.Module:
    """``model`` compiled with ``torch.compile`` in ``mode`` with static shapes (the model itself
    when ``mode`` is None) by ``backend`` (default :data:`BACKEND`). The result shares the model's
    parameters; keep saving the model.

    Where the AOTAutograd cache cannot tell fp16 from bf16 autocast
    (:func:`autograd_cache_knows_autocast_dtype`), that cache is turned off for the process: Inductor's
    own cache, keyed by the traced graph with its casts, still serves later starts."""
    mode = check_compile(mode)
    backend = BACKEND if backend is None else backend
    if mode is None:
        return model
    guard_autograd_cache()
    if backend != "inductor":  # modes are inductor's; other backends (tests: aot_eager) take none
        return torch.compile(model, dynamic=False, backend=backend)
    return torch.compile(model, mode=None if mode == "default" else mode, dynamic=False)
