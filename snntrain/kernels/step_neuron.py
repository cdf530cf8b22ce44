"""Neurons generated from a step function: host launch, operator registration and autograd.

The kernels come from :mod:`snntrain.kernels.neuron_jit` (a module generated per traced step and
found by its key). Registered as ``torch.ops.snntrain.step_neuron_fwd`` / ``step_neuron_bwd``
(``torch.library.triton_op``, one pair for every generated neuron: the key selects the kernels), so
they show by name in profiler traces and trace under ``torch.compile``; eager calls take an
``autograd.Function`` over the same host functions (:func:`~snntrain.kernels.op_utils.traced`).

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
per neuron (:func:`_channel_sums`), then added up per channel in one reduction with every other
per-channel sum; a scalar one's per program (then in a fixed order).

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
  four steps are 8 B: one E more at T = 4); then one elementwise pass reads dL/dy and X and writes dL/dx
  over dL/dy (3) = **6 E**.

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

import math

import torch
from torch import Tensor

from . import norm_neuron_base as base
from . import step_neuron_tuning as step_tuning
from .bn_neuron import bn_input_grad
from .layer_norm import layer_norm_stats, ln_input_grad
from .lif import (
    BWD_BLOCK,
    BWD_WARPS,
    FWD_BLOCK,
    FWD_WARPS,
    _empty,
    _neuron_order,
    _permuted,
    _time_major,
)
from .neuron_codegen import CSUM_NEURON, CSUM_PROGRAM, CSUM_ROWS
from .neuron_jit import lookup
from .neuron_step import chunk_steps
from .op_utils import INT32_MAX, cdiv, direct, op_wrap, profiled, register_op, traced

__all__ = ["bn_step_neuron", "ln_step_neuron", "step_neuron", "step_neuron_fwd", "step_neuron_bwd", "F_RETURN_STATE",
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


def _fwd_host(x: Tensor, init: Tensor | None, params: list[Tensor], key: str, flags: int, launch: bool,
              wrap=direct, affine: tuple | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Outputs, final states and checkpoints; ``affine``: the norm's arguments of a neuron whose kernels normalise
    as they read (spec ``affine``): ``(a, b)`` ([C] fp32) for ``x * a + b`` (``"bn"``), ``(weight, bias, mean,
    rstd, stride_st)`` for ``"ln"`` (:func:`ln_step_neuron`)."""
    compiled = lookup(key)
    spec = compiled.spec
    K = len(spec.states)
    T, step = x.shape[0], tuple(x.shape[1:])
    N = math.prod(step)
    if N * max(K, 1) > INT32_MAX:
        raise ValueError(f"a time step has {N} neurons with {K} states; the generated kernels support at most "
                         f"{INT32_MAX} state values per step")
    ct = torch.float64 if spec.fp64 else torch.float32
    dev = x.device
    order = _neuron_order(x, None)
    y = _empty(x.shape, order, 1, x.dtype, dev)
    final = _empty((K, *step) if flags & F_RETURN_STATE else (0,), order, 1, ct, dev)
    chunk = chunk_steps(T)
    n_ckpt = max(cdiv(T, chunk) - 1, 0) if flags & F_SAVE_CKPT else 0
    ckpt = torch.empty((n_ckpt, K, N), dtype=ct, device=dev)
    if launch and N > 0 and T > 0:
        C, S = _channels(x, (*spec.per_channel, spec.affine), order)
        xk, stride_xt, stride_xn = _time_major(x, order)
        if init is not None:
            init = _permuted(init, order, 1).contiguous()
        wrap(compiled.module.fwd_kernel)[(cdiv(N, FWD_BLOCK),)](
            xk, init, *params, *(affine or ()), y, final, ckpt, T, N, C, S, stride_xt, stride_xn,
            HAS_INIT=init is not None, STORE_FINAL=bool(flags & F_RETURN_STATE), STORE_CKPT=n_ckpt > 0,
            CHUNK=chunk, BLOCK=FWD_BLOCK, num_warps=FWD_WARPS,
        )
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


