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
numbering); a learnable ``[C]`` parameter's gradient is summed per neuron over T in the kernel and then
per channel (one reduction of ``N`` values), a scalar one's per program (then in a fixed order).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .lif import (
    BWD16_BLOCK,
    BWD16_WARPS,
    BWD_BLOCK,
    BWD_WARPS,
    FWD_BLOCK,
    FWD_WARPS,
    _empty,
    _neuron_order,
    _permuted,
    _time_major,
)
from .neuron_jit import lookup
from .neuron_step import chunk_steps
from .op_utils import INT32_MAX, cdiv, direct, op_wrap, profiled, register_op, traced

__all__ = ["bn_step_neuron", "step_neuron", "step_neuron_fwd", "step_neuron_bwd", "F_RETURN_STATE", "F_SAVE_CKPT", "F_GRAD_INIT"]

F_RETURN_STATE, F_SAVE_CKPT, F_GRAD_INIT = 1, 2, 4

# Launch sizes: the hand-written neuron's (snntrain.kernels.lif), the backward's smaller for its registers in fp32
# and per 16-bit input its 512 neurons over 8 warps (the same neurons per thread, twice the loads per program).


def _channels(x: Tensor, per_channel: tuple[bool, ...], order: tuple[int, ...]) -> tuple[int, int]:
    """``(C, S)``: the channels (dim 2 of ``x``) and the run of neurons per channel in the kernels' numbering
    (``order``): neuron ``n`` has channel ``(n // S) % C`` (S = H * W row-major, 1 channels-last)."""
    if not any(per_channel) or x.dim() < 3:
        return 1, 1
    pos = order.index(1)  # the channel dim of a step, in memory order
    return x.shape[2], math.prod(x.shape[1 + d] for d in order[pos + 1:])


