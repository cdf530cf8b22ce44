"""Fused batch norm -> multi-step IF/LIF/PLIF neuron in Triton, forward and hand-written backward.

Registered as ``snntrain::bn_neuron_fwd`` / ``bn_neuron_bwd``: per-channel statistics over
``T * B * H * W`` in training mode, the running statistics in eval mode. The input layout, the
tiles and the host plans are described in :mod:`snntrain.kernels.norm_neuron_base`.

Bytes: what is saved and what is recomputed
-------------------------------------------
Counted in tensors of the input's size ``E = T*B*C*H*W`` (4 B per element fp32, 2 B bf16),
for T <= 4 (one chunk, no checkpoints); the gradient of the spikes dS is a full tensor.

Batch norm, training:

* forward: statistics pass reads X (1); the fused pass reads X and writes S (2) = **3 E**;
* backward, pass 1: re-reads X and dS, recomputes the normalised input and the forward
  scan in registers, runs the reverse scan, reduces the per-channel sums of dL/dy and
  dL/dy * xhat and writes dL/dy into dX's buffer (3); pass 2, elementwise, reads dL/dy and
  X and writes dX in place from those sums (3) = **6 E**.

  Running the scan again in pass 2 instead of keeping dL/dy moves 5 E, but the scan's
  recomputation and reverse step take more instructions per element-step than a 16-bit
  element's bytes allow at the memory's rate: that backward was 25 % (SEW-ResNet-18) and
  21 % (the T=16 event network) slower in bf16, 12 % and 1 % in fp32 (H200,
  ``scripts/bench_bn_neuron.py --sweep``). Where no per-channel sum is needed (an eval-mode
  norm with frozen parameters) one pass recomputes the scan and writes dX (3 E). Saving the
  normalised input or the membrane in the forward costs at least one more E each way.

So 9 E per training step for the fused layer against 13 E for BatchNorm2d followed by a
neuron (BN forward 3, neuron forward 2, neuron backward 3, BN backward 5). For T > 4 the
fp32 state is checkpointed every 8 steps as in :mod:`snntrain.kernels.lif` (4 B per
neuron per 8 steps written, read twice in the backward). A stride-0 input reads X once
per element instead of T times (and writes dX once).

Per-channel sums (statistics, dL/dW, dL/dB, the BN backward's means) and PLIF's dL/dk
are per-program partials finished in a fixed order: deterministic, no host synchronisation.
The registered operator finishes them in small kernels. An eager call's batch-norm
statistics and backward sums are finished by the last program of each channel block to
store its partials (an arrival counter per block, the only atomic, kept zeroed by the
plan: :func:`_last_to_arrive`), one launch fewer in each direction. The running
statistics: the registered operator returns the batch mean and unbiased variance and the
caller folds them into the buffers with in-place tensor ops (``torch.compile`` fuses
them); eager calls with a float momentum fold them in, and count ``num_batches_tracked``,
where the statistics are finished (two launches fewer a layer).

The backward's scan kernel runs one loop over its program's (tile, chunk) pairs, each tile's chunks last to first,
and issues the loads of the next pair (input, dL/dS, residual, checkpoint) before the scan of the current one
(``norm_neuron_tuning.BWD_PREFETCH``): the scan's dependent arithmetic then overlaps the memory's latency instead of
waiting for it once per chunk. The checkpoints are kept in the input's memory format (``CK_CL``), so a
channels-last tile reads them as it reads its input.

The eager autograd function returns the spikes alone and keeps the statistics and checkpoints on its
context; traced calls build their plans without the arrival counters.

The backward's scan kernel also serves :mod:`snntrain.kernels.bn_neuron_pool` (the spikes max-pooled 3x3/2 inside
the forward): with ``POOL`` it gathers dL/dS at each pixel from the pooled gradient and the window positions
instead of loading it (:func:`_bn_bwd_plan`'s ``pooled``); the statistics launches and the forward's buffers are
shared with it too.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import neuron_step as ns
from . import norm_neuron_base as base
from . import norm_neuron_tuning as tuning
from .neuron_step import backward_scan, chunk_backward, fire, forward_scan, scalars, sum_kernel
from .norm_neuron_base import (
    _at,
    _bn_apply,
    _ckpt_at,
    _fwd_scan,
    _load_chunk,
    _pair_sum,
    _pair_sum_kernel,
    _state_before,
    _tile,
)
from .op_utils import FLOAT_DTYPES, PlanCache, Planned, cdiv, direct, op_wrap, profiled, register_op, traced
from .spike_pool import _stem_window_grad, _stem_windows

__all__ = ["bn_neuron", "bn_neuron_fwd", "bn_neuron_bwd", "bn_stats", "bn_input_grad", "residual_fits"]

#: Flag bits beyond the neuron's (:mod:`snntrain.kernels.neuron_step`) and ``F_GRAD_WB``
#: (:mod:`snntrain.kernels.norm_neuron_base`): batch statistics (training mode).
F_BATCH_STATS = 1 << 13
#: Eager calls only (never the registered operator, which mutates nothing): the statistics kernel also folds the
#: batch statistics into the float32 running statistics with the momentum ``params[5]`` (and counts the batch).
F_UPDATE_RUNNING = 1 << 15


# ----------------------------------------------------------------------------
# Device helpers
# ----------------------------------------------------------------------------


@triton.jit
def _group_tile(pid0, i, groups, TPP, S, C, offs_c, mask_c, BLOCK_S: tl.constexpr):
    """Tile ``i`` of the ``TPP`` consecutive position tiles of program ``pid0`` (``groups`` per sample):
    sample, position offsets, mask (empty past the last tile) and number of valid positions."""
    b = (pid0 // groups).to(tl.int64)
    s0 = ((pid0 % groups) * TPP + i) * BLOCK_S
    offs_s = s0 + tl.arange(0, BLOCK_S)
    mask = (offs_s < S)[:, None] & mask_c[None, :]
    ns = tl.maximum(tl.minimum(S - s0, BLOCK_S), 0).to(tl.float32)
    return b, offs_s, mask, ns


@triton.jit
def _bn_affine(mean_ptr, rstd_ptr, w_ptr, b_ptr, offs_c, mask_c, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    """Per-channel mean, rstd and the folded scale and shift: y = x * scale + shift."""
    mean = tl.load(mean_ptr + offs_c, mask=mask_c, other=0.0)
    rstd = tl.load(rstd_ptr + offs_c, mask=mask_c, other=1.0)
    if HAS_W:
        scale = rstd * tl.load(w_ptr + offs_c, mask=mask_c, other=1.0).to(tl.float32)
    else:
        scale = rstd
    shift = -mean * scale
    if HAS_B:
        shift += tl.load(b_ptr + offs_c, mask=mask_c, other=0.0).to(tl.float32)
    return mean, rstd, scale[None, :], shift[None, :]


@triton.jit
def _last_to_arrive(sem_ptr, arrivals):
    """Whether this program is the last of the ``arrivals`` programs that share the counter ``sem_ptr`` to get
    here: every thread's stores of the program are made visible (barrier, then an acquire-release atomic) before it
    counts, so the last one reads all the others' (the partials it then reads bypass L1: ``cache_modifier=".cg"``)."""
    tl.debug_barrier()
    return tl.atomic_add(sem_ptr, 1, sem="acq_rel", scope="gpu") == arrivals - 1


# ----------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------


@triton.jit(do_not_specialize=["T", "TPP"])
def _bn_stats_kernel(
    x_ptr,  # [T, B, C, S] input, element (t, b, c, s) at t*sx_t + b*sx_b + c*sx_c + s*sx_s
    part_ptr,  # [G0, 3, C] fp32 out: per program count, mean, M2 of each channel
    T,  # steps to read (1 for a stride-0 time axis)
    C, S,
    groups,  # programs per sample along the positions: cdiv(cdiv(S, BLOCK_S), TPP)
    TPP,  # position tiles per program
    sx_t, sx_b, sx_c, sx_s,
    sem_ptr,  # [G1] int32 arrival counters, zero between launches (FINISH)
    mean_ptr, rstd_ptr, var_ptr, rm_ptr, rv_ptr, nbt_ptr,  # the finish's outputs (FINISH), see _bn_stats_finish
    eps, momentum,
    FINISH: tl.constexpr,  # the last program of each channel block to store its partials finishes them
    UPDATE: tl.constexpr,
    COUNT_BATCH: tl.constexpr,
    BLOCK_R: tl.constexpr,  # rows per step of the finish
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,  # the tile
):
    pid0 = tl.program_id(0)
    pid1 = tl.program_id(1)
    offs_c = pid1 * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    # Sums of x - K per element, K the channel's mean over the program's first tile at the first step (so that
    # the sum of squares cancels little), reduced over the tile once at the end: the loop only loads and adds.
    b, offs_s, mask, ns = _group_tile(pid0, 0, groups, TPP, S, C, offs_c, mask_c, BLOCK_S)
    x_base = _at(x_ptr, b, offs_s, offs_c, sx_b, sx_s, sx_c)
    shift = tl.sum(tl.load(x_base, mask=mask, other=0.0).to(tl.float32), axis=0) / tl.maximum(ns, 1.0)
    s1 = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    s2 = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    n = tl.cast(0.0, tl.float32)
    for i in range(TPP):
        b, offs_s, mask, ns = _group_tile(pid0, i, groups, TPP, S, C, offs_c, mask_c, BLOCK_S)
        x_base = _at(x_ptr, b, offs_s, offs_c, sx_b, sx_s, sx_c)
        for t in range(T):
            x = tl.load(x_base + tl.cast(t, tl.int64) * sx_t, mask=mask, other=0.0).to(tl.float32)
            d = tl.where(mask, x - shift[None, :], 0.0)
            s1 += d
            s2 += d * d
        n += ns * T
    sum1 = tl.sum(s1, axis=0)
    n_1 = tl.maximum(n, 1.0)
    mean = shift + sum1 / n_1
    m2 = tl.maximum(tl.sum(s2, axis=0) - sum1 * (sum1 / n_1), 0.0)
    row = part_ptr + pid0.to(tl.int64) * 3 * C + offs_c
    tl.store(row, tl.zeros([BLOCK_C], dtype=tl.float32) + n, mask=mask_c)
    tl.store(row + C, mean, mask=mask_c)
    tl.store(row + 2 * C, m2, mask=mask_c)
    if FINISH:
        if _last_to_arrive(sem_ptr + pid1, tl.num_programs(0)):
            _bn_stats_finish(part_ptr, mean_ptr, rstd_ptr, var_ptr, rm_ptr, rv_ptr, nbt_ptr, offs_c, mask_c,
                             tl.num_programs(0), C, eps, momentum, pid1 == 0, UPDATE, COUNT_BATCH, BLOCK_R, BLOCK_C)
            tl.store(sem_ptr + pid1, 0)  # zero again for the next launch


