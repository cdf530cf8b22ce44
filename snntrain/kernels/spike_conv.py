"""Convolutions of spikes in FP8: the forward of a 2-D convolution whose input holds small integers (spikes, or sums
of a few spike maps) on the tensor cores' FP8 path.

Spikes and counts up to :data:`EXACT_MAX` are exact in FP8 (``e4m3``: three mantissa bits, so every integer from 0
to 16). The weight is rounded to ``e4m3`` with one scale per output channel (its largest magnitude maps to
:data:`E4M3_MAX`), from the master weight (float32 under autocast), on every call (:func:`quantize_weight`: one
kernel, one program per output channel). The convolution is an implicit matrix product (no unfolded copy of the
input): rows are output positions ``(n, ho, wo)``, columns output channels, the reduction runs over ``(kh, kw, ci)``
in steps of ``BLOCK_K`` input channels of one kernel position (:func:`~.spike_conv_tuning.conv_config`). The input is
read in place from a channels-last map, in its own dtype and converted in registers (or cast to e4m3 in one pass
first, where :data:`~.spike_conv_tuning.PRECAST` says so). The products are summed on the tensor cores into a float32
accumulator (on Hopper with about 14 bits of mantissa kept in the FP8 sums); the output is scaled per channel and
written channels-last in the requested dtype.

Registered as ``torch.ops.snntrain.spike_conv_fp8`` and ``torch.ops.snntrain.fp8_weight`` (:mod:`.op_utils`),
visible to ``torch.compile``; no autograd here (:class:`snntrain.nn.SpikeConv2d` runs the backward through
PyTorch's convolution backward). :func:`conv2d_reference` and :func:`quantize_weight_reference` are the same
arithmetic in PyTorch operations (the torch backend and the tests' reference: the same rounded weight, the sums in
float32).

What the kernel takes (:func:`unsupported` names what it does not): ``groups = 1``; input channels a multiple of
:data:`CHANNEL_MULTIPLE`; integer padding; a CUDA device of compute capability 8.9 or newer (Ada, Hopper and
later: :func:`fp8_device_reason`), or Triton's CPU interpreter.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import spike_conv_tuning as tuning
from .op_utils import INTERPRET, cdiv, direct, next_pow2, op_wrap, profiled, register_op, traced
from .spike_pool import output_size

#: The largest finite ``float8_e4m3fn`` value: a channel's largest weight magnitude is scaled to it.
E4M3_MAX = 448.0
#: Every integer from 0 to this is exact in ``e4m3``: the largest input value the FP8 path takes.
EXACT_MAX = 16
#: The input's channels must be a multiple of this (the FP8 matrix instructions reduce 32 values at a time).
CHANNEL_MULTIPLE = 32
#: The smallest scale: a channel of zero weights gets it (and stays zero).
_TINY = 1e-30


def fp8_device_reason(device: torch.device) -> str | None:
    """None where the FP8 kernels run on ``device`` (a CUDA GPU of compute capability 8.9 or newer, or Triton's CPU
    interpreter for CPU tensors), else why not."""
    if device.type == "cpu":
        return None if INTERPRET else "FP8 convolutions need a CUDA GPU (on the CPU only Triton's interpreter runs them)"
    if device.type != "cuda":
        return f"FP8 convolutions need a CUDA GPU, not a {device.type} device"
    return _cuda_fp8_reason(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=16)  # asked on every FP8 forward
def _cuda_fp8_reason(index: int) -> str | None:
    major, minor = torch.cuda.get_device_capability(index)
    if (major, minor) < (8, 9):
        return (f"{torch.cuda.get_device_name(index)} (compute capability {major}.{minor}) has no FP8 tensor cores; "
                "they need 8.9 or newer (Ada, Hopper, Blackwell)")
    return None


def unsupported(weight_shape, groups: int, padding) -> str | None:
    """None where the kernel takes a convolution of this weight shape, groups and padding, else what it does not
    take."""
    if groups != 1:
        return f"groups={groups} (only 1)"
    if isinstance(padding, str):
        return f"padding={padding!r} (only integers)"
    cin = weight_shape[1]
    if cin % CHANNEL_MULTIPLE:
        return f"{cin} input channels (a multiple of {CHANNEL_MULTIPLE} only)"
    return None


@triton.jit
def _round_e4m3(v):
    """``v`` (float32, ``|v| <= 448``) rounded to the nearest e4m3 value, ties to even, still in float32 (so the
    conversion that follows is exact: Triton's CPU interpreter rounds a carry into the exponent wrongly, 126.8 to
    64). Normal values keep three mantissa bits; below 2**-6 (e4m3's subnormals) the step is 2**-9, rounded by
    adding and taking away ``1.5 * 2**14``, whose float32 neighbours are ``2**-9`` apart."""
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # -1048576: 0xFFF00000, the low 20 bits cleared
    normal = bits.to(tl.float32, bitcast=True)
    magic = 24576.0
    sub = (v + magic) - magic
    return tl.where(tl.abs(v) < 0.015625, sub, normal)


@triton.jit
def _quantize_kernel(w_ptr, q_ptr, s_ptr, CIN, K, s0, s1, s2, s3, KW: tl.constexpr, BLOCK: tl.constexpr,
                     E4M3_MAX: tl.constexpr, TINY: tl.constexpr):
    """One output channel: its weights ``[CIN, KH, KW]`` (any strides) in the order ``(kh, kw, ci)``, scaled so the
    largest magnitude is ``E4M3_MAX``, rounded to e4m3; the scale (the weight is ``q * scale``) to ``s_ptr``."""
    co = tl.program_id(0)
    k = tl.arange(0, BLOCK)
    ci = k % CIN
    khw = k // CIN
    kh = khw // KW
    kw = khw - kh * KW
    mask = k < K
    w = tl.load(w_ptr + co.to(tl.int64) * s0 + ci * s1 + kh * s2 + kw * s3, mask=mask, other=0.0).to(tl.float32)
    # the scale as a product with float32(1 / E4M3_MAX), exact to the bit everywhere (PyTorch's CUDA division by a
    # number is such a product, its CPU division is not); the weights' division rounded to nearest, as PyTorch's
    # division of two tensors (the GPU's default division is an approximation)
    scale = tl.maximum(tl.max(tl.abs(w), axis=0) * (1.0 / E4M3_MAX), TINY)
    tl.store(q_ptr + co.to(tl.int64) * K + k, _round_e4m3(tl.div_rn(w, scale)).to(tl.float8e4nv), mask=mask)
    tl.store(s_ptr + co, scale)


@triton.jit
def _conv_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, H, W, C, HO, WO, COUT,
                 sxn, sxh, sxw, syn, syh, syw,
                 STRIDE_H: tl.constexpr, STRIDE_W: tl.constexpr, PAD_H: tl.constexpr, PAD_W: tl.constexpr,
                 DIL_H: tl.constexpr, DIL_W: tl.constexpr, KW: tl.constexpr, KT: tl.constexpr,
                 HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP_M: tl.constexpr):
    """One ``BLOCK_M x BLOCK_N`` tile of the output (positions x output channels); programs ordered in groups of
    ``GROUP_M`` row tiles so that neighbours share input rows in L2. ``x`` channels-last (channel stride 1),
    ``w`` e4m3 ``[COUT, KT]`` in ``(kh, kw, ci)`` order, ``KT = KH * KW * C``, ``C`` a multiple of ``BLOCK_K``."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(COUT, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    wo = rm % WO
    t = rm // WO
    ho = t % HO
    n = t // HO
    hi0 = ho * STRIDE_H - PAD_H
    wi0 = wo * STRIDE_W - PAD_W
    x_rows = x_ptr + n.to(tl.int64) * sxn
    in_m = rm < M
    w_rows = w_ptr + rn[:, None].to(tl.int64) * KT + rk[None, :]
    in_n = rn < COUT
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, KT, BLOCK_K):
        khw = k0 // C
        c0 = k0 - khw * C
        kh = khw // KW
        kw = khw - kh * KW
        hi = hi0 + kh * DIL_H
        wi = wi0 + kw * DIL_W
        ok = in_m & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
        a = tl.load(x_rows[:, None] + (hi * sxh + wi * sxw)[:, None] + (c0 + rk)[None, :], mask=ok[:, None],
                    other=0.0)
        b = tl.load(w_rows + k0, mask=in_n[:, None], other=0.0)
        # the FP8 tensor cores carry the float32 accumulator with about 14 bits of mantissa: a relative error far
        # below the weight's rounding (2**-4). Summing each step from zero and adding it on the CUDA cores keeps two
        # accumulators: 255 registers and 264-328 bytes of spills a thread on sm_90 (scripts/kernel_resources.py
        # --family spike_conv), against 215-241 registers and none
        acc = tl.dot(a.to(tl.float8e4nv), tl.trans(b), acc)
    out = acc * tl.load(s_ptr + rn, mask=in_n, other=0.0)[None, :]
    if HAS_BIAS:
        out += tl.load(b_ptr + rn, mask=in_n, other=0.0).to(tl.float32)[None, :]
    y_rows = y_ptr + n.to(tl.int64) * syn + ho * syh + wo * syw
    tl.store(y_rows[:, None] + rn[None, :], out.to(y_ptr.dtype.element_ty), mask=in_m[:, None] & in_n[None, :])


