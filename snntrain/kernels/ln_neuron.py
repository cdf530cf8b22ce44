"""Fused layer norm over channels -> multi-step IF/LIF/PLIF neuron in Triton, forward and hand-written
backward.

Registered as ``snntrain::ln_neuron_fwd`` / ``ln_neuron_bwd``: the ``LayerNorm2d`` of
:mod:`snntrain.nn.norm`, statistics per position over ``C``, followed by the neuron. The input
layout, the tiles and the host plans are described in :mod:`snntrain.kernels.norm_neuron_base`.

Layer norm: forward reads X, writes S (2 E), statistics per position recomputed from the
loaded tile; backward reads X and dS and writes dX in one pass (3 E): the reduction of
layer norm's backward is over the channels of a position, which one program holds.
dW and dB are per-program partial sums, summed in a fixed order by a second kernel.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import neuron_step as ns
from . import norm_neuron_base as base
from . import norm_neuron_tuning as tuning
from .neuron_step import chunk_backward, scalars, sum_kernel
from .norm_neuron_base import (
    _at,
    _ckpt_at,
    _fwd_scan,
    _ln_rows,
    _load_chunk,
    _pair_sum_kernel,
    _state_before,
    _tile,
)
from .op_utils import PlanCache, Planned, cdiv, direct, eager_function, op_wrap, profiled, register_op, traced

__all__ = ["ln_neuron", "ln_neuron_fwd", "ln_neuron_bwd"]


# ----------------------------------------------------------------------------
# Device helpers
# ----------------------------------------------------------------------------


@triton.jit
def _ln_dx(gy, xhat, rstd, w, mask, C):
    """Layer norm's dL/dx per row from dL/dy."""
    wg = tl.where(mask, gy * w[None, :], 0.0)
    c1 = tl.sum(wg * xhat, axis=1) / C
    c2 = tl.sum(wg, axis=1) / C
    return rstd[:, None] * (wg - xhat * c1[:, None] - c2[:, None])


@triton.jit
def _ln_params(w_ptr, b_ptr, offs_c, mask_c, HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_C: tl.constexpr):
    if HAS_W:
        w = tl.load(w_ptr + offs_c, mask=mask_c, other=0.0).to(tl.float32)
    else:
        w = tl.where(mask_c, 1.0, 0.0)
    if HAS_B:
        bias = tl.load(b_ptr + offs_c, mask=mask_c, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros([BLOCK_C], dtype=tl.float32)
    return w, bias


@triton.jit
def _ln_values(w_ptr, b_ptr, k_ptr, offs_c, mask_c, eps, k, v_threshold, v_reset, K_FROM_PTR: tl.constexpr,
               HARD_RESET: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_C: tl.constexpr):
    """The norm's weight and bias over a tile's channels and the neuron's scalars:
    ``(w, bias, eps, k, v_threshold, v_reset, v_r)``. (Values only: the tile's offsets come from
    :func:`~snntrain.kernels.norm_neuron_base._tile`, which takes no pointer; see
    :func:`~snntrain.kernels.norm_neuron_base._ckpt_at`.)"""
    w, bias = _ln_params(w_ptr, b_ptr, offs_c, mask_c, HAS_W, HAS_B, BLOCK_C)
    k, v_threshold, v_reset, v_r = scalars(k_ptr, k, v_threshold, v_reset, K_FROM_PTR, HARD_RESET)
    return w, bias, tl.cast(eps, tl.float32), k, v_threshold, v_reset, v_r


# ----------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------


@triton.jit(do_not_specialize=["T"])
def _ln_neuron_fwd_kernel(
    x_ptr,  # [T, B, C, S] input at t*sx_t + b*sx_b + c*sx_c + s*sx_s (sx_t = 0: one input for every step)
    w_ptr,  # [C] norm weight, read when HAS_W
    b_ptr,  # [C] norm bias, read when HAS_B
    k_ptr,  # [1] fp32 k, read when K_FROM_PTR
    s_ptr,  # [T, B, C, S] spikes out (dtype of x) at t*so_t + ...
    ckpt_ptr,  # [cdiv(T, CHUNK) - 1, B, C, S] contiguous fp32 state before each chunk but the first (STORE_CKPT)
    T, B, C, S, s_tiles,
    sx_t, sx_b, sx_c, sx_s,
    so_t, so_b, so_c, so_s,
    eps, k, v_threshold, v_reset,
    LEAK: tl.constexpr, DECAY_INPUT: tl.constexpr, HARD_RESET: tl.constexpr,  # the neuron (F_* flags)
    K_FROM_PTR: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr,  # the norm's weight and bias
    EXPANDED: tl.constexpr,
    NO_FMA: tl.constexpr, CHUNK: tl.constexpr, STORE_CKPT: tl.constexpr,  # rounding, steps per chunk, checkpoints
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,  # the tile
):
    b, offs_s, offs_c, mask_c, mask = _tile(tl.program_id(0), 0, s_tiles, S, C, BLOCK_S, BLOCK_C)
    w, bias, eps, k, v_threshold, v_reset, v_r = _ln_values(
        w_ptr, b_ptr, k_ptr, offs_c, mask_c, eps, k, v_threshold, v_reset, K_FROM_PTR, HARD_RESET, HAS_W, HAS_B,
        BLOCK_C)
    v = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32) + v_r
    x_base = _at(x_ptr, b, offs_s, offs_c, sx_b, sx_s, sx_c)
    s_base = _at(s_ptr, b, offs_s, offs_c, so_b, so_s, so_c)
    ck_base, NCK = _ckpt_at(ckpt_ptr, b, offs_s, offs_c, C, S, False), tl.cast(B, tl.int64) * C * S
    _fwd_scan(x_base, sx_t, s_base, so_t, ck_base, NCK, T, mask, v, w, bias, C, eps, k, v_r, v_threshold, v_reset,
                   LEAK, DECAY_INPUT, HARD_RESET, True, EXPANDED, STORE_CKPT, False, NO_FMA, CHUNK, BLOCK_S, BLOCK_C,
                   s_base, 0)


