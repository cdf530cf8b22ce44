"""2-D max pooling in Triton: one forward kernel and one backward kernel, PyTorch's results bit for bit.

Registered as ``torch.ops.snntrain.max_pool_fwd`` and ``torch.ops.snntrain.max_pool_bwd`` with autograd
(:mod:`snntrain.kernels.op_utils`: a ``triton_op`` visible to ``torch.compile`` and the profiler, an eager
``autograd.Function`` outside tracing); nothing synchronises with the host, so a CUDA graph captures them.
The models pool spikes with it (:class:`snntrain.nn.SpikeMaxPool2d`), but nothing here assumes 0/1 values:
the result is ``torch.nn.functional.max_pool2d``'s for any floating input.

Semantics (those of PyTorch's CUDA kernels, checked by the tests)
-----------------------------------------------------------------
The forward scans each window row by row (``kh`` outer, ``kw`` inner) over its positions inside the input
(padding is never a candidate) and keeps a value when it is greater than the best so far, or NaN, or the
window's first position inside the input: on ties the FIRST position in scan order wins (of spikes, the
first 1, or the first position when all are 0), and a NaN wins over everything after it. The comparison is
in fp32, which is exact for every input dtype. (One corner differs: a window whose values are all -inf gets
its first position here, as in PyTorch's CPU and NCHW CUDA kernels, while its channels-last CUDA kernel
records the map's position (0, 0) for it.) The backward routes each output's gradient to that position:
each input element sums, in fp32, the gradients of the outputs whose chosen position it is, in ascending
output order (row by row), and rounds the sum once to the input's dtype. That is what PyTorch's CUDA kernel
does; PyTorch's CPU kernel adds 16-bit gradients in their own dtype instead (rounding after every addition),
so on the CPU the reference for fp16/bf16 is PyTorch's result on the fp32 copy, rounded.

What the forward saves
----------------------
PyTorch's ``max_pool2d`` keeps the input and writes an int64 index per output element (8 B) for its
backward. Here the forward writes, per output element, the window position of its maximum,
``kh * KW + kw``, as one uint8 byte (windows of up to :data:`MAX_WINDOW` elements), and nothing else: the
backward needs neither the input nor its values. On the SEW-ResNet stem (``[T*B, 64, 112, 112]`` bf16 spikes
pooled 3x3/2 to 56x56: four input elements per output) PyTorch keeps 16 B per output element (8 B of index,
8 B of input), this 1 B.
Bytes moved: the forward reads the input and writes the output and the positions, the backward reads the
output gradient and the positions and writes the input gradient; ``2 E_in + 2 E_out + 2 P`` in all, with
``E`` a tensor's bytes and ``P`` the positions' (one byte per output element).

Kernels and layouts
-------------------
A program owns a tile of ``BLOCK_P`` pixels by ``BLOCK_C`` channels (:mod:`.spike_pool_tuning`). The
forward walks the window (unrolled: ``KH``, ``KW``, strides, padding and dilation are compile-time
constants) loading the tile's input pixel at each window position, the overlap between neighbouring
windows coming from the caches. The backward is a gather, no atomics: each input pixel visits the (at
most ``KH * KW``) outputs whose window covers it, in ascending output order, reads their saved positions
and adds the gradient where the position is its own. Every tensor is addressed through its four strides
(``[N, C, H, W]`` logical order), so NCHW, channels-last and strided views are read in place; on
channels-last maps (channels the unit stride) a pixel's channels are contiguous, one vector load each.
Outputs and the input gradient take the input's memory format (channels-last in, channels-last out), as
PyTorch's do. Offsets are 32-bit unless a tensor spans more than 2**31 elements (``WIDE``: 64-bit).

The same gather for the stem's 3x3, stride-2, padding-1 windows, seen from one tile of input pixels, is written
as device helpers (:func:`_stem_windows`, :func:`_stem_window_grad`) for the norm-neuron backward that
:mod:`snntrain.kernels.bn_neuron_pool` runs with the pool fused into it.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import spike_pool_tuning as tuning
from .op_utils import FLOAT_DTYPES, INT32_MAX, cdiv, direct, eager_function, op_wrap, profiled, register_op, traced

__all__ = ["MAX_WINDOW", "max_pool2d", "unsupported", "pool_params", "output_size", "max_pool_fwd", "max_pool_bwd"]

#: The largest window (``KH * KW`` elements) the kernels take: the window is unrolled at compile time and
#: its positions are stored in one byte.
MAX_WINDOW = 64


# ----------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------


@triton.jit
def _pixel_tile(P, C, H, W, WIDE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's tile of ``BLOCK_P`` pixels (of ``P`` = N x H x W, row-major) x ``BLOCK_C`` channels: each pixel's
    sample, row and column, the channels, and the masks of both (64-bit indices when ``WIDE``)."""
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    if WIDE:
        p = p.to(tl.int64)
        c = c.to(tl.int64)
    col = p % W
    t = p // W
    return t // H, t % H, col, c, p < P, c < C


