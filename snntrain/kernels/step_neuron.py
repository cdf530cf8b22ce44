"""Neurons generated from a step function: host launch, operator registration and autograd.

The kernels come from :mod:`snntrain.kernels.neuron_jit` (a module generated per traced step and
found by its key). Registered as ``torch.ops.snntrain.step_neuron_fwd`` / ``step_neuron_bwd``
(``torch.library.triton_op``, one pair for every generated neuron: the key selects the kernels), so
they show by name in profiler traces and trace under ``torch.compile``; eager calls take an
``autograd.Function`` over the same host functions (:func:`~snntrain.kernels.op_utils.traced`). Those keep a
plan per layout (``x``'s shape, strides, dtype and device, the flags, the neuron; :data:`_FWD_PLANS`,
:data:`_BWD_PLANS`, and :data:`_LN_FWD_PLANS`, :data:`_LN_BWD_PLANS` of the layer-norm tile kernels), as the
hand-written ops do: the outputs' layouts and the launch with its arguments bound once
(:class:`~snntrain.kernels.op_utils.Planned`), so that a call allocates its outputs and launches, and allocates
nothing it does not return (no empty final states, no empty checkpoints per call, no gradients of fixed
parameters). Traced and fake calls make their plan afresh.

What the forward keeps for the backward: the input X (the caller's tensor, not a copy) and the
states at the start of every chunk of :func:`~snntrain.kernels.neuron_step.chunk_steps` steps but the
first (``K`` states, fp32, every 8 steps: at most ``K / 2`` bytes per neuron-step and none for
T <= 8); the backward recomputes the chunk's states and every intermediate value of the step. The
outputs (spikes) are not saved.

Layouts are the hand-written neuron's (:mod:`snntrain.kernels.lif`, whose layout helpers these are): X
is read in place when its neurons form one strided run (contiguous, a stride-0 time axis, ...) or are
dense in another order (channels-last maps), the neurons then numbered in memory order and every output
and gradient laid out like X; other layouts are copied once. Parameters are one-element tensors or
``[C]`` tensors over dim 1 of a step ``[B, C, ...]`` (channel ``(n // S) % C`` of neuron ``n`` in that
numbering); a learnable ``[C]`` parameter's gradient is summed over T in the kernel and stored per program
where a program's block of neurons lies in one channel (``S`` a multiple of the block), per channel of
each program where the block is whole rows of channels (channels-last, ``C`` dividing the block), else
per neuron (:func:`_channel_sums`), then added up per channel with every other per-channel sum: in an eager
call where one program's share is small (:data:`~snntrain.kernels.step_neuron_tuning.FINISH_MAX_VALUES`) by the
kernel's last program to store its part of them (a channel's last with one value per program, else the last of
all; arrival counters kept zeroed by the plan, as the hand-written batch norm's), else in one reduction after it
(traced calls, CUDA-graph captures, large layers); a scalar one's per program (then in a fixed order).

A batch norm in front (:func:`bn_step_neuron`, spec ``affine`` ``"bn"``)
-----------------------------------------------------------------------
Bytes counted in tensors of the input's size ``E = T*B*C*H*W`` as in :mod:`snntrain.kernels.bn_neuron`
(whose statistics and finishing kernels these are), training mode:

* forward: the statistics kernel reads X (1; it folds in the running statistics too), the generated
  forward reads X, normalises it as it reads (``x * a + b``, ``a``, ``b`` per channel) and writes the
  outputs (2) = **3 E**;
* backward: the generated backward reads X and dS and writes dL/dy, the gradient of the normalised input,
  in X's dtype (3), with the two per-channel sums the norm needs (dL/dy and dL/dy * xhat) summed in
  registers and stored as the per-channel gradients are: 8 B per program of 256 neurons, ``8 C`` B per
  program for channels-last rows (2 B per neuron at C = 64), 8 B per neuron otherwise (a bf16 neuron's
  four steps are 8 B: one E more at T = 4), finished in the kernel or by one reduction as the per-channel
  gradients are (eager calls with few sums: two launches, the hand-written op's count); then one elementwise
  pass reads dL/dy and X and writes dL/dx over dL/dy (3) = **6 E**.

So 9 E, the hand-written fused op's count (against 13 E for the norm and the neuron unfused), with no
full-size temporary beyond dL/dx itself. With fixed statistics (eval mode) the backward kernel writes
``a * dL/dy``, dL/dx, itself (3 E); a stride-0 time axis (``[B, C, H, W]`` repeated over T) is read
once per element by the statistics, and its dL/dx is summed over T in registers and written once.

A layer norm in front (:func:`ln_step_neuron`, spec ``affine`` ``"ln"``)
-----------------------------------------------------------------------
:class:`~snntrain.nn.LayerNorm2d`: statistics per position over ``C``. Where the channels fit one program
(:mod:`snntrain.kernels.step_neuron_tuning`: ``C`` padded to a power of two up to ``LN_TILE_MAX_C``), the
generated tile kernels (``ln_fwd_kernel``, ``ln_bwd_kernel``) do each direction in one kernel, as the
hand-written fused op (:mod:`snntrain.kernels.ln_neuron`) does: a program holds all ``C`` channels of
``BLOCK_S`` positions of one sample (X read in place through its strides, NCHW or channels-last, as
:mod:`snntrain.kernels.norm_neuron_base` maps it), and at each step computes the mean and 1/std over ``C``
in registers (fp32; fp64 for fp64 input), normalises with the weight and bias and runs the traced step. The
backward walks the chunks in reverse from the forward's checkpoints (every 8 steps, ``K`` fp32 states),
recomputes the chunk's statistics and states, runs the reverse step and finishes the layer norm's backward
over ``C`` per step in registers, ``dx = rstd * (w*dy - mean_C(w*dy) - xhat * mean_C(w*dy*xhat))``; the
weight's and bias's gradients and every learnable parameter's are per-program partial sums (``[programs,
2 + learnable, C]``: deterministic, no atomics), added up by one reduction. Bytes in ``E`` as above:

* forward: reads X, writes the outputs = **2 E**;
* backward: reads X and dS, writes dL/dx = **3 E**;

so **5 E**, the hand-written fused op's count, against 9 E for the three-pass path below and 10 E for the
norm and the neuron unfused (which also keep the normalised input, one more E of activation memory). The
partial sums add ``4 (2 + learnable) C`` B per program of the backward, written once and read once. A
stride-0 time axis (``[B, C, H, W]`` repeated over T) is read and normalised once per position by each
kernel, and its dL/dy summed over T in registers before the layer norm's backward runs once.

Channels beyond the limit take three passes: :mod:`snntrain.kernels.layer_norm`'s forward kernel computes
the statistics (without the output), the generated per-neuron kernels read them and normalise as they read
(``(x - mean) * rstd * w + b``), and the backward kernel writes dL/dy, which one pass of the layer norm's
backward kernel turns into dL/dx in place with the weight's and bias's sums: forward 1 + 2 E, backward
3 + 3 E = **9 E** (the statistics, 8 B per position per step, besides).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from . import norm_neuron_base as base
from . import step_neuron_tuning as step_tuning
from .bn_neuron import _semaphores, bn_input_grad
from .layer_norm import layer_norm_stats, ln_input_grad
from .lif import (
    BWD_BLOCK,
    BWD_WARPS,
    FWD_BLOCK,
    FWD_WARPS,
    _neuron_order,
    _permuted,
    _time_major,
)
from .neuron_codegen import CSUM_NEURON, CSUM_PROGRAM, CSUM_ROWS
from .neuron_jit import lookup
from .neuron_step import SHORT_CHUNK, chunk_steps
from .op_utils import INT32_MAX, PlanCache, Planned, cdiv, direct, op_wrap, profiled, register_op, traced

__all__ = ["clear_plans", "bn_step_neuron", "ln_step_neuron", "step_neuron", "step_neuron_fwd", "step_neuron_bwd", "F_RETURN_STATE",
           "F_SAVE_CKPT", "F_GRAD_INIT"]

F_RETURN_STATE, F_SAVE_CKPT, F_GRAD_INIT = 1, 2, 4

# Launch sizes: the hand-written neuron's (snntrain.kernels.lif), the backward's smaller for its registers. Unlike the
# hand-written backward, 16-bit input keeps 256 neurons over 4 warps: with 512 over 8 the StepNeuron LIF's bf16
# T = 32 forward plus backward took 1.56x the hand-written kernel's time against 1.30x (H200, bench_neurons --suite
# api-lif, one run each).


def _channels(x: Tensor, per_channel: tuple[bool, ...], order: tuple[int, ...]) -> tuple[int, int]:
    """``(C, S)``: the channels (dim 2 of ``x``) and the run of neurons per channel in the kernels' numbering
    (``order``): neuron ``n`` has channel ``(n // S) % C`` (S = H * W row-major, 1 channels-last)."""
    if not any(per_channel) or x.dim() < 3:
        return 1, 1
    pos = order.index(1)  # the channel dim of a step, in memory order
    return x.shape[2], math.prod(x.shape[1 + d] for d in order[pos + 1:])


def _layout(shape, order: tuple[int, ...], lead: int) -> tuple[int, ...]:
    """The strides of a dense tensor of ``shape`` whose dims after the first ``lead`` are laid out in ``order``
    (the layout :func:`~snntrain.kernels.lif._empty` makes; row-major where ``order`` does not cover them)."""
    n = len(shape)
    if len(order) != n - lead:
        order = tuple(range(n - lead))
    strides = [0] * n
    run = 1
    for d in reversed((*range(lead), *(lead + d for d in order))):  # innermost first
        strides[d] = run
        run = run * shape[d]
    return tuple(strides)


def _new(shape, strides, dtype: torch.dtype, dev) -> Tensor:
    return torch.empty_strided(shape, strides, dtype=dtype, device=dev)


def _affine_names(affine: tuple | None) -> tuple:
    """The norm's arguments in a launch: its tensors by name (``a0``, ``a1``, ...), numbers as they are."""
    return tuple(name if isinstance(a, Tensor) else a for name, a in zip(_names("a", len(affine or ())), affine or ()))


def _bn_consts(mode: str, affine: tuple | None) -> dict:
    """The batch norm's constexprs (spec ``affine`` ``"bn"``, ``affine`` = ``(mean, rstd, weight, bias)``): whether
    the weight and the bias are given."""
    if mode != "bn":
        return {}
    return dict(HAS_W=affine[2] is not None, HAS_B=affine[3] is not None)


def _affine_key(affine: tuple | None) -> tuple:
    """What a plan depends on in ``affine``: its numbers and absent tensors (its tensors are each call's)."""
    return tuple(a for a in affine if not isinstance(a, Tensor)) if affine else ()


@functools.lru_cache(maxsize=None)
def _names(prefix: str, n: int) -> tuple[str, ...]:
    """The names ``prefix0``, ``prefix1``, ... of a launch's tensors (:class:`~snntrain.kernels.op_utils.Planned`)."""
    return tuple(f"{prefix}{i}" for i in range(n))


def _cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t.to(dtype)`` without an operation where ``t`` has that dtype already."""
    return t if t.dtype == dtype else t.to(dtype)


def _named(prefix: str, tensors) -> dict:
    """``tensors`` by their :func:`_names`."""
    return dict(zip(_names(prefix, len(tensors)), tensors))


class _FwdPlan:
    """What a forward of one layout (``x``'s shape, strides and dtype, the flags, whether initial states are given,
    the neuron) allocates and launches: the outputs' shapes and strides (``order``, the kernels' numbering of the
    neurons) and the kernel's launch (:class:`~snntrain.kernels.op_utils.Planned`, None where nothing runs).
    ``copy_x``: ``x`` is read from a contiguous copy (an odd layout), else in place. ``no_ckpt``: an eager plan's
    empty checkpoints (no checkpoint is stored: T fits one chunk, or no gradient), shared by its calls."""

    __slots__ = ("order", "ct", "y_stride", "final_shape", "final_stride", "ckpt_shape", "copy_x", "launch", "no_ckpt")


def _fwd_plan(x: Tensor, has_init: bool, key: str, flags: int, affine: tuple | None,
              launches: bool) -> tuple[_FwdPlan, Tensor]:
    """The forward plan of ``x``'s layout, and ``x`` as the kernel reads it (``[T, N]``, a copy where
    ``copy_x``)."""
    compiled = lookup(key)
    spec = compiled.spec
    K = len(spec.states)
    T, step = x.shape[0], tuple(x.shape[1:])
    N = math.prod(step)
    if N * max(K, 1) > INT32_MAX:
        raise ValueError(f"a time step has {N} neurons with {K} states; the generated kernels support at most "
                         f"{INT32_MAX} state values per step")
    plan = _FwdPlan()
    plan.ct = torch.float64 if spec.fp64 else torch.float32
    plan.order = order = _neuron_order(x, None)
    plan.y_stride = _layout(x.shape, order, 1)
    plan.final_shape = (K, *step)
    plan.final_stride = _layout(plan.final_shape, order, 1)
    chunk = chunk_steps(T)
    n_ckpt = max(cdiv(T, chunk) - 1, 0) if flags & F_SAVE_CKPT else 0
    plan.ckpt_shape = (n_ckpt, K, N)
    plan.launch, plan.copy_x, plan.no_ckpt, xk = None, False, None, x
    if launches and N > 0 and T > 0:
        C, S = _channels(x, (*spec.per_channel, spec.affine), order)
        xp = _permuted(x, order, 1)
        xk, stride_xt, stride_xn = _time_major(xp)
        plan.copy_x = xk is not xp
        plan.launch = Planned(
            compiled.module.fwd_kernel, (cdiv(N, FWD_BLOCK),),
            ("x", "init", *_names("p", len(spec.params)), *_affine_names(affine), "y", "final", "ckpt",
             T, N, C, S, stride_xt, stride_xn),
            dict(HAS_INIT=has_init, STORE_FINAL=bool(flags & F_RETURN_STATE), STORE_CKPT=n_ckpt > 0,
                 **_bn_consts(spec.affine, affine), CHUNK=chunk, BLOCK=FWD_BLOCK, num_warps=FWD_WARPS))
    return plan, xk


_FWD_PLANS = PlanCache()
_BWD_PLANS = PlanCache()


def _fwd_host(x: Tensor, init: Tensor | None, params, key: str, flags: int, launch: bool, wrap=direct,
              affine: tuple | None = None, eager: bool = False) -> tuple[Tensor, Tensor | None, Tensor]:
    """Outputs, final states and checkpoints; ``affine``: the norm's arguments of a neuron whose kernels normalise
    as they read (spec ``affine``): ``(mean, rstd, weight, bias)`` ([C], the weight and bias each None where absent) for
    ``x * a + b`` with ``a = rstd * weight``, ``b = bias - mean * a`` formed in the kernel (``"bn"``), ``(weight, bias, mean,
    rstd, stride_st)`` for ``"ln"`` (:func:`ln_step_neuron`). ``eager`` (a call that launches directly, not the
    operator, whose outputs are fresh tensors): the plan of the layout is reused (:data:`_FWD_PLANS`), the final
    states are None unless asked for and empty checkpoints are the plan's."""
    if eager:
        plan_key = (key, x.shape, x.stride(), x.dtype, x.device, init is None, flags, _affine_key(affine))
        plan = _FWD_PLANS.get(plan_key)
        if plan is None:
            plan, xk = _fwd_plan(x, init is not None, key, flags, affine, True)
            if plan.ckpt_shape[0] == 0:
                plan.no_ckpt = torch.empty(plan.ckpt_shape, dtype=plan.ct, device=x.device)
            _FWD_PLANS.put(plan_key, plan)
        else:
            xk = _time_major(x, plan.order)[0] if plan.copy_x else x
    else:
        plan, xk = _fwd_plan(x, init is not None, key, flags, affine, launch)
    dev = x.device
    y = _new(x.shape, plan.y_stride, x.dtype, dev)
    store_final = bool(flags & F_RETURN_STATE)
    if eager:
        final = _new(plan.final_shape, plan.final_stride, plan.ct, dev) if store_final else None
        ckpt = plan.no_ckpt if plan.no_ckpt is not None else torch.empty(plan.ckpt_shape, dtype=plan.ct, device=dev)
    else:
        final = (_new(plan.final_shape, plan.final_stride, plan.ct, dev) if store_final
                 else torch.empty((0,), dtype=plan.ct, device=dev))
        ckpt = torch.empty(plan.ckpt_shape, dtype=plan.ct, device=dev)
    if launch and plan.launch is not None:
        if init is not None:
            init = _permuted(init, plan.order, 1).contiguous()
        tensors = {"x": xk, "init": init, "y": y, "final": final, "ckpt": ckpt, **_named("p", params)}
        if affine:
            tensors.update(_named("a", affine))
        plan.launch(wrap, tensors)
    return y, final, ckpt