@triton.jit(do_not_specialize=["T"])
def _ln_neuron_bwd_kernel(
    x_ptr,  # [T, B, C, S] forward input at t*sx_t + b*sx_b + c*sx_c + s*sx_s
    w_ptr,  # [C] norm weight, read when HAS_W
    b_ptr,  # [C] norm bias, read when HAS_B
    k_ptr,  # [1] fp32 k, read when K_FROM_PTR
    ckpt_ptr,  # [cdiv(T, CHUNK) - 1, B, C, S] fp32 checkpoints of the forward
    gs_ptr,  # [T, B, C, S] dL/dS at t*sg_t + ...
    gx_ptr,  # dL/dx out: [T, B, C, S] at t*sd_t + ..., or [B, C, S] once when EXPANDED
    part_ptr,  # [G0, 2, C] fp32 out: per-program sums of dL/dy * xhat (dW) and dL/dy (dB)
    gk_part_ptr,  # [G0] fp32 out: per-program partial dL/dk (STORE_GK)
    T, B, C, S, s_tiles,
    sx_t, sx_b, sx_c, sx_s,
    sg_t, sg_b, sg_c, sg_s,
    sd_t, sd_b, sd_c, sd_s,
    eps, k, v_threshold, v_reset, alpha,
    LEAK: tl.constexpr, DECAY_INPUT: tl.constexpr, HARD_RESET: tl.constexpr,  # the neuron (F_* flags)
    DETACH_RESET: tl.constexpr, SURROGATE: tl.constexpr,  # its gradient
    K_FROM_PTR: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr,  # the norm's weight and bias
    EXPANDED: tl.constexpr,
    STORE_GK: tl.constexpr,
    NO_FMA: tl.constexpr, CHUNK: tl.constexpr,  # the charge's rounding, steps per chunk
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,  # the tile
):
    pid0 = tl.program_id(0)
    b, offs_s, offs_c, mask_c, mask = _tile(tl.program_id(0), 0, s_tiles, S, C, BLOCK_S, BLOCK_C)
    w, bias, eps, k, v_threshold, v_reset, v_r = _ln_values(
        w_ptr, b_ptr, k_ptr, offs_c, mask_c, eps, k, v_threshold, v_reset, K_FROM_PTR, HARD_RESET, HAS_W, HAS_B,
        BLOCK_C)
    alpha = tl.cast(alpha, tl.float32)
    one_minus_k = 1.0 - k
    x_base = _at(x_ptr, b, offs_s, offs_c, sx_b, sx_s, sx_c)
    gx_base = _at(gx_ptr, b, offs_s, offs_c, sd_b, sd_s, sd_c)
    ck_base, NCK = _ckpt_at(ckpt_ptr, b, offs_s, offs_c, C, S, False), tl.cast(B, tl.int64) * C * S
    gs_base = _at(gs_ptr, b, offs_s, offs_c, sg_b, sg_s, sg_c)
    out_dtype = gx_ptr.dtype.element_ty
    v0 = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32) + v_r
    gv = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    acc_g = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)  # sum of dL/dy (EXPANDED: per element, over T)
    acc_gx = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)  # sum of dL/dy * xhat
    gk = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    if EXPANDED:
        y_e, xhat_e, rstd_e = _ln_rows(tl.load(x_base, mask=mask, other=0.0).to(tl.float32), mask, C, eps, w, bias)
    n_chunks = tl.cdiv(T, CHUNK)
    for cc in range(n_chunks):
        c = n_chunks - 1 - tl.cast(cc, tl.int32)
        t0 = c * CHUNK
        v_start = _state_before(ck_base, NCK, c, mask, v0)
        # Issue every load of the chunk before its first store, recompute its charged states, scan it in reverse.
        if not EXPANDED:
            xs = _load_chunk(x_base, sx_t, t0, T, mask, CHUNK)
        gss = _load_chunk(gs_base, sg_t, t0, T, mask, CHUNK)
        ys = ()
        xhats = ()
        rstds = ()
        for j in tl.static_range(CHUNK):
            if EXPANDED:
                ys = ys + (y_e,)
            else:
                y, xhat, rstd = _ln_rows(xs[j].to(tl.float32), mask, C, eps, w, bias)
                ys = ys + (y,)
                xhats = xhats + (xhat,)
                rstds = rstds + (rstd,)
        out = chunk_backward(ys, v_start, gss, gss, gv, gk, t0, T, mask, k, one_minus_k, v_threshold, v_reset, v_r, alpha,
                             LEAK, DECAY_INPUT, HARD_RESET, DETACH_RESET, SURROGATE, 1, False, STORE_GK, NO_FMA, CHUNK)
        gv, gk = out[CHUNK], out[CHUNK + 1]  # dL/dV before the chunk, PLIF's dL/dk so far
        for j in tl.static_range(CHUNK - 1, -1, -1):  # in the scan's order, so that the sums add up alike
            m = mask & (t0 + j < T)
            gy = tl.where(m, out[j], 0.0)
            acc_g += gy
            if not EXPANDED:
                acc_gx += gy * xhats[j]
                gx = _ln_dx(gy, xhats[j], rstds[j], w, mask, C)
                tl.store(gx_base + tl.cast(t0 + j, tl.int64) * sd_t, gx.to(out_dtype), mask=m)
    if EXPANDED:
        acc_gx = acc_g * xhat_e
        tl.store(gx_base, _ln_dx(acc_g, xhat_e, rstd_e, w, mask, C).to(out_dtype), mask=mask)
    row = part_ptr + pid0.to(tl.int64) * 2 * C + offs_c
    tl.store(row, tl.sum(acc_gx, axis=0), mask=mask_c)
    tl.store(row + C, tl.sum(acc_g, axis=0), mask=mask_c)
    if STORE_GK:
        tl.store(gk_part_ptr + pid0, tl.sum(tl.sum(gk, axis=1), axis=0))