def _bwd_host(x: Tensor, init: Tensor | None, ckpt: Tensor, params: list[Tensor], grad_y: Tensor | None,
              grad_final: Tensor | None, key: str, flags: int, launch: bool,
              wrap=direct, affine: tuple[Tensor, ...] | None = None, sums: list | None = None,
              sum_t: bool = False, scaled: bool = False) -> tuple[Tensor, Tensor, list[Tensor]]:
    """``(dL/dx, dL/d(initial states), [dL/dparam])``. With ``affine`` = ``(a, b, mean, rstd)`` ([C] fp32, spec
    ``affine``) dL/dx is the gradient of the neuron's input ``x * a + b`` (``scaled``: ``a`` times it, the
    gradient of x through a norm with fixed statistics; ``sum_t``: x's time axis has stride 0, and dL/dx is one
    step's, summed over T), and ``sums``, where given, receives the per-channel sums of it and of it times
    ``(x - mean) * rstd`` (what a batch norm's backward needs). With spec ``affine`` ``"ln"`` (``affine`` as
    :func:`_fwd_host` takes it) dL/dx is dL/dy of the normalised input, nothing else (``sum_t`` as above)."""
    compiled = lookup(key)
    spec = compiled.spec
    K = len(spec.states)
    T, step = x.shape[0], tuple(x.shape[1:])
    N = math.prod(step)
    ct = torch.float64 if spec.fp64 else torch.float32
    dev = x.device
    order = _neuron_order(x, None)
    grad_x = _empty(step if sum_t else x.shape, order, 0 if sum_t else 1, x.dtype, dev)
    store_ginit = bool(flags & F_GRAD_INIT)
    grad_init = _empty((K, *step) if store_ginit else (0,), order, 1, ct, dev)
    block, warps = BWD_BLOCK, BWD_WARPS
    grid = cdiv(N, block)
    learn = [j for j, flag in enumerate(spec.learnable) if flag]
    channel = [j for j in learn if spec.per_channel[j]]
    bufs = {j: torch.empty((grid,), dtype=ct, device=dev) for j in learn if not spec.per_channel[j]}
    grads = [torch.empty(p.shape if spec.learnable[j] else (0,), dtype=p.dtype, device=dev)
             for j, p in enumerate(params)]
    if not launch:
        return grad_x, grad_init, grads
    if N == 0 or T == 0:
        grad_x.zero_()
        grad_init.zero_()
        for j in learn:
            grads[j].zero_()
        if sums is not None:
            sums[:] = [torch.zeros(x.shape[2], dtype=ct, device=dev) for _ in range(2)]
        return grad_x, grad_init, grads
    C, S = _channels(x, (*spec.per_channel, spec.affine), order)
    csum, cb, R, M = _channel_sums(N, C, S, grid, block)
    # every per-channel sum in one buffer, added up per channel by one reduction
    norm_sums = sums is not None
    rows = torch.empty((len(channel) + 2 * norm_sums, M), dtype=ct, device=dev)
    bufs.update(zip(channel, rows))
    xk, stride_xt, stride_xn = _time_major(x, order)
    if init is not None:
        init = _permuted(init, order, 1).contiguous()
    gy, stride_gt, stride_gn = (None, 0, 0) if grad_y is None else _time_major(grad_y, order)
    gfinal = None if grad_final is None else _permuted(grad_final, order, 1).to(ct).contiguous()
    extra, norm_bufs = {}, ()
    if spec.affine == "bn":
        extra = dict(NORM_SUMS=norm_sums, SUM_T=sum_t, GX_SCALED=scaled)
        norm_bufs = (rows[-2], rows[-1]) if norm_sums else affine[:1] * 2  # (not stored without NORM_SUMS)
    elif spec.affine == "ln":
        extra = dict(SUM_T=sum_t)
    wrap(compiled.module.bwd_kernel)[(grid,)](
        xk, init, ckpt, *params, *(affine or ()), gy, gfinal, grad_x, grad_init, *(bufs[j] for j in learn),
        *norm_bufs, T, N, C, S, stride_xt, stride_xn, stride_gt, stride_gn,
        HAS_INIT=init is not None, HAS_GY=gy is not None, HAS_GFINAL=gfinal is not None, STORE_GINIT=store_ginit,
        CSUM=csum, CB=cb, **extra, CHUNK=chunk_steps(T), BLOCK=block, num_warps=warps,
    )
    per_channel = rows.view(rows.shape[0], -1, C, R).sum(dim=(1, 3)) if rows.shape[0] else rows
    separate = rows.shape[0] > 1  # the operator's outputs may not alias one another
    for q, j in enumerate(channel):
        grads[j] = per_channel[q].reshape(params[j].shape).to(params[j].dtype, copy=separate)
    for j in learn:
        if not spec.per_channel[j]:
            grads[j] = bufs[j].sum().reshape(params[j].shape).to(params[j].dtype)
    if norm_sums:
        sums[:] = [per_channel[-2], per_channel[-1]]
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
    """The operators' forward and backward, launched without the operator machinery (eager calls); the
    parameters as separate arguments, so that autograd sees each of them."""

    @staticmethod
    def forward(ctx, x, init, key, flags, *params):
        with profiled("snntrain::step_neuron_fwd"):
            out = _fwd_host(x, init, list(params), key, flags, launch=True)
        _setup_context(ctx, (x, init, list(params), key, flags), out)
        return out

    @staticmethod
    def backward(ctx, grad_y, grad_final, _grad_ckpt):
        def bwd(*args):
            with profiled("snntrain::step_neuron_bwd"):
                return _bwd_host(*args, launch=True)

        grad_x, grad_init, grads = _grads(ctx, grad_y, grad_final, bwd)
        return (grad_x, grad_init, None, None, *grads)


