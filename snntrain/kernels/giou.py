"""Generalized-IoU loss for element-wise box pairs: Triton kernels, forward and hand-written backward.

Box ``i`` of ``pred`` is paired with box ``i`` of ``target``; both are ``[..., 4]``
tensors, either corners ``(x1, y1, x2, y2)`` or, for anchor-free heads, ``ltrb``
distances ``(l, t, r, b)`` from one common point (then ``x1 = -l, y1 = -t, x2 = r,
y2 = b`` relative to that point). The per-pair loss is ``1 - GIoU`` computed exactly as
``torchvision.ops.generalized_box_iou_loss`` does (same ``eps`` placement, intersection
counted only where it is strictly positive in both axes). A target whose index-3 value
(``y2`` or ``b``) is ``<= 0`` is padding: its loss and its gradients are 0 and it is not
counted by ``mean``.

What is here (and nothing else):

* the kernels: ``_giou_fwd_kernel`` (loss, optional per-box gradients: the "fused"
  mode), ``_giou_finalize_kernel`` (fixed-order reduction of per-program partials) and
  ``_giou_bwd_kernel`` (the analytic gradient, derived in the comment above it);
* host launch functions ``giou_forward`` / ``giou_backward`` that flatten ``[..., 4]``
  to ``[N, 4]`` rows (through strides, copying only when no flat view exists), allocate
  outputs and launch; they never convert dtypes and never synchronise with the host;
* the operators ``torch.ops.snntrain.giou_loss`` and ``torch.ops.snntrain.giou_loss_backward``
  (``torch.library.triton_op``, so ``torch.compile`` sees the kernels) with autograd;
* :func:`giou_loss_op`, the entry used by :mod:`snntrain.losses`.

Dtypes: fp16, bf16 and fp32 boxes are loaded as they are and the math runs in fp32;
the loss comes back in fp32 and gradients in each input's dtype. float64 boxes run the
same kernels with fp64 math and an fp64 loss (used by the gradcheck tests).

Reductions (``none`` / ``sum`` / ``mean``) stay on the device: a small problem
(``N <= SINGLE_MAX``) is reduced by one program in one launch; a larger one writes one
partial sum and one valid count per program, and ``_giou_finalize_kernel`` adds them in a
fixed order, so results are deterministic for a given launch configuration. ``mean``
divides by ``max(#valid, 1)``; that denominator is a second output, which the backward
reads from device memory.

Two ways to get the gradient (``grad_mode``):

* ``"separate"`` (default): the forward computes only the loss; the backward kernel reads
  the boxes again and writes the gradients already scaled by ``grad_output``.
* ``"fused"``: when a gradient is needed, the forward also writes the per-box gradient of
  the (weighted, masked) loss; the backward is then ``buffer * grad_output`` (and
  ``/ denominator`` for ``mean``) in plain PyTorch.

Bytes moved for a gradient of ``pred`` (P, T, G: bytes of pred, target and the gradient;
v: fraction of valid targets, since above ``SMALL_MAX`` boxes the kernels read ``pred``
only where the target is not padding): separate 2 (T + vP) + G, fused T + vP + 3G, so
separate never moves more. Fused also costs more when ``target`` needs a gradient too,
rounds the gradient twice in fp16/bf16 (buffer, then the scaled copy) and slows down a
forward whose inputs require grad but whose backward never runs; its backward is a
native multiply instead of a Triton launch, which can matter when host overhead
dominates (small inputs). ``scripts/bench_giou.py`` times both.

Eager calls go through a ``torch.autograd.Function`` that launches the same kernels
directly: the dispatcher path of a registered operator with autograd costs tens of
microseconds of host time per forward+backward, which would dominate a 32 x 256 box
loss. Under ``torch.compile`` (and whenever the ops are called by name) the registered
operators are used. While the profiler is on, the eager path is recorded under the
operator names. Under ``TRITON_INTERPRET=1`` (CPU tests) the operators are opaque
``custom_op``s with a shape-only fake implementation, because the interpreter cannot
run on the fake tensors that tracing uses; with compiled Triton they are ``triton_op``s.

Tie policy (where a min or max has equal arguments): the gradient follows PyTorch's
autograd of ``torch.maximum`` / ``torch.minimum``, which torchvision's loss uses: half of
it to each argument. The intersection term contributes only where the intersection
width and height are both strictly positive (touching boxes: no intersection gradient),
as torchvision's boolean mask does.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

NAMESPACE = "snntrain"
REDUCTIONS = ("none", "sum", "mean")
GRAD_MODES = ("separate", "fused")
#: The default way to compute the gradient; see the module docstring and scripts/bench_giou.py.
DEFAULT_GRAD_MODE = "separate"

_NONE, _SUM, _MEAN = 0, 1, 2

#: Sum/mean over at most this many boxes run as a single program (one launch, no partials).
SINGLE_MAX = 8192
#: Up to this many boxes the element-wise launches use a fixed configuration (no autotune).
SMALL_MAX = 16384
#: Programs per streaming multiprocessor for the reducing forward on large inputs.
PROGRAMS_PER_SM = 8

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_INT32_MAX = 2**31 - 1


# --------------------------------------------------------------------------------------
# Device helpers (inlined into the kernels)
# --------------------------------------------------------------------------------------


@triton.jit
def _load_boxes(ptr, rows, row_stride, inb, LTRB: tl.constexpr, FP64: tl.constexpr, INT64: tl.constexpr,
                BLOCK: tl.constexpr):
    """Load rows ``rows`` of an ``[N, 4]`` box tensor (last-dim stride 1) as corners x1, y1, x2, y2.

    Also returns the raw index-3 value (``y2`` or ``b``), which decides padding.
    """
    cols = tl.arange(0, 4)
    if INT64:
        base = rows.to(tl.int64) * row_stride
    else:
        base = rows * row_stride
    tile = tl.load(ptr + base[:, None] + cols[None, :], mask=inb[:, None], other=0.0)
    if FP64:
        tile = tile.to(tl.float64)
    else:
        tile = tile.to(tl.float32)
    # [BLOCK, 4] -> [BLOCK, 2, 2]: [:, j, k] = column 2j + k, so k = 0 holds x1, x2 and k = 1 holds y1, y2.
    xs, ys = tl.split(tl.reshape(tile, (BLOCK, 2, 2)))
    c0, c2 = tl.split(xs)
    c1, c3 = tl.split(ys)
    if LTRB:
        return -c0, -c1, c2, c3, c3
    return c0, c1, c2, c3, c3


@triton.jit
def _store_boxes(ptr, rows, inb, g0, g1, g2, g3, INT64: tl.constexpr, BLOCK: tl.constexpr):
    """Store four per-box columns into rows ``rows`` of a contiguous ``[N, 4]`` tensor (its dtype)."""
    cols = tl.arange(0, 4)
    tile = tl.reshape(tl.join(tl.join(g0, g2), tl.join(g1, g3)), (BLOCK, 4))
    if INT64:
        base = rows.to(tl.int64) * 4
    else:
        base = rows * 4
    tl.store(ptr + base[:, None] + cols[None, :], tile.to(ptr.dtype.element_ty), mask=inb[:, None])


@triton.jit
def _giou_terms(x1, y1, x2, y2, X1, Y1, X2, Y2, eps):
    """Loss 1 - GIoU of pred (x1, y1, x2, y2) against target (X1, Y1, X2, Y2), plus what its gradient needs.

    Same operation order as torchvision's generalized_box_iou_loss.
    """
    wp = x2 - x1
    hp = y2 - y1
    wg = X2 - X1
    hg = Y2 - Y1
    iw = tl.minimum(x2, X2) - tl.maximum(x1, X1)
    ih = tl.minimum(y2, Y2) - tl.maximum(y1, Y1)
    hit = (iw > 0) & (ih > 0)
    inter = tl.where(hit, iw * ih, 0.0)
    union = wp * hp + wg * hg - inter
    cw = tl.maximum(x2, X2) - tl.minimum(x1, X1)
    ch = tl.maximum(y2, Y2) - tl.minimum(y1, Y1)
    encl = cw * ch
    ud = union + eps
    cd = encl + eps
    loss = 1.0 - (inter / ud - (encl - union) / cd)
    # Partial derivatives of the loss (derivation above _giou_bwd_kernel).
    g_u = inter / (ud * ud) - 1.0 / cd
    g_i = tl.where(hit, -1.0 / ud - g_u, 0.0)
    g_c = ud / (cd * cd)
    return loss, g_u, g_i, g_c, wp, hp, wg, hg, iw, ih, cw, ch


@triton.jit
def _sel_max(a, b):
    """d max(a, b) / d a with PyTorch's tie rule: 1 if a > b, 1/2 if a == b, else 0."""
    return tl.where(a > b, 1.0, tl.where(a == b, 0.5, 0.0))


