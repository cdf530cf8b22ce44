"""Generalized-IoU loss for element-wise box pairs: Triton kernels, forward and backward.

Box ``i`` of ``pred`` is paired with box ``i`` of ``target``; both are ``[..., 4]``
tensors, either corners ``(x1, y1, x2, y2)`` or, for anchor-free heads, ``ltrb``
distances ``(l, t, r, b)`` from one common point (then ``x1 = -l, y1 = -t, x2 = r,
y2 = b`` relative to that point). The per-pair loss is ``1 - GIoU`` computed exactly as
``torchvision.ops.generalized_box_iou_loss`` does (same ``eps`` placement, intersection
counted only where it is strictly positive in both axes). A target whose index-3 value
(``y2`` or ``b``) is ``<= 0`` is padding: its loss and its gradients are 0 and it is not
counted by ``mean``.

What is here (and nothing else):

* the kernels: ``_giou_fwd_kernel`` (loss, and in the "fused" gradient mode the per-box
  gradient as well), ``_giou_finalize_kernel`` (fixed-order reduction of per-program
  partials), ``_giou_scale_kernel`` (the fused mode's backward on large inputs: the
  stored gradient times ``grad_output``, in place) and ``_giou_bwd_kernel`` (the
  hand-written analytic gradient, derived in the comment above it);
* host launch functions ``giou_forward`` / ``giou_backward`` that see ``[..., 4]`` as
  ``[N, 4]`` rows (through strides, copying only when no flat view exists), allocate
  outputs and launch; they never convert dtypes and never synchronise with the host;
* the operators ``torch.ops.snntrain.giou_loss`` and ``torch.ops.snntrain.giou_loss_backward``
  (``torch.library.triton_op``, so ``torch.compile`` sees the kernels) with autograd;
* :func:`giou_loss_op`, the entry used by :mod:`snntrain.losses`.

Dtypes: fp16, bf16 and fp32 boxes are loaded as they are and the math runs in fp32;
the loss comes back in fp32 and gradients in each input's dtype. float64 boxes run the
same kernels with fp64 math and an fp64 loss (used by the gradcheck tests): a precise
path, with IEEE divisions (``div.rn.f64``; fp32 uses Triton's fast ``div.full.f32``) and
``eps`` a compile-time constant, so that it is the exact double (a runtime float argument
would reach the GPU kernel as fp32).

Loads: a program reads a ``[BLOCK, 4]`` tile, one box per row. For the usual
contiguous ``[..., 4]`` tensor the row stride 4 is a compile-time constant (``ROW4_*``),
so each thread loads a whole box with one vector instruction (16 bytes for fp32,
8 bytes for fp16/bf16) and a warp reads one contiguous run; with a runtime stride the
compiler cannot prove the alignment and falls back to one load per coordinate, which
for 16-bit boxes costs more instructions than the memory system needs.
``scripts/kernel_resources.py --family giou`` shows the vector widths of the sm_90 builds.

Reductions (``none`` / ``sum`` / ``mean``) stay on the device: a small problem
(``N <= SINGLE_MAX``) is reduced by one program in one launch; a larger one runs a
persistent grid (one wave: as many programs as fit on the SMs, from the compiled
kernel's registers) that writes one partial sum and one valid count per program, and
``_giou_finalize_kernel`` adds them in a fixed order, so results are deterministic for a
given launch configuration (tuned once per size bucket, :mod:`snntrain.kernels.giou_tuning`).
``mean`` divides by ``max(#valid, 1)``.

Two ways to get the gradient (``grad_mode``); the default (``grad_mode=None``,
:func:`default_grad_mode`) is fused, except for fp32 / fp64 ``pred`` above
:data:`FUSED_MAX_F32` boxes, which use separate (measured on an H200: docs/benchmarks.md):

* ``"fused"``: when a gradient is needed, the forward also writes the per-box
  gradient of the (weighted, masked) loss into a buffer; the backward multiplies that
  buffer by ``grad_output`` in place and hands it to autograd (no copy). Single-program
  ``mean``: the forward counts the valid boxes first and writes the gradient already
  divided by the count, so the backward is one ``mul_`` by ``grad_output``. Larger
  ``sum``/``mean``: the forward also writes one byte per ``FLAG_ROWS`` (32: one warp's)
  rows saying whether any of them is valid, and ``_giou_scale_kernel`` (one launch)
  applies ``grad_output / max(#valid, 1)`` only to those groups: groups of padding
  already hold 0 and are neither read nor written again. ``none``: one ``mul_`` by
  ``grad_output``.
  A second backward through the same graph (``retain_graph=True``) finds the buffer
  consumed and runs the hand-written backward kernel instead.
* ``"separate"``: the forward computes only the loss; ``_giou_bwd_kernel`` reads the boxes
  again and writes the gradients already scaled by ``grad_output``.

Bytes moved for a gradient of ``pred`` (P, T, G: bytes of pred, target and the gradient,
all the same size; v: fraction of valid targets, since above ``SKIP_PAD_MIN`` boxes the
kernels read ``pred`` only where the target is not padding; b: fraction of
``FLAG_ROWS``-row groups that hold a valid target, b >= v):

* fused ``sum``/``mean``: forward T + vP + G, backward 2bG (read and write the blocks
  with valid rows): T + vP + (1 + 2b) G in all;
* fused ``none``: T + vP + 3G;
* separate: forward T + vP, backward T + vP + G: 2 (T + vP) + G.

So with padding in runs (b = v) fused moves less than separate; with padding scattered
one box at a time (b = 1) it moves T + vP + 3G, more than separate. The gradient cannot
be final in the forward, because autograd supplies ``grad_output`` only afterwards, so no
design moves just T + P + G. Fused also costs more when ``target`` needs a gradient too,
rounds the gradient twice in fp16/bf16 (buffer, then the scaled value) and slows down a
forward whose inputs require grad but whose backward never runs. ``scripts/bench_giou.py``
times both modes.

Host path. Eager calls go through a ``torch.autograd.Function`` that launches the
kernels directly: the dispatcher path of a registered operator with autograd costs tens
of microseconds of host time per forward+backward, which would dominate a 32 x 256 box
loss. Per call the forward does one launch for ``N <= SINGLE_MAX`` (two above: kernel
and finalize), allocates the loss and the gradient buffer, and looks up its
compile-time flags in a small cache; large launches use the configuration tuned on
their first call, launched without an autotuner layer. The
backward is one ``mul_`` (or one scale launch on large inputs). Calls whose inputs do
not require grad (or run under ``no_grad``) skip autograd altogether. Under
``torch.compile`` and ``torch.export`` (and with ``use_op``, or whenever the ops are
called by name) the registered operators are used: the dispatch rule of every op family
(:mod:`snntrain.kernels.op_utils`). The eager path keeps an ``autograd.Function`` of its
own (not :func:`~snntrain.kernels.op_utils.eager_function`): its backward consumes the
fused mode's buffers in place, which the registered operators cannot do. While the
profiler is on, the eager path is recorded under the operator names. Under ``TRITON_INTERPRET=1`` (CPU tests) the operators are opaque ``custom_op``s
with a shape-only fake implementation, because the interpreter cannot run on the fake
tensors that tracing uses; with compiled Triton they are ``triton_op``s.

Tie policy (where a min or max has equal arguments): the gradient follows PyTorch's
autograd of ``torch.maximum`` / ``torch.minimum``, which torchvision's loss uses: half of
it to each argument. The intersection term contributes only where the intersection
width and height are both strictly positive (touching boxes: no intersection gradient),
as torchvision's boolean mask does.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import giou_tuning as tuning
from .op_utils import INT32_MAX, cdiv, direct, no_launch, op_wrap, profiled, register_op, sm_count, traced

NAMESPACE = "snntrain"
REDUCTIONS = ("none", "sum", "mean")
GRAD_MODES = ("separate", "fused")
#: The default gradient mode (``grad_mode=None``) is "fused", except for fp32 / fp64 ``pred``
#: with more than this many boxes, which use "separate" (see :func:`default_grad_mode`).
FUSED_MAX_F32 = 1 << 22

_NONE, _SUM, _MEAN = 0, 1, 2

#: Sum/mean over at most this many boxes run as a single program (one launch, no partials).
SINGLE_MAX = 8192
#: Up to this many boxes the element-wise launches use a fixed configuration (no autotune).
SMALL_MAX = 16384
#: Above this many boxes the kernels do not read the pred rows whose target is padding
#: (a masked load that depends on the target load); below, they read every row.
SKIP_PAD_MIN = 16384

_F32, _F64 = torch.float32, torch.float64
_HALF = (torch.float16, torch.bfloat16)

#: Rows per "has a valid box" flag written by the fused forward on large inputs: one warp's
#: rows, so the forward reduces them with a warp reduction (forward blocks are multiples of it).
FLAG_ROWS = 32
#: Flags per program of the fused backward's scale kernel: 16 x 32 rows = 2048 elements, 16 per
#: thread (4 warps), so that each thread has 32 (bf16) or 64 (fp32) bytes in flight.
SCALE_GROUPS = 16


# --------------------------------------------------------------------------------------
# Device helpers (inlined into the kernels)
# --------------------------------------------------------------------------------------


@triton.jit
def _row_offsets(rows, row_stride, ROW4: tl.constexpr, INT64: tl.constexpr):
    """Element offset of the first coordinate of each row; ROW4: the row stride is the constant 4."""
    if INT64:
        r = rows.to(tl.int64)
    else:
        r = rows
    if ROW4:
        off = r * 4
    else:
        off = r * row_stride
    return off


@triton.jit
def _load_boxes(ptr, rows, row_stride, inb, LTRB: tl.constexpr, FP64: tl.constexpr, INT64: tl.constexpr,
                ROW4: tl.constexpr, BLOCK: tl.constexpr):
    """Load rows ``rows`` of an ``[N, 4]`` box tensor (last-dim stride 1) as corners x1, y1, x2, y2.

    One ``[BLOCK, 4]`` tile: with ``ROW4`` every thread reads whole boxes with vector loads.
    Also returns the raw index-3 value (``y2`` or ``b``), which decides padding.
    """
    cols = tl.arange(0, 4)
    base = _row_offsets(rows, row_stride, ROW4, INT64)
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
    base = _row_offsets(rows, 4, True, INT64)
    tl.store(ptr + base[:, None] + cols[None, :], tile.to(ptr.dtype.element_ty), mask=inb[:, None])


@triton.jit
def _giou_terms(x1, y1, x2, y2, X1, Y1, X2, Y2, eps):
    """Loss 1 - GIoU of pred (x1, y1, x2, y2) against target (X1, Y1, X2, Y2), plus what its gradient needs.

    Same operation order as torchvision's generalized_box_iou_loss (the loss-only
    variants do not use the extra values; the compiler drops them). ``eps`` is the
    kernels' compile-time ``EPS``, a Python float: added to a tensor it becomes a constant
    of that tensor's dtype, so fp64 boxes use the exact double. (A runtime float argument
    would be an fp32 kernel parameter on the GPU, rounding eps for fp64 too, while the CPU
    interpreter keeps it a Python float: the two would disagree in fp64.)
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
    iou = inter / ud
    loss = 1.0 - (iou - (encl - union) / cd)
    return loss, iou, ud, cd, hit, wp, hp, wg, hg, iw, ih, cw, ch


