"""One step of an IF/LIF/PLIF neuron, forward and backward, shared by every neuron kernel.

The multi-step neuron (:mod:`snntrain.kernels.lif`), the fused norm-neuron kernels
(:mod:`snntrain.kernels.bn_neuron`, :mod:`snntrain.kernels.ln_neuron`) and the spiking attention
(:mod:`snntrain.kernels.spike_attention`) scan T with the same step, written once here as
``@triton.jit`` helpers (Triton inlines them into each kernel):

* :func:`charge` ``H = V + k (X - (V - v_r))`` (``decay_input``), ``H = V - k (V - v_r) + X``
  or, without leak (IF), ``H = V + X``; ``v_r`` is ``v_reset`` for a hard reset, 0 for a soft one;
* :func:`fire` ``S = H - v_threshold >= 0``;
* :func:`reset` ``V = v_reset`` where it fired (hard) or ``V = H - v_threshold`` (soft), else ``H``;
* :func:`step`: the three in turn, the forward step;
* :func:`surrogate_grad`, :func:`grad_h`: dS/dH of the surrogates and dL/dH of one step;
* :func:`backward_step` (dL/dH and dL/dX of a step), :func:`grad_k_term` (the step's term of PLIF's
  dL/dk) and :func:`carry_grad` (dL/dV handed to the step before): the reverse step;
* :func:`forward_scan` and :func:`backward_scan`: a checkpoint chunk of steps, forward (the backward's
  recomputation of H) and in reverse (the gradients of the chunk's inputs, dL/dV carried to the chunk
  before and PLIF's dL/dk), the scans every neuron kernel's backward runs; :func:`chunk_backward`, the two
  in turn.

The operation order is the reference's (the torch backend, ``snntrain.nn.functional``), and
the charge's multiply is an explicitly rounded ``mul.rn.f32`` on NVIDIA GPUs (:data:`NO_FMA`,
never contracted into an FMA), so that the backward's recomputation of H gives the forward's
spikes bit for bit, and the reference's too.

Host side: the option bits of the kernels' ``flags`` argument (``F_*``), :func:`neuron_flags`
that sets them from a neuron's options, the time chunking of the checkpointed scans
(:data:`CHUNK`, :func:`chunk_steps`) and :func:`sum_kernel`, the fixed-order sum of
per-program partial sums (PLIF's dL/dk).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from .op_utils import INTERPRET

__all__ = [
    "SURROGATES", "CHUNK", "SHORT_CHUNK", "NO_FMA", "SUM_BLOCK", "chunk_steps", "neuron_flags",
    "F_LEAK", "F_DECAY_INPUT", "F_HARD_RESET", "F_DETACH_RESET", "F_SURROGATE_SHIFT", "F_SAVE_CKPT",
    "F_RETURN_STATE", "F_RETURN_MEMBRANE", "F_GRAD_X", "F_GRAD_V_INIT", "F_GRAD_K",
    "mul_rn", "charge", "fire", "reset", "step", "surrogate_grad", "grad_h", "backward_step", "grad_k_term",
    "carry_grad", "forward_scan", "backward_scan", "chunk_backward", "scalars", "sum_kernel",
]

#: Surrogate gradients implemented by the kernels, in the order of their kernel id.
SURROGATES: tuple[str, ...] = ("sigmoid", "atan", "piecewise_quadratic")
_SURROGATE_ID = {name: i for i, name in enumerate(SURROGATES)}

#: Steps per checkpoint chunk of the scans (see :mod:`snntrain.kernels.lif`).
CHUNK = 8
#: The chunk for T <= SHORT_CHUNK: one chunk, no checkpoints, no padded steps at T=4.
SHORT_CHUNK = 4

# Issue the charge's multiply as mul.rn.f32 (inline PTX) so that no FMA contraction
# changes H between the forward, the backward's recomputation and the reference.
NO_FMA = not INTERPRET and torch.version.hip is None

#: Elements per step of :func:`sum_kernel`.
SUM_BLOCK = 1024

# Bits of the ``flags`` argument of the neuron operators (one int keeps the per-call
# dispatch cost low; the floats travel as ``params = [k, v_threshold, v_reset, alpha, ...]``).
F_LEAK, F_DECAY_INPUT, F_HARD_RESET, F_DETACH_RESET = 1, 2, 4, 8
F_SURROGATE_SHIFT = 4  # bits 4-5: index into SURROGATES
F_SAVE_CKPT, F_RETURN_STATE, F_RETURN_MEMBRANE = 64, 128, 256
F_GRAD_X, F_GRAD_V_INIT, F_GRAD_K = 512, 1024, 2048


def chunk_steps(T: int) -> int:
    """Steps per chunk for a sequence of T steps; forward and backward must agree."""
    return SHORT_CHUNK if T <= SHORT_CHUNK else CHUNK


def neuron_flags(kind: str, tau: float, w: Tensor | None, v_reset: float | None, decay_input: bool,
                 detach_reset: bool, surrogate: str) -> tuple[int, float, Tensor | None]:
    """``(flags, k, k_tensor)`` of a neuron for the kernels: the option bits, ``k = 1/tau``
    and, for PLIF, ``k`` as a tensor ``sigmoid(w)`` (differentiable in ``w``)."""
    try:
        flags, k = _static_flags(kind, tau, v_reset, decay_input, detach_reset, surrogate)
    except TypeError:  # an unhashable option: checked without the cache
        flags, k = _static_flags.__wrapped__(kind, tau, v_reset, decay_input, detach_reset, surrogate)
    if kind != "plif":
        return flags, k, None
    if not isinstance(w, Tensor) or w.numel() != 1:
        raise ValueError("PLIF needs w, a one-element tensor with 1/tau = sigmoid(w)")
    return flags, k, torch.sigmoid(w.to(torch.float32))


@functools.lru_cache(maxsize=256)  # a pure function of the options, called by every layer call
def _static_flags(kind: str, tau: float, v_reset: float | None, decay_input: bool, detach_reset: bool,
                  surrogate: str) -> tuple[int, float]:
    if kind == "lif":
        flags, k = F_LEAK, 1.0 / tau
    elif kind == "if":
        flags, k = 0, 1.0
    elif kind == "plif":
        flags, k = F_LEAK, 0.0
    else:
        raise ValueError(f"neuron kind={kind!r} is not valid; choose one of if, lif, plif")
    sid = _SURROGATE_ID.get(surrogate)
    if sid is None:
        raise ValueError(f"surrogate={surrogate!r} is not valid; choose one of {', '.join(SURROGATES)}")
    if decay_input:
        flags |= F_DECAY_INPUT
    if v_reset is not None:
        flags |= F_HARD_RESET
    if detach_reset:
        flags |= F_DETACH_RESET
    return flags | sid << F_SURROGATE_SHIFT, k


# ----------------------------------------------------------------------------
# Device functions
# ----------------------------------------------------------------------------


@triton.jit
def mul_rn(a, b, NO_FMA: tl.constexpr):
    """a * b rounded on its own (never fused with a following add)."""
    if NO_FMA:
        return tl.inline_asm_elementwise(
            "mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return a * b


@triton.jit
def charge(x, v, k, v_r, LEAK: tl.constexpr, DECAY_INPUT: tl.constexpr, NO_FMA: tl.constexpr):
    """H from the previous state V and input X (same operation order as the reference)."""
    if LEAK:
        if DECAY_INPUT:
            h = v + mul_rn(x - (v - v_r), k, NO_FMA)
        else:
            h = v - mul_rn(v - v_r, k, NO_FMA) + x
    else:
        h = v + x
    return h


@triton.jit
def fire(h, v_threshold):
    """The spike decision: H - v_threshold >= 0 (a Heaviside step with H(0) = 1)."""
    return (h - v_threshold) >= 0.0


@triton.jit
def reset(h, spike, v_threshold, v_reset, HARD_RESET: tl.constexpr):
    """V after the reset; equal to H*(1-S) + v_reset*S (hard) or H - v_th*S (soft)."""
    if HARD_RESET:
        return tl.where(spike, v_reset, h)
    else:
        return tl.where(spike, h - v_threshold, h)


@triton.jit
def step(x, v, k, v_r, v_threshold, v_reset, LEAK: tl.constexpr, DECAY_INPUT: tl.constexpr,
         HARD_RESET: tl.constexpr, NO_FMA: tl.constexpr):
    """One forward step from the state V before it and the input X: ``(H, spike, V after the reset)``."""
    h = charge(x, v, k, v_r, LEAK, DECAY_INPUT, NO_FMA)
    spike = fire(h, v_threshold)
    return h, spike, reset(h, spike, v_threshold, v_reset, HARD_RESET)


@triton.jit
def surrogate_grad(u, alpha, SURROGATE: tl.constexpr):
    """dS/du at u = H - v_threshold; the formulas of snntrain.nn.surrogate."""
    # The backward is issue-bound (about as many instructions per element-step as the
    # memory system allows), so the divisions use the fast, non-IEEE form (div.full.f32,
    # within 2 ulp): an IEEE division costs several times as many instructions.
    if SURROGATE == 0:  # sigmoid: alpha * sg * (1 - sg) = alpha * e / (1 + e)^2 with e = exp(-alpha * |u|)
        # (the derivative is even in u; |u| keeps e in (0, 1], so nothing overflows)
        e = tl.exp(-(alpha * tl.abs(u)))
        r = tl.math.fdiv(tl.full(u.shape, 1.0, tl.float32), 1.0 + e)
        return alpha * e * r * r
    elif SURROGATE == 1:  # atan
        z = (1.5707963267948966 * alpha) * u
        return tl.math.fdiv(tl.full(u.shape, alpha * 0.5, tl.float32), 1.0 + z * z)
    else:  # piecewise_quadratic
        return tl.maximum(alpha - alpha * alpha * tl.abs(u), 0.0)


@triton.jit
def grad_h(h, gs, gv, v_threshold, v_reset, alpha, HARD_RESET: tl.constexpr, DETACH_RESET: tl.constexpr,
           SURROGATE: tl.constexpr):
    """dL/dH of one step from the charged state H, dL/dS and dL/dV (V after the reset)."""
    u = h - v_threshold
    spike = u >= 0.0
    sg = surrogate_grad(u, alpha, SURROGATE)
    if HARD_RESET:
        if DETACH_RESET:
            g_s = gs
        else:
            g_s = gs + gv * (v_reset - h)
        gh = tl.where(spike, 0.0, gv) + g_s * sg
    else:
        if DETACH_RESET:
            g_s = gs
        else:
            g_s = gs - gv * v_threshold
        gh = gv + g_s * sg
    return gh


@triton.jit
def backward_step(h, gs, gv, k, v_threshold, v_reset, alpha, LEAK: tl.constexpr, DECAY_INPUT: tl.constexpr,
                  HARD_RESET: tl.constexpr, DETACH_RESET: tl.constexpr, SURROGATE: tl.constexpr):
    """One reverse step from the recomputed H, dL/dS and dL/dV (V after the reset): ``(dL/dH, dL/dX)``."""
    gh = grad_h(h, gs, gv, v_threshold, v_reset, alpha, HARD_RESET, DETACH_RESET, SURROGATE)
    if LEAK and DECAY_INPUT:
        g_in = gh * k
    else:
        g_in = gh
    return gh, g_in


@triton.jit
def grad_k_term(gh, x, v_start, h_prev, v_threshold, v_reset, v_r, FIRST: tl.constexpr,
                DECAY_INPUT: tl.constexpr, HARD_RESET: tl.constexpr):
    """The step's term dL/dH * dH/dk of dL/dk. The state before the step is ``v_start`` for the first
    step of a chunk (``FIRST``), else the reset of the previous step's H ``h_prev``."""
    if FIRST:
        v_prev = v_start
    else:
        v_prev = reset(h_prev, fire(h_prev, v_threshold), v_threshold, v_reset, HARD_RESET)
    if DECAY_INPUT:
        dh_dk = x - (v_prev - v_r)
    else:
        dh_dk = v_r - v_prev
    return gh * dh_dk