@triton.jit
def _sel_min(a, b):
    """d min(a, b) / d a with PyTorch's tie rule: 1 if a < b, 1/2 if a == b, else 0."""
    return tl.where(a < b, 1.0, tl.where(a == b, 0.5, 0.0))


@triton.jit
def _side_grad(x1, y1, x2, y2, X1, Y1, X2, Y2, w, h, iw, ih, cw, ch, g_u, g_i, g_c):
    """Gradient of the loss with respect to box (x1, y1, x2, y2) of width w, height h, paired with (X1..Y2)."""
    gx1 = -(g_u * h) - g_i * ih * _sel_max(x1, X1) - g_c * ch * _sel_min(x1, X1)
    gy1 = -(g_u * w) - g_i * iw * _sel_max(y1, Y1) - g_c * cw * _sel_min(y1, Y1)
    gx2 = g_u * h + g_i * ih * _sel_min(x2, X2) + g_c * ch * _sel_max(x2, X2)
    gy2 = g_u * w + g_i * iw * _sel_min(y2, Y2) + g_c * cw * _sel_max(y2, Y2)
    return gx1, gy1, gx2, gy2


@triton.jit
def _store_grad(ptr, rows, inb, valid, scale, g0, g1, g2, g3, LTRB: tl.constexpr, INT64: tl.constexpr,
                BLOCK: tl.constexpr):
    """Scale a per-box corner gradient, zero it on padding, map it to ltrb if needed and store it."""
    g0 = tl.where(valid, g0 * scale, 0.0)
    g1 = tl.where(valid, g1 * scale, 0.0)
    g2 = tl.where(valid, g2 * scale, 0.0)
    g3 = tl.where(valid, g3 * scale, 0.0)
    if LTRB:  # x1 = -l, y1 = -t
        g0 = -g0
        g1 = -g1
    _store_boxes(ptr, rows, inb, g0, g1, g2, g3, INT64, BLOCK)