def _channel_sums(N: int, C: int, S: int, grid: int, block: int) -> tuple[int, int, int, int]:
    """``(CSUM, CB, R, M)``: how the backward stores a per-channel sum (:mod:`~snntrain.kernels.neuron_codegen`'s
    ``_store_channel_sums``), ``M`` values per sum, which ``view(-1, C, R).sum((0, 2))`` adds up per channel. One
    value per program where each ``block`` of neurons lies in one channel (``S`` a multiple of the
    block, or one channel in all), one per channel and program where a block is whole rows of ``C`` channels
    (channels-last numbering, ``C`` dividing the block), else one per neuron."""
    if C == 1:
        return CSUM_PROGRAM, 1, 1, grid
    if S % block == 0:
        return CSUM_PROGRAM, 1, S // block, grid
    if S == 1 and block % C == 0:
        return CSUM_ROWS, C, 1, grid * C
    return CSUM_NEURON, 1, S, N


class _BwdPlan:
    """What a backward of one layout allocates and launches (as :class:`_FwdPlan`): dL/dx's and dL/d(initial
    states)'s shapes and strides, the learnable parameters (``learn``; ``channel``: those per channel, whose sums
    share one buffer of ``rows`` rows, with the norm's two sums last; ``scalar``: the others, one row each of the
    ``sbuf`` buffer of per-program sums), how the per-channel sums are added up (``C``, ``R``; ``finish``: by the
    kernel's last program to store its part of them, into a ``[rows, C]`` buffer, else by one reduction here),
    whether ``x`` and dL/dy are read from contiguous copies, the launch."""

    __slots__ = ("order", "ct", "gx_shape", "gx_stride", "ginit_shape", "ginit_stride", "learn", "channel", "scalar",
                 "rows", "sbuf", "C", "R", "finish", "copy_x", "copy_g", "launch")