def _check_weight(weight: Tensor) -> None:
    if weight.dim() != 4:
        raise ValueError(f"weight of shape {tuple(weight.shape)}: a 2-D convolution's weight is [Cout, Cin, KH, KW]")


def _quantize_host(weight: Tensor, launch: bool = True, wrap=direct) -> tuple[Tensor, Tensor]:
    _check_weight(weight)
    cout, cin, kh, kw = weight.shape
    k = cin * kh * kw
    q = torch.empty((cout, k), dtype=torch.float8_e4m3fn, device=weight.device)
    s = torch.empty(cout, dtype=torch.float32, device=weight.device)
    if launch and cout and k:
        wrap(_quantize_kernel)[(cout,)](weight, q, s, cin, k, *weight.stride(), KW=kw, BLOCK=next_pow2(k),
                                        E4M3_MAX=E4M3_MAX, TINY=_TINY, num_warps=tuning.QUANT_WARPS)
    return q, s


def _conv_host(x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None, kernel_size: list[int], stride: list[int],
               padding: list[int], dilation: list[int], dtype: torch.dtype, launch: bool = True,
               wrap=direct) -> Tensor:
    n, c, h, w = x.shape
    kh, kw = kernel_size
    cout = q.shape[0]
    if q.shape[1] != c * kh * kw:
        raise ValueError(f"FP8 weight of shape {tuple(q.shape)} does not fit {c} input channels and a {kh}x{kw} "
                         f"kernel ([Cout, {c * kh * kw}] does)")
    if c % CHANNEL_MULTIPLE:
        raise ValueError(f"{c} input channels: the FP8 convolution takes a multiple of {CHANNEL_MULTIPLE}")
    ho = output_size(h, kh, stride[0], padding[0], dilation[0], False)
    wo = output_size(w, kw, stride[1], padding[1], dilation[1], False)
    y = torch.empty((n, cout, ho, wo), dtype=dtype, device=x.device, memory_format=torch.channels_last)
    m = n * ho * wo
    if launch and m and cout:
        bm, bn, bk, group, warps, stages = tuning.conv_config(c, cout, kh * kw)
        if tuning.PRECAST and x.dtype != torch.float8_e4m3fn:  # one pass to e4m3 (exact), channels-last
            x = x.to(dtype=torch.float8_e4m3fn, memory_format=torch.channels_last)
        elif x.stride(1) != 1:
            x = x.contiguous(memory_format=torch.channels_last)
        grid = (cdiv(m, bm) * cdiv(cout, bn),)
        wrap(_conv_kernel)[grid](
            x, q, scale, scale if bias is None else bias, y, m, h, w, c, ho, wo, cout,
            x.stride(0), x.stride(2), x.stride(3), y.stride(0), y.stride(2), y.stride(3),
            STRIDE_H=stride[0], STRIDE_W=stride[1], PAD_H=padding[0], PAD_W=padding[1], DIL_H=dilation[0],
            DIL_W=dilation[1], KW=kw, KT=c * kh * kw, HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=bn,
            BLOCK_K=bk, GROUP_M=group, num_warps=warps, num_stages=stages)
    return y