@triton.jit
def _giou_partials(iou, ud, cd, hit, scale):
    """``scale`` times dL/dU, dL/dI (total) and dL/dC (derivation above _giou_bwd_kernel), with two reciprocals."""
    r_u = 1.0 / ud
    r_c = 1.0 / cd
    g_u = iou * r_u - r_c  # I / (U + e)^2 - 1 / (C + e)
    g_i = tl.where(hit, -r_u - g_u, 0.0)
    g_c = ud * (r_c * r_c)  # (U + e) / (C + e)^2
    return g_u * scale, g_i * scale, g_c * scale


@triton.jit
def _sel_max(a, b):
    """d max(a, b) / d a with PyTorch's tie rule: 1 if a > b, 1/2 if a == b, else 0."""
    return tl.where(a > b, 1.0, tl.where(a == b, 0.5, 0.0))


@triton.jit
def _sel_min(a, b):
    """d min(a, b) / d a with PyTorch's tie rule: 1 if a < b, 1/2 if a == b, else 0."""
    return tl.where(a < b, 1.0, tl.where(a == b, 0.5, 0.0))


@triton.jit
def _shares(x1, y1, x2, y2, X1, Y1, X2, Y2):
    """Pred's share of the intersection's edges: max(x1, X1), max(y1, Y1), min(x2, X2), min(y2, Y2).

    The other shares follow (no NaN on valid rows): pred's share of the enclosing box's
    edges min(x1, X1), ... is one minus these, and the target's shares are the complements.
    """
    return _sel_max(x1, X1), _sel_max(y1, Y1), _sel_min(x2, X2), _sel_min(y2, Y2)