# --------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------


@triton.jit
def _giou_fwd_kernel(
    pred_ptr,  # [N, 4] boxes, row stride stride_p, last-dim stride 1 (fp16 / bf16 / fp32 / fp64)
    target_ptr,  # [N, 4] boxes, row stride stride_t, last-dim stride 1
    weight_ptr,  # [N] per-box weights, stride stride_w (read only if HAS_WEIGHT)
    loss_ptr,  # none: [N] per-box loss; sum/mean: [num_programs] partial sums, or [1] the result if SINGLE
    count_ptr,  # sum/mean: [num_programs] int32 partial valid counts, or [1] max(#valid, 1) if SINGLE
    gpred_ptr,  # FUSED_PRED: [N, 4] contiguous, pred's dtype: d(weighted masked per-box loss) / d pred
    gtarget_ptr,  # FUSED_TARGET: [N, 4] contiguous, target's dtype: the same for target
    N,  # number of boxes
    stride_p,
    stride_t,
    stride_w,
    eps,
    n_bucket,  # power-of-two bucket of N: autotune key only
    REDUCTION: tl.constexpr,  # 0 none, 1 sum, 2 mean
    HAS_WEIGHT: tl.constexpr,
    LTRB: tl.constexpr,
    FUSED_PRED: tl.constexpr,
    FUSED_TARGET: tl.constexpr,
    SINGLE: tl.constexpr,  # one program reduces everything and writes the result
    SKIP_PAD: tl.constexpr,  # do not read pred rows whose target is padding (a second, dependent load)
    FP64: tl.constexpr,
    INT64: tl.constexpr,  # 64-bit offsets
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if FP64:
        acc = tl.zeros([BLOCK], dtype=tl.float64)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
    cnt = tl.zeros([BLOCK], dtype=tl.int32)
    # Grid-stride loop over tiles of BLOCK boxes (one iteration when the grid covers N).
    for start in range(pid * BLOCK, N, nprog * BLOCK):
        rows = start + tl.arange(0, BLOCK)
        inb = rows < N
        X1, Y1, X2, Y2, raw3 = _load_boxes(target_ptr, rows, stride_t, inb, LTRB, FP64, INT64, BLOCK)
        valid = inb & (raw3 > 0)
        x1, y1, x2, y2, _ = _load_boxes(pred_ptr, rows, stride_p, valid if SKIP_PAD else inb, LTRB, FP64, INT64,
                                        BLOCK)
        loss, g_u, g_i, g_c, wp, hp, wg, hg, iw, ih, cw, ch = _giou_terms(x1, y1, x2, y2, X1, Y1, X2, Y2, eps)
        if HAS_WEIGHT:
            if INT64:
                w = tl.load(weight_ptr + rows.to(tl.int64) * stride_w, mask=inb, other=0.0)
            else:
                w = tl.load(weight_ptr + rows * stride_w, mask=inb, other=0.0)
            w = w.to(loss.dtype)
            lw = tl.where(valid, loss * w, 0.0)
        else:
            w = 1.0
            lw = tl.where(valid, loss, 0.0)
        if REDUCTION == 0:
            tl.store(loss_ptr + rows, lw, mask=inb)
        else:
            acc += lw
            cnt += valid.to(tl.int32)
        if FUSED_PRED:
            a0, a1, a2, a3 = _side_grad(x1, y1, x2, y2, X1, Y1, X2, Y2, wp, hp, iw, ih, cw, ch, g_u, g_i, g_c)
            _store_grad(gpred_ptr, rows, inb, valid, w, a0, a1, a2, a3, LTRB, INT64, BLOCK)
        if FUSED_TARGET:
            b0, b1, b2, b3 = _side_grad(X1, Y1, X2, Y2, x1, y1, x2, y2, wg, hg, iw, ih, cw, ch, g_u, g_i, g_c)
            _store_grad(gtarget_ptr, rows, inb, valid, w, b0, b1, b2, b3, LTRB, INT64, BLOCK)
    if REDUCTION != 0:
        total = tl.sum(acc, axis=0)
        n_valid = tl.sum(cnt, axis=0)
        if SINGLE:
            denom = tl.maximum(n_valid, 1).to(total.dtype)
            if REDUCTION == 2:
                total = total / denom
            tl.store(loss_ptr, total)
            tl.store(count_ptr, denom)
        else:
            tl.store(loss_ptr + pid, total)
            tl.store(count_ptr + pid, n_valid)


@triton.jit
def _giou_finalize_kernel(
    part_loss_ptr,  # [P] partial loss sums (fp32 / fp64)
    part_count_ptr,  # [P] int32 partial valid counts
    loss_ptr,  # [1] sum, or sum / max(#valid, 1) if MEAN
    denom_ptr,  # [1] max(#valid, 1), same dtype as the loss
    P,
    MEAN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    acc = tl.zeros([BLOCK], dtype=part_loss_ptr.dtype.element_ty)
    cnt = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, P, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < P
        acc += tl.load(part_loss_ptr + offs, mask=m, other=0.0)
        cnt += tl.load(part_count_ptr + offs, mask=m, other=0)
    total = tl.sum(acc, axis=0)
    denom = tl.maximum(tl.sum(cnt, axis=0), 1).to(total.dtype)
    if MEAN:
        total = total / denom
    tl.store(loss_ptr, total)
    tl.store(denom_ptr, denom)


# --------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------
#
# Gradient of the per-pair loss. Pred box (x1, y1, x2, y2), target box (X1, Y1, X2, Y2):
#
#   wp = x2 - x1, hp = y2 - y1, Ap = wp * hp          (target: wg, hg, Ag likewise)
#   ix1 = max(x1, X1), iy1 = max(y1, Y1), ix2 = min(x2, X2), iy2 = min(y2, Y2)
#   iw = ix2 - ix1, ih = iy2 - iy1, hit = (iw > 0) and (ih > 0)
#   I = iw * ih if hit else 0
#   U = Ap + Ag - I
#   cx1 = min(x1, X1), cy1 = min(y1, Y1), cx2 = max(x2, X2), cy2 = max(y2, Y2)
#   cw = cx2 - cx1, ch = cy2 - cy1, C = cw * ch
#   L = 1 - (I / (U + e) - (C - U) / (C + e))
#
# Treating I, U and C as independent first:
#   dL/dI|U,C = -1 / (U + e)
#   dL/dU     =  I / (U + e)^2 - 1 / (C + e)                   (U appears in both fractions)
#   dL/dC     = -1 / (C + e) + (C - U) / (C + e)^2 = (U + e) / (C + e)^2
# U depends on I (U = Ap + Ag - I), so with the chain rule
#   g_u = dL/dAp = dL/dAg = dL/dU
#   g_i = dL/dI (total) = -1 / (U + e) - g_u,  and 0 where not hit (I is the constant 0 there)
#   g_c = dL/dC = (U + e) / (C + e)^2
# Geometry:
#   dAp/dx1 = -hp, dAp/dx2 = hp, dAp/dy1 = -wp, dAp/dy2 = wp
#   dI/dix1 = -ih, dI/dix2 = ih, dI/diy1 = -iw, dI/diy2 = iw
#   dC/dcx1 = -ch, dC/dcx2 = ch, dC/dcy1 = -cw, dC/dcy2 = cw
# and for the min / max the subgradient of torch.maximum / torch.minimum (torchvision's
# autograd): smax(a, b) = d max(a, b)/da = [a > b] + 1/2 [a == b], smin(a, b) = [a < b] + 1/2 [a == b].
# So, for pred:
#   dL/dx1 = -g_u hp - g_i ih smax(x1, X1) - g_c ch smin(x1, X1)
#   dL/dy1 = -g_u wp - g_i iw smax(y1, Y1) - g_c cw smin(y1, Y1)
#   dL/dx2 =  g_u hp + g_i ih smin(x2, X2) + g_c ch smax(x2, X2)
#   dL/dy2 =  g_u wp + g_i iw smin(y2, Y2) + g_c cw smax(y2, Y2)
# and for the target the same with (wg, hg) and the two boxes swapped in smax / smin
# (which gives the complementary share on ties).
# ltrb boxes: x1 = -l, y1 = -t, x2 = r, y2 = b, so dL/dl = -dL/dx1, dL/dt = -dL/dy1,
# dL/dr = dL/dx2, dL/db = dL/dy2.
# Reduction and weights: the loss is sum_i s_i L_i with s_i = valid_i * w_i * k_i where
# k_i = grad_output_i (none), grad_output (sum) or grad_output / max(#valid, 1) (mean), so every
# per-box gradient above is multiplied by s_i (and set to 0, not multiplied, on padding rows, so
# that non-finite padding values cannot leak), and dLoss/dw_i = valid_i * k_i * L_i.


@triton.jit
def _giou_bwd_kernel(
    grad_out_ptr,  # none: [N] with stride stride_go; sum / mean: [1]
    denom_ptr,  # mean: [1] max(#valid, 1) from the forward
    pred_ptr,  # [N, 4] boxes, row stride stride_p, last-dim stride 1
    target_ptr,  # [N, 4] boxes, row stride stride_t, last-dim stride 1
    weight_ptr,  # [N] per-box weights, stride stride_w (if HAS_WEIGHT)
    gpred_ptr,  # NEED_PRED: [N, 4] contiguous, pred's dtype
    gtarget_ptr,  # NEED_TARGET: [N, 4] contiguous, target's dtype
    gweight_ptr,  # NEED_WEIGHT: [N] contiguous, weight's dtype
    N,
    stride_p,
    stride_t,
    stride_w,
    stride_go,
    eps,
    n_bucket,  # power-of-two bucket of N: autotune key only
    REDUCTION: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    LTRB: tl.constexpr,
    NEED_PRED: tl.constexpr,
    NEED_TARGET: tl.constexpr,
    NEED_WEIGHT: tl.constexpr,
    SKIP_PAD: tl.constexpr,  # do not read pred rows whose target is padding (a second, dependent load)
    FP64: tl.constexpr,
    INT64: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    inb = rows < N
    X1, Y1, X2, Y2, raw3 = _load_boxes(target_ptr, rows, stride_t, inb, LTRB, FP64, INT64, BLOCK)
    valid = inb & (raw3 > 0)
    x1, y1, x2, y2, _ = _load_boxes(pred_ptr, rows, stride_p, valid if SKIP_PAD else inb, LTRB, FP64, INT64, BLOCK)
    loss, g_u, g_i, g_c, wp, hp, wg, hg, iw, ih, cw, ch = _giou_terms(x1, y1, x2, y2, X1, Y1, X2, Y2, eps)
    if REDUCTION == 0:
        if INT64:
            k = tl.load(grad_out_ptr + rows.to(tl.int64) * stride_go, mask=inb, other=0.0)
        else:
            k = tl.load(grad_out_ptr + rows * stride_go, mask=inb, other=0.0)
        k = k.to(loss.dtype)
    else:
        k = tl.load(grad_out_ptr).to(loss.dtype)
        if REDUCTION == 2:
            k = k / tl.load(denom_ptr).to(loss.dtype)
    if NEED_WEIGHT:
        tl.store(gweight_ptr + rows, tl.where(valid, loss * k, 0.0).to(gweight_ptr.dtype.element_ty), mask=inb)
    if HAS_WEIGHT:
        if INT64:
            w = tl.load(weight_ptr + rows.to(tl.int64) * stride_w, mask=inb, other=0.0)
        else:
            w = tl.load(weight_ptr + rows * stride_w, mask=inb, other=0.0)
        s = k * w.to(loss.dtype)
    else:
        s = k
    if NEED_PRED:
        a0, a1, a2, a3 = _side_grad(x1, y1, x2, y2, X1, Y1, X2, Y2, wp, hp, iw, ih, cw, ch, g_u, g_i, g_c)
        _store_grad(gpred_ptr, rows, inb, valid, s, a0, a1, a2, a3, LTRB, INT64, BLOCK)
    if NEED_TARGET:
        b0, b1, b2, b3 = _side_grad(X1, Y1, X2, Y2, x1, y1, x2, y2, wg, hg, iw, ih, cw, ch, g_u, g_i, g_c)
        _store_grad(gtarget_ptr, rows, inb, valid, s, b0, b1, b2, b3, LTRB, INT64, BLOCK)


# --------------------------------------------------------------------------------------
# Launch configurations
# --------------------------------------------------------------------------------------
#
# Large inputs: triton.autotune over block size and warps, keyed on a power-of-two bucket
# of N plus the variant flags (the autotuner adds the argument dtypes), so a training loop
# tunes once per bucket and never again. Small inputs are launch-bound: they launch the
# plain kernel with one fixed configuration (no autotuner layer on the host path).
# Tune before capturing a CUDA graph (call the loss once on the same sizes): tuning
# launches the kernel many times and measures it, which a capture cannot contain.

if _INTERPRET:  # the interpreter cannot time configurations
    _FWD_CONFIGS = [triton.Config({"BLOCK": 64}, num_warps=4)]
    _BWD_CONFIGS = [triton.Config({"BLOCK": 64}, num_warps=4)]
    _SINGLE_CONFIG = (64, 4)  # (BLOCK, num_warps)
    _SMALL_CONFIG = (64, 4)
else:
    _FWD_CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((512, 4), (1024, 4), (1024, 8), (2048, 8))]
    _BWD_CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((256, 4), (512, 4), (1024, 4), (1024, 8))]
    _SINGLE_CONFIG = (4096, 16)  # one program: 8 boxes per thread, 4096 boxes per iteration
    _SMALL_CONFIG = (512, 4)

_FWD_KEY = ["n_bucket", "REDUCTION", "HAS_WEIGHT", "LTRB", "FUSED_PRED", "FUSED_TARGET"]
_BWD_KEY = ["n_bucket", "REDUCTION", "HAS_WEIGHT", "LTRB", "NEED_PRED", "NEED_TARGET", "NEED_WEIGHT"]

_fwd_tuned = triton.autotune(configs=_FWD_CONFIGS, key=_FWD_KEY)(_giou_fwd_kernel)
_bwd_tuned = triton.autotune(configs=_BWD_CONFIGS, key=_BWD_KEY)(_giou_bwd_kernel)

_FINALIZE_BLOCK = 1024
_SM_COUNT: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    n = _SM_COUNT.get(idx)
    if n is None:
        n = _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return n


def _bucket(n) -> int:
    """Power-of-two bucket (at least 1024) of a box count: the autotune key."""
    b = 1024
    while b < n:
        b *= 2
    return b


# --------------------------------------------------------------------------------------
# Host launch functions
# --------------------------------------------------------------------------------------


def _direct(kernel):
    return kernel


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``[..., 4]`` -> ``[N, 4]`` with last-dim stride 1, as a view when one exists (a copy otherwise)."""
    if x.is_contiguous():
        x = x.view(-1, 4)
        return x, 4
    if x.stride(-1) != 1:
        x = x.contiguous()
    try:
        x = x.view(-1, 4)
    except RuntimeError:
        x = x.reshape(-1, 4)
    return x, x.stride(0)


def _vec(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``[...]`` -> ``[N]``, as a view when one exists."""
    try:
        x = x.view(-1)
    except RuntimeError:
        x = x.reshape(-1)
    return x, x.stride(0)


def _int64(n, *strides) -> bool:
    return n * max(4, *strides) > _INT32_MAX


def giou_forward(pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, reduction: int,
                 eps: float, ltrb: bool, fused: int, wrap=_direct):
    """Launch the forward. Returns ``(loss, denom, grad_pred_buf, grad_target_buf)``.

    ``pred``/``target``: ``[..., 4]``; ``weight``: ``None`` or shape ``pred.shape[:-1]``.
    ``reduction``: 0 none, 1 sum, 2 mean. ``fused``: bit 0 asks for the per-box gradient of
    pred, bit 1 for target (unscaled by grad_output and by the mean's denominator).
    ``loss``: ``pred.shape[:-1]`` for none, ``[]`` otherwise, fp32 (fp64 for fp64 boxes).
    ``denom``: ``[]`` max(#valid, 1) for sum/mean, ``None`` for none. Gradient buffers have
    their input's shape and dtype when asked for, else are ``None``. ``wrap`` is applied to
    each kernel before launching (``torch.library.wrap_triton`` inside the operators).
    """
    p, stride_p = _rows(pred)
    t, stride_t = _rows(target)
    n = p.shape[0]
    dev = pred.device
    fp64 = pred.dtype == torch.float64 or target.dtype == torch.float64
    acc = torch.float64 if fp64 else torch.float32
    if weight is None:
        w, stride_w, has_w = p, 0, False  # p: a placeholder pointer, never read
    else:
        w, stride_w = _vec(weight)
        has_w = True
    fused_pred, fused_target = bool(fused & 1), bool(fused & 2)
    gp = torch.empty(pred.shape, dtype=pred.dtype, device=dev) if fused_pred else None
    gt = torch.empty(target.shape, dtype=target.dtype, device=dev) if fused_target else None
    flags = dict(REDUCTION=reduction, HAS_WEIGHT=has_w, LTRB=ltrb, FUSED_PRED=fused_pred, FUSED_TARGET=fused_target,
                 SKIP_PAD=n > SMALL_MAX, FP64=fp64, INT64=_int64(n, stride_p, stride_t, stride_w))
    gp_arg = p if gp is None else gp  # placeholders are never written
    gt_arg = p if gt is None else gt
    if reduction == _NONE:
        loss = torch.empty(pred.shape[:-1], dtype=acc, device=dev)
        if n > 0:
            if n <= SMALL_MAX:
                block, warps = _SMALL_CONFIG
                wrap(_giou_fwd_kernel)[(triton.cdiv(n, block),)](
                    p, t, w, loss, loss, gp_arg, gt_arg, n, stride_p, stride_t, stride_w, eps, 0, SINGLE=False,
                    BLOCK=block, num_warps=warps, **flags)
            else:
                wrap(_fwd_tuned)[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](
                    p, t, w, loss, loss, gp_arg, gt_arg, n, stride_p, stride_t, stride_w, eps, _bucket(n),
                    SINGLE=False, **flags)
        return loss, None, gp, gt
    loss = torch.empty((), dtype=acc, device=dev)
    denom = torch.empty((), dtype=acc, device=dev)
    if n <= SINGLE_MAX:
        block, warps = _SINGLE_CONFIG
        wrap(_giou_fwd_kernel)[(1,)](p, t, w, loss, denom, gp_arg, gt_arg, n, stride_p, stride_t, stride_w, eps, 0,
                                     SINGLE=True, BLOCK=block, num_warps=warps, **flags)
        return loss, denom, gp, gt
    nprog = min(triton.cdiv(n, 1024), PROGRAMS_PER_SM * _sm_count(dev))
    part_loss = torch.empty(nprog, dtype=acc, device=dev)
    part_count = torch.empty(nprog, dtype=torch.int32, device=dev)
    wrap(_fwd_tuned)[(nprog,)](p, t, w, part_loss, part_count, gp_arg, gt_arg, n, stride_p, stride_t, stride_w, eps,
                               _bucket(n), SINGLE=False, **flags)
    wrap(_giou_finalize_kernel)[(1,)](part_loss, part_count, loss, denom, nprog, MEAN=reduction == _MEAN,
                                      BLOCK=_FINALIZE_BLOCK, num_warps=4)
    return loss, denom, gp, gt


def giou_backward(grad_out: torch.Tensor, pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None,
                  denom: torch.Tensor | None, reduction: int, eps: float, ltrb: bool, need_pred: bool,
                  need_target: bool, need_weight: bool, wrap=_direct):
    """Launch the hand-written backward. Returns ``(grad_pred, grad_target, grad_weight)``.

    ``grad_out``: the loss's gradient (``pred.shape[:-1]`` for none, ``[]`` otherwise);
    ``denom``: the forward's second output (mean only). Gradients not asked for are ``None``.
    """
    p, stride_p = _rows(pred)
    t, stride_t = _rows(target)
    n = p.shape[0]
    dev = pred.device
    fp64 = pred.dtype == torch.float64 or target.dtype == torch.float64
    if weight is None:
        w, stride_w, has_w = p, 0, False
    else:
        w, stride_w = _vec(weight)
        has_w = True
    if reduction == _NONE:
        go, stride_go = _vec(grad_out)
    else:
        go, stride_go = grad_out, 0
    gp = torch.empty(pred.shape, dtype=pred.dtype, device=dev) if need_pred else None
    gt = torch.empty(target.shape, dtype=target.dtype, device=dev) if need_target else None
    gw = torch.empty(weight.shape, dtype=weight.dtype, device=dev) if need_weight else None
    if n > 0 and (need_pred or need_target or need_weight):
        args = (go, go if denom is None else denom, p, t, w, p if gp is None else gp, p if gt is None else gt,
                p if gw is None else gw, n, stride_p, stride_t, stride_w, stride_go, eps)
        flags = dict(REDUCTION=reduction, HAS_WEIGHT=has_w, LTRB=ltrb, NEED_PRED=need_pred, NEED_TARGET=need_target,
                     NEED_WEIGHT=need_weight, SKIP_PAD=n > SMALL_MAX, FP64=fp64,
                     INT64=_int64(n, stride_p, stride_t, stride_w, stride_go))
        if n <= SMALL_MAX:
            block, warps = _SMALL_CONFIG
            wrap(_giou_bwd_kernel)[(triton.cdiv(n, block),)](*args, 0, BLOCK=block, num_warps=warps, **flags)
        else:
            wrap(_bwd_tuned)[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](*args, _bucket(n), **flags)
    return gp, gt, gw


def _scale_fused(buf: torch.Tensor, grad_out: torch.Tensor, denom: torch.Tensor, reduction: int) -> torch.Tensor:
    """Backward of the fused mode: the stored per-box gradient times grad_output (/ denom for mean)."""
    if reduction == _NONE:
        return (buf * grad_out.unsqueeze(-1)).to(buf.dtype)
    if reduction == _MEAN:
        return buf * (grad_out / denom)
    return buf * grad_out



# --------------------------------------------------------------------------------------
# Registered operators (torch.compile, torch.export, calls by name)
# --------------------------------------------------------------------------------------
# With compiled Triton they are triton_ops, so torch.compile traces into the kernels.
# Triton's CPU interpreter cannot run on the fake tensors that tracing uses, so under
# TRITON_INTERPRET=1 they are opaque custom ops with a fake implementation that only
# allocates (same schema, same eager behaviour).


class _NoLaunch:
    """Stands in for a kernel in fake (shape-only) runs: indexing by a grid gives a no-op launcher."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _no_launch(kernel):
    return _NoLaunch()


def _filled(like: torch.Tensor, *tensors):
    """Operators return tensors only: an output not computed is an empty tensor."""
    return tuple(like.new_empty(0) if x is None else x for x in tensors)


def _fwd_op_impl(pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, reduction: int, eps: float,
                 ltrb: bool, fused: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    loss, denom, gp, gt = giou_forward(pred, target, weight, reduction, eps, ltrb, fused, _op_wrap)
    return (loss, *_filled(loss, denom, gp, gt))


def _fwd_op_fake(pred, target, weight, reduction, eps, ltrb, fused):
    loss, denom, gp, gt = giou_forward(pred, target, weight, reduction, eps, ltrb, fused, _no_launch)
    return (loss, *_filled(loss, denom, gp, gt))


def _bwd_op_impl(grad_out: torch.Tensor, pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None,
                 denom: torch.Tensor, reduction: int, eps: float, ltrb: bool, need_pred: bool, need_target: bool,
                 need_weight: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _filled(pred, *giou_backward(grad_out, pred, target, weight, denom, reduction, eps, ltrb, need_pred,
                                        need_target, need_weight, _op_wrap))


def _bwd_op_fake(grad_out, pred, target, weight, denom, reduction, eps, ltrb, need_pred, need_target, need_weight):
    return _filled(pred, *giou_backward(grad_out, pred, target, weight, denom, reduction, eps, ltrb, need_pred,
                                        need_target, need_weight, _no_launch))


if _INTERPRET:
    _op_wrap = _direct
    giou_loss_fwd_op = torch.library.custom_op(f"{NAMESPACE}::giou_loss", _fwd_op_impl, mutates_args=())
    giou_loss_fwd_op.register_fake(_fwd_op_fake)
    giou_loss_bwd_op = torch.library.custom_op(f"{NAMESPACE}::giou_loss_backward", _bwd_op_impl, mutates_args=())
    giou_loss_bwd_op.register_fake(_bwd_op_fake)
else:
    _op_wrap = torch.library.wrap_triton
    giou_loss_fwd_op = torch.library.triton_op(f"{NAMESPACE}::giou_loss", _fwd_op_impl, mutates_args=())
    giou_loss_bwd_op = torch.library.triton_op(f"{NAMESPACE}::giou_loss_backward", _bwd_op_impl, mutates_args=())


def _op_setup_context(ctx, inputs, output):
    pred, target, weight, reduction, eps, ltrb, fused = inputs
    _loss, denom, gp, gt = output
    ctx.save_for_backward(pred, target, weight, denom, gp, gt)
    ctx.reduction, ctx.eps, ctx.ltrb, ctx.fused = reduction, eps, ltrb, fused
    ctx.mark_non_differentiable(denom, gp, gt)
    ctx.set_materialize_grads(False)


def _op_backward(ctx, grad_loss, _g_denom, _g_gp, _g_gt):
    pred, target, weight, denom, gp_buf, gt_buf = ctx.saved_tensors
    need_pred, need_target, need_weight = ctx.needs_input_grad[:3]
    return _backward(grad_loss, pred, target, weight, denom, gp_buf, gt_buf, ctx.reduction, ctx.eps, ctx.ltrb,
                     ctx.fused, need_pred, need_target, need_weight, giou_loss_bwd_op)


def _backward(grad_loss, pred, target, weight, denom, gp_buf, gt_buf, reduction, eps, ltrb, fused, need_pred,
              need_target, need_weight, bwd):
    """Shared backward: fused buffers are scaled, whatever is left goes to the backward kernel."""
    gp = gt = gw = None
    if grad_loss is None:
        return gp, gt, gw, None, None, None, None
    if need_pred and fused & 1:
        gp = _scale_fused(gp_buf, grad_loss, denom, reduction)
        need_pred = False
    if need_target and fused & 2:
        gt = _scale_fused(gt_buf, grad_loss, denom, reduction)
        need_target = False
    if need_pred or need_target or need_weight:
        kp, kt, kw = bwd(grad_loss, pred, target, weight, denom, reduction, eps, ltrb, need_pred, need_target,
                         need_weight)
        gp = kp if need_pred else gp
        gt = kt if need_target else gt
        gw = kw if need_weight else gw
    return gp, gt, gw, None, None, None, None


giou_loss_fwd_op.register_autograd(_op_backward, setup_context=_op_setup_context)


# --------------------------------------------------------------------------------------
# Eager path and entry point
# --------------------------------------------------------------------------------------

from torch.autograd import profiler as _profiler  # noqa: E402


class _GIoULossFunction(torch.autograd.Function):
    """The eager path: the same host functions and kernels as the operators, without the dispatcher."""

    @staticmethod
    def forward(ctx, pred, target, weight, reduction, eps, ltrb, fused_mode):
        fused = 0
        if fused_mode:
            fused = (1 if ctx.needs_input_grad[0] else 0) | (2 if ctx.needs_input_grad[1] else 0)
        if _profiler._is_profiler_enabled:
            with torch.profiler.record_function(f"{NAMESPACE}::giou_loss"):
                loss, denom, gp, gt = giou_forward(pred, target, weight, reduction, eps, ltrb, fused)
        else:
            loss, denom, gp, gt = giou_forward(pred, target, weight, reduction, eps, ltrb, fused)
        ctx.save_for_backward(pred, target, weight, denom, gp, gt)
        ctx.reduction, ctx.eps, ctx.ltrb, ctx.fused = reduction, eps, ltrb, fused
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        pred, target, weight, denom, gp_buf, gt_buf = ctx.saved_tensors
        need_pred, need_target, need_weight = ctx.needs_input_grad[:3]
        if _profiler._is_profiler_enabled:
            with torch.profiler.record_function(f"{NAMESPACE}::giou_loss_backward"):
                return _backward(grad_loss, pred, target, weight, denom, gp_buf, gt_buf, ctx.reduction, ctx.eps,
                                 ctx.ltrb, ctx.fused, need_pred, need_target, need_weight, giou_backward)
        return _backward(grad_loss, pred, target, weight, denom, gp_buf, gt_buf, ctx.reduction, ctx.eps, ctx.ltrb,
                         ctx.fused, need_pred, need_target, need_weight, giou_backward)


_REDUCTION_CODE = {"none": _NONE, "sum": _SUM, "mean": _MEAN}


def giou_loss_op(pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                 reduction: str = "mean", eps: float = 1e-7, ltrb: bool = False, grad_mode: str | None = None,
                 use_op: bool = False) -> torch.Tensor:
    """GIoU loss through the Triton kernels (arguments are assumed valid: see :func:`snntrain.losses.giou_loss`).

    ``weight`` must already have the shape ``pred.shape[:-1]`` (an expanded view is fine).
    ``grad_mode``: ``"separate"`` or ``"fused"`` (default :data:`DEFAULT_GRAD_MODE`).
    ``use_op``: go through the registered operator even in eager mode (always done
    under ``torch.compile``).
    """
    red = _REDUCTION_CODE[reduction]
    grad_mode = grad_mode or DEFAULT_GRAD_MODE
    if grad_mode not in GRAD_MODES:
        raise ValueError(f"grad_mode={grad_mode!r} is not valid; choose one of {', '.join(map(repr, GRAD_MODES))}")
    fused_mode = grad_mode == "fused"
    if use_op or torch.compiler.is_compiling():
        fused = 0
        if fused_mode and torch.is_grad_enabled():
            fused = (1 if pred.requires_grad else 0) | (2 if target.requires_grad else 0)
        return torch.ops.snntrain.giou_loss(pred, target, weight, red, float(eps), bool(ltrb), fused)[0]
    return _GIoULossFunction.apply(pred, target, weight, red, float(eps), bool(ltrb),
                                   fused_mode and torch.is_grad_enabled())