def _quantize_op(weight: Tensor) -> tuple[Tensor, Tensor]:
    """``(q, scale)``: ``weight`` ``[Cout, Cin, KH, KW]`` as e4m3 ``[Cout, KH * KW * Cin]`` and float32 scales
    ``[Cout]``."""
    return _quantize_host(weight, wrap=op_wrap)


def _quantize_fake(weight):
    return _quantize_host(weight, launch=False)


def _conv_op(x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None, kernel_size: list[int], stride: list[int],
             padding: list[int], dilation: list[int], dtype: torch.dtype) -> Tensor:
    """The convolution of ``x`` (integers 0..16, any float dtype) with the weight ``q * scale``, channels-last
    output in ``dtype``."""
    return _conv_host(x, q, scale, bias, kernel_size, stride, padding, dilation, dtype, wrap=op_wrap)


def _conv_fake(x, q, scale, bias, kernel_size, stride, padding, dilation, dtype):
    return _conv_host(x, q, scale, bias, kernel_size, stride, padding, dilation, dtype, launch=False)


fp8_weight = register_op("snntrain::fp8_weight", _quantize_op, _quantize_fake)
spike_conv_fp8 = register_op("snntrain::spike_conv_fp8", _conv_op, _conv_fake)


def quantize_weight(weight: Tensor) -> tuple[Tensor, Tensor]:
    """``(q, scale)`` of ``weight`` with the Triton kernel: the registered operator under tracing, a direct launch
    otherwise."""
    if traced(weight):
        return fp8_weight(weight)
    with profiled("snntrain::fp8_weight"):
        return _quantize_host(weight)