@triton.jit
def _bn_stats_finish_kernel(
    part_ptr,  # [G0, 3, C] fp32 partial count, mean, M2
    mean_ptr,  # [C] fp32 out: batch mean
    rstd_ptr,  # [C] fp32 out: 1 / sqrt(biased variance + eps)
    var_ptr,  # [C] fp32 out: unbiased variance (for the running statistics)
    rm_ptr,  # [C] fp32 running mean, updated in place when UPDATE: rm += momentum * (mean - rm)
    rv_ptr,  # [C] fp32 running variance, likewise with the unbiased variance
    nbt_ptr,  # [] int64 num_batches_tracked, + 1 when UPDATE and COUNT_BATCH (by program 0)
    G0, C, eps, momentum,
    UPDATE: tl.constexpr,
    COUNT_BATCH: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    _bn_stats_finish(part_ptr, mean_ptr, rstd_ptr, var_ptr, rm_ptr, rv_ptr, nbt_ptr, offs_c, offs_c < C, G0, C, eps,
                     momentum, tl.program_id(0) == 0, UPDATE, COUNT_BATCH, BLOCK_R, BLOCK_C)


@triton.jit
def _bn_stats_finish(part_ptr, mean_ptr, rstd_ptr, var_ptr, rm_ptr, rv_ptr, nbt_ptr, offs_c, mask_c, G0, C, eps,
                     momentum, first, UPDATE: tl.constexpr, COUNT_BATCH: tl.constexpr, BLOCK_R: tl.constexpr,
                     BLOCK_C: tl.constexpr):
    """The channels ``offs_c`` of the batch statistics from the G0 partials, in a fixed order; ``first``: the
    program that counts the batch."""
    eps = tl.cast(eps, tl.float32)  # float arguments may arrive as fp64 from a compiled graph
    n = tl.zeros([BLOCK_C], dtype=tl.float32)
    mean = tl.zeros([BLOCK_C], dtype=tl.float32)
    m2 = tl.zeros([BLOCK_C], dtype=tl.float32)
    for r0 in range(0, G0, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        m = (rows < G0)[:, None] & mask_c[None, :]
        base = part_ptr + rows.to(tl.int64)[:, None] * 3 * C + offs_c[None, :]
        n_r = tl.load(base, mask=m, other=0.0, cache_modifier=".cg")
        mean_r = tl.load(base + C, mask=m, other=0.0, cache_modifier=".cg")
        m2_r = tl.load(base + 2 * C, mask=m, other=0.0, cache_modifier=".cg")
        n_b = tl.sum(n_r, axis=0)
        mean_b = tl.sum(n_r * mean_r, axis=0) / tl.maximum(n_b, 1.0)
        d = tl.where(m, mean_r - mean_b[None, :], 0.0)
        m2_b = tl.sum(m2_r, axis=0) + tl.sum(n_r * d * d, axis=0)
        n_ab = tl.maximum(n + n_b, 1.0)
        delta = mean_b - mean
        mean += delta * (n_b / n_ab)
        m2 += m2_b + delta * delta * (n * n_b / n_ab)
        n += n_b
    tl.store(mean_ptr + offs_c, mean, mask=mask_c)
    tl.store(rstd_ptr + offs_c, tl.rsqrt(m2 / tl.maximum(n, 1.0) + eps), mask=mask_c)
    var = m2 / tl.maximum(n - 1.0, 1.0)
    tl.store(var_ptr + offs_c, var, mask=mask_c)
    if UPDATE:  # BatchNorm2d's running statistics, as torch.lerp_ folds them in
        momentum = tl.cast(momentum, tl.float32)
        rm = tl.load(rm_ptr + offs_c, mask=mask_c, other=0.0)
        rv = tl.load(rv_ptr + offs_c, mask=mask_c, other=0.0)
        tl.store(rm_ptr + offs_c, rm + momentum * (mean - rm), mask=mask_c)
        tl.store(rv_ptr + offs_c, rv + momentum * (var - rv), mask=mask_c)
        if COUNT_BATCH:
            if first:
                tl.store(nbt_ptr, tl.load(nbt_ptr) + 1)


@triton.jit(do_not_specialize=["T"])
def _bn_neuron_fwd_kernel(
    x_ptr,  # [T, B, C, S] input at t*sx_t + b*sx_b + c*sx_c + s*sx_s (sx_t = 0: one input for every step)
    mean_ptr,  # [C] fp32 mean used for normalising (batch or running)
    rstd_ptr,  # [C] fp32 1 / sqrt(var + eps)
    w_ptr,  # [C] norm weight, read when HAS_W
    b_ptr,  # [C] norm bias, read when HAS_B
    k_ptr,  # [1] fp32 k = 1/tau, read when K_FROM_PTR (PLIF)
    s_ptr,  # [T, B, C, S] spikes out (dtype of x) at t*so_t + b*so_b + c*so_c + s*so_s; RESIDUAL 1: spikes + r
    r_ptr,  # [T, B, C, S] RESIDUAL: at the spikes' strides, added to them (1) or to the neuron's input (2), or the
    #         factor of the spikes (3) or of one minus them (4) in what is stored
    ckpt_ptr,  # [cdiv(T, CHUNK) - 1, B, C, S] fp32 state before each chunk but the first (STORE_CKPT; CK_CL: each
    #            map stored channels-last)
    cnt_ptr,  # [C] fp32: += the spikes of each channel (COUNT)
    T, B, C, S, s_tiles,
    sx_t, sx_b, sx_c, sx_s,
    so_t, so_b, so_c, so_s,
    k, v_threshold, v_reset,
    LEAK: tl.constexpr, DECAY_INPUT: tl.constexpr, HARD_RESET: tl.constexpr,  # the neuron (F_* flags)
    K_FROM_PTR: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr,  # the norm's weight and bias
    EXPANDED: tl.constexpr,
    STORE_CKPT: tl.constexpr,
    COUNT: tl.constexpr,
    RESIDUAL: tl.constexpr,  # 0, or how r joins: ADD_TO_SPIKES (1), ADD_TO_INPUT (2), AND_SPIKES (3), IAND_SPIKES (4)
    NO_FMA: tl.constexpr, CHUNK: tl.constexpr,  # the charge's rounding, steps per chunk
    CK_CL: tl.constexpr,  # the checkpoints are laid out channels-last (:func:`_ckpt_at`)
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,  # the tile
):
    pid0 = tl.program_id(0)
    b, offs_s, offs_c, mask_c, mask = _tile(pid0, tl.program_id(1), s_tiles, S, C, BLOCK_S, BLOCK_C)
    _mean, _rstd, scale, shift = _bn_affine(mean_ptr, rstd_ptr, w_ptr, b_ptr, offs_c, mask_c, HAS_W, HAS_B)
    k, v_threshold, v_reset, v_r = scalars(k_ptr, k, v_threshold, v_reset, K_FROM_PTR, HARD_RESET)
    v = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32) + v_r
    x_base = _at(x_ptr, b, offs_s, offs_c, sx_b, sx_s, sx_c)
    s_base = _at(s_ptr, b, offs_s, offs_c, so_b, so_s, so_c)
    ck_base, NCK = _ckpt_at(ckpt_ptr, b, offs_s, offs_c, C, S, CK_CL), tl.cast(B, tl.int64) * C * S
    r_base = _at(r_ptr, b, offs_s, offs_c, so_b, so_s, so_c) if RESIDUAL else s_base
    fired = _fwd_scan(x_base, sx_t, s_base, so_t, ck_base, NCK, T, mask, v, scale, shift, C, 0.0, k, v_r,
                           v_threshold, v_reset, LEAK, DECAY_INPUT, HARD_RESET, False, EXPANDED, STORE_CKPT, COUNT,
                           NO_FMA, CHUNK, BLOCK_S, BLOCK_C, r_base, RESIDUAL)
    if COUNT:  # the activity report's spikes per channel, while they are in registers (no second read)
        tl.atomic_add(cnt_ptr + offs_c, tl.sum(fired, axis=0), mask=mask_c)


@triton.jit(do_not_specialize=["T", "TPP"])
def _bn_neuron_bwd_kernel(
    x_ptr,  # [T, B, C, S] forward input at t*sx_t + b*sx_b + c*sx_c + s*sx_s
    mean_ptr,  # [C] fp32 mean the forward normalised with
    rstd_ptr,  # [C] fp32 its 1 / sqrt(var + eps)
    w_ptr,  # [C] norm weight, read when HAS_W
    b_ptr,  # [C] norm bias, read when HAS_B
    k_ptr,  # [1] fp32 k, read when K_FROM_PTR
    ckpt_ptr,  # [cdiv(T, CHUNK) - 1, B, C, S] fp32 checkpoints of the forward (CK_CL: each map channels-last)
    gs_ptr,  # [T, B, C, S] dL/dS at t*sg_t + b*sg_b + c*sg_c + s*sg_s; POOL: [T, B, C, Ho * Wo] dL/d(pooled S)
    pos_ptr,  # POOL: [T, B, C, Ho * Wo] uint8 window positions of the pooled spikes, at dL/d(pooled S)'s strides
    sum_g_ptr,  # [C] fp32 per channel sum of dL/dy (read in PASS 2 with BATCH_STATS, written in PASS 1 with FINISH)
    sum_gx_ptr,  # [C] fp32 per channel sum of dL/dy * xhat (likewise)
    gx_ptr,  # dL/dx out (PASS 2): [T, B, C, S] at t*sd_t + ..., or [B, C, S] once when EXPANDED
    r_ptr,  # RESIDUAL: [T, B, C, S] the residual the forward added to the neuron's input or the spikes' factor, at
    #         t*sr_t + ...
    gr_ptr,  # RESIDUAL 3, 4 (PASS 1): [T, B, C, S] dL/dr out, at r's strides
    part_ptr,  # [G0, 2, C] fp32 out (PASS 1): per-program sums of dL/dy and dL/dy * xhat
    gk_part_ptr,  # [G0 * G1] fp32 out (PASS 1 with STORE_GK): per-program partial dL/dk
    sem_ptr,  # [G1] int32 arrival counters, zero between launches (PASS 1 with FINISH)
    T, B, C, S,
    W, Ho, Wo,  # POOL: the input's width and the pooled map's height and width
    groups,  # programs per sample along the positions: cdiv(cdiv(S, BLOCK_S), TPP)
    TPP,  # position tiles per program (fewer partial sums to finish)
    sx_t, sx_b, sx_c, sx_s,
    sg_t, sg_b, sg_c, sg_s,
    sd_t, sd_b, sd_c, sd_s,
    sr_t, sr_b, sr_c, sr_s,
    inv_n,  # 1 / (elements per channel)
    k, v_threshold, v_reset, alpha,
    LEAK: tl.constexpr, DECAY_INPUT: tl.constexpr, HARD_RESET: tl.constexpr,  # the neuron (F_* flags)
    DETACH_RESET: tl.constexpr, SURROGATE: tl.constexpr,  # its gradient
    K_FROM_PTR: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr,  # the norm's weight and bias
    EXPANDED: tl.constexpr, BATCH_STATS: tl.constexpr,  # a stride-0 time axis, batch statistics (training)
    RESIDUAL: tl.constexpr,  # 0; ADD_TO_INPUT (2): the forward added r_ptr's tensor to the neuron's input; AND_SPIKES
    #                          (3), IAND_SPIKES (4): it stored spikes * r or (1 - spikes) * r, whose gradient gs_ptr is
    #                          (not with POOL)
    PASS: tl.constexpr,  # 1: per-channel sums (and dL/dk); 2: dL/dx
    FINISH: tl.constexpr,  # PASS 1: the last program of each channel block adds the partials into the sums
    FINISH_R: tl.constexpr,  # rows per step of that sum
    STORE_GK: tl.constexpr,
    STORE_GY: tl.constexpr,  # PASS 1: dL/dy into gx_ptr (summed over T when EXPANDED), for _bn_dx_kernel (or a
    #                          RESIDUAL's gradient: the plan passes it as gx_ptr)
    POOL: tl.constexpr,  # the spikes were max-pooled 3x3/2 (bn_neuron_pool): dL/dS gathered from the pooled gradient
    NO_FMA: tl.constexpr, CHUNK: tl.constexpr,  # the charge's rounding, steps per chunk
    CK_CL: tl.constexpr,  # the checkpoints are laid out channels-last (:func:`_ckpt_at`)
    PREFETCH: tl.constexpr,  # issue the next chunk's loads before this chunk's scan
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,  # the tile
):
    pid0 = tl.program_id(0)
    pid1 = tl.program_id(1)
    offs_c = pid1 * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    mean, rstd, scale, shift = _bn_affine(mean_ptr, rstd_ptr, w_ptr, b_ptr, offs_c, mask_c, HAS_W, HAS_B)
    mean = mean[None, :]
    rstd = rstd[None, :]
    k, v_threshold, v_reset, v_r = scalars(k_ptr, k, v_threshold, v_reset, K_FROM_PTR, HARD_RESET)
    alpha = tl.cast(alpha, tl.float32)
    inv_n = tl.cast(inv_n, tl.float32)
    one_minus_k = 1.0 - k
    m_g = mean  # placeholders outside PASS 2
    m_gx = mean
    if PASS == 2:
        if BATCH_STATS:
            m_g = (tl.load(sum_g_ptr + offs_c, mask=mask_c, other=0.0) * inv_n)[None, :]
            m_gx = (tl.load(sum_gx_ptr + offs_c, mask=mask_c, other=0.0) * inv_n)[None, :]
    NCK = tl.cast(B, tl.int64) * C * S
    v0 = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32) + v_r
    acc_g = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)  # PASS 1: sums of dL/dy and dL/dy * xhat
    acc_gx = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    gk = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    gv = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)  # dL/dV after the chunk
    g_sum = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)  # EXPANDED: dL/dy summed over T
    # One loop over the program's (tile, chunk) pairs, each tile's chunks last to first; with PREFETCH the loads of
    # the next pair are issued before the scan of this one, so that they are in flight while it computes.
    n_chunks = tl.cdiv(T, CHUNK)
    n_iter = TPP * n_chunks
    if PREFETCH:
        b, offs_s, mask, _ns = _group_tile(pid0, 0, groups, TPP, S, C, offs_c, mask_c, BLOCK_S)
        nxt = _bn_bwd_loads(x_ptr, ckpt_ptr, gs_ptr, pos_ptr, r_ptr, b, offs_s, offs_c, mask, n_chunks - 1, v0, T, C,
                            S, W, Ho, Wo, NCK, sx_t, sx_b, sx_c, sx_s, sg_t, sg_b, sg_c, sg_s, sr_t, sr_b, sr_c, sr_s,
                            EXPANDED, RESIDUAL, POOL, CK_CL, CHUNK, BLOCK_S, BLOCK_C)
    for it in range(n_iter):
        i, c = _pair(it, n_chunks)
        b, offs_s, mask, _ns = _group_tile(pid0, i, groups, TPP, S, C, offs_c, mask_c, BLOCK_S)
        if PREFETCH:
            cur = nxt
            i1, c1 = _pair(it + 1, n_chunks)
            b1, offs_s1, mask1, _ns1 = _group_tile(pid0, i1, groups, TPP, S, C, offs_c, mask_c, BLOCK_S)
            nxt = _bn_bwd_loads(x_ptr, ckpt_ptr, gs_ptr, pos_ptr, r_ptr, b1, offs_s1, offs_c, mask1 & (it + 1 < n_iter),
                                c1, v0, T, C, S, W, Ho, Wo, NCK, sx_t, sx_b, sx_c, sx_s, sg_t, sg_b, sg_c, sg_s, sr_t,
                                sr_b, sr_c, sr_s, EXPANDED, RESIDUAL, POOL, CK_CL, CHUNK, BLOCK_S, BLOCK_C)
        else:
            cur = _bn_bwd_loads(x_ptr, ckpt_ptr, gs_ptr, pos_ptr, r_ptr, b, offs_s, offs_c, mask, c, v0, T, C, S, W, Ho,
                                Wo, NCK, sx_t, sx_b, sx_c, sx_s, sg_t, sg_b, sg_c, sg_s, sr_t, sr_b, sr_c, sr_s,
                                EXPANDED, RESIDUAL, POOL, CK_CL, CHUNK, BLOCK_S, BLOCK_C)
        acc_g, acc_gx, gk, gv, g_sum = _bn_bwd_chunk(
            cur, gx_ptr, gr_ptr, gs_ptr, b, offs_s, offs_c, mask, c, acc_g, acc_gx, gk, gv, g_sum, mean, rstd, scale,
            shift, m_g, m_gx, T, sd_b, sd_c, sd_s, sd_t, sr_t, sr_b, sr_c, sr_s, k, one_minus_k, v_threshold, v_reset,
            v_r, alpha, LEAK, DECAY_INPUT, HARD_RESET, DETACH_RESET, SURROGATE, EXPANDED, BATCH_STATS, RESIDUAL, PASS,
            STORE_GK, STORE_GY, NO_FMA, CHUNK, BLOCK_S, BLOCK_C)
    if PASS == 1:
        row = part_ptr + pid0.to(tl.int64) * 2 * C + offs_c
        tl.store(row, tl.sum(acc_g, axis=0), mask=mask_c)
        tl.store(row + C, tl.sum(acc_gx, axis=0), mask=mask_c)
        if STORE_GK:
            tl.store(gk_part_ptr + pid0.to(tl.int64) * tl.num_programs(1) + pid1, tl.sum(tl.sum(gk, axis=1), axis=0))
        if FINISH:
            if _last_to_arrive(sem_ptr + pid1, tl.num_programs(0)):
                _pair_sum(part_ptr, sum_g_ptr, sum_gx_ptr, offs_c, mask_c, tl.num_programs(0), C, FINISH_R,
                          BLOCK_C)
                tl.store(sem_ptr + pid1, 0)  # zero again for the next launch


