"""The whole training step in one CUDA graph (``cuda_graph: true``): forward, loss, backward and the
optimizer's update, captured once and replayed for every later batch.

With ``compile=reduce-overhead`` PyTorch captures the forward and the backward as two graphs, and around
them every step still pays on the host for the guards of the compiled function, the autograd engine (one
node per parameter), the optimizer's Python and its launch. Where the step's GPU work is a few
milliseconds (the default detector, small images) that host work is most of the step. Captured whole,
a step costs the host the copy of the batch into the graph's inputs and one graph launch, eagerly
(no compilation: the kernels are those of the eager step) or over a ``compile=default`` objective.

What the graph holds is fixed at capture: the input shapes (a last, smaller batch is skipped, as with
``compile``), the parameters' and the optimizer state's memory (the weight average and batch-norm
re-estimation write them in place, so the graph sees their changes), and the learning rate, which the
graph reads from a tensor that the schedule fills (:func:`prepare_optimizer`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def prepare_optimizer(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Make ``optimizer`` capturable, in place: each group's learning rate becomes a one-element tensor on
    ``device`` (a Python number would be baked into the graph; the scheduler fills a tensor in place, so the
    replays follow the schedule), optimizers that keep a step count (AdamW) keep it on the device, and a plain
    SGD runs its fused kernel (the one that reads that tensor on the device)."""
    for group in optimizer.param_groups:
        lr = group["lr"]
        if not (torch.is_tensor(lr) and lr.device == device):
            group["lr"] = torch.tensor(float(lr), dtype=torch.float32, device=device)
        if "capturable" in group:
            group["capturable"] = True
        if isinstance(optimizer, torch.optim.SGD) and not group.get("fused"):
            # plain SGD reads a tensor learning rate on the host (``alpha=-lr``), which a capture cannot do; the
            # fused kernel reads it on the device
            if group.get("differentiable"):
                raise ValueError("a CUDA graph cannot capture SGD(differentiable=True): it reads the learning rate "
                                 "on the host; build it with differentiable=False")
            group["fused"], group["foreach"] = True, False


def plain_optimizer_state(state: dict[str, Any], capturable: bool = False) -> dict[str, Any]:
    """An optimizer ``state_dict`` as saved without graphs: learning rates as numbers and ``capturable`` back to
    ``capturable``, so that a checkpoint of a run with ``cuda_graph`` resumes anywhere (on a CPU too)."""
    groups = []
    for group in state.get("param_groups", []):
        group = dict(group)
        if torch.is_tensor(group.get("lr")):
            group["lr"] = float(group["lr"])
        if "capturable" in group:
            group["capturable"] = capturable
        groups.append(group)
    return {**state, "param_groups": groups}


def plain_scheduler_state(state: dict[str, Any]) -> dict[str, Any]:
    """A learning-rate schedule's ``state_dict`` as saved without graphs: its last learning rates as numbers
    (with the learning rate in a device tensor, the schedule records tensors), the twin of
    :func:`plain_optimizer_state`."""
    if "_last_lr" not in state:
        return state
    return {**state, "_last_lr": [float(v) for v in state["_last_lr"]]}


class StepGraph:
    """``step(*inputs)`` (everything on the device, nothing that waits for the host; it returns a dict of
    tensors) run as one CUDA graph. The first ``warmup`` calls run eagerly on a side stream, each after
    ``optimizer.zero_grad``: the lazy initialisations, Triton's compilation and autotuning and the optimizer's
    state happen there, outside the capture. The next call captures the step (its gradients then live in the
    graph: every replay writes them afresh, with no zeroing) and replays it; every later call copies its
    inputs into the graph's own and replays. The returned tensors are the graph's: the next call overwrites
    them, so read (or copy) them before."""

    def __init__(self, step: Callable[..., dict[str, torch.Tensor]], optimizer: torch.optim.Optimizer,
                 warmup: int = 2) -> None:
        if warmup < 1:
            raise ValueError(f"warmup={warmup} must be >= 1: the step runs eagerly before it is captured")
        self.step, self.optimizer, self.warmup = step, optimizer, warmup
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: tuple[torch.Tensor, ...] = ()
        self.outputs: dict[str, torch.Tensor] = {}
        self._side: torch.cuda.Stream | None = None

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        self.calls += 1
        if self.graph is not None:
            return self.replay(inputs)
        device = inputs[0].device
        if device.type != "cuda":
            raise ValueError(f"a CUDA graph needs CUDA tensors; the step's first input is on {device}")
        current = torch.cuda.current_stream(device)
        if self._side is None:
            self._side = torch.cuda.Stream(device)
        side = self._side
        side.wait_stream(current)
        if self.calls <= self.warmup:
            with torch.cuda.stream(side):
                self.optimizer.zero_grad(set_to_none=True)
                out = self.step(*inputs)
            current.wait_stream(side)
            return out
        prepare_optimizer(self.optimizer, device)
        with torch.cuda.stream(side):
            self.inputs = tuple(x.clone() for x in inputs)  # clone keeps each tensor's memory layout
        current.wait_stream(side)
        self.optimizer.zero_grad(set_to_none=True)  # the captured backward allocates the gradients in the graph
        graph = torch.cuda.CUDAGraph()
        # thread_local: the loader's pin-memory thread may use CUDA while this thread captures
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self.outputs = self.step(*self.inputs)
        self.graph = graph
        graph.replay()  # capturing ran nothing: this batch's step
        return self.outputs

    def replay(self, inputs: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        if len(inputs) != len(self.inputs) or any(x.shape != s.shape for x, s in zip(inputs, self.inputs)):
            raise ValueError(
                f"the captured training step takes inputs of shapes {[tuple(s.shape) for s in self.inputs]}, "
                f"got {[tuple(x.shape) for x in inputs]}: a CUDA graph replays fixed shapes")
        for static, x in zip(self.inputs, inputs):
            static.copy_(x, non_blocking=True)
        self.graph.replay()
        return self.outputs


def training_step_fn(objective: Callable[..., dict[str, torch.Tensor]], optimizer: torch.optim.Optimizer,
                     after_backward: Callable[[], None] | None = None) -> Callable[..., dict[str, torch.Tensor]]:
    """The step :class:`StepGraph` captures: ``objective(*inputs)`` (a dict with ``"loss"``), its backward,
    ``after_backward()`` (with several processes, the all-reduce of the gradients: NCCL collectives are captured
    like kernels) and ``optimizer.step()``; returns the objective's outputs, detached."""

    def step(*inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        out = objective(*inputs)
        out["loss"].backward()
        if after_backward is not None:
            after_backward()
        optimizer.step()
        return {k: v.detach() if torch.is_tensor(v) else v for k, v in out.items()}

    return step