@triton.jit
def carry_grad(gh, gv, valid, one_minus_k, LEAK: tl.constexpr):
    """dL/dV of the step before (the state this step started from) from this step's dL/dH;
    ``gv`` unchanged where the step is past T (``valid`` false)."""
    if LEAK:
        gv_prev = gh * one_minus_k
    else:
        gv_prev = gh
    return tl.where(valid, gv_prev, gv)


@triton.jit
def forward_scan(ys, v, k, v_r, v_threshold, v_reset, LEAK: tl.constexpr, DECAY_INPUT: tl.constexpr,
                 HARD_RESET: tl.constexpr, NO_FMA: tl.constexpr, CHUNK: tl.constexpr):
    """The charged states H of a chunk's CHUNK steps (a tuple) from the state ``v`` before the chunk and the
    steps' inputs ``ys`` (a tuple): the forward scan, as the backward recomputes it."""
    hs = ()
    for j in tl.static_range(CHUNK):
        h, _spike, v = step(ys[j], v, k, v_r, v_threshold, v_reset, LEAK, DECAY_INPUT, HARD_RESET, NO_FMA)
        hs = hs + (h,)
    return hs


@triton.jit
def backward_scan(hs, ys, gss, gs_step, gqs, gv, gk, v_start, t0, T, mask, k, one_minus_k, v_threshold, v_reset, v_r,
                  alpha, LEAK: tl.constexpr, DECAY_INPUT: tl.constexpr, HARD_RESET: tl.constexpr,
                  DETACH_RESET: tl.constexpr, SURROGATE: tl.constexpr, GS: tl.constexpr, HAS_GQ: tl.constexpr,
                  STORE_GK: tl.constexpr, CHUNK: tl.constexpr):
    """The reverse-time scan over the chunk of CHUNK steps that starts at step ``t0`` (steps from T on are
    padding: they pass dL/dV through and add nothing).

    ``hs``: the steps' charged states (:func:`forward_scan`), ``ys``: their inputs (read for PLIF's dL/dk,
    ``STORE_GK``), ``gss``: dL/dS of each step, a tuple (``GS`` 1) or the pointers to the chunk's first step, step
    ``j`` read at ``gss + j * gs_step`` as the scan reaches it (``GS`` 2: fewer registers live), or none (``GS`` 0:
    zero); ``gqs``: dL/dV of each step's state after the reset (``HAS_GQ``); ``gv``: dL/dV after the chunk, ``gk``: PLIF's running dL/dk per element, ``v_start``:
    the state before the chunk, ``mask``: the elements of the block. Returns a tuple of CHUNK + 2 values: dL/d(input)
    of each step in time order, then dL/dV before the chunk and the updated ``gk``."""
    g_ins = ()
    for j in tl.static_range(CHUNK - 1, -1, -1):
        valid = t0 + j < T
        if HAS_GQ:
            gv = gv + gqs[j].to(tl.float32)
        if GS == 1:
            gs = gss[j].to(tl.float32)
        elif GS == 2:
            gs = tl.load(gss + j * gs_step, mask=mask & valid, other=0.0).to(tl.float32)
        else:
            gs = 0.0
        gh, g_in = backward_step(hs[j], gs, gv, k, v_threshold, v_reset, alpha, LEAK, DECAY_INPUT, HARD_RESET,
                                 DETACH_RESET, SURROGATE)
        g_ins = (g_in,) + g_ins
        if STORE_GK:
            gk += tl.where(mask & valid, grad_k_term(gh, ys[j], v_start, hs[j - 1], v_threshold, v_reset, v_r, j == 0,
                                                     DECAY_INPUT, HARD_RESET), 0.0)
        gv = carry_grad(gh, gv, valid, one_minus_k, LEAK)
    return g_ins + (gv, gk)