def _bwd_plan(x: Tensor, has_init: bool, grad_y: Tensor | None, has_gfinal: bool, key: str, flags: int,
              affine: tuple | None, norm_sums: bool, sum_t: bool, scaled: bool,
              launches: bool, fuse: bool = False) -> tuple[_BwdPlan, Tensor, Tensor | None]:
    """The backward plan of a layout, with ``x`` and dL/dy as the kernel reads them (copies where ``copy_x``,
    ``copy_g``). ``fuse`` (eager plans): the kernel finishes the per-channel sums itself where one program's share
    of them is small (:data:`~snntrain.kernels.step_neuron_tuning.FINISH_MAX_VALUES`; arrival counters as
    :func:`~snntrain.kernels.bn_neuron._semaphores` keeps them), one launch fewer."""
    compiled = lookup(key)
    spec = compiled.spec
    K = len(spec.states)
    T, step = x.shape[0], tuple(x.shape[1:])
    N = math.prod(step)
    plan = _BwdPlan()
    plan.ct = torch.float64 if spec.fp64 else torch.float32
    plan.order = order = _neuron_order(x, None)
    plan.gx_shape = step if sum_t else tuple(x.shape)
    plan.gx_stride = _layout(plan.gx_shape, order, 0 if sum_t else 1)
    plan.ginit_shape = (K, *step)
    plan.ginit_stride = _layout(plan.ginit_shape, order, 1)
    plan.learn = learn = tuple(j for j, flag in enumerate(spec.learnable) if flag)
    plan.channel = tuple(j for j in learn if spec.per_channel[j])
    plan.scalar = tuple(j for j in learn if not spec.per_channel[j])
    block, warps = BWD_BLOCK, BWD_WARPS
    grid = cdiv(N, block)
    plan.sbuf = (len(plan.scalar), grid)
    plan.rows, plan.C, plan.R, plan.finish = (0, 0), 1, 1, False
    plan.launch, plan.copy_x, plan.copy_g, xk, gy = None, False, False, x, grad_y
    if not launches or N == 0 or T == 0:
        return plan, xk, gy
    C, S = _channels(x, (*spec.per_channel, spec.affine), order)
    csum, cb, plan.R, M = _channel_sums(N, C, S, grid, block)
    plan.C = C
    nrows = len(plan.channel) + 2 * norm_sums
    plan.rows = (nrows, M)
    sem = None
    if nrows and fuse and nrows * (M // C if csum == CSUM_PROGRAM else M) <= step_tuning.FINISH_MAX_VALUES:
        sem = _semaphores(C if csum == CSUM_PROGRAM else 1, True, x.device)
    plan.finish = sem is not None
    fin_j, fin_c = step_tuning.finish_tile(1 if csum == CSUM_PROGRAM else C)
    xp = _permuted(x, order, 1)
    xk, stride_xt, stride_xn = _time_major(xp)
    plan.copy_x = xk is not xp
    stride_gt = stride_gn = 0
    if grad_y is not None:
        gp = _permuted(grad_y, order, 1)
        gy, stride_gt, stride_gn = _time_major(gp)
        plan.copy_g = gy is not gp
    extra, rows, sums_shape, finish = {}, (), (), {}
    if spec.affine == "bn":
        extra = dict(**_bn_consts(spec.affine, affine), NORM_SUMS=norm_sums, SUM_T=sum_t, GX_SCALED=scaled)
    elif spec.affine == "ln":
        extra = dict(SUM_T=sum_t)
    if plan.channel or spec.affine == "bn":  # the kernel has per-channel sums (rows_ptr, fin_ptr, sem_ptr)
        rows = ("rows", "fin", sem) if sem is not None else ("rows", "rows", "rows")
        sums_shape = (M, M // (C * plan.R), plan.R)
        finish = dict(NROWS=nrows, FINISH=sem is not None, FINISH_J=fin_j, FINISH_C=fin_c)
    plan.launch = Planned(
        compiled.module.bwd_kernel, (grid,),
        ("x", "init", "ckpt", *_names("p", len(spec.params)), *_affine_names(affine), "gy", "gfinal",
         "gx", "ginit", *(f"g{j}" for j in plan.scalar), *rows, T, N, C, S, stride_xt, stride_xn, stride_gt,
         stride_gn, *sums_shape),
        dict(HAS_INIT=has_init, HAS_GY=grad_y is not None, HAS_GFINAL=has_gfinal, STORE_GINIT=bool(flags & F_GRAD_INIT),
             CSUM=csum, CB=cb, **finish, **extra, CHUNK=chunk_steps(T), BLOCK=block, num_warps=warps))
    return plan, xk, gy


def _bwd_host(x: Tensor, init: Tensor | None, ckpt: Tensor, params, grad_y: Tensor | None,
              grad_final: Tensor | None, key: str, flags: int, launch: bool,
              wrap=direct, affine: tuple[Tensor, ...] | None = None, sums: list | None = None,
              sum_t: bool = False, scaled: bool = False, eager: bool = False) -> tuple[Tensor, Tensor, list[Tensor]]:
    """``(dL/dx, dL/d(initial states), [dL/dparam])``. With ``affine`` = ``(mean, rstd, weight, bias)`` (spec
    ``affine`` ``"bn"``, as :func:`_fwd_host` takes it) dL/dx is the gradient of the neuron's input ``x * a + b`` (``scaled``: ``a`` times it, the
    gradient of x through a norm with fixed statistics; ``sum_t``: x's time axis has stride 0, and dL/dx is one
    step's, summed over T), and ``sums``, where given, receives the per-channel sums of it and of it times
    ``(x - mean) * rstd`` (what a batch norm's backward needs). With spec ``affine`` ``"ln"`` (``affine`` as
    :func:`_fwd_host` takes it) dL/dx is dL/dy of the normalised input, nothing else (``sum_t`` as above).
    ``eager`` (as :func:`_fwd_host`): the plan of the layout is reused (:data:`_BWD_PLANS`), and dL/d(initial
    states) and the gradients of fixed parameters are None."""
    norm_sums = sums is not None
    if eager:
        plan_key = (key, x.shape, x.stride(), x.dtype, x.device, init is None,
                    None if grad_y is None else grad_y.stride(), grad_final is None, flags, sum_t, scaled, norm_sums,
                    _affine_key(affine))
        plan = _BWD_PLANS.get(plan_key)
        if plan is None:
            plan, xk, gy = _bwd_plan(x, init is not None, grad_y, grad_final is not None, key, flags, affine, norm_sums,
                                     sum_t, scaled, True, fuse=True)
            _BWD_PLANS.put(plan_key, plan)
        else:
            xk = _time_major(x, plan.order)[0] if plan.copy_x else x
            gy = _time_major(grad_y, plan.order)[0] if plan.copy_g else grad_y
    else:
        plan, xk, gy = _bwd_plan(x, init is not None, grad_y, grad_final is not None, key, flags, affine, norm_sums,
                                 sum_t, scaled, launch)
    dev = x.device
    ct = plan.ct
    store_ginit = bool(flags & F_GRAD_INIT)
    grad_x = _new(plan.gx_shape, plan.gx_stride, x.dtype, dev)
    if store_ginit:
        grad_init = _new(plan.ginit_shape, plan.ginit_stride, ct, dev)
    else:
        grad_init = None if eager else torch.empty((0,), dtype=ct, device=dev)
    learn = plan.learn
    if eager:
        grads: list = [None] * len(params)
    else:  # the operator's outputs: one per parameter (the learnable ones' made below when launching)
        grads = [torch.empty(p.shape if j in learn and not launch else (0,), dtype=p.dtype, device=dev)
                 for j, p in enumerate(params)]
    if not launch:
        return grad_x, grad_init, grads
    if plan.launch is None:  # no neuron or no step
        grad_x.zero_()
        if grad_init is not None:
            grad_init.zero_()
        for j in learn:
            grads[j] = torch.zeros(params[j].shape, dtype=params[j].dtype, device=dev)
        if sums is not None:
            sums[:] = [torch.zeros(x.shape[2], dtype=ct, device=dev) for _ in range(2)]
        return grad_x, grad_init, grads
    rows = torch.empty(plan.rows, dtype=ct, device=dev) if plan.rows[0] else None
    fin = torch.empty((plan.rows[0], plan.C), dtype=ct, device=dev) if plan.finish else None
    sbuf = torch.empty(plan.sbuf, dtype=ct, device=dev) if plan.scalar else None
    tensors = {"x": xk, "init": None if init is None else _permuted(init, plan.order, 1).contiguous(), "ckpt": ckpt,
               "gy": gy, "gx": grad_x, "ginit": grad_init, "rows": rows, "fin": fin, **_named("p", params)}
    if grad_final is not None:
        tensors["gfinal"] = _permuted(grad_final, plan.order, 1).to(ct).contiguous()
    else:
        tensors["gfinal"] = None
    if affine:
        tensors.update(_named("a", affine))
    for q, j in enumerate(plan.scalar):
        tensors[f"g{j}"] = sbuf[q]
    plan.launch(wrap, tensors)
    if rows is not None:
        per_channel = fin if fin is not None else rows.view(rows.shape[0], -1, plan.C, plan.R).sum(dim=(1, 3))
        separate = rows.shape[0] > 1 and not eager  # the operator's outputs may not alias one another
        for q, j in enumerate(plan.channel):
            grads[j] = per_channel[q].reshape(params[j].shape).to(params[j].dtype, copy=separate)
        if norm_sums:
            sums[:] = [per_channel[-2], per_channel[-1]]
    for q, j in enumerate(plan.scalar):
        grads[j] = sbuf[q].sum().reshape(params[j].shape).to(params[j].dtype)
    return grad_x, grad_init, grads


# ----------------------------------------------------------------------------
# Operator registration
# ----------------------------------------------------------------------------


def _op_fwd(x: Tensor, init: Tensor | None, params: list[Tensor], key: str, flags: int
            ) -> tuple[Tensor, Tensor, Tensor]:
    """``(outputs [T, ...], final states [K, ...] or empty, checkpoints)`` of the generated neuron ``key``."""
    return _fwd_host(x, init, list(params), key, flags, launch=True, wrap=op_wrap)


def _op_fwd_fake(x, init, params, key, flags):
    return _fwd_host(x, init, list(params), key, flags, launch=False)


def _op_bwd(x: Tensor, init: Tensor | None, ckpt: Tensor, params: list[Tensor], grad_y: Tensor | None,
            grad_final: Tensor | None, key: str, flags: int) -> tuple[Tensor, Tensor, list[Tensor]]:
    """``(dL/dx, dL/d(initial states) or empty, [dL/dparam or empty])``."""
    return _bwd_host(x, init, ckpt, list(params), grad_y, grad_final, key, flags, launch=True, wrap=op_wrap)


def _op_bwd_fake(x, init, ckpt, params, grad_y, grad_final, key, flags):
    return _bwd_host(x, init, ckpt, list(params), grad_y, grad_final, key, flags, launch=False)


step_neuron_fwd = register_op("snntrain::step_neuron_fwd", _op_fwd, _op_fwd_fake)
step_neuron_bwd = register_op("snntrain::step_neuron_bwd", _op_bwd, _op_bwd_fake)


def _setup_context(ctx, inputs, output) -> None:
    x, init, params, key, flags = inputs
    _y, final, ckpt = output
    ctx.save_for_backward(x, init, ckpt, *params)
    ctx.key, ctx.flags = key, flags
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(ckpt)
    if not flags & F_RETURN_STATE:
        ctx.mark_non_differentiable(final)


def _grads(ctx, grad_y, grad_final, bwd):
    x, init, ckpt, *params = ctx.saved_tensors
    flags = ctx.flags
    need_init = init is not None and ctx.needs_input_grad[1]
    if need_init:
        flags |= F_GRAD_INIT
    if not ctx.flags & F_RETURN_STATE:
        grad_final = None
    grad_x, grad_init, grads = bwd(x, init, ckpt, params, grad_y, grad_final, ctx.key, flags)
    spec = lookup(ctx.key).spec
    grads = [g if learn else None for g, learn in zip(grads, spec.learnable)]
    return grad_x, (grad_init.to(init.dtype) if need_init else None), grads


def _op_backward(ctx, grad_y, grad_final, _grad_ckpt):
    grad_x, grad_init, grads = _grads(ctx, grad_y, grad_final, step_neuron_bwd)
    return grad_x, grad_init, grads, None, None


step_neuron_fwd.register_autograd(_op_backward, setup_context=_setup_context)


class _EagerStepNeuron(torch.autograd.Function):
    """The operators' forward and backward, launched without the operator machinery (eager calls, with the plans
    of :func:`_fwd_host` and :func:`_bwd_host`); the parameters as separate arguments, so that autograd sees each
    of them. Returns the outputs, and the final states with ``F_RETURN_STATE`` (the checkpoints are saved, not
    returned)."""

    @staticmethod
    def forward(ctx, x, init, key, flags, *params):
        with profiled("snntrain::step_neuron_fwd"):
            y, final, ckpt = _fwd_host(x, init, params, key, flags, launch=True, eager=True)
        ctx.save_for_backward(x, init, ckpt, *params)
        ctx.key, ctx.flags = key, flags
        ctx.set_materialize_grads(False)
        return (y, final) if flags & F_RETURN_STATE else y

    @staticmethod
    def backward(ctx, grad_y, grad_final=None):
        grad_x, grad_init, grads = _grads(ctx, grad_y, grad_final, _eager_bwd)
        return (grad_x, grad_init, None, None, *grads)


def _eager_bwd(*args):
    with profiled("snntrain::step_neuron_bwd"):
        return _bwd_host(*args, launch=True, eager=True)


class _EagerBNStepNeuron(torch.autograd.Function):
    """A batch norm folded into a generated neuron (spec ``affine`` ``"bn"``): the neuron's input is ``x * a + b`` with
    ``a = weight * rstd``, ``b = bias - mean * a`` per channel, formed in the kernels' registers. The backward kernel
    gives dL/dy of that input and its per-channel sums; with batch statistics one elementwise pass
    (:func:`~snntrain.kernels.bn_neuron.bn_input_grad`) turns dL/dy into dL/dx in place, with fixed
    statistics the kernel writes ``a * dL/dy`` itself. ``x`` is ``[T, B, C, ...]``, or ``[B, C, H, W]`` with
    ``T`` (read as a stride-0 time axis; its gradient is summed over T in the kernel)."""

    @staticmethod
    def forward(ctx, x, weight, bias, mean, rstd, T, key, flags, batch_stats, *params):
        xt = x if T is None else x.expand(T, *x.shape)
        with profiled("snntrain::step_neuron_fwd"):
            y, _final, ckpt = _fwd_host(xt, None, params, key, flags, launch=True, affine=(mean, rstd, weight, bias),
                                        eager=True)
        ctx.save_for_backward(x, weight, bias, ckpt, *params)
        ctx.mean, ctx.rstd = mean, rstd
        ctx.T, ctx.key, ctx.flags, ctx.batch_stats = T, key, flags, batch_stats
        ctx.set_materialize_grads(False)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, bias, ckpt, *params = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        spec = lookup(ctx.key).spec
        if grad_y is None:
            return (None,) * 9 + tuple(None for _ in params)
        batch, T, mean, rstd = ctx.batch_stats, ctx.T, ctx.mean, ctx.rstd
        sums: list | None = [] if need_w or need_b or (need_x and batch) else None
        xt = x if T is None else x.expand(T, *x.shape)
        with profiled("snntrain::step_neuron_bwd"):
            grad_x, _gi, grads = _bwd_host(xt, None, ckpt, params, grad_y, None, ctx.key, ctx.flags, launch=True,
                                           affine=(mean, rstd, weight, bias), sums=sums, sum_t=T is not None,
                                           scaled=not batch, eager=True)
            s_g, s_gx = sums if sums is not None else (None, None)
            if need_x and batch:  # through the batch's mean and variance
                grad_x = bn_input_grad(x, grad_x, mean, rstd, weight, s_g, s_gx, T)
        grads = [g if learn else None for g, learn in zip(grads, spec.learnable)]
        return (grad_x if need_x else None, _cast(s_gx, weight.dtype) if need_w else None,
                _cast(s_g, bias.dtype) if need_b else None, None, None, None, None, None, None, *grads)


def bn_step_neuron(x: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor, rstd: Tensor,
                   batch_stats: bool, params: list[Tensor], key: str, T: int | None = None) -> Tensor:
    """The generated neuron ``key`` (spec ``affine`` ``"bn"``) over the batch norm
    ``(x - mean) * rstd * weight + bias`` of ``x`` ``[T, B, C, ...]`` (or ``[B, C, H, W]`` repeated over ``T``
    steps), fused: outputs ``[T, B, C, ...]`` in ``x``'s dtype. ``mean`` and ``rstd`` ([C] fp32, fp64 for fp64
    input; :func:`~snntrain.kernels.bn_neuron.bn_stats`) are the batch's (``batch_stats``: the gradient also flows
    through them, as the batch norm's in training) or the running statistics. Differentiable in ``x``,
    ``weight``, ``bias`` and the learnable parameters (eager calls)."""
    flags = F_SAVE_CKPT if torch.is_grad_enabled() else 0
    return _EagerBNStepNeuron.apply(x, weight, bias, mean, rstd, T, key, flags, batch_stats, *params)


def _positions_in_order(x: Tensor) -> bool:
    """Whether the kernels' numbering of ``x`` ``[T, B, C, H, W]`` keeps B, H, W in that order (the layer norm's
    statistics are numbered so: position ``(n // (C * S)) * S + n % S`` of neuron ``n``); contiguous and
    channels-last maps do."""
    rest = [d for d in _neuron_order(x, None) if d != 1]
    return rest == sorted(rest)


class _EagerLNStepNeuron(torch.autograd.Function):
    """A layer norm over channels folded into a generated neuron (spec ``affine`` ``"ln"``): the neuron's input is
    ``(x - mean) * rstd * weight + bias`` with ``mean``, ``rstd`` per position and step, computed in the kernels.
    The backward kernel gives dL/dy of that input; one pass of the layer norm's backward kernel
    (:func:`~snntrain.kernels.layer_norm.ln_input_grad`) turns it into dL/dx in place, with the weight's and
    bias's gradients. ``x`` is ``[T, B, C, H, W]``, or ``[B, C, H, W]`` with ``T`` (a stride-0 time axis: the
    statistics are per (b, h, w), and dL/dy is summed over T in the kernel before the finishing pass)."""

    @staticmethod
    def forward(ctx, x, weight, bias, mean, rstd, T, key, flags, *params):
        C = x.shape[-3]
        ct = mean.dtype
        w = torch.ones(C, dtype=ct, device=x.device) if weight is None else weight
        b = torch.zeros(C, dtype=ct, device=x.device) if bias is None else bias
        affine = (w, b, mean, rstd, 0 if T is not None else mean.numel() // max(x.shape[0], 1))
        xt = x if T is None else x.expand(T, *x.shape)
        with profiled("snntrain::step_neuron_fwd"):
            y, _final, ckpt = _fwd_host(xt, None, params, key, flags, launch=True, affine=affine, eager=True)
        ctx.save_for_backward(x, weight, bias, mean, rstd, ckpt, *params)
        ctx.affine, ctx.T, ctx.key, ctx.flags = affine, T, key, flags
        ctx.set_materialize_grads(False)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, bias, mean, rstd, ckpt, *params = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        spec = lookup(ctx.key).spec
        if grad_y is None:
            return (None,) * 8 + tuple(None for _ in params)
        T = ctx.T
        xt = x if T is None else x.expand(T, *x.shape)
        grad_w = grad_b = None
        with profiled("snntrain::step_neuron_bwd"):
            grad_x, _gi, grads = _bwd_host(xt, None, ckpt, params, grad_y, None, ctx.key, ctx.flags, launch=True,
                                           affine=ctx.affine, sum_t=T is not None, eager=True)
            if need_x or need_w or need_b:
                grad_x, grad_w, grad_b = ln_input_grad(x, grad_x, weight, bias, mean, rstd, need_w, need_b)
        grads = [g if learn else None for g, learn in zip(grads, spec.learnable)]
        return (grad_x if need_x else None, grad_w, grad_b, None, None, None, None, None, *grads)


class _LNTilePlan:
    """An eager tile launch of one layout (``x``'s shape, strides and dtype, T, eps, whether checkpoints are kept;
    dL/dy's strides in the backward): ``out`` the spikes' layout (forward; :class:`~snntrain.kernels.
    norm_neuron_base._FwdPlan`), ``gx_stride`` dL/dx's (backward), the checkpoints' or the partial sums' shape, an
    empty checkpoint tensor shared by the plan's calls where none is kept (``no_ckpt``), whether ``x`` and dL/dy
    are copies (odd layouts), the launch (None where nothing runs)."""

    __slots__ = ("out", "ct", "ckpt_shape", "no_ckpt", "copy_x", "copy_g", "gx_stride", "part_shape", "launch")


_LN_FWD_PLANS = PlanCache()
_LN_BWD_PLANS = PlanCache()


def clear_plans() -> None:
    """Forget the eager launch plans (after launch sizes in :mod:`snntrain.kernels.step_neuron_tuning` changed)."""
    for plans in (_FWD_PLANS, _BWD_PLANS, _LN_FWD_PLANS, _LN_BWD_PLANS):
        plans.clear()
    step_tuning.ln_tiles.cache_clear()


def _ln_tile_fwd_plan(x: Tensor, key: str, T: int | None, save_ckpt: bool, eps: float) -> _LNTilePlan:
    compiled = lookup(key)
    spec = compiled.spec
    steps = x.shape[0] if T is None else T
    plan = _LNTilePlan()
    plan.out, expanded, B, C, S, (st, sb, sc, ss) = base._fwd_plan(x, steps, 0)
    plan.copy_x = plan.out.copy
    chunk = chunk_steps(steps)
    n_ckpt = max(cdiv(steps, chunk) - 1, 0) if save_ckpt else 0
    plan.ct = torch.float64 if spec.fp64 else torch.float32
    plan.ckpt_shape = (n_ckpt, len(spec.states), B, C, S)
    plan.no_ckpt = torch.empty(plan.ckpt_shape, dtype=plan.ct, device=x.device) if n_ckpt == 0 else None
    plan.launch = None
    if B * C * S > 0 and steps > 0:
        bs, bc, warps = step_tuning.ln_tiles(C, False)
        s_tiles = cdiv(S, bs)
        plan.launch = Planned(
            compiled.module.ln_fwd_kernel, (B * s_tiles,),
            ("x", *_names("p", len(spec.params)), "w", "b", "y", "ckpt", steps, B, C, S, s_tiles, st, sb, sc, ss,
             *base._spike_strides(plan.out), eps),
            dict(EPS64=float(eps) if spec.fp64 else 0.0, EXPANDED=expanded, STORE_CKPT=n_ckpt > 0, CHUNK=chunk,
                 BLOCK_S=bs, BLOCK_C=bc, num_warps=warps))
    return plan


def _ln_tile_fwd_host(x: Tensor, w: Tensor, b: Tensor, eps: float, params, key: str, T: int | None,
                      save_ckpt: bool) -> tuple[Tensor, Tensor]:
    """Outputs and checkpoints of the generated tile forward (``ln_fwd_kernel``) of the layer norm over channels
    and the neuron ``key`` over ``x`` ``[T, B, C, H, W]`` (or ``[B, C, H, W]`` repeated over ``T``), mapped as
    :func:`~snntrain.kernels.norm_neuron_base._map` maps it; ``w``, ``b`` the norm's weight and bias ([C]). Eager
    calls only: the plan of the layout is reused (:data:`_LN_FWD_PLANS`)."""
    plan_key = (key, x.shape, x.stride(), x.dtype, x.device, T, save_ckpt, eps)
    plan = _LN_FWD_PLANS.get(plan_key)
    if plan is None:
        plan = _LN_FWD_PLANS.put(plan_key, _ln_tile_fwd_plan(x, key, T, save_ckpt, eps))
    if plan.copy_x:
        x = x.contiguous()
    y = base._spikes(plan.out, x)
    ckpt = plan.no_ckpt if plan.no_ckpt is not None else torch.empty(plan.ckpt_shape, dtype=plan.ct, device=x.device)
    if plan.launch is not None:
        plan.launch(direct, {"x": x, "w": w, "b": b, "y": y, "ckpt": ckpt, **_named("p", params)})
    return y, ckpt


def _ln_tile_bwd_plan(x: Tensor, grad_y: Tensor, key: str, T: int | None, eps: float) -> _LNTilePlan:
    compiled = lookup(key)
    spec = compiled.spec
    steps = x.shape[0] if T is None else T
    xm, B, C, H, W, (st, sb, sc, ss) = base._map(x, T)
    S = H * W
    expanded = T is not None
    plan = _LNTilePlan()
    plan.ct = torch.float64 if spec.fp64 else torch.float32
    plan.copy_x = xm is not x
    gy, sg = base._grad_map(grad_y)
    plan.copy_g = gy is not grad_y
    plan.gx_stride = torch.empty_like(xm, device="meta").stride()  # dL/dx laid out like x (as mapped)
    sd = base._strides(torch.empty_strided(xm.shape, plan.gx_stride, device="meta"), expanded)
    chunk = chunk_steps(steps)
    bs, bc, warps = step_tuning.ln_tiles(C, True, chunk > SHORT_CHUNK)
    s_tiles = cdiv(S, bs)
    grid = B * s_tiles
    plan.part_shape = (grid, 2 + sum(spec.learnable), C)
    plan.launch = None
    if grid > 0 and steps > 0:
        plan.launch = Planned(
            compiled.module.ln_bwd_kernel, (grid,),
            ("x", "ckpt", *_names("p", len(spec.params)), "w", "b", "gy", "gx", "part", steps, B, C, S, s_tiles, st,
             sb, sc, ss, *sg, *sd, eps),
            dict(EPS64=float(eps) if spec.fp64 else 0.0, EXPANDED=expanded, CHUNK=chunk, BLOCK_S=bs,
                 BLOCK_C=bc, num_warps=warps))
    return plan


def _ln_tile_bwd_host(x: Tensor, w: Tensor, b: Tensor, eps: float, ckpt: Tensor, params,
                      grad_y: Tensor, key: str, T: int | None) -> tuple[Tensor, Tensor]:
    """``(dL/dx, sums)`` of the generated tile backward (``ln_bwd_kernel``): dL/dx laid out like ``x`` (``[B, C,
    H, W]``, summed over T, for a repeated input), ``sums`` ``[2 + learnable parameters, C]`` (compute dtype):
    dL/dweight, dL/dbias, then each learnable parameter's gradient (per channel, or in column 0), the programs'
    partial sums added up in one reduction. Eager calls only, with the plans of :data:`_LN_BWD_PLANS`."""
    plan_key = (key, x.shape, x.stride(), x.dtype, x.device, T, grad_y.stride(), eps)
    plan = _LN_BWD_PLANS.get(plan_key)
    if plan is None:
        plan = _LN_BWD_PLANS.put(plan_key, _ln_tile_bwd_plan(x, grad_y, key, T, eps))
    if plan.copy_x:
        x = base._map(x, T)[0]
    if plan.copy_g:
        grad_y = base._grad_map(grad_y)[0]
    dev = x.device
    grad_x = torch.empty_strided(x.shape, plan.gx_stride, dtype=x.dtype, device=dev)
    if plan.launch is None:
        return grad_x.zero_(), torch.zeros(plan.part_shape[1:], dtype=plan.ct, device=dev)
    part = torch.empty(plan.part_shape, dtype=plan.ct, device=dev)
    plan.launch(direct, {"x": x, "ckpt": ckpt, "w": w, "b": b, "gy": grad_y, "gx": grad_x, "part": part,
                         **_named("p", params)})
    return grad_x, part.sum(dim=0)


class _EagerLNTileStepNeuron(torch.autograd.Function):
    """A layer norm over channels and a generated neuron (spec ``affine`` ``"ln"``) in one kernel per direction:
    each program holds all ``C`` channels of a tile of positions, computes every step's statistics from the tile it
    loads, and its backward finishes the layer norm's gradient over ``C`` in registers (the weight's, the bias's and
    the per-channel parameters' gradients as per-program sums). ``x`` is ``[T, B, C, H, W]``, or ``[B, C, H, W]``
    with ``T`` (a stride-0 time axis: normalised once per position, dL/dx summed over T)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, T, key, flags, *params):
        w, b = weight, bias
        if w is None or b is None:
            C = x.shape[-3]
            ct = torch.float64 if lookup(key).spec.fp64 else torch.float32
            w = torch.ones(C, dtype=ct, device=x.device) if weight is None else weight
            b = torch.zeros(C, dtype=ct, device=x.device) if bias is None else bias
        with profiled("snntrain::step_neuron_fwd"):
            y, ckpt = _ln_tile_fwd_host(x, w, b, eps, params, key, T, bool(flags & F_SAVE_CKPT))
        ctx.save_for_backward(x, weight, bias, ckpt, *params)
        ctx.wb, ctx.eps, ctx.T, ctx.key = (w, b), eps, T, key
        ctx.set_materialize_grads(False)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, bias, ckpt, *params = ctx.saved_tensors
        if grad_y is None:
            return (None,) * 7 + tuple(None for _ in params)
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        spec = lookup(ctx.key).spec
        with profiled("snntrain::step_neuron_bwd"):
            grad_x, sums = _ln_tile_bwd_host(x, *ctx.wb, ctx.eps, ckpt, params, grad_y, ctx.key, ctx.T)
        grads, q = [], 2
        for p, learn, per_channel in zip(params, spec.learnable, spec.per_channel):
            if learn:
                g = sums[q] if per_channel else sums[q, 0]
                grads.append(g.reshape(p.shape).to(p.dtype))
                q += 1
            else:
                grads.append(None)
        return (grad_x if need_x else None, _cast(sums[0], weight.dtype) if need_w else None,
                _cast(sums[1], bias.dtype) if need_b else None, None, None, None, None, *grads)


def ln_step_neuron(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, params: list[Tensor],
                   key: str, T: int | None = None) -> Tensor:
    """The generated neuron ``key`` (spec ``affine`` ``"ln"``) over the layer norm over channels (``eps`` added to
    the variance; ``weight``, ``bias`` [C] or None) of ``x`` ``[T, B, C, H, W]`` (or ``[B, C, H, W]`` repeated
    over ``T`` steps), fused: outputs ``[T, B, C, H, W]`` in ``x``'s dtype (NCHW or channels-last, as ``x``).
    Differentiable in ``x``, ``weight``, ``bias`` and the learnable parameters (eager calls). One tile kernel per
    direction where the channels fit one program (:func:`~snntrain.kernels.step_neuron_tuning.ln_tile_fits`),
    else the three-pass path: statistics (:func:`~snntrain.kernels.layer_norm.layer_norm_stats`), the generated
    per-neuron kernels, the layer norm's backward (layouts whose neuron numbering does not keep B, H, W in order
    are copied once there)."""
    x = base._map(x, T)[0]  # H and W as one run (odd layouts copied once, differentiably)
    flags = F_SAVE_CKPT if torch.is_grad_enabled() else 0
    if step_tuning.ln_tile_fits(x.shape[-3]):
        return _EagerLNTileStepNeuron.apply(x, weight, bias, eps, T, key, flags, *params)
    if not _positions_in_order(x if T is None else x.expand(T, *x.shape)):
        x = x.contiguous()
    mean, rstd = layer_norm_stats(x, eps)  # per position over C ([B, C, H, W]: once per element)
    return _EagerLNStepNeuron.apply(x, weight, bias, mean, rstd, T, key, flags, *params)


def step_neuron(x: Tensor, init: Tensor | None, params: list[Tensor], key: str, return_state: bool
                ) -> tuple[Tensor, Tensor | None]:
    """Run the generated neuron ``key`` over ``x`` ``[T, ...]``: ``(outputs in x's dtype, final states
    [K, ...] or None)``. ``init`` is ``[K, ...]`` (the compute dtype) or None (the states' initial values);
    ``params`` the parameter tensors in the step's order. Differentiable in ``x``, ``init`` and the
    learnable parameters."""
    flags = F_RETURN_STATE if return_state else 0
    if torch.is_grad_enabled() and (x.requires_grad or (init is not None and init.requires_grad)
                                    or any(p.requires_grad for p in params)):
        flags |= F_SAVE_CKPT
    if traced(x, init, *params):
        y, final, _ckpt = step_neuron_fwd(x, init, params, key, flags)
        return y, final if return_state else None
    out = _EagerStepNeuron.apply(x, init, key, flags, *params)
    return out if return_state else (out, None)
