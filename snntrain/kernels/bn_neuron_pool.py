"""Fused batch norm -> multi-step IF/LIF/PLIF neuron -> 3x3, stride-2, padding-1 max-pool of the spikes.

The ImageNet stem of the ResNets (:class:`snntrain.models.SEWResNet`, ``SpikingResNet``): a convolution, then
:class:`~snntrain.nn.NormNeuron` (:mod:`snntrain.kernels.bn_neuron`), then :class:`~snntrain.nn.SpikeMaxPool2d`
(:mod:`snntrain.kernels.spike_pool`). Here the pool runs inside the neuron's kernels: the forward writes the pooled
spikes and their window positions instead of the full-resolution spikes, and the neuron's backward gathers dL/dS
from the pooled gradient and the positions instead of reading a dL/dS that the pool's backward wrote. Registered as
``snntrain::bn_neuron_pool_fwd`` / ``bn_neuron_pool_bwd`` (a ``triton_op`` each, visible to ``torch.compile``
and ``torch.export``; nothing synchronises with the host, so a CUDA graph captures them), with the eager twin the
other families have (:mod:`snntrain.kernels.op_utils`).

Results: those of :func:`~snntrain.kernels.bn_neuron.bn_neuron` followed by
:func:`~snntrain.kernels.spike_pool.max_pool2d` (PyTorch's ``max_pool2d``) bit for bit: the same statistics pass,
the same per-element arithmetic, PyTorch's window position (the first spike in row-major window order; a window
without a spike takes its first position inside the input), and in the backward dL/dS equal to what the pool's
backward kernel writes (the gradients of the windows whose position is the pixel, summed in fp32 in ascending
output order and rounded once to the gradient's dtype), followed by the norm-neuron backward unchanged.

Forward
-------
One launch of the statistics pass of :mod:`~snntrain.kernels.bn_neuron` (training), then
:func:`_bn_neuron_pool_fwd_kernel`: a program owns a tile of pooled pixels x channels and keeps, in registers,
the membrane of each of the nine input pixels of every window of the tile; for each step it normalises the
window's inputs (read once for a stride-0 time axis), runs the neuron step at the nine pixels, ORs their spikes and
records the first window position that fired (the smallest ``kh * 3 + kw``), then writes the pooled spike and the
position (uint8). Neighbouring windows share input pixels (a row or column of three): each program recomputes
them instead of exchanging them, so the neuron runs at 9 pixels per pooled pixel, 2.25 times per input pixel.
For T > 4 the fp32 state is checkpointed every 8 steps, each input pixel's by the one window that owns it.

Backward
--------
The norm-neuron backward of :mod:`~snntrain.kernels.bn_neuron` (the scan's pass with the per-channel sums, then
the elementwise dL/dx), with ``POOL``: at each input pixel and step, dL/dS is the sum of the pooled gradients of the
(at most four) windows over the pixel whose saved position is the pixel's (:func:`~snntrain.kernels.spike_pool.
_stem_window_grad`, a gather, no atomics). Saved by the forward: x, the statistics, the checkpoints and the
positions (one byte per pooled element); neither the spikes nor a gradient of full resolution exists.

Bytes moved
-----------
A training step (forward and backward), T <= 4 (no checkpoints), counted in bytes of: ``E`` the full-resolution
spikes (``[T, B, C, H, W]``, the input's dtype; also dL/dS), ``X`` the input (``X = E``, or ``E / T`` for a
stride-0 time axis, the stem of a static image), ``Q`` the pooled spikes (``[T, B, C, Ho, Wo]``, about ``E / 4``;
also their gradient) and ``P`` the positions (one byte per pooled element).

* unfused, :func:`~snntrain.kernels.bn_neuron.bn_neuron` then the max-pool's two kernels: norm-neuron forward
  ``2 X + E`` (statistics, then the fused pass writes S); pool forward ``E + Q + P``; pool backward ``Q + P + E``
  (writes dL/dS); norm-neuron backward ``5 X + E`` (the scan's pass reads X and dL/dS and writes dL/dy, the
  elementwise pass reads dL/dy and X and writes dL/dx) = **7 X + 4 E + 2 Q + 2 P**;
* fused: forward ``2 X + Q + P``; backward ``5 X + Q + P`` (the gather reads each pooled gradient and position
  from memory about once: a window's nine pixels are neighbours, their tiles' reads meet in the caches)
  = **7 X + 2 Q + 2 P**: ``4 E`` less (S written and read, dL/dS written and read).

The SEW-ResNet-18 stem at 224 x 224, batch 32, T = 4, bf16 (``[32, 64, 112, 112]`` repeated over T):
X = 51.4 MB, E = 205.5 MB, Q = 51.4 MB, P = 25.7 MB: 1336 MB unfused, 514 MB fused (822 MB less, 0.19 ms at a
copy rate of 4.2 TB/s). The pooled forward does 2.25 times the neuron arithmetic per input pixel, which at 16 bits
may make it issue-bound rather than memory-bound (``scripts/bench_pool.py`` times it). The full-resolution
spikes and their gradient (E each) are never allocated: the step's peak memory is lower by up to 2 E.

Configurations: the pool is 3x3, stride 2, padding 1, dilation 1, without ``ceil_mode`` (the ResNets' stem); the
norm a batch norm with or without affine parameters and running statistics; the neuron IF, LIF or PLIF with every
option :mod:`~snntrain.kernels.bn_neuron` takes; input ``[T, B, C, H, W]`` or ``[B, C, H, W]`` with ``T``, NCHW or
channels-last (other layouts copied once, as there), any H and W. :func:`snntrain.nn.norm_neuron_max_pool` decides
per call and runs the two modules one after the other where this op does not apply.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import bn_neuron as bn
from . import bn_neuron_pool_tuning as tuning
from . import neuron_step as ns
from . import norm_neuron_base as base
from .bn_neuron import _bn_affine
from .neuron_step import charge, fire, reset, scalars
from .norm_neuron_base import _bn_apply
from .op_utils import PlanCache, Planned, cdiv, direct, op_wrap, profiled, register_op

__all__ = ["POOL_PARAMS", "bn_neuron_pool", "bn_neuron_pool_fwd", "bn_neuron_pool_bwd", "pooled_size"]

#: The max-pool the op fuses, as :func:`snntrain.kernels.spike_pool.pool_params` writes it: 3x3, stride 2,
#: padding 1, dilation 1, no ``ceil_mode``.
POOL_PARAMS = (3, 3, 2, 2, 1, 1, 1, 1, 0)


def pooled_size(n: int) -> int:
    """The pooled length of an input length ``n`` (``spike_pool.output_size(n, 3, 2, 1, 1, False)``)."""
    return (n - 1) // 2 + 1


# ----------------------------------------------------------------------------
# Kernel
# ----------------------------------------------------------------------------


@triton.jit
def _window_pixel(oh, ow, p_ok, H, W, Ho, Wo, KH: tl.constexpr, KW: tl.constexpr):
    """Position (KH, KW) of the windows of pooled pixels (oh, ow): its input pixel ``ih * W + iw`` (0 in the
    padding), whether it is inside the input, and whether this window stores the pixel's checkpoints. Every input
    pixel has one such window: the one that holds it in its rows 0-1 (the last row of windows also in its row 2,
    which no window below holds) and likewise in its columns."""
    ih = 2 * oh - 1 + KH
    iw = 2 * ow - 1 + KW
    inside = p_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
    owned = inside
    if KH == 2:
        owned = owned & (oh == Ho - 1)
    if KW == 2:
        owned = owned & (ow == Wo - 1)
    return tl.where(inside, ih * W + iw, 0).to(tl.int64), inside, owned


@triton.jit
def _pixel_step(x_c, x_off, inside, mask_c, y_e, v, first, code, scale, shift, k, v_r, v_threshold, v_reset,
                LEAK: tl.constexpr, DECAY_INPUT: tl.constexpr, HARD_RESET: tl.constexpr, EXPANDED: tl.constexpr,
                NO_FMA: tl.constexpr):
    """One step of the neuron at window position ``code`` (``kh * 3 + kw``) of the tile's windows, whose input
    pixels are ``inside`` the input: their input (``y_e`` for a stride-0 time axis, else loaded at ``x_c + x_off``,
    the channels' pointers and the pixels' offsets, and normalised), the step, and ``first``, the smallest position
    of each window that fired so far (255: none). Returns the state after the reset and ``first``."""
    m = inside[:, None] & mask_c[None, :]
    if EXPANDED:
        y = y_e
    else:
        y = _bn_apply(tl.load(x_c + x_off[:, None], mask=m, other=0.0).to(tl.float32), scale, shift)
    h = charge(y, v, k, v_r, LEAK, DECAY_INPUT, NO_FMA)
    spike = fire(h, v_threshold)
    first = tl.minimum(first, tl.where(spike & m, code, 255))
    return reset(h, spike, v_threshold, v_reset, HARD_RESET), first


@triton.jit(do_not_specialize=["T"])
def _bn_neuron_pool_fwd_kernel(
    x_ptr,  # [T, B, C, S] input at t*sx_t + b*sx_b + c*sx_c + s*sx_s, s = ih * W + iw (sx_t = 0: one input for all T)
    mean_ptr,  # [C] fp32 mean used for normalising (batch or running)
    rstd_ptr,  # [C] fp32 1 / sqrt(var + eps)
    w_ptr,  # [C] norm weight, read when HAS_W
    b_ptr,  # [C] norm bias, read when HAS_B
    k_ptr,  # [1] fp32 k = 1/tau, read when K_FROM_PTR (PLIF)
    y_ptr,  # [T, B, C, Ho * Wo] pooled spikes out (x's dtype) at t*sy_t + b*sy_b + c*sy_c + q*sy_s, q = oh * Wo + ow
    pos_ptr,  # [T, B, C, Ho * Wo] uint8 window position of each pooled spike out, kh * 3 + kw (y's strides)
    ckpt_ptr,  # [cdiv(T, CHUNK) - 1, B, C, S] contiguous fp32 state before each chunk but the first (STORE_CKPT)
    T, B, C, H, W, Ho, Wo,
    sx_t, sx_b, sx_c, sx_s,
    sy_t, sy_b, sy_c, sy_s,
    k, v_threshold, v_reset,
    LEAK: tl.constexpr, DECAY_INPUT: tl.constexpr, HARD_RESET: tl.constexpr,  # the neuron (F_* flags)
    K_FROM_PTR: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr,  # the norm's weight and bias
    EXPANDED: tl.constexpr,
    STORE_CKPT: tl.constexpr,
    NO_FMA: tl.constexpr, CHUNK: tl.constexpr,  # the charge's rounding, steps per checkpoint chunk
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,  # the tile: pooled pixels (of B * Ho * Wo) x channels
):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    p_ok = p < B * Ho * Wo
    b = (p // (Ho * Wo)).to(tl.int64)
    q = p % (Ho * Wo)
    oh = q // Wo
    ow = q % Wo
    _mean, _rstd, scale, shift = _bn_affine(mean_ptr, rstd_ptr, w_ptr, b_ptr, offs_c, mask_c, HAS_W, HAS_B)
    k, v_threshold, v_reset, v_r = scalars(k_ptr, k, v_threshold, v_reset, K_FROM_PTR, HARD_RESET)
    c64 = offs_c.to(tl.int64)[None, :]
    S = H * W
    # the nine input pixels of each window, in window order, as offsets and masks per pooled pixel (the tile's
    # pointers are formed where they are used): the input's offsets, whether inside the input, the checkpoints'
    # offsets and whether the window owns the pixel; for a stride-0 time axis the normalised input, read once
    x_c = x_ptr + c64 * sx_c
    ck_c = ckpt_ptr + c64 * S
    xs = ()
    ins = ()
    cks = ()
    owns = ()
    ys = ()
    for j in tl.static_range(9):
        s, inside, owned = _window_pixel(oh, ow, p_ok, H, W, Ho, Wo, j // 3, j % 3)
        xs = xs + (b * sx_b + s * sx_s,)
        ins = ins + (inside,)
        cks = cks + (b * C * S + s,)
        owns = owns + (owned,)
        if EXPANDED:
            m = inside[:, None] & mask_c[None, :]
            ys = ys + (_bn_apply(tl.load(x_c + xs[j][:, None], mask=m, other=0.0).to(tl.float32), scale, shift),)
        else:
            ys = ys + (scale,)  # unused
    mask = p_ok[:, None] & mask_c[None, :]
    # the position of a window without a spike: its first inside the input (row 0 and column 0 of the first
    # row and column of windows are padding)
    empty = (tl.where(oh == 0, 3, 0) + tl.where(ow == 0, 1, 0))[:, None]
    y_ptrs = y_ptr + (b * sy_b + q.to(tl.int64) * sy_s)[:, None] + c64 * sy_c
    pos_ptrs = pos_ptr + (b * sy_b + q.to(tl.int64) * sy_s)[:, None] + c64 * sy_c
    out_dtype = y_ptr.dtype.element_ty
    NCK = tl.cast(B, tl.int64) * C * S
    v0 = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32) + v_r
    v1 = v0
    v2 = v0
    v3 = v0
    v4 = v0
    v5 = v0
    v6 = v0
    v7 = v0
    v8 = v0
    for c_iter in range(tl.cdiv(T, CHUNK)):
        c = tl.cast(c_iter, tl.int32)
        t0 = c * CHUNK
        if STORE_CKPT:  # the state before the chunk, each input pixel's by the window that owns it
            row = tl.cast(c - 1, tl.int64) * NCK
            tl.store(ck_c + (cks[0] + row)[:, None], v0, mask=owns[0][:, None] & mask_c[None, :] & (c > 0))
            tl.store(ck_c + (cks[1] + row)[:, None], v1, mask=owns[1][:, None] & mask_c[None, :] & (c > 0))
            tl.store(ck_c + (cks[2] + row)[:, None], v2, mask=owns[2][:, None] & mask_c[None, :] & (c > 0))
            tl.store(ck_c + (cks[3] + row)[:, None], v3, mask=owns[3][:, None] & mask_c[None, :] & (c > 0))
            tl.store(ck_c + (cks[4] + row)[:, None], v4, mask=owns[4][:, None] & mask_c[None, :] & (c > 0))
            tl.store(ck_c + (cks[5] + row)[:, None], v5, mask=owns[5][:, None] & mask_c[None, :] & (c > 0))
            tl.store(ck_c + (cks[6] + row)[:, None], v6, mask=owns[6][:, None] & mask_c[None, :] & (c > 0))
            tl.store(ck_c + (cks[7] + row)[:, None], v7, mask=owns[7][:, None] & mask_c[None, :] & (c > 0))
            tl.store(ck_c + (cks[8] + row)[:, None], v8, mask=owns[8][:, None] & mask_c[None, :] & (c > 0))
        for t in range(t0, tl.minimum(t0 + CHUNK, T)):
            t_off = tl.cast(t, tl.int64) * sx_t
            first = tl.full([BLOCK_P, BLOCK_C], 255, tl.int32)
            v0, first = _pixel_step(x_c, xs[0] + t_off, ins[0], mask_c, ys[0], v0, first, 0, scale, shift, k,
                                    v_r, v_threshold, v_reset, LEAK, DECAY_INPUT, HARD_RESET, EXPANDED, NO_FMA)
            v1, first = _pixel_step(x_c, xs[1] + t_off, ins[1], mask_c, ys[1], v1, first, 1, scale, shift, k,
                                    v_r, v_threshold, v_reset, LEAK, DECAY_INPUT, HARD_RESET, EXPANDED, NO_FMA)
            v2, first = _pixel_step(x_c, xs[2] + t_off, ins[2], mask_c, ys[2], v2, first, 2, scale, shift, k,
                                    v_r, v_threshold, v_reset, LEAK, DECAY_INPUT, HARD_RESET, EXPANDED, NO_FMA)
            v3, first = _pixel_step(x_c, xs[3] + t_off, ins[3], mask_c, ys[3], v3, first, 3, scale, shift, k,
                                    v_r, v_threshold, v_reset, LEAK, DECAY_INPUT, HARD_RESET, EXPANDED, NO_FMA)
            v4, first = _pixel_step(x_c, xs[4] + t_off, ins[4], mask_c, ys[4], v4, first, 4, scale, shift, k,
                                    v_r, v_threshold, v_reset, LEAK, DECAY_INPUT, HARD_RESET, EXPANDED, NO_FMA)
            v5, first = _pixel_step(x_c, xs[5] + t_off, ins[5], mask_c, ys[5], v5, first, 5, scale, shift, k,
                                    v_r, v_threshold, v_reset, LEAK, DECAY_INPUT, HARD_RESET, EXPANDED, NO_FMA)
            v6, first = _pixel_step(x_c, xs[6] + t_off, ins[6], mask_c, ys[6], v6, first, 6, scale, shift, k,
                                    v_r, v_threshold, v_reset, LEAK, DECAY_INPUT, HARD_RESET, EXPANDED, NO_FMA)
            v7, first = _pixel_step(x_c, xs[7] + t_off, ins[7], mask_c, ys[7], v7, first, 7, scale, shift, k,
                                    v_r, v_threshold, v_reset, LEAK, DECAY_INPUT, HARD_RESET, EXPANDED, NO_FMA)
            v8, first = _pixel_step(x_c, xs[8] + t_off, ins[8], mask_c, ys[8], v8, first, 8, scale, shift, k,
                                    v_r, v_threshold, v_reset, LEAK, DECAY_INPUT, HARD_RESET, EXPANDED, NO_FMA)
            fired = first < 255
            o_off = tl.cast(t, tl.int64) * sy_t
            tl.store(y_ptrs + o_off, tl.where(fired, 1.0, 0.0).to(out_dtype), mask=mask)
            tl.store(pos_ptrs + o_off, tl.where(fired, first, empty).to(tl.uint8), mask=mask)


# ----------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------


def _fwd_plan(x: Tensor, T: int, params: list[float], flags: int, has_w: bool, has_b: bool, has_k: bool,
              launches: bool, nbt: bool = False, fuse: bool = False) -> base._FwdPlan:
    """The forward's plan: ``out_shape`` and ``out_strides`` are the pooled spikes' (and the positions'), in the
    memory format the separate ops give them (x's); the statistics launches are :mod:`~snntrain.kernels.bn_neuron`'s
    (``fuse``: finished by their last program, eager plans)."""
    plan, expanded, B, C, S, (st, sb, sc, ss) = base._fwd_plan(x, T, flags)
    H, W = x.shape[-2:]
    Ho, Wo = pooled_size(H), pooled_size(W)
    cl = C > 1 and S > 1 and x.stride()[-3] == 1  # the spikes' format (base._fwd_plan), which the pool keeps
    plan.out_shape = (T, B, C, Ho, Wo)
    Q = Ho * Wo
    plan.out_strides = (B * Q * C, Q * C, 1, Wo * C, C) if cl else (B * C * Q, C * Q, Q, Wo, 1)
    if not launches or B * C * S == 0:
        return plan
    k, v_threshold, v_reset, _alpha, eps = params[:5]
    out = []
    if flags & bn.F_BATCH_STATS:
        update = bool(flags & bn.F_UPDATE_RUNNING)
        plan.part_shape, stats = bn._stats_launches(x.device, 1 if expanded else T, B, C, S, (st, sb, sc, ss), eps,
                                                    params[5] if update else 0.0, update, nbt, fuse)
        out += stats
    bp, bc = tuning.fwd_tiles(C, sc == 1 and C > 1)
    out.append(Planned(
        _bn_neuron_pool_fwd_kernel, (cdiv(B * Q, bp), cdiv(C, bc)),
        ("x", "mean", "rstd", "weight", "bias", "k", "spikes", "pos", "ckpt", T, B, C, H, W, Ho, Wo,
         st, sb, sc, ss, *base._spike_strides(plan), k, v_threshold, v_reset),
        dict(**base._neuron_consts(flags), K_FROM_PTR=has_k, HAS_W=has_w, HAS_B=has_b, EXPANDED=expanded,
             STORE_CKPT=plan.ckpt_shape[0] > 0, NO_FMA=ns.NO_FMA, CHUNK=ns.chunk_steps(T),
             BLOCK_P=bp, BLOCK_C=bc, num_warps=tuning.fwd_warps(T))))
    plan.launches = tuple(out)
    stats = C if flags & bn.F_BATCH_STATS else 0
    plan.ws = (stats, stats, stats, 3 * stats * plan.part_shape[0] if stats else 0, math.prod(plan.ckpt_shape))
    return plan


_FWD_PLANS = PlanCache()
_BWD_PLANS = PlanCache()


def _fwd_host(x: Tensor, weight: Tensor | None, bias: Tensor | None, running_mean: Tensor | None,
              running_var: Tensor | None, k_tensor: Tensor | None, T: int, params: list[float], flags: int,
              launch: bool, wrap=direct, nbt: Tensor | None = None,
              eager: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(pooled spikes, positions, mean, rstd, unbiased var, checkpoints)``; ``nbt`` and ``eager`` as in
    :func:`snntrain.kernels.bn_neuron._bn_fwd_host`."""
    def build(launches: bool, fuse: bool = False) -> base._FwdPlan:
        return _fwd_plan(x, T, params, flags, weight is not None, bias is not None, k_tensor is not None, launches,
                         nbt is not None, fuse)

    plan = None
    if launch and wrap is direct:
        plan = base._plan(_FWD_PLANS, (x.shape, x.stride(), x.device, T, flags, weight is None, bias is None,
                                       k_tensor is None, nbt is None, *params), build)
    plan, tensors = bn._bn_fwd_buffers(plan, build, x, weight, bias, running_mean, running_var, k_tensor, params,
                                       flags, launch, eager, nbt=nbt)
    pos = torch.empty_strided(plan.out_shape, plan.out_strides, dtype=torch.uint8, device=x.device)
    tensors["pos"] = pos
    if launch:
        for planned in plan.launches:
            planned(wrap, tensors)
    return tensors["spikes"], pos, tensors["mean"], tensors["rstd"], tensors["var"], tensors["ckpt"]


#: The backward's plans: the norm-neuron backward's with the pooled gradient gathered (``pooled``).
_bwd_plan = functools.partial(bn._bn_bwd_plan, pooled=True)


def _bwd_host(x: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor, rstd: Tensor, ckpt: Tensor,
              k_tensor: Tensor | None, pos: Tensor, grad: Tensor, T: int, params: list[float], flags: int,
              launch: bool, wrap=direct, eager: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dL/dx, dL/dweight, dL/dbias, dL/dk)`` from dL/d(pooled spikes) ``grad`` (at ``pos``'s strides); empty
    where not asked for (F_GRAD_X, F_GRAD_WB, F_GRAD_K), dL/dk None where not asked for in an ``eager`` call."""
    return base._bwd_host(_BWD_PLANS, _bwd_plan, x, weight, bias, k_tensor, grad, T, params, flags, launch, wrap,
                          (1, 0), eager, mean=mean, rstd=rstd, ckpt=ckpt, pos=pos)


# ----------------------------------------------------------------------------
# Operator registration
# ----------------------------------------------------------------------------


def _op_fwd(x: Tensor, weight: Tensor | None, bias: Tensor | None, running_mean: Tensor | None,
            running_var: Tensor | None, k_tensor: Tensor | None, T: int, params: list[float],
            flags: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(pooled spikes, positions, mean, rstd, unbiased var, checkpoints)``: batch statistics with F_BATCH_STATS
    (var empty otherwise), else the running statistics; ``params = [k, v_threshold, v_reset, alpha, eps]``."""
    return _fwd_host(x, weight, bias, running_mean, running_var, k_tensor, T, params, flags, True, op_wrap)


def _op_fwd_fake(x, weight, bias, running_mean, running_var, k_tensor, T, params, flags):
    return _fwd_host(x, weight, bias, running_mean, running_var, k_tensor, T, params, flags, False)


def _op_bwd(x: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor, rstd: Tensor, ckpt: Tensor,
            k_tensor: Tensor | None, pos: Tensor, grad: Tensor, T: int, params: list[float],
            flags: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dL/dx, dL/dweight, dL/dbias, dL/dk)``, each empty unless asked for; ``grad`` at ``pos``'s strides."""
    return _bwd_host(x, weight, bias, mean, rstd, ckpt, k_tensor, pos, grad, T, params, flags, True, op_wrap)


def _op_bwd_fake(x, weight, bias, mean, rstd, ckpt, k_tensor, pos, grad, T, params, flags):
    return _bwd_host(x, weight, bias, mean, rstd, ckpt, k_tensor, pos, grad, T, params, flags, False)


bn_neuron_pool_fwd = register_op("snntrain::bn_neuron_pool_fwd", _op_fwd, _op_fwd_fake)
bn_neuron_pool_bwd = register_op("snntrain::bn_neuron_pool_bwd", _op_bwd, _op_bwd_fake)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, _rm, _rv, k_tensor, T, params, flags = inputs
    _pooled, pos, mean, rstd, var, ckpt = output
    ctx.save_for_backward(x, weight, bias, mean, rstd, ckpt, k_tensor, pos)
    ctx.T, ctx.params, ctx.flags = T, params, flags
    ctx.mark_non_differentiable(pos, mean, rstd, var, ckpt)


def _backward(ctx, grad, _gp, _gm, _gr, _gv, _gc):
    x, weight, bias, mean, rstd, ckpt, k_tensor, pos = ctx.saved_tensors
    return _grads(ctx, x, weight, bias, mean, rstd, ckpt, k_tensor, pos, grad, bn_neuron_pool_bwd)


def _grads(ctx, x, weight, bias, mean, rstd, ckpt, k_tensor, pos, grad, bwd) -> tuple:
    """The gradients of the forward's nine inputs from dL/d(pooled spikes) ``grad``, through ``bwd`` (the backward
    operator, or the eager host function), which takes the gradient at the positions' strides."""
    flags, nx, nw, nb, nk = base._grad_flags(ctx, ctx.flags, 0, 1, 2, 5)
    if not (nx or nw or nb or nk):
        return (None,) * 9
    if grad is None:
        grad = torch.zeros_like(pos, dtype=x.dtype)
    elif grad.stride() != pos.stride():  # one layout for both, read with one set of strides
        grad = torch.empty_like(pos, dtype=grad.dtype).copy_(grad)
    gx, gw, gb, gk = bwd(x, weight, bias, mean, rstd, ckpt, k_tensor, pos, grad, ctx.T, ctx.params, flags)
    return (gx if nx else None, gw if nw else None, gb if nb else None, None, None, gk if nk else None,
            None, None, None)


bn_neuron_pool_fwd.register_autograd(_backward, setup_context=_setup_context)


def _eager_bwd(*args):
    with profiled("snntrain::bn_neuron_pool_bwd"):
        return _bwd_host(*args, launch=True, eager=True)


class _EagerBNNeuronPool(torch.autograd.Function):
    """``snntrain::bn_neuron_pool_fwd`` and its backward, launched without the operator machinery (eager calls),
    with the two inputs more of :class:`snntrain.kernels.bn_neuron._EagerBNNeuron` (``num_batches_tracked`` and
    ``stats``); it keeps the statistics and checkpoints on ``ctx``, and saves the positions as autograd saves
    tensors (what the backward keeps shows in ``saved_tensors_hooks``)."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, k_tensor, T, params, flags, nbt, stats):
        with profiled("snntrain::bn_neuron_pool_fwd"):
            pooled, pos, mean, rstd, var, ckpt = _fwd_host(x, weight, bias, running_mean, running_var, k_tensor, T,
                                                           params, flags, True, nbt=nbt, eager=True)
        ctx.save_for_backward(x, weight, bias, k_tensor, pos)
        ctx.mean, ctx.rstd, ctx.ckpt = mean, rstd, ckpt
        ctx.T, ctx.params, ctx.flags = T, params, flags
        ctx.set_materialize_grads(False)
        if stats:
            ctx.mark_non_differentiable(mean, var)
            return pooled, mean, var
        return pooled

    @staticmethod
    def backward(ctx, grad, *_stats):
        x, weight, bias, k_tensor, pos = ctx.saved_tensors
        return *_grads(ctx, x, weight, bias, ctx.mean, ctx.rstd, ctx.ckpt, k_tensor, pos, grad, _eager_bwd), \
            None, None


# ----------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------


def bn_neuron_pool(x: Tensor, weight: Tensor | None, bias: Tensor | None, running_mean: Tensor | None,
                   running_var: Tensor | None, *, training: bool, momentum: float | Tensor, eps: float,
                   T: int | None = None, num_batches_tracked: Tensor | None = None, **neuron) -> Tensor:
    """``max_pool2d(bn_neuron(x, ...), 3, stride=2, padding=1)`` over the steps and samples, in one op: the pooled
    spikes ``[T, B, C, Ho, Wo]`` (``Ho = (H - 1) // 2 + 1``, likewise ``Wo``) in x's dtype and memory format.

    The arguments are :func:`snntrain.kernels.bn_neuron.bn_neuron`'s (no ``count``), with the same semantics:
    ``x`` ``[T, B, C, H, W]`` or ``[B, C, H, W]`` with ``T``; batch statistics in training or without running
    statistics, which ``training`` updates with ``momentum`` (and ``num_batches_tracked``); differentiable in
    ``x``, ``weight``, ``bias`` and PLIF's ``w``. Values, gradients and running statistics are those of
    :func:`~snntrain.kernels.bn_neuron.bn_neuron` followed by :func:`~snntrain.kernels.spike_pool.max_pool2d`."""
    T, flags, params, k_tensor, update = bn._bn_prepare(x, weight, bias, running_mean, running_var, training, eps, T,
                                                        neuron)
    return bn._bn_dispatch(bn_neuron_pool_fwd, _EagerBNNeuronPool, x, weight, bias, running_mean, running_var,
                           k_tensor, T, params, flags, update, training, momentum, num_batches_tracked)