class _EagerBNStepNeuron(torch.autograd.Function):
    """A batch norm folded into a generated neuron (spec ``affine`` ``"bn"``): the neuron's input is ``x * a + b`` with
    ``a = weight * rstd``, ``b = bias - mean * a`` per channel, computed in the kernels. The backward kernel
    gives dL/dy of that input and its per-channel sums; with batch statistics one elementwise pass
    (:func:`~snntrain.kernels.bn_neuron.bn_input_grad`) turns dL/dy into dL/dx in place, with fixed
    statistics the kernel writes ``a * dL/dy`` itself. ``x`` is ``[T, B, C, ...]``, or ``[B, C, H, W]`` with
    ``T`` (read as a stride-0 time axis; its gradient is summed over T in the kernel)."""

    @staticmethod
    def forward(ctx, x, weight, bias, mean, rstd, T, key, flags, batch_stats, *params):
        a = rstd if weight is None else rstd * weight.to(rstd.dtype)
        b = torch.mul(mean, a).neg_() if bias is None else torch.addcmul(bias.to(rstd.dtype), mean, a, value=-1.0)
        xt = x if T is None else x.expand(T, *x.shape)
        with profiled("snntrain::step_neuron_fwd"):
            y, _final, ckpt = _fwd_host(xt, None, list(params), key, flags, launch=True, affine=(a, b))
        ctx.save_for_backward(x, weight, ckpt, *params)
        ctx.a, ctx.b, ctx.mean, ctx.rstd = a, b, mean, rstd
        ctx.T, ctx.key, ctx.flags, ctx.batch_stats = T, key, flags, batch_stats
        ctx.b_dtype = None if bias is None else bias.dtype
        ctx.set_materialize_grads(False)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, ckpt, *params = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        spec = lookup(ctx.key).spec
        if grad_y is None:
            return (None,) * 9 + tuple(None for _ in params)
        batch, T, mean, rstd = ctx.batch_stats, ctx.T, ctx.mean, ctx.rstd
        sums: list | None = [] if need_w or need_b or (need_x and batch) else None
        xt = x if T is None else x.expand(T, *x.shape)
        with profiled("snntrain::step_neuron_bwd"):
            grad_x, _gi, grads = _bwd_host(xt, None, ckpt, params, grad_y, None, ctx.key, ctx.flags, launch=True,
                                           affine=(ctx.a, ctx.b, mean, rstd), sums=sums, sum_t=T is not None,
                                           scaled=not batch)
            s_g, s_gx = sums if sums is not None else (None, None)
            if need_x and batch:  # through the batch's mean and variance
                grad_x = bn_input_grad(x, grad_x, mean, rstd, weight, s_g, s_gx, T)
        grads = [g if learn else None for g, learn in zip(grads, spec.learnable)]
        return (grad_x if need_x else None, s_gx.to(weight.dtype) if need_w else None,
                s_g.to(ctx.b_dtype) if need_b else None, None, None, None, None, None, None, *grads)


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
            y, _final, ckpt = _fwd_host(xt, None, list(params), key, flags, launch=True, affine=affine)
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
                                           affine=ctx.affine, sum_t=T is not None)
            if need_x or need_w or need_b:
                grad_x, grad_w, grad_b = ln_input_grad(x, grad_x, weight, bias, mean, rstd, need_w, need_b)
        grads = [g if learn else None for g, learn in zip(grads, spec.learnable)]
        return (grad_x if need_x else None, grad_w, grad_b, None, None, None, None, None, *grads)