@triton.jit
def _max_pool_fwd_kernel(
    x_ptr,  # [N, C, H, W] input, any strides (sx_*)
    y_ptr,  # [N, C, Ho, Wo] window maxima, x's dtype (strides sy_*)
    pos_ptr,  # [N, C, Ho, Wo] uint8 window position of each maximum, kh * KW + kw (y's strides); if STORE_POS
    P, C, H, W, Ho, Wo,  # P = N * Ho * Wo output pixels
    sx_n, sx_c, sx_h, sx_w,
    sy_n, sy_c, sy_h, sy_w,
    KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
    PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
    STORE_POS: tl.constexpr, WIDE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    n, oh, ow, c, p_ok, c_ok = _pixel_tile(P, C, Ho, Wo, WIDE, BLOCK_P, BLOCK_C)
    x_c = c[None, :] * sx_c
    x_n = n * sx_n
    h0 = oh * SH - PH
    w0 = ow * SW - PW
    best = tl.full([BLOCK_P, BLOCK_C], float("-inf"), tl.float32)
    pos = tl.full([BLOCK_P, BLOCK_C], 255, tl.int32)  # 255: no position inside the input seen yet
    for kh in tl.static_range(KH):
        ih = h0 + kh * DH
        h_ok = p_ok & (ih >= 0) & (ih < H)
        for kw in tl.static_range(KW):
            iw = w0 + kw * DW
            m = (h_ok & (iw >= 0) & (iw < W))[:, None] & c_ok[None, :]
            v = tl.load(x_ptr + (x_n + ih * sx_h + iw * sx_w)[:, None] + x_c, mask=m,
                        other=float("-inf")).to(tl.float32)
            # PyTorch's rule: greater than the best so far, or NaN; and the first position inside the input
            take = m & ((v > best) | (v != v) | (pos == 255))
            best = tl.where(take, v, best)
            pos = tl.where(take, kh * KW + kw, pos)
    m = p_ok[:, None] & c_ok[None, :]
    tl.store(y_ptr + (n * sy_n + oh * sy_h + ow * sy_w)[:, None] + c[None, :] * sy_c,
             best.to(y_ptr.dtype.element_ty), mask=m)
    if STORE_POS:
        tl.store(pos_ptr + (n * sy_n + oh * sy_h + ow * sy_w)[:, None] + c[None, :] * sy_c, pos.to(tl.uint8), mask=m)


@triton.jit
def _max_pool_bwd_kernel(
    g_ptr,  # [N, C, Ho, Wo] dL/dy, any strides (sg_*; 0 for an expanded gradient)
    pos_ptr,  # [N, C, Ho, Wo] uint8 window positions the forward chose (strides sp_*)
    dx_ptr,  # [N, C, H, W] dL/dx, g's dtype (strides sd_*)
    Q, C, H, W, Ho, Wo,  # Q = N * H * W input pixels
    sg_n, sg_c, sg_h, sg_w,
    sp_n, sp_c, sp_h, sp_w,
    sd_n, sd_c, sd_h, sd_w,
    KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
    PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
    WIDE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    n, ih, iw, c, q_ok, c_ok = _pixel_tile(Q, C, H, W, WIDE, BLOCK_P, BLOCK_C)
    g_c = c[None, :] * sg_c
    p_c = c[None, :] * sp_c
    g_n = n * sg_n
    p_n = n * sp_n
    acc = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
    # window row kh of output row oh covers input row ih when oh * SH - PH + kh * DH == ih; kh descending
    # is oh ascending (and kw descending ow ascending): the outputs in PyTorch's order
    for jh in tl.static_range(KH):
        kh = KH - 1 - jh
        hn = ih + PH - kh * DH
        oh = hn // SH
        h_ok = q_ok & (hn >= 0) & (hn % SH == 0) & (oh < Ho)
        for jw in tl.static_range(KW):
            kw = KW - 1 - jw
            wn = iw + PW - kw * DW
            ow = wn // SW
            m = (h_ok & (wn >= 0) & (wn % SW == 0) & (ow < Wo))[:, None] & c_ok[None, :]
            chosen = tl.load(pos_ptr + (p_n + oh * sp_h + ow * sp_w)[:, None] + p_c, mask=m, other=255)
            # loaded whatever the position, so that the gradient's loads do not wait for the positions'
            g = tl.load(g_ptr + (g_n + oh * sg_h + ow * sg_w)[:, None] + g_c, mask=m, other=0.0).to(tl.float32)
            acc += tl.where(chosen.to(tl.int32) == kh * KW + kw, g, 0.0)
    m = q_ok[:, None] & c_ok[None, :]
    tl.store(dx_ptr + (n * sd_n + ih * sd_h + iw * sd_w)[:, None] + c[None, :] * sd_c,
             acc.to(dx_ptr.dtype.element_ty), mask=m)



# ----------------------------------------------------------------------------
# The backward's gather seen from inside another kernel: the stem's 3x3, stride-2, padding-1 windows
# ----------------------------------------------------------------------------


@triton.jit
def _stem_windows(offs_s, W, Ho, Wo):
    """The windows of a 3x3, stride-2, padding-1 max-pool (``Ho x Wo`` outputs) that cover the input pixels
    ``offs_s`` (row-major indices into a map ``W`` wide): at most four, in ascending output order, the order in which
    :func:`_max_pool_bwd_kernel` adds their gradients. Input row ``ih`` is covered by output row ``ih // 2`` at window
    row ``1 + ih % 2`` and, for odd ``ih``, by the next output row (if there is one) at window row 0; columns
    likewise. Returns the four windows' output pixels ``oh * Wo + ow``, whether the second, third and fourth exist
    (the first always does) and the window position ``kh * 3 + kw`` the input pixel has in each."""
    ih = offs_s // W
    iw = offs_s % W
    oh = ih // 2
    ow = iw // 2
    kh = 1 + ih % 2
    kw = 1 + iw % 2
    below = (kh == 2) & (oh + 1 < Ho)  # odd row: the next output row covers it too, at kh = 0
    right = (kw == 2) & (ow + 1 < Wo)
    q = oh * Wo + ow
    return q, q + 1, q + Wo, q + Wo + 1, right, below, below & right, kh * 3 + kw, kh * 3, kw, kh * 0


@triton.jit
def _stem_window_grad(g_ptrs, p_ptrs, s_q, q0, q1, q2, q3, e1, e2, e3, c0, c1, c2, c3, mask,
                      BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr):
    """dL/dx of one step at a tile of input pixels x channels of the 3x3, stride-2, padding-1 max-pool, from
    dL/dy (``g_ptrs + q * s_q`` for output pixel ``q``) and the forward's uint8 positions (``p_ptrs + q * s_q``):
    the windows of :func:`_stem_windows` whose saved position is the pixel's, their gradients summed in fp32 in
    ascending output order, as :func:`_max_pool_bwd_kernel` sums them (the caller rounds once to the gradient's
    dtype). ``mask``: the tile's valid elements; ``e1`` .. ``e3``: which of the windows exist."""
    acc = tl.zeros([BLOCK_S, BLOCK_C], tl.float32)
    for i in tl.static_range(4):
        if i == 0:
            q, m, code = q0, mask, c0
        elif i == 1:
            q, m, code = q1, mask & e1[:, None], c1
        elif i == 2:
            q, m, code = q2, mask & e2[:, None], c2
        else:
            q, m, code = q3, mask & e3[:, None], c3
        off = (q.to(tl.int64) * s_q)[:, None]
        chosen = tl.load(p_ptrs + off, mask=m, other=255)
        # loaded whatever the position, so that the gradient's loads do not wait for the positions'
        g = tl.load(g_ptrs + off, mask=m, other=0.0).to(tl.float32)
        acc += tl.where(chosen.to(tl.int32) == code[:, None], g, 0.0)
    return acc

# ----------------------------------------------------------------------------
# Host functions
# ----------------------------------------------------------------------------


def output_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """The pooled length of ``size`` (PyTorch's rule: with ``ceil_mode`` the last window starts inside the
    input or its left padding)."""
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pair(name: str, value) -> tuple[int, int]:
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return int(value[0]), int(value[1])
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    raise ValueError(f"{name}={value!r} is not valid; give an integer or a pair of integers")


def pool_params(kernel_size, stride, padding, dilation, ceil_mode) -> list[int]:
    """``[KH, KW, SH, SW, PH, PW, DH, DW, ceil_mode]`` of ``max_pool2d``'s arguments (``stride`` None or empty:
    the kernel size), checked as PyTorch checks them: a clear ``ValueError`` naming the bad value."""
    kh, kw = _pair("kernel_size", kernel_size)
    sh, sw = (kh, kw) if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) \
        else _pair("stride", stride)
    ph, pw = _pair("padding", padding)
    dh, dw = _pair("dilation", dilation)
    for name, pair in (("kernel_size", (kh, kw)), ("stride", (sh, sw)), ("dilation", (dh, dw))):
        if min(pair) < 1:
            raise ValueError(f"{name}={pair} is not valid; it must be positive")
    if min(ph, pw) < 0 or ph > kh // 2 or pw > kw // 2:
        raise ValueError(f"padding={(ph, pw)} is not valid for kernel_size={(kh, kw)}; it must be between 0 and "
                         "half the kernel size")
    return [kh, kw, sh, sw, ph, pw, dh, dw, int(bool(ceil_mode))]


def unsupported(x: Tensor, params: list[int]) -> str | None:
    """Why the kernels cannot pool ``x`` (``[N, C, H, W]``) with ``params`` (:func:`pool_params`), or None."""
    kh, kw = params[0], params[1]
    if x.dim() != 4:
        return f"input of {x.dim()} dimensions (the kernels take [N, C, H, W] or [C, H, W])"
    if x.dtype not in FLOAT_DTYPES:
        return f"dtype {x.dtype} (the kernels take float32, float16 and bfloat16)"
    if kh * kw > MAX_WINDOW:
        return f"kernel_size={(kh, kw)} ({kh * kw} elements; the kernels take windows of up to {MAX_WINDOW})"
    return None


def _channels_last(t: Tensor) -> bool:
    """Whether PyTorch's pooling gives ``t``'s output and gradient the channels-last format."""
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def _format(channels_last: bool) -> torch.memory_format:
    return torch.channels_last if channels_last else torch.contiguous_format


def _wide(*tensors: Tensor) -> bool:
    """Whether an offset into one of the 4-D ``tensors`` may pass 32 bits (their largest offset: each dimension's
    last index times its stride; strides are never negative)."""
    for t in tensors:
        (n, c, h, w), (sn, sc, sh, sw) = t.shape, t.stride()
        if (n - 1) * sn + (c - 1) * sc + (h - 1) * sh + (w - 1) * sw >= INT32_MAX:
            return True
    return False


def _fwd_host(x: Tensor, params: list[int], save_pos: bool, launch: bool = True, wrap=direct) -> tuple[Tensor, Tensor]:
    """``(y, positions)``: the pooled map and, when ``save_pos``, the uint8 window positions (else empty)."""
    kh, kw, sh, sw, ph, pw, dh, dw, ceil_mode = params
    N, C, H, W = x.shape
    Ho = output_size(H, kh, sh, ph, dh, bool(ceil_mode))
    Wo = output_size(W, kw, sw, pw, dw, bool(ceil_mode))
    if Ho < 1 or Wo < 1:
        raise ValueError(f"max pooling of a {H}x{W} map with kernel_size={(kh, kw)}, stride={(sh, sw)}, padding="
                         f"{(ph, pw)}, dilation={(dh, dw)} gives a {Ho}x{Wo} output; it must be at least 1x1")
    fmt = _format(_channels_last(x))
    y = torch.empty((N, C, Ho, Wo), dtype=x.dtype, device=x.device, memory_format=fmt)
    pos = torch.empty((N, C, Ho, Wo) if save_pos else (0,), dtype=torch.uint8, device=x.device,
                      memory_format=fmt if save_pos else torch.contiguous_format)
    P = N * Ho * Wo
    if launch and P > 0 and C > 0:
        block_p, block_c = tuning.pool_tiles(C, x.stride(1) == 1)
        wrap(_max_pool_fwd_kernel)[(cdiv(P, block_p), cdiv(C, block_c))](
            x, y, pos if save_pos else None, P, C, H, W, Ho, Wo,
            *x.stride(), *y.stride(),
            KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw,
            STORE_POS=save_pos, WIDE=_wide(x, y) or P >= INT32_MAX, BLOCK_P=block_p, BLOCK_C=block_c,
            num_warps=tuning.WARPS,
        )
    return y, pos


def _bwd_host(grad_y: Tensor, pos: Tensor, params: list[int], launch: bool = True, wrap=direct) -> Tensor:
    """dL/dx from dL/dy and the forward's positions; ``params`` are the forward's plus ``[H, W, channels_last]``."""
    kh, kw, sh, sw, ph, pw, dh, dw, _ceil, H, W, channels_last = params
    N, C, Ho, Wo = grad_y.shape
    dx = torch.empty((N, C, H, W), dtype=grad_y.dtype, device=grad_y.device, memory_format=_format(bool(channels_last)))
    Q = N * H * W
    if launch and Q > 0 and C > 0:
        block_p, block_c = tuning.pool_tiles(C, dx.stride(1) == 1)
        wrap(_max_pool_bwd_kernel)[(cdiv(Q, block_p), cdiv(C, block_c))](
            grad_y, pos, dx, Q, C, H, W, Ho, Wo,
            *grad_y.stride(), *pos.stride(), *dx.stride(),
            KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw,
            WIDE=_wide(grad_y, pos, dx) or Q >= INT32_MAX, BLOCK_P=block_p, BLOCK_C=block_c,
            num_warps=tuning.WARPS,
        )
    return dx


# ----------------------------------------------------------------------------
# Operator registration
# ----------------------------------------------------------------------------


def _max_pool_fwd(x: Tensor, params: list[int], save_pos: bool) -> tuple[Tensor, Tensor]:
    """``(y, positions)``: ``x`` ``[N, C, H, W]`` max-pooled with ``params`` (``[KH, KW, SH, SW, PH, PW, DH, DW,
    ceil_mode]``) and the uint8 window position of each maximum (empty unless ``save_pos``)."""
    return _fwd_host(x, params, save_pos, wrap=op_wrap)


def _max_pool_fwd_fake(x, params, save_pos):
    return _fwd_host(x, params, save_pos, launch=False)


def _max_pool_bwd(grad_y: Tensor, pos: Tensor, params: list[int]) -> Tensor:
    """dL/dx of the pooling; ``params`` are the forward's followed by ``[H, W, channels_last]`` of its input."""
    return _bwd_host(grad_y, pos, params, wrap=op_wrap)


def _max_pool_bwd_fake(grad_y, pos, params):
    return _bwd_host(grad_y, pos, params, launch=False)


max_pool_fwd = register_op("snntrain::max_pool_fwd", _max_pool_fwd, _max_pool_fwd_fake)
max_pool_bwd = register_op("snntrain::max_pool_bwd", _max_pool_bwd, _max_pool_bwd_fake)


def _setup_context(ctx, inputs, output) -> None:
    x, params, save_pos = inputs
    _y, pos = output
    ctx.save_for_backward(pos)
    ctx.saved_pos = bool(save_pos)
    ctx.bwd_params = [*params, x.shape[2], x.shape[3], int(_channels_last(x))]
    ctx.mark_non_differentiable(pos)


def _backward(ctx, grad_y, _grad_pos, bwd=None):
    if grad_y is None or not ctx.needs_input_grad[0]:
        return None, None, None
    if not ctx.saved_pos:
        raise RuntimeError("max_pool_fwd ran with save_pos=False, so it kept nothing for a backward")
    (pos,) = ctx.saved_tensors
    return (bwd or max_pool_bwd)(grad_y, pos, ctx.bwd_params), None, None


max_pool_fwd.register_autograd(_backward, setup_context=_setup_context)


def _eager_bwd(grad_y, pos, params):
    with profiled("snntrain::max_pool_bwd"):
        return _bwd_host(grad_y, pos, params)


# The same forward and backward as the registered ops, launched without the operator machinery.
_EagerMaxPool = eager_function("snntrain::max_pool_fwd", _fwd_host, _setup_context,
                               functools.partial(_backward, bwd=_eager_bwd))


def max_pool2d(x: Tensor, params: list[int]) -> Tensor:
    """``torch.nn.functional.max_pool2d(x, ...)`` of ``x`` ``[N, C, H, W]`` with ``params`` (:func:`pool_params`)
    through the Triton kernels: the same values and gradients (see the module docstring), in ``x``'s memory
    format. The caller has checked :func:`unsupported`."""
    save_pos = torch.is_grad_enabled() and x.requires_grad
    fn = max_pool_fwd if traced(x) else _EagerMaxPool.apply
    y, _pos = fn(x, params, save_pos)
    return y