@triton.jit
def _side_grad(s0, s1, s2, s3, w, h, g_u, g_c_ch, g_c_cw, bx, by):
    """Corner gradient of one box of width w, height h, whose intersection-edge shares are s0..s3.

    With e = g_c * ch (x) or g_c * cw (y) and b = g_i * ih - g_c * ch (x) or g_i * iw - g_c * cw (y):
    dL/dx1 = -(g_u h + e) - s0 b, dL/dx2 = g_u h + e + s2 b, and likewise for y with w.
    """
    ax = g_u * h + g_c_ch
    ay = g_u * w + g_c_cw
    return -ax - s0 * bx, -ay - s1 * by, ax + s2 * bx, ay + s3 * by


@triton.jit
def _store_grad(ptr, rows, inb, valid, g0, g1, g2, g3, LTRB: tl.constexpr, INT64: tl.constexpr,
                BLOCK: tl.constexpr):
    """Zero a per-box corner gradient on padding, map it to ltrb if needed and store it."""
    g0 = tl.where(valid, g0, 0.0)
    g1 = tl.where(valid, g1, 0.0)
    g2 = tl.where(valid, g2, 0.0)
    g3 = tl.where(valid, g3, 0.0)
    if LTRB:  # x1 = -l, y1 = -t
        g0 = -g0
        g1 = -g1
    _store_boxes(ptr, rows, inb, g0, g1, g2, g3, INT64, BLOCK)


@triton.jit
def _store_box_grads(gpred_ptr, gtarget_ptr, rows, inb, valid, scale, x1, y1, x2, y2, X1, Y1, X2, Y2, iou, ud, cd,
                     hit, wp, hp, wg, hg, iw, ih, cw, ch, PRED: tl.constexpr, TARGET: tl.constexpr,
                     LTRB: tl.constexpr, INT64: tl.constexpr, BLOCK: tl.constexpr):
    """Store ``scale`` times the gradient of the per-box loss for pred and/or target (0 on padding rows)."""
    g_u, g_i, g_c = _giou_partials(iou, ud, cd, hit, scale)
    g_c_ch = g_c * ch
    g_c_cw = g_c * cw
    bx = g_i * ih - g_c_ch
    by = g_i * iw - g_c_cw
    s0, s1, s2, s3 = _shares(x1, y1, x2, y2, X1, Y1, X2, Y2)
    if PRED:
        a0, a1, a2, a3 = _side_grad(s0, s1, s2, s3, wp, hp, g_u, g_c_ch, g_c_cw, bx, by)
        _store_grad(gpred_ptr, rows, inb, valid, a0, a1, a2, a3, LTRB, INT64, BLOCK)
    if TARGET:
        b0, b1, b2, b3 = _side_grad(1.0 - s0, 1.0 - s1, 1.0 - s2, 1.0 - s3, wg, hg, g_u, g_c_ch, g_c_cw, bx, by)
        _store_grad(gtarget_ptr, rows, inb, valid, b0, b1, b2, b3, LTRB, INT64, BLOCK)


# --------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------