def _fwd_host(x: Tensor, init: Tensor | None, params: list[Tensor], key: str, flags: int, launch: bool,
              wrap=direct, affine: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Outputs, final states and checkpoints; ``affine`` = ``(a, b)`` ([C] fp32) for a neuron whose kernels
    take ``x * a + b`` (spec ``affine``: a batch norm folded in front)."""
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


def _bwd_host(x: Tensor, init: Tensor | None, ckpt: Tensor, params: list[Tensor], grad_y: Tensor | None,
              grad_final: Tensor | None, key: str, flags: int, launch: bool,
              wrap=direct, affine: tuple[Tensor, ...] | None = None, sums: list | None = None,
              ) -> tuple[Tensor, Tensor, list[Tensor]]:
    """``(dL/dx, dL/d(initial states), [dL/dparam])``. With ``affine`` = ``(a, b, mean, rstd)`` ([C] fp32, spec
    ``affine``) dL/dx is the gradient of the neuron's input ``x * a + b``, and ``sums`` receives the per-channel
    sums of it and of it times ``(x - mean) * rstd`` (what a batch norm's backward needs)."""
    compiled = lookup(key)
    spec = compiled.spec
    K = len(spec.states)
    T, step = x.shape[0], tuple(x.shape[1:])
    N = math.prod(step)
    ct = torch.float64 if spec.fp64 else torch.float32
    dev = x.device
    order = _neuron_order(x, None)
    grad_x = _empty(x.shape, order, 1, x.dtype, dev)
    store_ginit = bool(flags & F_GRAD_INIT)
    grad_init = _empty((K, *step) if store_ginit else (0,), order, 1, ct, dev)
    block, warps = (BWD_BLOCK, BWD_WARPS) if x.element_size() >= 4 else (BWD16_BLOCK, BWD16_WARPS)
    grid = cdiv(N, block)
    learn = [j for j, flag in enumerate(spec.learnable) if flag]
    bufs = [torch.empty((N,) if spec.per_channel[j] else (grid,), dtype=ct, device=dev) for j in learn]
    grads = [torch.empty(p.shape if spec.learnable[j] else (0,), dtype=p.dtype, device=dev)
             for j, p in enumerate(params)]
    if not launch:
        return grad_x, grad_init, grads
    if N == 0 or T == 0:
        grad_x.zero_()
        grad_init.zero_()
        for j in learn:
            grads[j].zero_()
        return grad_x, grad_init, grads
    C, S = _channels(x, (*spec.per_channel, spec.affine), order)
    xk, stride_xt, stride_xn = _time_major(x, order)
    if init is not None:
        init = _permuted(init, order, 1).contiguous()
    norm_sums = [torch.empty((N,), dtype=ct, device=dev) for _ in range(2)] if spec.affine else []
    gy, stride_gt, stride_gn = (None, 0, 0) if grad_y is None else _time_major(grad_y, order)
    gfinal = None if grad_final is None else _permuted(grad_final, order, 1).to(ct).contiguous()
    wrap(compiled.module.bwd_kernel)[(grid,)](
        xk, init, ckpt, *params, *(affine or ()), gy, gfinal, grad_x, grad_init, *bufs, *norm_sums,
        T, N, C, S, stride_xt, stride_xn, stride_gt, stride_gn,
        HAS_INIT=init is not None, HAS_GY=gy is not None, HAS_GFINAL=gfinal is not None, STORE_GINIT=store_ginit,
        CHUNK=chunk_steps(T), BLOCK=block, num_warps=warps,
    )
    for j, buf in zip(learn, bufs):
        p = params[j]
        if spec.per_channel[j]:  # per neuron -> per channel: n = (outer * C + channel) * S + inner
            g = buf.view(-1, C, S).sum(dim=(0, 2))
        else:
            g = buf.sum()
        grads[j] = g.reshape(p.shape).to(p.dtype)
    if sums is not None:
        sums[:] = [buf.view(-1, C, S).sum(dim=(0, 2)) for buf in norm_sums]
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
    """A batch norm folded into a generated neuron (spec ``affine``): the neuron's input is ``x * a + b`` with
    ``a = weight * rstd``, ``b = bias - mean * a`` per channel, computed in the kernels; the backward kernel
    gives dL/dy of that input and its per-channel sums, from which a few elementwise operations make dL/dx
    (through the batch statistics in training)."""

    @staticmethod
    def forward(ctx, x, weight, bias, mean, rstd, key, flags, batch_stats, *params):
        a = rstd * weight.to(rstd.dtype)
        b = bias.to(rstd.dtype) - mean * a
        with profiled("snntrain::step_neuron_fwd"):
            y, _final, ckpt = _fwd_host(x, None, list(params), key, flags, launch=True, affine=(a, b))
        ctx.save_for_backward(x, ckpt, a, b, mean, rstd, *params)
        ctx.key, ctx.flags, ctx.batch_stats = key, flags, batch_stats
        ctx.w_dtype, ctx.b_dtype = weight.dtype, bias.dtype
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, ckpt, a, b, mean, rstd, *params = ctx.saved_tensors
        sums: list = []
        with profiled("snntrain::step_neuron_bwd"):
            grad_in, _gi, grads = _bwd_host(x, None, ckpt, params, grad_y, None, ctx.key, ctx.flags, launch=True,
                                            affine=(a, b, mean, rstd), sums=sums)
        s_g, s_gx = sums  # per channel: sum of dL/dy, sum of dL/dy * xhat
        view = (1, 1, -1) + (1,) * (x.dim() - 3)
        if ctx.batch_stats:  # dL/dx through the batch's mean and variance
            m = x.numel() // x.shape[2]
            xhat = (x.to(a.dtype) - mean.view(view)) * rstd.view(view)
            grad_x = (grad_in.to(a.dtype) - (s_g / m).view(view) - xhat * (s_gx / m).view(view)) * a.view(view)
        else:
            grad_x = grad_in.to(a.dtype) * a.view(view)
        spec = lookup(ctx.key).spec
        grads = [g if learn else None for g, learn in zip(grads, spec.learnable)]
        return (grad_x.to(x.dtype), s_gx.to(ctx.w_dtype), s_g.to(ctx.b_dtype), None, None, None, None, None, *grads)


def bn_step_neuron(x: Tensor, weight: Tensor, bias: Tensor, mean: Tensor, rstd: Tensor, batch_stats: bool,
                   params: list[Tensor], key: str) -> Tensor:
    """The generated neuron ``key`` (spec ``affine``) over the batch norm ``(x - mean) * rstd * weight + bias`` of
    ``x`` ``[T, B, C, ...]``, fused: outputs in ``x``'s dtype. ``mean`` and ``rstd`` ([C] fp32) are the batch's
    (``batch_stats``: the gradient also flows through them, as the batch norm's in training) or the running
    statistics. Differentiable in ``x``, ``weight``, ``bias`` and the learnable parameters (eager calls)."""
    flags = F_SAVE_CKPT if torch.is_grad_enabled() else 0
    return _EagerBNStepNeuron.apply(x, weight, bias, mean, rstd, key, flags, batch_stats, *params)


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