def conv2d(x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None, kernel_size, stride, padding, dilation,
           dtype: torch.dtype) -> Tensor:
    """The FP8 convolution with the Triton kernel (the registered operator under tracing)."""
    args = (list(kernel_size), list(stride), list(padding), list(dilation), dtype)
    if traced(x, q, scale, bias):
        return spike_conv_fp8(x, q, scale, bias, *args)
    with profiled("snntrain::spike_conv_fp8"):
        return _conv_host(x, q, scale, bias, *args)


def quantize_weight_reference(weight: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`quantize_weight` in PyTorch operations."""
    _check_weight(weight)
    w = weight.detach().permute(0, 2, 3, 1).reshape(weight.shape[0], -1).float()
    scale = (w.abs().amax(1) * (1.0 / E4M3_MAX)).clamp_min(_TINY) if w.numel() else w.new_zeros(weight.shape[0])
    return (w / scale[:, None]).to(torch.float8_e4m3fn), scale


def _conv_weight(rows: Tensor, kernel_size) -> Tensor:
    """``[Cout, KH * KW * Cin]`` rows in ``(kh, kw, ci)`` order as a convolution's weight ``[Cout, Cin, KH, KW]``."""
    kh, kw = kernel_size
    return rows.reshape(rows.shape[0], kh, kw, -1).permute(0, 3, 1, 2)


def dequantize(q: Tensor, scale: Tensor, kernel_size) -> Tensor:
    """The weight ``[Cout, Cin, KH, KW]`` (float32) that ``(q, scale)`` stands for."""
    return _conv_weight(q.float() * scale[:, None], kernel_size)


def conv2d_reference(x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None, kernel_size, stride, padding,
                     dilation, dtype: torch.dtype) -> Tensor:
    """:func:`conv2d` in PyTorch operations, in the kernel's order: the convolution with the e4m3 values ``q``
    summed in float32 (exact products: TF32's ten mantissa bits hold e4m3's three), then scaled per output channel,
    the bias added; channels-last output in ``dtype``."""
    w = _conv_weight(q.float(), kernel_size)
    y = torch.nn.functional.conv2d(x.float(), w, None, list(stride), list(padding), list(dilation))
    y = y * scale.view(1, -1, 1, 1)
    if bias is not None:
        y = y + bias.float().view(1, -1, 1, 1)
    return y.to(dtype).contiguous(memory_format=torch.channels_last)