@triton.jit
def _giou_fwd_kernel(
    pred_ptr,  # [N, 4] boxes, row stride stride_p, last-dim stride 1 (fp16 / bf16 / fp32 / fp64)
    target_ptr,  # [N, 4] boxes, row stride stride_t, last-dim stride 1
    weight_ptr,  # [N] per-box weights, stride stride_w (read only if HAS_WEIGHT)
    loss_ptr,  # none: [N] per-box loss; sum/mean: [num_programs] partial sums, or [1] the result if SINGLE
    count_ptr,  # sum/mean: [num_programs] int32 partial valid counts, or [1] max(#valid, 1) if STORE_DENOM
    gpred_ptr,  # FUSED_PRED: [N, 4] contiguous, pred's dtype: d(weighted masked per-box loss) / d pred
    gtarget_ptr,  # FUSED_TARGET: [N, 4] contiguous, target's dtype: the same for target
    flags_ptr,  # FLAGS: [cdiv(N, FLAG_ROWS)] int8, 1 where a block of FLAG_ROWS rows has a valid target
    N,  # number of boxes
    stride_p,
    stride_t,
    stride_w,
    n_bucket,  # power-of-two bucket of N: autotune key only
    EPS: tl.constexpr,  # the stabiliser (compile-time, see _giou_terms)
    REDUCTION: tl.constexpr,  # 0 none, 1 sum, 2 mean
    HAS_WEIGHT: tl.constexpr,
    LTRB: tl.constexpr,
    FUSED_PRED: tl.constexpr,
    FUSED_TARGET: tl.constexpr,
    SINGLE: tl.constexpr,  # one program reduces everything and writes the result
    STORE_DENOM: tl.constexpr,  # SINGLE: also write max(#valid, 1) to count_ptr
    PRESCALE: tl.constexpr,  # SINGLE mean: count first, write the fused gradients divided by max(#valid, 1)
    FLAGS: tl.constexpr,  # write the per-block valid flags
    FLAG_ROWS: tl.constexpr,  # rows per flag (one warp's rows); divides BLOCK
    SKIP_PAD: tl.constexpr,  # do not read pred rows whose target is padding (a second, dependent load)
    ROW4_P: tl.constexpr,  # stride_p == 4 (contiguous rows: vector loads)
    ROW4_T: tl.constexpr,  # stride_t == 4
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
    if PRESCALE:
        # Count the valid boxes before the main loop (one read of the targets' index-3 column,
        # L2-resident afterwards), so that the gradients can be written already divided by it.
        for start in range(0, N, BLOCK):
            rows = start + tl.arange(0, BLOCK)
            y2 = tl.load(target_ptr + _row_offsets(rows, stride_t, ROW4_T, INT64) + 3, mask=rows < N, other=0.0)
            cnt += (y2 > 0).to(tl.int32)
        inv_denom = 1.0 / tl.maximum(tl.sum(cnt, axis=0), 1).to(acc.dtype)
        cnt = tl.zeros([BLOCK], dtype=tl.int32)
    # Grid-stride loop over tiles of BLOCK boxes (one iteration when the grid covers N).
    for start in range(pid * BLOCK, N, nprog * BLOCK):
        rows = start + tl.arange(0, BLOCK)
        inb = rows < N
        X1, Y1, X2, Y2, raw3 = _load_boxes(target_ptr, rows, stride_t, inb, LTRB, FP64, INT64, ROW4_T, BLOCK)
        valid = inb & (raw3 > 0)
        x1, y1, x2, y2, _ = _load_boxes(pred_ptr, rows, stride_p, valid if SKIP_PAD else inb, LTRB, FP64, INT64,
                                        ROW4_P, BLOCK)
        loss, iou, ud, cd, hit, wp, hp, wg, hg, iw, ih, cw, ch = _giou_terms(x1, y1, x2, y2, X1, Y1, X2, Y2, EPS)
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
        if PRESCALE:
            s = w * inv_denom
        else:
            s = w
        if REDUCTION == 0:
            tl.store(loss_ptr + rows, lw, mask=inb)
        else:
            acc += lw
            cnt += valid.to(tl.int32)
        if FUSED_PRED or FUSED_TARGET:
            _store_box_grads(gpred_ptr, gtarget_ptr, rows, inb, valid, s, x1, y1, x2, y2, X1, Y1, X2, Y2, iou, ud, cd,
                             hit, wp, hp, wg, hg, iw, ih, cw, ch, FUSED_PRED, FUSED_TARGET, LTRB, INT64, BLOCK)
        if FLAGS:
            # One flag per FLAG_ROWS consecutive rows. With FLAG_ROWS = 32 a group is one warp's rows,
            # so the reduction is a warp reduction; the flag is broadcast back to the group's rows and
            # stored by its first row, so the store keeps the rows' layout. No exchange through shared
            # memory and no barrier in the loop (a [BLOCK // FLAG_ROWS] store would need both).
            groups = tl.reshape(valid.to(tl.int32), (BLOCK // FLAG_ROWS, FLAG_ROWS))
            any_valid = tl.broadcast_to(tl.max(groups, axis=1)[:, None], (BLOCK // FLAG_ROWS, FLAG_ROWS))
            tl.store(flags_ptr + rows // FLAG_ROWS, tl.reshape(any_valid, (BLOCK,)).to(tl.int8),
                     mask=inb & (rows % FLAG_ROWS == 0))
    if REDUCTION != 0:
        total = tl.sum(acc, axis=0)
        n_valid = tl.sum(cnt, axis=0)
        if SINGLE:
            denom = tl.maximum(n_valid, 1).to(total.dtype)
            if REDUCTION == 2:
                total = total / denom
            tl.store(loss_ptr, total)
            if STORE_DENOM:
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


@triton.jit
def _giou_scale_kernel(
    g_ptr,  # [N, 4] contiguous fused gradient (fp16 / bf16 / fp32 / fp64), scaled in place
    flags_ptr,  # [n_flags] int8 from the forward: 0 where FLAG_ROWS rows are all padding (gradient already 0)
    grad_out_ptr,  # [1] the loss's gradient
    denom_ptr,  # MEAN: [1] max(#valid, 1)
    n_elem,  # 4 N
    n_flags,  # cdiv(N, FLAG_ROWS)
    MEAN: tl.constexpr,
    FP64: tl.constexpr,
    INT64: tl.constexpr,
    GROUPS: tl.constexpr,  # flags per program
    FLAG_ROWS: tl.constexpr,
):
    """Fused mode's backward on large inputs: g *= grad_output (/ max(#valid, 1)) on the row groups with a valid row.

    A program covers GROUPS groups of FLAG_ROWS rows, one tile row per group; groups without
    a valid row are masked off, so their bytes are neither read nor written.
    """
    pid = tl.program_id(0)
    if INT64:
        grp = pid.to(tl.int64) * GROUPS + tl.arange(0, GROUPS)
    else:
        grp = pid * GROUPS + tl.arange(0, GROUPS)
    keep = tl.load(flags_ptr + grp, mask=grp < n_flags, other=0) != 0
    if FP64:
        s = tl.load(grad_out_ptr).to(tl.float64)
    else:
        s = tl.load(grad_out_ptr).to(tl.float32)
    if MEAN:
        s = s / tl.load(denom_ptr).to(s.dtype)
    offs = grp[:, None] * (4 * FLAG_ROWS) + tl.arange(0, 4 * FLAG_ROWS)[None, :]
    m = keep[:, None] & (offs < n_elem)
    g = tl.load(g_ptr + offs, mask=m, other=0.0)
    tl.store(g_ptr + offs, (g.to(s.dtype) * s).to(g_ptr.dtype.element_ty), mask=m)


# --------------------------------------------------------------------------------------
# Backward (hand-written)
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
# Since smin(a, b) = 1 - smax(a, b) (no NaN on valid rows), with s = smax(x1, X1) and
# e = g_c ch, b = g_i ih - g_c ch:  dL/dx1 = -(g_u hp + e) - s b, and for the target
# dL/dX1 = -(g_u hg + e) - (1 - s) b; the other coordinates alike (_side_grad). The kernels
# compute 1 / (U + e) and 1 / (C + e) once: g_u = IoU / (U + e) - 1 / (C + e),
# g_c = (U + e) (1 / (C + e))^2 (_giou_partials).
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
    n_bucket,  # power-of-two bucket of N: autotune key only
    EPS: tl.constexpr,
    REDUCTION: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    LTRB: tl.constexpr,
    NEED_PRED: tl.constexpr,
    NEED_TARGET: tl.constexpr,
    NEED_WEIGHT: tl.constexpr,
    SKIP_PAD: tl.constexpr,  # do not read pred rows whose target is padding (a second, dependent load)
    ROW4_P: tl.constexpr,
    ROW4_T: tl.constexpr,
    FP64: tl.constexpr,
    INT64: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    inb = rows < N
    X1, Y1, X2, Y2, raw3 = _load_boxes(target_ptr, rows, stride_t, inb, LTRB, FP64, INT64, ROW4_T, BLOCK)
    valid = inb & (raw3 > 0)
    x1, y1, x2, y2, _ = _load_boxes(pred_ptr, rows, stride_p, valid if SKIP_PAD else inb, LTRB, FP64, INT64, ROW4_P,
                                    BLOCK)
    loss, iou, ud, cd, hit, wp, hp, wg, hg, iw, ih, cw, ch = _giou_terms(x1, y1, x2, y2, X1, Y1, X2, Y2, EPS)
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
    if NEED_PRED or NEED_TARGET:
        _store_box_grads(gpred_ptr, gtarget_ptr, rows, inb, valid, s, x1, y1, x2, y2, X1, Y1, X2, Y2, iou, ud, cd, hit,
                         wp, hp, wg, hg, iw, ih, cw, ch, NEED_PRED, NEED_TARGET, LTRB, INT64, BLOCK)


# --------------------------------------------------------------------------------------
# Launch configurations (giou_tuning.py) and constexpr sets
# --------------------------------------------------------------------------------------

_fwd_tuned = triton.autotune(configs=tuning.FWD_CONFIGS, key=tuning.FWD_KEY)(_giou_fwd_kernel)
_bwd_tuned = triton.autotune(configs=tuning.BWD_CONFIGS, key=tuning.BWD_KEY)(_giou_bwd_kernel)


@functools.lru_cache(maxsize=None)
def _fwd_flags(reduction, has_w, ltrb, fused, single, store_denom, prescale, flags, skip_pad, row4_p, row4_t, fp64,
               int64, flag_rows, eps) -> dict:
    return dict(EPS=eps, REDUCTION=reduction, HAS_WEIGHT=has_w, LTRB=ltrb, FUSED_PRED=bool(fused & 1),
                FUSED_TARGET=bool(fused & 2), SINGLE=single, STORE_DENOM=store_denom, PRESCALE=prescale, FLAGS=flags,
                FLAG_ROWS=flag_rows, SKIP_PAD=skip_pad, ROW4_P=row4_p, ROW4_T=row4_t, FP64=fp64, INT64=int64)


@functools.lru_cache(maxsize=None)
def _bwd_flags(reduction, has_w, ltrb, need_pred, need_target, need_weight, skip_pad, row4_p, row4_t, fp64,
               int64, eps) -> dict:
    return dict(EPS=eps, REDUCTION=reduction, HAS_WEIGHT=has_w, LTRB=ltrb, NEED_PRED=need_pred,
                NEED_TARGET=need_target, NEED_WEIGHT=need_weight, SKIP_PAD=skip_pad, ROW4_P=row4_p, ROW4_T=row4_t,
                FP64=fp64, INT64=int64)


# --------------------------------------------------------------------------------------
# Host launch functions
# --------------------------------------------------------------------------------------


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``[..., 4]`` -> a tensor whose rows of 4 have last-dim stride 1, and the row stride.

    A contiguous tensor is used as it is (the kernels only need its pointer); otherwise a
    ``[N, 4]`` view when one exists, a copy when not.
    """
    if x.is_contiguous():
        return x, 4
    if x.stride(-1) != 1:
        x = x.contiguous()
        return x, 4
    try:
        x = x.view(-1, 4)
    except RuntimeError:
        x = x.reshape(-1, 4)
    return x, x.stride(0) if x.shape[0] > 1 else 4


def _vec(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``[...]`` -> ``[N]``, as a view when one exists."""
    try:
        x = x.view(-1)
    except RuntimeError:
        x = x.reshape(-1)
    return x, x.stride(0)


def giou_forward(pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, reduction: int,
                 eps: float, ltrb: bool, fused: int, wrap=direct, eager: bool = False, need_denom: bool = True):
    """Launch the forward. Returns ``(loss, denom, grad_pred_buf, grad_target_buf, flags)``.

    ``pred``/``target``: ``[..., 4]``; ``weight``: ``None`` or shape ``pred.shape[:-1]``.
    ``reduction``: 0 none, 1 sum, 2 mean. ``fused``: bit 0 asks for the per-box gradient of
    pred, bit 1 for target (not scaled by grad_output).
    ``loss``: ``pred.shape[:-1]`` for none, ``[]`` otherwise, fp32 (fp64 for fp64 boxes).
    ``denom``: ``[]`` max(#valid, 1) for sum/mean, ``None`` for none (and, single-program,
    when ``need_denom`` is false). Gradient buffers have their input's shape and dtype
    when asked for, else are ``None``. ``wrap`` is applied to each kernel before launching
    (``torch.library.wrap_triton`` inside the operators).

    ``eager`` (the autograd Function's forward; ``wrap`` must be the default) enables the
    fused mode's shortcuts for :func:`_scale_in_place`: single-program ``mean`` gradients
    come back already divided by max(#valid, 1); multi-program sum/mean also return
    ``flags`` (int8, one per ``FLAG_ROWS`` rows: any valid target). Otherwise the buffers
    hold the gradient of the weighted, masked per-box loss and ``flags`` is ``None``.
    """
    p, sp = _rows(pred)
    t, st = _rows(target)
    n = pred.numel() // 4
    dev = pred.device
    fp64 = pred.dtype is _F64 or target.dtype is _F64
    acc = _F64 if fp64 else _F32
    if weight is None:
        w, sw = p, 0  # p: a placeholder pointer, never read
    else:
        w, sw = _vec(weight)
    gp = torch.empty(pred.shape, dtype=pred.dtype, device=dev) if fused & 1 else None
    gt = torch.empty(target.shape, dtype=target.dtype, device=dev) if fused & 2 else None
    gp_arg = p if gp is None else gp  # placeholders are never written
    gt_arg = p if gt is None else gt
    int64 = n * max(4, sp, st, sw) > INT32_MAX
    has_w = weight is not None
    if reduction == _NONE:
        loss = torch.empty(pred.shape[:-1], dtype=acc, device=dev)
        if n > 0:
            args = (p, t, w, loss, loss, gp_arg, gt_arg, p, n, sp, st, sw)
            flags = _fwd_flags(_NONE, has_w, ltrb, fused, False, False, False, False, n > SKIP_PAD_MIN, sp == 4,
                               st == 4, fp64, int64, FLAG_ROWS, eps)
            if n <= SMALL_MAX:
                block, warps = tuning.SMALL_CONFIG
                wrap(_giou_fwd_kernel)[(cdiv(n, block),)](*args, 0, BLOCK=block, num_warps=warps, **flags)
            else:
                if wrap is direct:
                    key = tuning.best_key(_fwd_tuned, n, (pred.dtype, target.dtype, w.dtype), flags)
                    kwargs, block, _ = tuning.tuned_best(_fwd_tuned, lambda block, per_sm: (cdiv(n, block),), args, key,
                                                   flags)
                    _giou_fwd_kernel[(cdiv(n, block),)](*args, key[1], **flags, **kwargs)
                else:
                    wrap(_fwd_tuned)[lambda meta: (cdiv(n, meta["BLOCK"]),)](*args, tuning.bucket(n), **flags)
        return loss, None, gp, gt, None
    loss = torch.empty((), dtype=acc, device=dev)
    if n <= SINGLE_MAX:
        denom = torch.empty((), dtype=acc, device=dev) if need_denom else None
        flags = _fwd_flags(reduction, has_w, ltrb, fused, True, need_denom, eager and fused != 0 and reduction == _MEAN,
                           False, n > SKIP_PAD_MIN, sp == 4, st == 4, fp64, int64, FLAG_ROWS, eps)
        block, warps = tuning.SINGLE_CONFIG
        wrap(_giou_fwd_kernel)[(1,)](p, t, w, loss, loss if denom is None else denom, gp_arg, gt_arg, p, n, sp, st, sw,
                                     0, BLOCK=block, num_warps=warps, **flags)
        return loss, denom, gp, gt, None
    denom = torch.empty((), dtype=acc, device=dev)
    with_flags = eager and fused != 0
    flags = _fwd_flags(reduction, has_w, ltrb, fused, False, False, False, with_flags, n > SKIP_PAD_MIN, sp == 4,
                       st == 4, fp64, int64, FLAG_ROWS, eps)
    fl = torch.empty(cdiv(n, FLAG_ROWS), dtype=torch.int8, device=dev) if with_flags else None
    fl_arg = p if fl is None else fl
    sms = sm_count(dev)
    if wrap is direct:
        key = tuning.best_key(_fwd_tuned, n, (pred.dtype, target.dtype, w.dtype), flags)
        best = tuning.BEST.get(key)
        if best is None:
            best = tuning.tune_persistent(_giou_fwd_kernel, (p, t, w, gp_arg, gt_arg, fl_arg, n, sp, st, sw), n, sms,
                                          acc, dev, key, flags)
        kwargs, block, per_sm = best
        nprog = min(cdiv(n, block), per_sm * sms)
    else:
        nprog = min(cdiv(n, 1024), tuning.PROGRAMS_PER_SM * sms)
    part_loss = torch.empty(nprog, dtype=acc, device=dev)
    part_count = torch.empty(nprog, dtype=torch.int32, device=dev)
    args = (p, t, w, part_loss, part_count, gp_arg, gt_arg, fl_arg, n, sp, st, sw)
    if wrap is direct:
        _giou_fwd_kernel[(nprog,)](*args, key[1], **flags, **kwargs)
    else:
        wrap(_fwd_tuned)[(nprog,)](*args, tuning.bucket(n), **flags)
    wrap(_giou_finalize_kernel)[(1,)](part_loss, part_count, loss, denom, nprog, MEAN=reduction == _MEAN,
                                      BLOCK=tuning.FINALIZE_BLOCK, num_warps=4)
    return loss, denom, gp, gt, fl


def giou_backward(grad_out: torch.Tensor, pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None,
                  denom: torch.Tensor | None, reduction: int, eps: float, ltrb: bool, need_pred: bool,
                  need_target: bool, need_weight: bool, wrap=direct):
    """Launch the hand-written backward. Returns ``(grad_pred, grad_target, grad_weight)``.

    ``grad_out``: the loss's gradient (``pred.shape[:-1]`` for none, ``[]`` otherwise);
    ``denom``: max(#valid, 1) (mean only). Gradients not asked for are ``None``.
    """
    p, sp = _rows(pred)
    t, st = _rows(target)
    n = pred.numel() // 4
    dev = pred.device
    fp64 = pred.dtype is _F64 or target.dtype is _F64
    if weight is None:
        w, sw = p, 0
    else:
        w, sw = _vec(weight)
    if reduction == _NONE:
        go, sgo = _vec(grad_out)
    else:
        go, sgo = grad_out, 0
    gp = torch.empty(pred.shape, dtype=pred.dtype, device=dev) if need_pred else None
    gt = torch.empty(target.shape, dtype=target.dtype, device=dev) if need_target else None
    gw = torch.empty(weight.shape, dtype=weight.dtype, device=dev) if need_weight else None
    if n > 0 and (need_pred or need_target or need_weight):
        args = (go, go if denom is None else denom, p, t, w, p if gp is None else gp, p if gt is None else gt,
                p if gw is None else gw, n, sp, st, sw, sgo)
        flags = _bwd_flags(reduction, weight is not None, ltrb, need_pred, need_target, need_weight, n > SKIP_PAD_MIN,
                           sp == 4, st == 4, fp64, n * max(4, sp, st, sw, sgo) > INT32_MAX, eps)
        if n <= SMALL_MAX:
            block, warps = tuning.SMALL_CONFIG
            wrap(_giou_bwd_kernel)[(cdiv(n, block),)](*args, 0, BLOCK=block, num_warps=warps, **flags)
        elif wrap is direct:
            key = tuning.best_key(_bwd_tuned, n, (go.dtype, pred.dtype, target.dtype, w.dtype), flags)
            kwargs, block, _ = tuning.tuned_best(_bwd_tuned, lambda block, per_sm: (cdiv(n, block),), args, key, flags)
            _giou_bwd_kernel[(cdiv(n, block),)](*args, key[1], **flags, **kwargs)
        else:
            wrap(_bwd_tuned)[lambda meta: (cdiv(n, meta["BLOCK"]),)](*args, tuning.bucket(n), **flags)
    return gp, gt, gw


def _scale_in_place(buf: torch.Tensor, grad: torch.Tensor, denom: torch.Tensor | None, flags: torch.Tensor | None,
                    reduction: int) -> torch.Tensor:
    """Fused mode's eager backward: ``buf`` (from :func:`giou_forward` with ``eager``) times grad_output, in place."""
    if reduction == _NONE:
        return buf.mul_(grad.unsqueeze(-1))
    if flags is None:  # single program: sum, or mean already divided by max(#valid, 1)
        return buf.mul_(grad)
    n_elem = buf.numel()
    n_flags = flags.shape[0]
    _giou_scale_kernel[(cdiv(n_flags, SCALE_GROUPS),)](
        buf, flags, grad, grad if denom is None else denom, n_elem, n_flags, MEAN=reduction == _MEAN,
        FP64=buf.dtype is _F64, INT64=n_elem + 4 * FLAG_ROWS * SCALE_GROUPS > INT32_MAX, GROUPS=SCALE_GROUPS,
        FLAG_ROWS=FLAG_ROWS, num_warps=tuning.SCALE_WARPS)
    return buf


def _scale_fused(buf: torch.Tensor, grad_out: torch.Tensor, denom: torch.Tensor, reduction: int) -> torch.Tensor:
    """Fused mode's backward in the registered operators: a new tensor, buffer times grad_output (/ denom for mean)."""
    if reduction == _NONE:
        return (buf * grad_out.unsqueeze(-1)).to(buf.dtype)
    if reduction == _MEAN:
        return (buf * (grad_out / denom)).to(buf.dtype)
    return (buf * grad_out).to(buf.dtype)


def _valid_denom(target: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """max(#valid, 1) from the targets (when the forward did not store it)."""
    return (target[..., 3] > 0).sum().clamp_(min=1).to(dtype)


# --------------------------------------------------------------------------------------
# Registered operators (torch.compile, torch.export, calls by name)
# --------------------------------------------------------------------------------------
# With compiled Triton they are triton_ops, so torch.compile traces into the kernels.
# Triton's CPU interpreter cannot run on the fake tensors that tracing uses, so under
# TRITON_INTERPRET=1 they are opaque custom ops with a fake implementation that only
# allocates (same schema, same eager behaviour).


_FWD_NAME = f"{NAMESPACE}::giou_loss"
_BWD_NAME = f"{NAMESPACE}::giou_loss_backward"


def _filled(like: torch.Tensor, *tensors):
    """Operators return tensors only: an output not computed is an empty tensor."""
    return tuple(like.new_empty(0) if x is None else x for x in tensors)


def _fwd_op_impl(pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, reduction: int, eps: float,
                 ltrb: bool, fused: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    loss, denom, gp, gt, _ = giou_forward(pred, target, weight, reduction, eps, ltrb, fused, op_wrap)
    return (loss, *_filled(loss, denom, gp, gt))


def _fwd_op_fake(pred, target, weight, reduction, eps, ltrb, fused):
    loss, denom, gp, gt, _ = giou_forward(pred, target, weight, reduction, eps, ltrb, fused, no_launch)
    return (loss, *_filled(loss, denom, gp, gt))


def _bwd_op_impl(grad_out: torch.Tensor, pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None,
                 denom: torch.Tensor, reduction: int, eps: float, ltrb: bool, need_pred: bool, need_target: bool,
                 need_weight: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _filled(pred, *giou_backward(grad_out, pred, target, weight, denom, reduction, eps, ltrb, need_pred,
                                        need_target, need_weight, op_wrap))


def _bwd_op_fake(grad_out, pred, target, weight, denom, reduction, eps, ltrb, need_pred, need_target, need_weight):
    return _filled(pred, *giou_backward(grad_out, pred, target, weight, denom, reduction, eps, ltrb, need_pred,
                                        need_target, need_weight, no_launch))


giou_loss_fwd_op = register_op(_FWD_NAME, _fwd_op_impl, _fwd_op_fake)
giou_loss_bwd_op = register_op(_BWD_NAME, _bwd_op_impl, _bwd_op_fake)


def _op_setup_context(ctx, inputs, output):
    pred, target, weight, reduction, eps, ltrb, fused = inputs
    _loss, denom, gp, gt = output
    ctx.save_for_backward(pred, target, weight, denom, gp, gt)
    ctx.reduction, ctx.eps, ctx.ltrb, ctx.fused = reduction, eps, ltrb, fused
    ctx.mark_non_differentiable(denom, gp, gt)
    ctx.set_materialize_grads(False)


def _op_backward(ctx, grad_loss, _g_denom, _g_gp, _g_gt):
    with profiled(_BWD_NAME):  # the fused mode's backward launches no operator of its own: name it
        return _op_backward_impl(ctx, grad_loss)


def _op_backward_impl(ctx, grad_loss):
    pred, target, weight, denom, gp_buf, gt_buf = ctx.saved_tensors
    need_pred, need_target, need_weight = ctx.needs_input_grad[:3]
    gp = gt = gw = None
    if grad_loss is None:
        return gp, gt, gw, None, None, None, None
    fused = ctx.fused
    if need_pred and fused & 1:
        gp = _scale_fused(gp_buf, grad_loss, denom, ctx.reduction)
        need_pred = False
    if need_target and fused & 2:
        gt = _scale_fused(gt_buf, grad_loss, denom, ctx.reduction)
        need_target = False
    if need_pred or need_target or need_weight:
        kp, kt, kw = giou_loss_bwd_op(grad_loss, pred, target, weight, denom, ctx.reduction, ctx.eps, ctx.ltrb,
                                      need_pred, need_target, need_weight)
        gp = kp if need_pred else gp
        gt = kt if need_target else gt
        gw = kw if need_weight else gw
    return gp, gt, gw, None, None, None, None


giou_loss_fwd_op.register_autograd(_op_backward, setup_context=_op_setup_context)


# --------------------------------------------------------------------------------------
# Eager path and entry point
# --------------------------------------------------------------------------------------

class _GIoULossFunction(torch.autograd.Function):
    """The eager path: the same host functions and kernels as the operators, without the dispatcher."""

    @staticmethod
    def forward(ctx, pred, target, weight, reduction, eps, ltrb, fused_mode):
        ng = ctx.needs_input_grad
        fused = ng[0] + 2 * ng[1] if fused_mode else 0
        # mean's denominator is needed by the hand-written backward: separate mode, or a weight gradient
        need_denom = reduction == _MEAN and (not fused_mode or ng[2])
        with profiled(_FWD_NAME):
            loss, denom, gp, gt, flags = giou_forward(pred, target, weight, reduction, eps, ltrb, fused, direct, True,
                                                      need_denom)
        ctx.save_for_backward(pred, target, weight)
        ctx.state = (reduction, eps, ltrb, fused, denom, flags, gp, gt)
        return loss

    @staticmethod
    def backward(ctx, grad):
        with profiled(_BWD_NAME):
            return _eager_backward(ctx, grad)


def _eager_backward(ctx, grad):
    reduction, eps, ltrb, fused, denom, flags, gp, gt = ctx.state
    need_pred, need_target, need_weight = ctx.needs_input_grad[:3]
    if fused:
        # Scale the forward's buffers in place and hand them over: autograd keeps an
        # unshared gradient as .grad without copying it. They are consumed, so a second
        # backward through a retained graph takes the kernel path below.
        ctx.state = (reduction, eps, ltrb, 0, denom, None, None, None)
        if gp is not None:
            _scale_in_place(gp, grad, denom, flags, reduction)
        if gt is not None:
            _scale_in_place(gt, grad, denom, flags, reduction)
        if not need_weight:
            return gp, gt, None, None, None, None, None
    kp = need_pred and gp is None
    kt = need_target and gt is None
    gw = None
    if kp or kt or need_weight:
        pred, target, weight = ctx.saved_tensors
        if denom is None and reduction == _MEAN:
            denom = _valid_denom(target, _F64 if pred.dtype is _F64 or target.dtype is _F64 else _F32)
        rp, rt, gw = giou_backward(grad, pred, target, weight, denom, reduction, eps, ltrb, kp, kt, need_weight)
        if kp:
            gp = rp
        if kt:
            gt = rt
    return gp, gt, gw, None, None, None, None


try:  # the C++ apply, without torch.autograd.Function.apply's Python wrapper (older torch versions have one)
    _apply_c = torch._C._FunctionBase.__dict__["apply"].__get__(None, _GIoULossFunction)
except (AttributeError, KeyError, TypeError):  # pragma: no cover - depends on the torch version
    _apply_c = None
_functorch_active = torch._C._are_functorch_transforms_active


def default_grad_mode(n_boxes: int, dtype: torch.dtype) -> str:
    """The gradient mode used when none is given, for ``n_boxes`` boxes of ``pred`` in ``dtype``.

    "fused" for fp16 / bf16 at every size and for fp32 / fp64 up to :data:`FUSED_MAX_F32`
    boxes; "separate" above. Measured on an H200 (docs/benchmarks.md): at 16 M boxes the
    fp32 separate mode was faster (0.264 vs 0.290 ms forward+backward), bf16 fused was
    (0.267 vs 0.421 ms); at 32 x 256 boxes fused was faster in both (fewer host operations).
    """
    if dtype in _HALF or n_boxes <= FUSED_MAX_F32:
        return "fused"
    return "separate"
_REDUCTION_CODE = {"none": _NONE, "sum": _SUM, "mean": _MEAN}


def giou_loss_op(pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                 reduction: str = "mean", eps: float = 1e-7, ltrb: bool = False, grad_mode: str | None = None,
                 use_op: bool = False) -> torch.Tensor:
    """GIoU loss through the Triton kernels (arguments are assumed valid: see :func:`snntrain.losses.giou_loss`).

    ``weight`` must already have the shape ``pred.shape[:-1]`` (an expanded view is fine).
    ``grad_mode``: ``"separate"``, ``"fused"`` or ``None`` (:func:`default_grad_mode`).
    ``use_op``: go through the registered operator even in eager mode (always done
    under ``torch.compile``).
    """
    red = _REDUCTION_CODE[reduction]
    if grad_mode is None:
        fused_mode = pred.dtype in _HALF or pred.numel() <= 4 * FUSED_MAX_F32
    elif grad_mode in GRAD_MODES:
        fused_mode = grad_mode == "fused"
    else:
        raise ValueError(f"grad_mode={grad_mode!r} is not valid; choose one of {', '.join(map(repr, GRAD_MODES))}")
    if use_op or traced(pred, target, weight):
        fused = 0
        if fused_mode and torch.is_grad_enabled():
            fused = (1 if pred.requires_grad else 0) | (2 if target.requires_grad else 0)
        return torch.ops.snntrain.giou_loss(pred, target, weight, red, float(eps), bool(ltrb), fused)[0]
    if torch.is_grad_enabled() and (pred.requires_grad or target.requires_grad
                                    or (weight is not None and weight.requires_grad)):
        if _apply_c is None or _functorch_active():
            return _GIoULossFunction.apply(pred, target, weight, red, float(eps), bool(ltrb), fused_mode)
        return _apply_c(pred, target, weight, red, float(eps), bool(ltrb), fused_mode)
    # Nothing needs a gradient: the forward alone, no autograd node.
    with profiled(_FWD_NAME):
        return giou_forward(pred, target, weight, red, float(eps), bool(ltrb), 0, direct, True, False)[0]