# ----------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------


def _ln_fwd_plan(x: Tensor, T: int, params: list[float], flags: int, has_w: bool, has_b: bool, has_k: bool,
                 launches: bool) -> base._FwdPlan:
    plan, expanded, B, C, S, (st, sb, sc, ss) = base._fwd_plan(x, T, flags)
    if not launches or B * C * S == 0:
        return plan
    k, v_threshold, v_reset, _alpha, eps = params[:5]
    bs, bc = tuning.ln_tiles(C, tuning.LN_FWD_TILE)
    s_tiles = cdiv(S, bs)
    plan.launches = (Planned(
        _ln_neuron_fwd_kernel, (B * s_tiles,),
        ("x", "weight", "bias", "k", "spikes", "ckpt", T, B, C, S, s_tiles, st, sb, sc, ss,
         *base._spike_strides(plan), eps, k, v_threshold, v_reset),
        dict(**base._neuron_consts(flags), K_FROM_PTR=has_k, HAS_W=has_w, HAS_B=has_b, EXPANDED=expanded,
             STORE_CKPT=plan.ckpt_shape[0] > 0, NO_FMA=ns.NO_FMA, CHUNK=ns.chunk_steps(T), BLOCK_S=bs, BLOCK_C=bc,
             num_warps=tuning.LN_WARPS)),)
    return plan