@triton.jit
def chunk_backward(ys, v_start, gss, gqs, gv, gk, t0, T, mask, k, one_minus_k, v_threshold, v_reset, v_r, alpha,
                   LEAK: tl.constexpr, DECAY_INPUT: tl.constexpr, HARD_RESET: tl.constexpr, DETACH_RESET: tl.constexpr,
                   SURROGATE: tl.constexpr, GS: tl.constexpr, HAS_GQ: tl.constexpr, STORE_GK: tl.constexpr,
                   NO_FMA: tl.constexpr, CHUNK: tl.constexpr):
    """The backward over the chunk from ``t0`` given its inputs ``ys`` and the state ``v_start`` before it: the
    charged states recomputed (:func:`forward_scan`), then :func:`backward_scan` (``gss`` a tuple or none)."""
    hs = forward_scan(ys, v_start, k, v_r, v_threshold, v_reset, LEAK, DECAY_INPUT, HARD_RESET, NO_FMA, CHUNK)
    return backward_scan(hs, ys, gss, 0, gqs, gv, gk, v_start, t0, T, mask, k, one_minus_k, v_threshold, v_reset, v_r,
                         alpha, LEAK, DECAY_INPUT, HARD_RESET, DETACH_RESET, SURROGATE, GS, HAS_GQ, STORE_GK, CHUNK)


@triton.jit
def scalars(k_ptr, k, v_threshold, v_reset, K_FROM_PTR: tl.constexpr, HARD_RESET: tl.constexpr):
    """The scalars in fp32 (float arguments may arrive as fp64 from a compiled graph; the
    reference's are fp32) and the charge's rest potential v_r."""
    v_threshold = tl.cast(v_threshold, tl.float32)
    v_reset = tl.cast(v_reset, tl.float32)
    if K_FROM_PTR:
        k = tl.load(k_ptr).to(tl.float32)
    else:
        k = tl.cast(k, tl.float32)
    if HARD_RESET:
        v_r = v_reset
    else:
        v_r = tl.cast(0.0, tl.float32)
    return k, v_threshold, v_reset, v_r


@triton.jit
def sum_kernel(
    part_ptr,  # [n] fp32 partial sums
    out_ptr,  # [1] fp32 their sum, in a fixed order
    n,
    BLOCK: tl.constexpr,
):
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(part_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr, tl.sum(acc, axis=0))