@triton.jit
def _pair(it, n_chunks):
    """Tile and chunk of the backward loop's iteration ``it``: each tile's ``n_chunks`` chunks, last to first."""
    i = it // n_chunks
    return i, n_chunks - 1 - (it - i * n_chunks)


@triton.jit
def _bn_bwd_loads(
    x_ptr, ckpt_ptr, gs_ptr, pos_ptr, r_ptr, b, offs_s, offs_c, mask, c, v0, T, C, S, W, Ho, Wo, NCK, sx_t, sx_b, sx_c,
    sx_s, sg_t, sg_b, sg_c, sg_s, sr_t, sr_b, sr_c, sr_s,
    EXPANDED: tl.constexpr, RESIDUAL: tl.constexpr, POOL: tl.constexpr, CK_CL: tl.constexpr, CHUNK: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """What the backward of chunk ``c`` of a tile reads, as a tuple: the state before the chunk (``v0`` before the
    first), the inputs of its steps (``EXPANDED``: the one input), dL/dS of its steps (``POOL``: gathered from the
    pooled gradient and positions (:func:`~snntrain.kernels.spike_pool._stem_window_grad`) and rounded to the
    gradient's dtype, the values the separate max-pool backward would have written), and with ``RESIDUAL`` 2, 3 or 4
    the residual of its steps."""
    t0 = c * CHUNK
    x_base = _at(x_ptr, b, offs_s, offs_c, sx_b, sx_s, sx_c)
    v_start = _state_before(_ckpt_at(ckpt_ptr, b, offs_s, offs_c, C, S, CK_CL), NCK, c, mask, v0)
    if EXPANDED:
        xs = (tl.load(x_base, mask=mask, other=0.0),)
    else:
        xs = _load_chunk(x_base, sx_t, t0, T, mask, CHUNK)
    if POOL:  # the (at most four) windows over each pixel, and the channels' rows of dL/d(pooled S) and positions
        q0, q1, q2, q3, e1, e2, e3, c0, c1, c2, c3 = _stem_windows(offs_s, W, Ho, Wo)
        c_off = b * sg_b + offs_c.to(tl.int64)[None, :] * sg_c
        gss = ()
        for j in tl.static_range(CHUNK):
            t_off = tl.cast(t0 + j, tl.int64) * sg_t
            g = _stem_window_grad(gs_ptr + c_off + t_off, pos_ptr + c_off + t_off, sg_s, q0, q1, q2, q3, e1, e2, e3,
                                  c0, c1, c2, c3, mask & (t0 + j < T), BLOCK_S, BLOCK_C)
            gss = gss + (g.to(gs_ptr.dtype.element_ty),)
    else:
        gss = _load_chunk(_at(gs_ptr, b, offs_s, offs_c, sg_b, sg_s, sg_c), sg_t, t0, T, mask, CHUNK)
    if RESIDUAL >= 2:
        rs = _load_chunk(_at(r_ptr, b, offs_s, offs_c, sr_b, sr_s, sr_c), sr_t, t0, T, mask, CHUNK)
    else:
        rs = ()
    return v_start, xs, gss, rs


@triton.jit
def _bn_bwd_chunk(
    loaded, gx_ptr, gr_ptr, gs_ptr, b, offs_s, offs_c, mask, c, acc_g, acc_gx, gk, gv, g_sum, mean, rstd, scale, shift,
    m_g, m_gx, T, sd_b, sd_c, sd_s, sd_t, sr_t, sr_b, sr_c, sr_s, k, one_minus_k, v_threshold, v_reset, v_r, alpha,
    LEAK: tl.constexpr, DECAY_INPUT: tl.constexpr, HARD_RESET: tl.constexpr, DETACH_RESET: tl.constexpr,
    SURROGATE: tl.constexpr, EXPANDED: tl.constexpr, BATCH_STATS: tl.constexpr, RESIDUAL: tl.constexpr,
    PASS: tl.constexpr, STORE_GK: tl.constexpr, STORE_GY: tl.constexpr, NO_FMA: tl.constexpr, CHUNK: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """The backward of chunk ``c`` of a tile from what :func:`_bn_bwd_loads` read (``loaded``): its charged states
    recomputed, the reverse scan, then the PASS's sums or dL/dx; returns the sums, PLIF's dL/dk, dL/dV before the
    chunk (zero after a tile's first chunk, ``c`` 0) and, ``EXPANDED``, dL/dy summed over the tile's steps so far.
    With ``RESIDUAL`` 2 the neuron's input is recomputed with the residual added, and dL/dy (``STORE_GY``) is also
    the residual's gradient; with 3 or 4 (SEW's AND and IAND: the forward stored ``spikes * r`` or
    ``(1 - spikes) * r``) dL/dS is the loaded gradient times r (negated for IAND), rounded to the gradient's dtype as
    PyTorch's product would be, and PASS 1 stores r's gradient, the loaded one where the recomputed spike is 1 (AND)
    or 0 (IAND)."""
    v_start, xs, gss, rs = loaded
    t0 = c * CHUNK
    gx_base = _at(gx_ptr, b, offs_s, offs_c, sd_b, sd_s, sd_c)
    out_dtype = gx_ptr.dtype.element_ty
    ys = ()
    if EXPANDED:
        y_e = _bn_apply(xs[0].to(tl.float32), scale, shift)
        for _j in tl.static_range(CHUNK):
            ys = ys + (y_e,)
    elif RESIDUAL == 2:
        for j in tl.static_range(CHUNK):
            ys = ys + (_bn_apply(xs[j].to(tl.float32), scale, shift) + rs[j].to(tl.float32),)
    else:
        for j in tl.static_range(CHUNK):
            ys = ys + (_bn_apply(xs[j].to(tl.float32), scale, shift),)
    # (PASS 2 plans have STORE_GK false: PLIF's dL/dk is PASS 1's)
    if RESIDUAL >= 3:  # SEW's AND / IAND: dL/dS from the output's gradient, and r's gradient from the spikes
        gos = gss
        gss = ()
        for j in tl.static_range(CHUNK):
            g = gos[j].to(tl.float32) * rs[j].to(tl.float32)
            if RESIDUAL == 4:  # negated before the rounding, which is symmetric in the sign
                g = -g
            gss = gss + (g.to(gs_ptr.dtype.element_ty),)
        hs = forward_scan(ys, v_start, k, v_r, v_threshold, v_reset, LEAK, DECAY_INPUT, HARD_RESET, NO_FMA, CHUNK)
        if PASS == 1:
            gr_base = _at(gr_ptr, b, offs_s, offs_c, sr_b, sr_s, sr_c)
            for j in tl.static_range(CHUNK):
                spike = fire(hs[j], v_threshold)
                if RESIDUAL == 3:
                    g_r = tl.where(spike, gos[j].to(tl.float32), 0.0)
                else:
                    g_r = tl.where(spike, 0.0, gos[j].to(tl.float32))
                tl.store(gr_base + tl.cast(t0 + j, tl.int64) * sr_t, g_r.to(gr_ptr.dtype.element_ty),
                         mask=mask & (t0 + j < T))
        out = backward_scan(hs, ys, gss, 0, gss, gv, gk, v_start, t0, T, mask, k, one_minus_k, v_threshold, v_reset,
                            v_r, alpha, LEAK, DECAY_INPUT, HARD_RESET, DETACH_RESET, SURROGATE, 1, False, STORE_GK,
                            CHUNK)
    else:
        out = chunk_backward(ys, v_start, gss, gss, gv, gk, t0, T, mask, k, one_minus_k, v_threshold, v_reset, v_r,
                             alpha, LEAK, DECAY_INPUT, HARD_RESET, DETACH_RESET, SURROGATE, 1, False, STORE_GK,
                             NO_FMA, CHUNK)
    gv, gk = out[CHUNK], out[CHUNK + 1]  # dL/dV before the chunk, PLIF's dL/dk so far
    for j in tl.static_range(CHUNK - 1, -1, -1):  # in the scan's order, so that the sums add up alike
        m = mask & (t0 + j < T)
        gy = out[j]
        if EXPANDED:
            g_sum += tl.where(m, gy, 0.0)
        else:
            xhat = (xs[j].to(tl.float32) - mean) * rstd
            if PASS == 1:
                acc_g += tl.where(m, gy, 0.0)
                acc_gx += tl.where(m, gy * xhat, 0.0)
                if STORE_GY:
                    tl.store(gx_base + tl.cast(t0 + j, tl.int64) * sd_t, gy.to(out_dtype), mask=m)
            else:
                if BATCH_STATS:
                    gx = scale * (gy - m_g - xhat * m_gx)
                else:
                    gx = scale * gy
                tl.store(gx_base + tl.cast(t0 + j, tl.int64) * sd_t, gx.to(out_dtype), mask=m)
    if EXPANDED:
        if c == 0:  # the tile's last chunk: its dL/dy summed over T
            xhat = (xs[0].to(tl.float32) - mean) * rstd
            if PASS == 1:
                acc_g += g_sum
                acc_gx += tl.where(mask, g_sum * xhat, 0.0)
                if STORE_GY:
                    tl.store(gx_base, g_sum.to(out_dtype), mask=mask)
            else:
                if BATCH_STATS:
                    gx = scale * (g_sum - m_g - xhat * m_gx)
                else:
                    gx = scale * g_sum
                tl.store(gx_base, gx.to(out_dtype), mask=mask)
        g_sum = tl.where(c > 0, g_sum, 0.0)
    gv = tl.where(c > 0, gv, 0.0)  # the next tile's scan starts with none
    return acc_g, acc_gx, gk, gv, g_sum


@triton.jit(do_not_specialize=["T"])
def _bn_dx_kernel(
    x_ptr,  # [T, B, C, S] forward input at t*sx_t + b*sx_b + c*sx_c + s*sx_s (T = 1 when EXPANDED)
    mean_ptr,  # [C] fp32 mean the forward normalised with
    rstd_ptr,  # [C] fp32 its 1 / sqrt(var + eps)
    w_ptr,  # [C] norm weight, read when HAS_W
    sum_g_ptr,  # [C] fp32 per channel sum of dL/dy (read with BATCH_STATS)
    sum_gx_ptr,  # [C] fp32 per channel sum of dL/dy * xhat (read with BATCH_STATS)
    gy_ptr,  # dL/dy (the backward's PASS 1 with STORE_GY), at t*sd_t + ..., read when SEPARATE (else gx_ptr's)
    gx_ptr,  # dL/dx out, at gy's strides: over dL/dy in place, or beside it with SEPARATE (a residual's gradient)
    T, B, C, S, s_tiles,
    sx_t, sx_b, sx_c, sx_s,
    sd_t, sd_b, sd_c, sd_s,
    inv_n,  # 1 / (elements per channel)
    HAS_W: tl.constexpr,
    BATCH_STATS: tl.constexpr,
    SEPARATE: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,  # the tile
):
    """dL/dx of batch norm from dL/dy, elementwise: the formula of the backward's PASS 2 without the scan."""
    pid0 = tl.program_id(0)
    per_t = B * s_tiles
    t = (pid0 // per_t).to(tl.int64)
    b, offs_s, offs_c, mask_c, mask = _tile(pid0 % per_t, tl.program_id(1), s_tiles, S, C, BLOCK_S, BLOCK_C)
    mean, rstd, scale, _shift = _bn_affine(mean_ptr, rstd_ptr, w_ptr, w_ptr, offs_c, mask_c, HAS_W, False)
    gx_at = _at(gx_ptr, b, offs_s, offs_c, sd_b, sd_s, sd_c) + t * sd_t
    if SEPARATE:
        gy = tl.load(_at(gy_ptr, b, offs_s, offs_c, sd_b, sd_s, sd_c) + t * sd_t, mask=mask, other=0.0)
    else:
        gy = tl.load(gx_at, mask=mask, other=0.0)
    gy = gy.to(tl.float32)
    if BATCH_STATS:
        inv_n = tl.cast(inv_n, tl.float32)
        m_g = (tl.load(sum_g_ptr + offs_c, mask=mask_c, other=0.0) * inv_n)[None, :]
        m_gx = (tl.load(sum_gx_ptr + offs_c, mask=mask_c, other=0.0) * inv_n)[None, :]
        x_at = _at(x_ptr, b, offs_s, offs_c, sx_b, sx_s, sx_c) + t * sx_t
        x = tl.load(x_at, mask=mask, other=0.0).to(tl.float32)
        xhat = (x - mean[None, :]) * rstd[None, :]
        gx = scale * (gy - m_g - xhat * m_gx)
    else:
        gx = scale * gy
    tl.store(gx_at, gx.to(gx_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------


def _semaphores(n: int, fuse: bool, device: torch.device) -> Tensor | None:
    """The zeroed arrival counters of a kernel whose last program per channel block finishes its partial sums
    (:func:`_last_to_arrive`), kept by an eager plan and zeroed again by each launch; None where the plan keeps the
    finishing kernel instead: traced calls, and plans made while a CUDA graph is captured (the counters must not
    come from the graph's memory pool). The launches of one plan share its counters, so calls of one layout run one
    after the other (one stream, as a model's layers do), never at once on two streams."""
    if not fuse or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return None
    return torch.zeros(n, dtype=torch.int32, device=device)


def _bn_fwd_plan(x: Tensor, T: int, params: list[float], flags: int, has_w: bool, has_b: bool, has_k: bool,
                 count: bool, launches: bool, nbt: bool = False, fuse: bool = False,
                 residual: int = 0) -> base._FwdPlan:
    """``fuse``: the statistics kernel finishes its partials itself (eager plans; one launch fewer); ``residual``:
    0, or where the kernel adds the tensor ``residual`` (at the spikes' strides): to the spikes it stores
    (``ADD_TO_SPIKES``) or to the neuron's input (``ADD_TO_INPUT``)."""
    plan, expanded, B, C, S, (st, sb, sc, ss) = base._fwd_plan(x, T, flags)
    if not launches or B * C * S == 0:
        return plan
    k, v_threshold, v_reset, _alpha, eps = params[:5]
    cl = sc < ss
    out = []
    if flags & F_BATCH_STATS:
        update = bool(flags & F_UPDATE_RUNNING)
        plan.part_shape, stats = _stats_launches(x.device, 1 if expanded else T, B, C, S, (st, sb, sc, ss), eps,
                                                 params[5] if update else 0.0, update, nbt, fuse)
        out += stats
    bs, bc = tuning.bn_tiles(C, S, cl, tuning.FWD_TILE, tuning.FWD_CL_CHANNELS)
    s_tiles = cdiv(S, bs)
    so = base._spike_strides(plan)
    out.append(Planned(
        _bn_neuron_fwd_kernel, (B * s_tiles, cdiv(C, bc)),
        ("x", "mean", "rstd", "weight", "bias", "k", "spikes", "residual" if residual else "spikes", "ckpt",
         "count" if count else "mean", T, B, C, S, s_tiles, st, sb, sc, ss, *so, k, v_threshold, v_reset),
        dict(**base._neuron_consts(flags), K_FROM_PTR=has_k, HAS_W=has_w, HAS_B=has_b, EXPANDED=expanded,
             STORE_CKPT=plan.ckpt_shape[0] > 0, COUNT=count, RESIDUAL=residual, NO_FMA=ns.NO_FMA,
             CHUNK=ns.chunk_steps(T), CK_CL=cl,
             BLOCK_S=bs, BLOCK_C=bc, num_warps=tuning.FWD_WARPS)))
    plan.launches = tuple(out)
    stats = C if flags & F_BATCH_STATS else 0
    # an eager call's float32 tensors, views of one allocation: mean, rstd, var, partials, checkpoints
    plan.ws = (stats, stats, stats, 3 * stats * plan.part_shape[0] if stats else 0, math.prod(plan.ckpt_shape))
    return plan


def _stats_launches(device: torch.device, steps: int, B: int, C: int, S: int, strides: tuple[int, ...], eps: float,
                    momentum: float, update: bool, nbt: bool, fuse: bool) -> tuple[tuple[int, int, int], list]:
    """The partial sums' shape and the launches of the batch statistics of ``x`` (``steps`` steps of ``[B, C, S]``
    at ``strides``): into ``mean``, ``rstd`` and ``var``, with ``update`` folding them into ``rm``, ``rv`` (and
    counting the batch in ``nbt`` with ``nbt``) with the float ``momentum``; ``fuse``: see :func:`_semaphores`."""
    st, sb, sc, ss = strides
    bs, bc = tuning.bn_tiles(C, S, sc < ss, tuning.STATS_TILE, tuning.FWD_CL_CHANNELS)
    groups, tpp = tuning.tile_groups(B, S, bs, cdiv(C, bc), device, tuning.STATS_PROGRAMS_PER_SM)
    g0 = B * groups
    finish = ("mean", "rstd", "var", *(("rm", "rv", "nbt" if nbt else "rm") if update else ("mean", "mean", "mean")))
    opts = dict(UPDATE=update, COUNT_BATCH=update and nbt)
    sem = _semaphores(cdiv(C, bc), fuse, device)
    out = [Planned(_bn_stats_kernel, (g0, cdiv(C, bc)),
                   ("x", "part", steps, C, S, groups, tpp, st, sb, sc, ss,
                    *((sem, *finish, eps, momentum) if sem is not None else ("part",) * 7 + (0.0, 0.0))),
                   dict(FINISH=sem is not None, **opts, BLOCK_R=tuning.finish_rows(bc), BLOCK_S=bs, BLOCK_C=bc,
                        num_warps=tuning.STATS_WARPS))]
    if sem is None:
        out.append(Planned(_bn_stats_finish_kernel, (cdiv(C, tuning.FINISH_C),), ("part", *finish, g0, C, eps, momentum),
                           dict(**opts, BLOCK_R=tuning.FINISH_R, BLOCK_C=tuning.FINISH_C, num_warps=4)))
    return (g0, 3, C), out


_BN_FWD_PLANS = PlanCache()
_BN_BWD_PLANS = PlanCache()


def _bn_fwd_host(x: Tensor, weight: Tensor | None, bias: Tensor | None, running_mean: Tensor | None,
                 running_var: Tensor | None, k_tensor: Tensor | None, T: int, params: list[float], flags: int,
                 launch: bool, wrap=direct, count: Tensor | None = None, nbt: Tensor | None = None,
                 eager: bool = False, residual: Tensor | None = None,
                 residual_to: int = base.ADD_TO_SPIKES) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The forward's host function; ``count`` (eager inference only, see :func:`bn_neuron`): a float32 ``[C]``
    that the forward kernel adds each channel's spikes to; ``nbt`` (eager training with F_UPDATE_RUNNING): the
    ``num_batches_tracked`` to count the batch in; ``residual`` (eager calls, laid out as the spikes:
    :func:`residual_fits`): added to the spikes (``residual_to`` ``ADD_TO_SPIKES``: the first output is their sum)
    or to the neuron's input (``ADD_TO_INPUT``). Calls that launch directly reuse the plan of their layout;
    ``eager`` (not the operator, whose outputs may not alias one another): the float32 tensors are views of one
    allocation."""
    mode = 0 if residual is None else residual_to

    def build(launches: bool, fuse: bool = False) -> base._FwdPlan:
        return _bn_fwd_plan(x, T, params, flags, weight is not None, bias is not None, k_tensor is not None,
                            count is not None, launches, nbt is not None, fuse, mode)

    plan = None
    if launch and wrap is direct:
        plan = base._plan(_BN_FWD_PLANS, (x.shape, x.stride(), x.device, T, flags, weight is None, bias is None,
                                     k_tensor is None, count is None, nbt is None, mode, *params), build)
    plan, tensors = _bn_fwd_buffers(plan, build, x, weight, bias, running_mean, running_var, k_tensor, params, flags,
                                    launch, eager, count=count, nbt=nbt, residual=residual)
    out = tensors["spikes"], tensors["mean"], tensors["rstd"], tensors["var"], tensors["ckpt"]
    if launch:
        for planned in plan.launches:
            planned(wrap, tensors)
    return out


def _bn_fwd_buffers(plan: base._FwdPlan | None, build, x: Tensor, weight: Tensor | None, bias: Tensor | None,
                    running_mean: Tensor | None, running_var: Tensor | None, k_tensor: Tensor | None,
                    params: list[float], flags: int, launch: bool, eager: bool,
                    **more: Tensor | None) -> tuple[base._FwdPlan, dict]:
    """A batch-norm forward's plan (``plan``, or ``build(launch)`` where it is None) and the tensors its launches
    take by name: the inputs, ``more``, and the outputs it allocates, ``spikes`` (the plan's ``out_shape`` and
    ``out_strides``, x's dtype), the statistics ``mean``, ``rstd``, ``var`` (the running statistics' where there
    are no batch statistics), the partial sums ``part`` and the checkpoints ``ckpt``: in an ``eager`` call of a
    cached plan, float32 views of one allocation."""
    dev = x.device
    part = None
    if eager and plan is not None and plan.ws is not None:
        spikes = base._spikes(plan, x)
        mean, rstd, var, part, ckpt = torch.empty(sum(plan.ws), dtype=torch.float32, device=dev).split_with_sizes(
            plan.ws)
    else:
        if plan is None:
            plan = build(launch)
        spikes, ckpt = base._fwd_outputs(plan, x)
        if flags & F_BATCH_STATS:
            mean, rstd, var = (torch.empty(plan.C, dtype=torch.float32, device=dev) for _ in range(3))
        else:
            var = torch.empty(0, dtype=torch.float32, device=dev)
        if plan.part_shape is not None and launch:
            part = torch.empty(plan.part_shape, dtype=torch.float32, device=dev)
    if not flags & F_BATCH_STATS:
        mean = running_mean.to(torch.float32, copy=True)  # an op's output may not alias its input
        rstd = torch.rsqrt(running_var.to(torch.float32) + params[4])
    return plan, {"x": x.contiguous() if plan.copy and launch and plan.launches else x, "mean": mean, "rstd": rstd,
                  "var": var, "weight": weight, "bias": bias, "k": k_tensor, "spikes": spikes, "ckpt": ckpt,
                  "rm": running_mean, "rv": running_var, "part": part, **more}


def _bn_bwd_plan(x: Tensor, grad_spikes: Tensor, T: int, params: list[float], flags: int, has_w: bool,
                 has_b: bool, has_k: bool, launches: bool, fuse: bool = False, pooled: bool = False,
                 residual: Tensor | None = None, residual_to: int = base.ADD_TO_INPUT) -> base._BwdPlan:
    """``fuse``: the scan's pass finishes the per-channel sums itself (eager plans; one launch fewer). ``pooled``
    (:mod:`snntrain.kernels.bn_neuron_pool`): ``grad_spikes`` is the gradient of the spikes max-pooled 3x3/2
    (``[T, B, C, Ho, Wo]``, at the strides of the forward's window positions, the tensor ``pos``), gathered into
    dL/dS by the scan's kernel. ``residual``: the tensor the forward added to the neuron's input (``ADD_TO_INPUT``,
    not with a stride-0 time axis): the scan reads it to recompute the neuron's input and leaves dL/dy, its gradient,
    in ``grad_r``, from which the elementwise pass writes dL/dx; with ``residual_to`` ``AND_SPIKES`` or
    ``IAND_SPIKES`` (the forward stored the spikes' SEW AND or IAND with it, and ``grad_spikes`` is that output's
    gradient) the scan forms dL/dS from it and ``residual`` and writes the residual's gradient into ``grad_r``."""
    plan, xk, expanded, B, C, S, (st, sb, sc, ss) = base._bwd_plan(x, T, flags, has_w, has_k)
    need_x, need_wb, need_k = plan.need_x, plan.need_wb, plan.need_k
    if not launches or B * C * S == 0:
        return plan
    sg, sd = base._bwd_grad_maps(plan, xk, grad_spikes, expanded)
    if pooled and plan.copy_g:  # a copy would lose the positions' strides, which the gather reads the gradient at
        raise ValueError(f"the pooled gradient's strides {grad_spikes.stride()} do not fold H and W into one run")
    batch = bool(flags & F_BATCH_STATS)
    cl = sc < ss
    chunk = ns.chunk_steps(T)
    short = chunk <= ns.SHORT_CHUNK
    cl_channels = tuning.BWD_CL_CHANNELS if short else tuning.BWD_CL_CHANNELS_LONG
    bs, bc = tuning.bn_tiles(C, S, cl, tuning.BWD_TILE if short else tuning.BWD_TILE_LONG, cl_channels)
    g1 = cdiv(C, bc)
    k, v_threshold, v_reset, alpha, _eps = params[:5]
    n = (1 if expanded else T) * B * S
    common = dict(**base._neuron_consts(flags), DETACH_RESET=bool(flags & ns.F_DETACH_RESET),
                  SURROGATE=(flags >> ns.F_SURROGATE_SHIFT) & 3, K_FROM_PTR=has_k, HAS_W=has_w, HAS_B=has_b,
                  EXPANDED=expanded, BATCH_STATS=batch, RESIDUAL=0 if residual is None else residual_to,
                  NO_FMA=ns.NO_FMA, CHUNK=chunk, CK_CL=cl and not pooled, PREFETCH=tuning.BWD_PREFETCH,
                  BLOCK_S=bs, BLOCK_C=bc, num_warps=tuning.BWD_WARPS)
    res = residual is not None
    to_input = res and residual_to == base.ADD_TO_INPUT  # dL/dy is the residual's gradient
    sr = base._strides(residual, False) if res else (0, 0, 0, 0)
    args = (st, sb, sc, ss, *sg, *sd, *sr, 1.0 / n, k, v_threshold, v_reset, alpha)
    tensors = ("x", "mean", "rstd", "weight", "bias", "k", "ckpt", "gs", "pos" if pooled else "gs", "sum0", "sum1",
               "grad_r" if to_input else "grad_x", "residual" if res else "x", "grad_r" if res and not to_input else "x")
    pool = (x.shape[-1], *grad_spikes.shape[-2:]) if pooled else (1, 1, 1)  # W, Ho, Wo
    groups, tpp = tuning.tile_groups(B, S, bs, g1, x.device, tuning.BWD_PROGRAMS_PER_SM)
    g0 = B * groups
    out = []
    if batch or need_wb or need_k or res:
        plan.part_shape = (g0, 2, C)
        plan.gk_shape = (g0 * g1,) if need_k else None
        sem = _semaphores(g1, fuse, x.device)
        # PASS 1 leaves dL/dy in grad_x (the scan is not run a second time): see the module's description
        out.append(Planned(_bn_neuron_bwd_kernel, (g0, g1),
                           (*tensors, "part", "gk_part" if need_k else "part", "part" if sem is None else sem,
                            T, B, C, S, *pool, groups, tpp, *args),
                           dict(PASS=1, FINISH=sem is not None, FINISH_R=tuning.finish_rows(bc),
                                STORE_GK=need_k, STORE_GY=need_x or to_input, POOL=pooled, **common)))
        if sem is None:
            out.append(Planned(_pair_sum_kernel, (cdiv(C, tuning.FINISH_C),), ("part", "sum0", "sum1", g0, C),
                               dict(BLOCK_R=tuning.FINISH_R, BLOCK_C=tuning.FINISH_C, num_warps=4)))
        if need_k:
            out.append(Planned(sum_kernel, (1,), ("gk_part", "grad_k", g0 * g1), dict(BLOCK=ns.SUM_BLOCK, num_warps=4)))
        if need_x:
            bs, bc = tuning.bn_tiles(C, S, cl, tuning.FWD_TILE, tuning.FWD_CL_CHANNELS)
            s_tiles = cdiv(S, bs)
            steps = 1 if expanded else T
            out.append(Planned(
                _bn_dx_kernel, (steps * B * s_tiles, cdiv(C, bc)),
                ("x", "mean", "rstd", "weight", "sum0", "sum1", "grad_r" if to_input else "grad_x", "grad_x", steps,
                 B, C, S, s_tiles, st, sb, sc, ss, *sd, 1.0 / n),
                dict(HAS_W=has_w, BATCH_STATS=batch, SEPARATE=to_input, BLOCK_S=bs, BLOCK_C=bc,
                     num_warps=tuning.FWD_WARPS)))
    elif need_x:  # no sums to take: dL/dx in one pass
        out.append(Planned(_bn_neuron_bwd_kernel, (g0, g1),
                           (*tensors, "mean", "mean", "mean", T, B, C, S, *pool, groups, tpp, *args),
                           dict(PASS=2, FINISH=False, FINISH_R=1, STORE_GK=False, STORE_GY=False, POOL=pooled,
                                **common)))
    plan.launches = tuple(out)
    return plan


def _bn_bwd_host(x: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor, rstd: Tensor, ckpt: Tensor,
                 k_tensor: Tensor | None, grad_spikes: Tensor, T: int, params: list[float], flags: int,
                 launch: bool, wrap=direct, eager: bool = False, residual: Tensor | None = None,
                 residual_to: int = base.ADD_TO_INPUT) -> tuple[Tensor, ...]:
    """``(dL/dx, dL/dweight, dL/dbias, dL/dk)``; empty where not asked for (F_GRAD_X, F_GRAD_WB, F_GRAD_K); dL/dk
    None where not asked for in an ``eager`` call; with ``residual`` (the forward added it to the neuron's input, or,
    ``residual_to`` ``AND_SPIKES``/``IAND_SPIKES``, gated the spikes it stored with it), its gradient fifth."""
    return base._bwd_host(_BN_BWD_PLANS, _bn_bwd_plan, x, weight, bias, k_tensor, grad_spikes, T, params, flags, launch,
                     wrap, (1, 0), eager, residual, residual_to, mean=mean, rstd=rstd, ckpt=ckpt)


# ----------------------------------------------------------------------------
# Operator registration
# ----------------------------------------------------------------------------


def _bn_fwd(x: Tensor, weight: Tensor | None, bias: Tensor | None, running_mean: Tensor | None,
            running_var: Tensor | None, k_tensor: Tensor | None, T: int, params: list[float],
            flags: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(spikes, mean, rstd, unbiased var, checkpoints)``: batch statistics with F_BATCH_STATS
    (var empty otherwise), else the running statistics; ``params = [k, v_threshold, v_reset, alpha, eps]``."""
    return _bn_fwd_host(x, weight, bias, running_mean, running_var, k_tensor, T, params, flags, True, op_wrap)


def _bn_fwd_fake(x, weight, bias, running_mean, running_var, k_tensor, T, params, flags):
    return _bn_fwd_host(x, weight, bias, running_mean, running_var, k_tensor, T, params, flags, False)


def _bn_bwd(x: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor, rstd: Tensor, ckpt: Tensor,
            k_tensor: Tensor | None, grad_spikes: Tensor, T: int, params: list[float],
            flags: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dL/dx, dL/dweight, dL/dbias, dL/dk)``, each empty unless asked for."""
    return _bn_bwd_host(x, weight, bias, mean, rstd, ckpt, k_tensor, grad_spikes, T, params, flags, True, op_wrap)


def _bn_bwd_fake(x, weight, bias, mean, rstd, ckpt, k_tensor, grad_spikes, T, params, flags):
    return _bn_bwd_host(x, weight, bias, mean, rstd, ckpt, k_tensor, grad_spikes, T, params, flags, False)


bn_neuron_fwd = register_op("snntrain::bn_neuron_fwd", _bn_fwd, _bn_fwd_fake)
bn_neuron_bwd = register_op("snntrain::bn_neuron_bwd", _bn_bwd, _bn_bwd_fake)


def _bn_setup_context(ctx, inputs, output) -> None:
    x, weight, bias, _rm, _rv, k_tensor, T, params, flags = inputs
    _spikes, mean, rstd, var, ckpt = output
    ctx.save_for_backward(x, weight, bias, mean, rstd, ckpt, k_tensor)
    ctx.T, ctx.params, ctx.flags = T, params, flags
    ctx.mark_non_differentiable(mean, rstd, var, ckpt)


def _bn_backward(ctx, grad_spikes, _gm, _gr, _gv, _gc):
    x, weight, bias, mean, rstd, ckpt, k_tensor = ctx.saved_tensors
    return _bn_grads(ctx, x, weight, bias, mean, rstd, ckpt, k_tensor, grad_spikes, bn_neuron_bwd)


def _bn_grads(ctx, x, weight, bias, mean, rstd, ckpt, k_tensor, grad_spikes, bwd) -> tuple:
    """The gradients of the forward's nine inputs, from ``bwd`` (the backward operator, or the eager host
    function)."""
    flags, nx, nw, nb, nk = base._grad_flags(ctx, ctx.flags, 0, 1, 2, 5)
    if not (nx or nw or nb or nk):
        return (None,) * 9
    if grad_spikes is None:
        grad_spikes = torch.zeros((ctx.T, *x.shape[-4:]), dtype=x.dtype, device=x.device)
    gx, gw, gb, gk = bwd(x, weight, bias, mean, rstd, ckpt, k_tensor, grad_spikes, ctx.T, ctx.params, flags)
    return (gx if nx else None, gw if nw else None, gb if nb else None, None, None, gk if nk else None,
            None, None, None)


bn_neuron_fwd.register_autograd(_bn_backward, setup_context=_bn_setup_context)


def _eager_bn_bwd(*args):
    with profiled("snntrain::bn_neuron_bwd"):
        return _bn_bwd_host(*args, launch=True, eager=True)


#: Residual modes whose backward's scan reads the residual (and writes its gradient).
_SCANNED_RESIDUALS = (base.ADD_TO_INPUT, base.AND_SPIKES, base.IAND_SPIKES)


class _EagerBNNeuron(torch.autograd.Function):
    """``snntrain::bn_neuron_fwd`` and its backward, launched without the operator machinery (eager calls). It
    takes two inputs more: ``num_batches_tracked`` (eager training folds the running statistics in its statistics
    kernel and counts the batch there), and ``stats``: whether to return the batch mean and unbiased variance
    beside the spikes (for the caller to fold in; otherwise it returns the spikes alone, and keeps the statistics
    and checkpoints on ``ctx``: fewer outputs for autograd to wrap). Two more, ``residual`` and ``residual_to``
    (:func:`bn_neuron`'s): the forward kernel adds ``residual`` to the spikes (the output's gradient is the
    residual's too) or to the neuron's input (the backward's dL/dy is its gradient), or stores the spikes' SEW AND
    or IAND with it (the backward's scan forms dL/dS and the residual's gradient)."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, k_tensor, T, params, flags, nbt, stats,
                residual=None, residual_to=base.ADD_TO_SPIKES):
        with profiled("snntrain::bn_neuron_fwd"):
            spikes, mean, rstd, var, ckpt = _bn_fwd_host(x, weight, bias, running_mean, running_var, k_tensor, T,
                                                         params, flags, True, nbt=nbt, eager=True, residual=residual,
                                                         residual_to=residual_to)
        ctx.residual = 0 if residual is None else residual_to
        if ctx.residual in _SCANNED_RESIDUALS:
            ctx.save_for_backward(x, weight, bias, k_tensor, residual)
        else:
            ctx.save_for_backward(x, weight, bias, k_tensor)
        ctx.mean, ctx.rstd, ctx.ckpt, ctx.T, ctx.params, ctx.flags = mean, rstd, ckpt, T, params, flags
        ctx.set_materialize_grads(False)
        if stats:
            ctx.mark_non_differentiable(mean, var)
            return spikes, mean, var
        return spikes

    @staticmethod
    def backward(ctx, grad_spikes, *_stats):
        if ctx.residual in _SCANNED_RESIDUALS:
            return _EagerBNNeuron._scanned_residual_grads(ctx, grad_spikes)
        x, weight, bias, k_tensor = ctx.saved_tensors
        grads = *_bn_grads(ctx, x, weight, bias, ctx.mean, ctx.rstd, ctx.ckpt, k_tensor, grad_spikes,
                           _eager_bn_bwd), None, None
        if ctx.residual:
            return *grads, grad_spikes if ctx.needs_input_grad[11] else None, None
        return grads

    @staticmethod
    def _scanned_residual_grads(ctx, grad_spikes) -> tuple:
        """The gradients of a forward whose residual the backward's scan reads: added to the neuron's input (the
        backward's dL/dy is the residual's), or gating the spikes (the scan writes the residual's gradient); the
        scan runs whichever other gradient is asked for."""
        x, weight, bias, k_tensor, residual = ctx.saved_tensors
        flags, nx, nw, nb, nk = base._grad_flags(ctx, ctx.flags, 0, 1, 2, 5)
        if grad_spikes is None:
            grad_spikes = torch.zeros((ctx.T, *x.shape[-4:]), dtype=x.dtype, device=x.device)
        with profiled("snntrain::bn_neuron_bwd"):
            gx, gw, gb, gk, gr = _bn_bwd_host(x, weight, bias, ctx.mean, ctx.rstd, ctx.ckpt, k_tensor, grad_spikes,
                                              ctx.T, ctx.params, flags, True, eager=True, residual=residual,
                                              residual_to=ctx.residual)
        return (gx if nx else None, gw if nw else None, gb if nb else None, None, None, gk if nk else None,
                None, None, None, None, None, gr if ctx.needs_input_grad[11] else None, None)


# ----------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------


def bn_neuron(x: Tensor, weight: Tensor | None, bias: Tensor | None, running_mean: Tensor | None,
              running_var: Tensor | None, *, training: bool, momentum: float | Tensor, eps: float,
              T: int | None = None, count: Tensor | None = None, num_batches_tracked: Tensor | None = None,
              residual: Tensor | None = None, residual_to: str = "spikes", connect: str = "ADD", **neuron) -> Tensor:
    """Spikes of ``neuron(batch_norm(x))`` with the fused kernels (with ``residual``: ``neuron(batch_norm(x)) +
    residual``, or ``neuron(batch_norm(x) + residual)`` with ``residual_to="input"``; with ``connect`` ``"AND"`` or
    ``"IAND"``: ``spikes * residual`` or ``(1 - spikes) * residual``).

    ``x``: ``[T, B, C, H, W]``, or ``[B, C, H, W]`` with ``T`` (the same input at every
    step). Batch statistics when ``training`` or without running statistics (as
    :class:`torch.nn.BatchNorm2d`); in training the running statistics are updated in place
    with ``momentum`` (a float, or a 0-dim tensor such as ``1 / num_batches_tracked``).
    ``neuron``: ``kind`` (``if``, ``lif``, ``plif``) and the options of
    :func:`snntrain.kernels.lif.neuron_multistep` (``tau``, ``w``, ``v_threshold``,
    ``v_reset``, ``decay_input``, ``detach_reset``, ``surrogate``, ``alpha``), validated already.
    Differentiable in ``x``, ``weight``, ``bias`` and PLIF's ``w``.

    ``num_batches_tracked``: BatchNorm2d's batch counter, incremented by one in training with running statistics
    (eager calls count it in the statistics kernel, which also folds in the running statistics).

    ``count``: a float32 ``[C]`` tensor on ``x``'s device that the forward kernel adds each channel's spikes to,
    counted in registers as they are fired (the activity report, :mod:`snntrain.efficiency`), for inference
    without gradients and outside ``torch.compile`` (validation, ``task=report``); exact while a channel's
    total stays below 2**24.

    ``residual``: a tensor of the spikes' shape to add to them (SEW-ResNet's ``ADD`` connection), the result
    equal to ``spikes + residual`` and differentiable in ``residual`` too. In an eager call with ``residual``
    laid out as the spikes (:func:`residual_fits`) the forward kernel adds it as it stores the spikes: one tensor
    read instead of an addition's two reads and a write. Otherwise (traced calls, ``count``, other layouts) the
    spikes are added to it after the kernels.

    ``connect`` (with ``residual_to="spikes"``): SEW-ResNet's connection of the spikes ``S`` and ``residual``,
    ``"ADD"`` (``S + residual``, above), ``"AND"`` (``S * residual``) or ``"IAND"`` (``(1 - S) * residual``). For
    AND and IAND an eager call with ``residual`` laid out as the spikes stores the connection in place of the spikes,
    and the backward's scan, which recomputes the spikes, forms their gradient from the output's and ``residual``
    and writes ``residual``'s gradient (the spikes are neither stored nor kept); other calls connect after the
    kernels.

    ``residual_to="input"`` (Spiking ResNet's blocks: the shortcut joins before the block's last neuron): the
    forward kernel adds ``residual`` to the normalised input in float32 before each step of the neuron, and the
    backward's scan, which recomputes that input, leaves dL/d(input), the residual's gradient, where the norm's
    gradient is formed from. Eager calls only, ``residual`` laid out as the spikes (:func:`residual_fits`), ``x``
    ``[T, B, C, H, W]`` and no ``count``: anything else is refused (the caller runs the norm, the addition and the
    neuron instead, as :func:`snntrain.nn.norm_add_neuron` does).
    """
    if residual_to not in ("spikes", "input"):
        raise ValueError(f"residual_to={residual_to!r} is not valid; choose 'spikes' or 'input'")
    if connect not in _CONNECTS or (residual_to == "input" and connect != "ADD"):
        raise ValueError(f"connect={connect!r} is not valid with residual_to={residual_to!r}; choose "
                         + ("'ADD'" if residual_to == "input" else ", ".join(repr(c) for c in _CONNECTS)))
    if residual is not None and residual_to == "input":
        if count is not None or T is not None or traced(x, weight, bias, residual) or not residual_fits(x, T, residual):
            raise ValueError("bn_neuron adds a residual to the neuron's input in eager calls of [T, B, C, H, W] input "
                             f"without count, with the residual laid out as the spikes; got x {tuple(x.shape)}, T={T}, "
                             f"residual {tuple(residual.shape)} at strides {residual.stride()} ({residual.dtype})")
    elif residual is not None and (count is not None or traced(x, weight, bias, residual)
                                   or not residual_fits(x, T, residual)):
        from ..nn.layers import sew_connect  # (PyTorch ops only)

        spikes = bn_neuron(x, weight, bias, running_mean, running_var, training=training, momentum=momentum, eps=eps,
                           T=T, count=count, num_batches_tracked=num_batches_tracked, **neuron)
        return sew_connect(spikes, residual, connect)
    T, flags, params, k_tensor, update = _bn_prepare(x, weight, bias, running_mean, running_var, training, eps, T,
                                                     neuron)
    if count is not None:  # inference: no autograd, no checkpoints
        _check_count(count, x, weight, bias, k_tensor)
        with profiled("snntrain::bn_neuron_fwd"):
            spikes, mean, _rstd, var, _ckpt = _bn_fwd_host(x, weight, bias, running_mean, running_var, k_tensor, T,
                                                           params, flags, True, count=count, eager=True)
        _bn_fold_running(mean, var, running_mean, running_var, momentum, update, training, flags, num_batches_tracked)
        return spikes
    return _bn_dispatch(bn_neuron_fwd, _EagerBNNeuron, x, weight, bias, running_mean, running_var, k_tensor, T, params,
                        flags, update, training, momentum, num_batches_tracked, residual,
                        base.ADD_TO_INPUT if residual_to == "input" else _CONNECTS[connect])


#: ``connect`` of :func:`bn_neuron` (SEW-ResNet's connections) -> the forward kernel's residual mode.
_CONNECTS = {"ADD": base.ADD_TO_SPIKES, "AND": base.AND_SPIKES, "IAND": base.IAND_SPIKES}


def residual_fits(x: Tensor, T: int | None, residual: Tensor) -> bool:
    """Whether the forward kernel of :func:`bn_neuron` can add ``residual`` to the spikes of ``x`` as it stores them:
    the spikes' shape, strides (:func:`~snntrain.kernels.norm_neuron_base.spike_layout`), dtype and device."""
    shape, strides = base.spike_layout(x, x.shape[0] if T is None else T)
    return (residual.dtype == x.dtype and residual.device == x.device and tuple(residual.shape) == shape
            and all(a == b for a, b, n in zip(residual.stride(), strides, shape) if n > 1))


def _bn_prepare(x: Tensor, weight: Tensor | None, bias: Tensor | None, running_mean: Tensor | None,
                running_var: Tensor | None, training: bool, eps: float, T: int | None,
                neuron: dict) -> tuple[int, int, list[float], Tensor | None, bool]:
    """``(T, flags, params, k_tensor, update)`` of a call of a batch-norm entry point (:func:`bn_neuron`,
    :func:`snntrain.kernels.bn_neuron_pool.bn_neuron_pool`): batch statistics in training or without running
    statistics, checkpoints where a gradient will be taken, and whether the running statistics are updated."""
    expanded = T is not None
    T, flags, k, k_tensor = base._prepare(x, T, neuron)
    batch = training or running_mean is None or running_var is None
    if batch:
        n = (1 if expanded else T) * x.shape[-4] * x.shape[-2] * x.shape[-1]
        if n <= 1 and training:
            raise ValueError(f"batch norm needs more than 1 value per channel in training, got input shape "
                             f"{tuple(x.shape)}")
        flags |= F_BATCH_STATS
    if base._needs_ckpt(x, weight, bias, k_tensor):
        flags |= ns.F_SAVE_CKPT
    update = training and running_mean is not None and running_var is not None
    return T, flags, base._params(k, neuron, eps), k_tensor, update


def _bn_dispatch(op, eager: type[torch.autograd.Function], x: Tensor, weight: Tensor | None, bias: Tensor | None,
                 running_mean: Tensor | None, running_var: Tensor | None, k_tensor: Tensor | None, T: int,
                 params: list[float], flags: int, update: bool, training: bool, momentum: float | Tensor,
                 num_batches_tracked: Tensor | None, residual: Tensor | None = None,
                 residual_to: int = base.ADD_TO_SPIKES) -> Tensor:
    """The first output of a batch-norm forward, the registered operator ``op`` (traced calls; its outputs end with
    ``mean, rstd, var, ckpt``) or its eager twin ``eager`` (which folds float32 running statistics with a float
    momentum in its statistics kernel, and returns the batch statistics beside its first output only where they
    are left to fold), the running statistics and the batch count updated as BatchNorm2d updates them."""
    if traced(x, weight, bias, k_tensor):  # the operator is functional: the running statistics follow it
        out = op(x, weight, bias, running_mean, running_var, k_tensor, T, params, flags)
        result, mean, var = out[0], out[-4], out[-2]
    else:
        if update and type(momentum) is float and running_mean.dtype == running_var.dtype == torch.float32:
            flags |= F_UPDATE_RUNNING
            params = [*params, momentum]
            update = False  # done by the statistics kernel
        out = eager.apply(x, weight, bias, running_mean, running_var, k_tensor, T, params, flags,
                          num_batches_tracked if flags & F_UPDATE_RUNNING else None, update,
                          *(() if residual is None else (residual, residual_to)))
        result, mean, var = out if update else (out, None, None)
    _bn_fold_running(mean, var, running_mean, running_var, momentum, update, training, flags, num_batches_tracked)
    return result


def _bn_fold_running(mean: Tensor, var: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
                     momentum: float | Tensor, update: bool, training: bool, flags: int,
                     num_batches_tracked: Tensor | None) -> None:
    """Fold the batch statistics into the running ones (``update``) and count the batch, where the statistics
    kernel has not (F_UPDATE_RUNNING)."""
    if update:
        with torch.no_grad():
            running_mean.lerp_(mean.to(running_mean.dtype), momentum)
            running_var.lerp_(var.to(running_var.dtype), momentum)
    if training and num_batches_tracked is not None and not flags & F_UPDATE_RUNNING:
        num_batches_tracked.add_(1)


def _check_count(count: Tensor, x: Tensor, weight: Tensor | None, bias: Tensor | None,
                 k_tensor: Tensor | None) -> None:
    C = x.shape[-3]
    if count.dtype != torch.float32 or count.shape != (C,) or not count.is_contiguous() or count.device != x.device:
        raise ValueError(f"count must be a contiguous float32 tensor of the {C} channels on {x.device}, got "
                         f"{count.dtype} of shape {tuple(count.shape)} on {count.device}")
    if base._needs_ckpt(x, weight, bias, k_tensor) or traced(x, weight, bias, k_tensor):
        raise ValueError("count= counts spikes during inference: call bn_neuron under torch.no_grad() or "
                         "torch.inference_mode(), outside torch.compile")


# ----------------------------------------------------------------------------
# The batch norm in front of other kernels (a generated neuron's, :mod:`snntrain.kernels.step_neuron`)
# ----------------------------------------------------------------------------


class _StatsPlan:
    """The launches of :func:`bn_stats` for one layout: whether x is copied, the float32 workspace's parts (mean,
    rstd, unbiased variance, partial sums) and the launches."""

    __slots__ = ("copy", "ws", "launches")


_STATS_PLANS = PlanCache()
_DX_PLANS = PlanCache()


def clear_plans() -> None:
    """Forget the eager launch plans of the fused batch-norm and layer-norm neurons (after launch sizes in
    :mod:`snntrain.kernels.norm_neuron_tuning` changed)."""
    from . import bn_neuron_pool, ln_neuron

    for plans in (_BN_FWD_PLANS, _BN_BWD_PLANS, _STATS_PLANS, _DX_PLANS, bn_neuron_pool._FWD_PLANS,
                  bn_neuron_pool._BWD_PLANS, ln_neuron._LN_FWD_PLANS, ln_neuron._LN_BWD_PLANS):
        plans.clear()


def _stats_plan(x: Tensor, T: int | None, eps: float, momentum: float, update: bool, nbt: bool,
                fuse: bool) -> _StatsPlan:
    xk, B, C, H, W, strides = base._map(x, T)
    base._check_size(B, C, H * W)
    plan = _StatsPlan()
    plan.copy = xk is not x
    if B * C * H * W == 0:
        part_shape, plan.launches = (0, 3, C), ()
    else:
        part_shape, launches = _stats_launches(x.device, 1 if T is not None else x.shape[0], B, C, H * W, strides,
                                               eps, momentum, update, nbt, fuse)
        plan.launches = tuple(launches)
    plan.ws = (C, C, C, math.prod(part_shape))
    return plan


def bn_stats(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None, *, training: bool,
             momentum: float | Tensor, eps: float, T: int | None = None,
             num_batches_tracked: Tensor | None = None) -> tuple[Tensor, Tensor, bool]:
    """``(mean, rstd, batch)``: the per-channel mean and ``1 / sqrt(var + eps)`` (float32; float64 for float64
    input) that :class:`torch.nn.BatchNorm2d` normalises ``x`` with, and whether they are the batch's (training,
    or no running statistics: the gradient then flows through them, :func:`bn_input_grad`).

    ``x``: ``[T, B, C, H, W]``, or ``[B, C, H, W]`` with ``T`` (each element counted once). Batch statistics come
    from one pass of the statistics kernel (fp32 sums of any input dtype; channels-last read in place) which, in
    training with float32 running statistics and a float ``momentum``, also folds them into the running
    statistics and counts the batch in ``num_batches_tracked``; other running statistics are folded in here with
    ``momentum`` (a float or a 0-dim tensor, as :func:`bn_neuron`'s), float64 input takes ``torch.var_mean``.
    Eager calls only (outside ``torch.compile``)."""
    batch = training or running_mean is None or running_var is None
    if not batch:
        return running_mean.to(torch.float32 if x.dtype != torch.float64 else x.dtype, copy=True), \
            torch.rsqrt(running_var.to(torch.float32 if x.dtype != torch.float64 else x.dtype) + eps), False
    B, C, H, W = x.shape[-4:]
    n = (1 if T is not None else x.shape[0]) * B * H * W
    if n <= 1 and training:
        raise ValueError(f"batch norm needs more than 1 value per channel in training, got input shape "
                         f"{tuple(x.shape)}")
    update = training and running_mean is not None and running_var is not None
    if x.dtype == torch.float64:
        var, mean = torch.var_mean(x if T is not None else x.flatten(0, 1), dim=(0, 2, 3), correction=0)
        rstd = torch.rsqrt(var + eps)
        var = var * (n / max(n - 1, 1))
        in_kernel = False
    else:
        if x.dtype not in FLOAT_DTYPES:
            raise TypeError(f"x has dtype {x.dtype}; the batch statistics kernel takes float32, float16 or bfloat16")
        in_kernel = update and type(momentum) is float and running_mean.dtype == running_var.dtype == torch.float32
        count = in_kernel and num_batches_tracked is not None
        key = (x.shape, x.stride(), x.device, T, eps, momentum if in_kernel else 0.0, in_kernel, count)
        plan = _STATS_PLANS.get(key)
        if plan is None:
            plan = _STATS_PLANS.put(key, _stats_plan(x, T, eps, momentum if in_kernel else 0.0, in_kernel, count,
                                                     True))
        mean, rstd, var, part = torch.empty(sum(plan.ws), dtype=torch.float32, device=x.device).split_with_sizes(
            plan.ws)
        if not plan.launches:
            mean.zero_()
            rstd.fill_(1.0 / math.sqrt(eps))
            var.zero_()
        tensors = {"x": x.contiguous() if plan.copy else x, "part": part, "mean": mean, "rstd": rstd, "var": var,
                   "rm": running_mean, "rv": running_var, "nbt": num_batches_tracked}
        with profiled("snntrain::bn_stats"):
            for planned in plan.launches:
                planned(direct, tensors)
    if update and not in_kernel:
        with torch.no_grad():
            running_mean.lerp_(mean.to(running_mean.dtype), momentum)
            running_var.lerp_(var.to(running_var.dtype), momentum)
    if training and num_batches_tracked is not None and not (in_kernel and count):
        with torch.no_grad():
            num_batches_tracked.add_(1)
    return mean, rstd, True


def bn_input_grad(x: Tensor, grad: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor | None, sum_g: Tensor,
                  sum_gx: Tensor, T: int | None = None) -> Tensor:
    """dL/dx of a training-mode batch norm ``y = (x - mean) * rstd * weight + bias`` (batch statistics) from
    ``grad`` = dL/dy (``x``'s shape and dtype, or one step's, summed over T, for ``[B, C, H, W]`` input with
    ``T``) and the per-channel sums of dL/dy (``sum_g``) and of dL/dy * (x - mean) * rstd (``sum_gx``), all
    float32: one elementwise pass (:func:`_bn_dx_kernel`) that reads dL/dy and x and writes dL/dx over dL/dy.
    Returns dL/dx (``grad`` itself, or a copy of it where its H and W do not form one run). Float64 input (float64
    statistics and sums) takes the same formula in PyTorch: the kernel computes in float32."""
    if x.dtype == torch.float64:
        view = (-1, 1, 1)  # channels are dim -3
        m = x.numel() // x.shape[-3]
        a = rstd if weight is None else rstd * weight.to(rstd.dtype)
        xhat = (x - mean.view(view)) * rstd.view(view)
        return (grad - (sum_g / m).view(view) - xhat * (sum_gx / m).view(view)) * a.view(view)
    H, W = grad.shape[-2:]
    sh, sw = grad.stride()[-2:]
    if H > 1 and W > 1 and sh != W * sw:
        grad = grad.contiguous()
    if grad.numel() == 0:
        return grad
    key = (x.shape, x.stride(), grad.stride(), x.device, T, weight is None)
    planned = _DX_PLANS.get(key)
    if planned is None:
        xk, B, C, H, W, (st, sb, sc, ss) = base._map(x, T)
        S = H * W
        steps = 1 if T is not None else x.shape[0]
        bs, bc = tuning.bn_tiles(C, S, sc < ss, tuning.FWD_TILE, tuning.FWD_CL_CHANNELS)
        s_tiles = cdiv(S, bs)
        planned = _DX_PLANS.put(key, (xk is not x, Planned(
            _bn_dx_kernel, (steps * B * s_tiles, cdiv(C, bc)),
            ("x", "mean", "rstd", "weight", "sum_g", "sum_gx", "grad", "grad", steps, B, C, S, s_tiles, st, sb, sc, ss,
             *base._strides(grad, T is not None), 1.0 / (steps * B * S)),
            dict(HAS_W=weight is not None, BATCH_STATS=True, SEPARATE=False, BLOCK_S=bs, BLOCK_C=bc,
                 num_warps=tuning.FWD_WARPS))))
    copy, launch = planned
    launch(direct, {"x": x.contiguous() if copy else x, "mean": mean, "rstd": rstd,
                    "weight": weight if weight is not None else mean, "sum_g": sum_g, "sum_gx": sum_gx, "grad": grad})
    return grad