def _ln_tile_fwd_host(x: Tensor, w: Tensor, b: Tensor, eps: float, params: list[Tensor], key: str, T: int | None,
                      save_ckpt: bool) -> tuple[Tensor, Tensor]:
    """Outputs and checkpoints of the generated tile forward (``ln_fwd_kernel``) of the layer norm over channels
    and the neuron ``key`` over ``x`` ``[T, B, C, H, W]`` (or ``[B, C, H, W]`` repeated over ``T``), mapped as
    :func:`~snntrain.kernels.norm_neuron_base._map` maps it; ``w``, ``b`` the norm's weight and bias ([C])."""
    compiled = lookup(key)
    spec = compiled.spec
    K = len(spec.states)
    steps = x.shape[0] if T is None else T
    plan, expanded, B, C, S, (st, sb, sc, ss) = base._fwd_plan(x, steps, 0)
    if plan.copy:
        x = x.contiguous()
    y = base._spikes(plan, x)
    chunk = chunk_steps(steps)
    n_ckpt = max(cdiv(steps, chunk) - 1, 0) if save_ckpt else 0
    ct = torch.float64 if spec.fp64 else torch.float32
    ckpt = torch.empty((n_ckpt, K, B, C, S), dtype=ct, device=x.device)
    if B * C * S > 0 and steps > 0:
        bs, bc, warps = step_tuning.ln_tiles(C, False)
        s_tiles = cdiv(S, bs)
        compiled.module.ln_fwd_kernel[(B * s_tiles,)](
            x, *params, w, b, y, ckpt, steps, B, C, S, s_tiles, st, sb, sc, ss, *base._spike_strides(plan), eps,
            EPS64=float(eps) if spec.fp64 else 0.0, EXPANDED=expanded, STORE_CKPT=n_ckpt > 0, CHUNK=chunk,
            BLOCK_S=bs, BLOCK_C=bc, num_warps=warps,
        )
    return y, ckpt


def _ln_tile_bwd_host(x: Tensor, w: Tensor, b: Tensor, eps: float, ckpt: Tensor, params: list[Tensor],
                      grad_y: Tensor, key: str, T: int | None) -> tuple[Tensor, Tensor]:
    """``(dL/dx, sums)`` of the generated tile backward (``ln_bwd_kernel``): dL/dx laid out like ``x`` (``[B, C,
    H, W]``, summed over T, for a repeated input), ``sums`` ``[2 + learnable parameters, C]`` (compute dtype):
    dL/dweight, dL/dbias, then each learnable parameter's gradient (per channel, or in column 0), the programs'
    partial sums added up in one reduction."""
    compiled = lookup(key)
    spec = compiled.spec
    steps = x.shape[0] if T is None else T
    x, B, C, H, W, (st, sb, sc, ss) = base._map(x, T)
    S = H * W
    expanded = T is not None
    ct = torch.float64 if spec.fp64 else torch.float32
    gy, sg = base._grad_map(grad_y)
    grad_x = torch.empty_like(x)
    sd = base._strides(grad_x, expanded)
    bs, bc, warps = step_tuning.ln_tiles(C, True)
    s_tiles = cdiv(S, bs)
    grid = B * s_tiles
    rows = 2 + sum(spec.learnable)
    part = torch.empty((grid, rows, C), dtype=ct, device=x.device)
    if grid == 0 or steps == 0:
        return grad_x.zero_(), torch.zeros((rows, C), dtype=ct, device=x.device)
    compiled.module.ln_bwd_kernel[(grid,)](
        x, ckpt, *params, w, b, gy, grad_x, part, steps, B, C, S, s_tiles, st, sb, sc, ss, *sg, *sd, eps,
        EPS64=float(eps) if spec.fp64 else 0.0, EXPANDED=expanded, CHUNK=chunk_steps(steps), BLOCK_S=bs,
        BLOCK_C=bc, num_warps=warps,
    )
    return grad_x, part.sum(dim=0)


class _EagerLNTileStepNeuron(torch.autograd.Function):
    """A layer norm over channels and a generated neuron (spec ``affine`` ``"ln"``) in one kernel per direction:
    each program holds all ``C`` channels of a tile of positions, computes every step's statistics from the tile it
    loads, and its backward finishes the layer norm's gradient over ``C`` in registers (the weight's, the bias's and
    the per-channel parameters' gradients as per-program sums). ``x`` is ``[T, B, C, H, W]``, or ``[B, C, H, W]``
    with ``T`` (a stride-0 time axis: normalised once per position, dL/dx summed over T)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, T, key, flags, *params):
        C = x.shape[-3]
        ct = torch.float64 if lookup(key).spec.fp64 else torch.float32
        w = torch.ones(C, dtype=ct, device=x.device) if weight is None else weight
        b = torch.zeros(C, dtype=ct, device=x.device) if bias is None else bias
        with profiled("snntrain::step_neuron_fwd"):
            y, ckpt = _ln_tile_fwd_host(x, w, b, eps, list(params), key, T, bool(flags & F_SAVE_CKPT))
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
        return (grad_x if need_x else None, sums[0].to(weight.dtype) if need_w else None,
                sums[1].to(bias.dtype) if need_b else None, None, None, None, None, *grads)


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
    else:
        y, final, _ckpt = _EagerStepNeuron.apply(x, init, key, flags, *params)
    return y, final if return_state else None