_LN_FWD_PLANS = PlanCache()
_LN_BWD_PLANS = PlanCache()


def _ln_fwd_host(x: Tensor, weight: Tensor | None, bias: Tensor | None, k_tensor: Tensor | None, T: int,
                 params: list[float], flags: int, launch: bool, wrap=direct) -> tuple[Tensor, Tensor]:
    def build(launches: bool, fuse: bool = False) -> base._FwdPlan:
        return _ln_fwd_plan(x, T, params, flags, weight is not None, bias is not None, k_tensor is not None, launches)

    if launch and wrap is direct:
        plan = base._plan(_LN_FWD_PLANS, (x.shape, x.stride(), x.device, T, flags, weight is None, bias is None,
                                     k_tensor is None, *params), build)
    else:
        plan = build(launch)
    spikes, ckpt = base._fwd_outputs(plan, x)
    if launch and plan.launches:
        tensors = {"x": x.contiguous() if plan.copy else x, "weight": weight, "bias": bias, "k": k_tensor,
                   "spikes": spikes, "ckpt": ckpt}
        for planned in plan.launches:
            planned(wrap, tensors)
    return spikes, ckpt


def _ln_bwd_plan(x: Tensor, grad_spikes: Tensor, T: int, params: list[float], flags: int, has_w: bool,
                 has_b: bool, has_k: bool, launches: bool, fuse: bool = False) -> base._BwdPlan:
    # the kernel always writes dL/dx (the weight sums come with it)
    plan, xk, expanded, B, C, S, (st, sb, sc, ss) = base._bwd_plan(x, T, flags | ns.F_GRAD_X, has_w, has_k)
    if not launches or B * C * S == 0:
        return plan
    sg, sd = base._bwd_grad_maps(plan, xk, grad_spikes, expanded)
    bs, bc = tuning.ln_tiles(C, tuning.LN_BWD_TILE)
    s_tiles = cdiv(S, bs)
    g0 = B * s_tiles
    plan.part_shape = (g0, 2, C)
    plan.gk_shape = (g0,) if plan.need_k else None
    k, v_threshold, v_reset, alpha, eps = params[:5]
    out = [Planned(
        _ln_neuron_bwd_kernel, (g0,),
        ("x", "weight", "bias", "k", "ckpt", "gs", "grad_x", "part", "gk_part" if plan.need_k else "part",
         T, B, C, S, s_tiles, st, sb, sc, ss, *sg, *sd, eps, k, v_threshold, v_reset, alpha),
        dict(**base._neuron_consts(flags), DETACH_RESET=bool(flags & ns.F_DETACH_RESET),
             SURROGATE=(flags >> ns.F_SURROGATE_SHIFT) & 3, K_FROM_PTR=has_k, HAS_W=has_w, HAS_B=has_b,
             EXPANDED=expanded, STORE_GK=plan.need_k, NO_FMA=ns.NO_FMA, CHUNK=ns.chunk_steps(T), BLOCK_S=bs,
             BLOCK_C=bc, num_warps=tuning.LN_WARPS))]
    if plan.need_wb:
        out.append(Planned(_pair_sum_kernel, (cdiv(C, tuning.FINISH_C),), ("part", "sum0", "sum1", g0, C),
                           dict(BLOCK_R=tuning.FINISH_R, BLOCK_C=tuning.FINISH_C, num_warps=4)))
    if plan.need_k:
        out.append(Planned(sum_kernel, (1,), ("gk_part", "grad_k", g0), dict(BLOCK=ns.SUM_BLOCK, num_warps=4)))
    plan.launches = tuple(out)
    return plan


def _ln_bwd_host(x: Tensor, weight: Tensor | None, bias: Tensor | None, ckpt: Tensor, k_tensor: Tensor | None,
                 grad_spikes: Tensor, T: int, params: list[float], flags: int, launch: bool,
                 wrap=direct, eager: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dL/dx, dL/dweight, dL/dbias, dL/dk)``; dL/dx always, the others empty unless asked for (dL/dk None in an
    ``eager`` call)."""
    return base._bwd_host(_LN_BWD_PLANS, _ln_bwd_plan, x, weight, bias, k_tensor, grad_spikes, T, params, flags, launch,
                     wrap, (0, 1), eager, ckpt=ckpt)


# ----------------------------------------------------------------------------
# Operator registration
# ----------------------------------------------------------------------------


def _ln_fwd(x: Tensor, weight: Tensor | None, bias: Tensor | None, k_tensor: Tensor | None, T: int,
            params: list[float], flags: int) -> tuple[Tensor, Tensor]:
    """``(spikes, checkpoints)``."""
    return _ln_fwd_host(x, weight, bias, k_tensor, T, params, flags, True, op_wrap)


def _ln_fwd_fake(x, weight, bias, k_tensor, T, params, flags):
    return _ln_fwd_host(x, weight, bias, k_tensor, T, params, flags, False)


def _ln_bwd(x: Tensor, weight: Tensor | None, bias: Tensor | None, ckpt: Tensor, k_tensor: Tensor | None,
            grad_spikes: Tensor, T: int, params: list[float], flags: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dL/dx, dL/dweight, dL/dbias, dL/dk)``; dL/dx always, the others empty unless asked for."""
    return _ln_bwd_host(x, weight, bias, ckpt, k_tensor, grad_spikes, T, params, flags, True, op_wrap)


def _ln_bwd_fake(x, weight, bias, ckpt, k_tensor, grad_spikes, T, params, flags):
    return _ln_bwd_host(x, weight, bias, ckpt, k_tensor, grad_spikes, T, params, flags, False)


ln_neuron_fwd = register_op("snntrain::ln_neuron_fwd", _ln_fwd, _ln_fwd_fake)
ln_neuron_bwd = register_op("snntrain::ln_neuron_bwd", _ln_bwd, _ln_bwd_fake)


def _ln_setup_context(ctx, inputs, output) -> None:
    x, weight, bias, k_tensor, T, params, flags = inputs
    _spikes, ckpt = output
    ctx.save_for_backward(x, weight, bias, ckpt, k_tensor)
    ctx.T, ctx.params, ctx.flags = T, params, flags
    ctx.mark_non_differentiable(ckpt)


def _ln_backward(ctx, grad_spikes, _gc, bwd=None):
    x, weight, bias, ckpt, k_tensor = ctx.saved_tensors
    flags, nx, nw, nb, nk = base._grad_flags(ctx, ctx.flags, 0, 1, 2, 3)
    if not (nx or nw or nb or nk):
        return (None,) * 7
    if grad_spikes is None:
        grad_spikes = torch.zeros((ctx.T, *x.shape[-4:]), dtype=x.dtype, device=x.device)
    gx, gw, gb, gk = (bwd or ln_neuron_bwd)(x, weight, bias, ckpt, k_tensor, grad_spikes, ctx.T, ctx.params, flags)
    return gx if nx else None, gw if nw else None, gb if nb else None, gk if nk else None, None, None, None


ln_neuron_fwd.register_autograd(_ln_backward, setup_context=_ln_setup_context)


def _eager_ln_bwd(*args):
    with profiled("snntrain::ln_neuron_bwd"):
        return _ln_bwd_host(*args, launch=True, eager=True)


# The layer-norm op's forward and backward without the operator machinery (eager calls).
_EagerLNNeuron = eager_function("snntrain::ln_neuron_fwd", functools.partial(_ln_fwd_host, launch=True),
                                _ln_setup_context, functools.partial(_ln_backward, bwd=_eager_ln_bwd))


# ----------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------


def ln_neuron(x: Tensor, weight: Tensor | None, bias: Tensor | None, *, eps: float, T: int | None = None,
              **neuron) -> Tensor:
    """Spikes of ``neuron(layer_norm_over_channels(x))`` with the fused kernels; ``x`` and
    ``neuron`` as in :func:`bn_neuron`. Differentiable in ``x``, ``weight``, ``bias`` and ``w``."""
    T, flags, k, k_tensor = base._prepare(x, T, neuron)
    if base._needs_ckpt(x, weight, bias, k_tensor):
        flags |= ns.F_SAVE_CKPT
    params = base._params(k, neuron, eps)
    fn = ln_neuron_fwd if traced(x, weight, bias, k_tensor) else _EagerLNNeuron.apply
    spikes, _ckpt = fn(x, weight, bias, k_tensor, T, params, flags)
    return spikes
