"""Spikes packed into bits: the form in which a convolution of spikes keeps its input for the backward.

A tensor that holds integers in ``[0, 2**BITS - 1]`` (0/1 spikes: ``BITS = 1``; a sum of up to three spike maps:
2; up to fifteen: 4; up to 255: 8) is kept as ``ceil(numel * BITS / 8)`` bytes: element ``i`` of the tensor's
**memory order** (its storage, read in place: row-major or channels-last alike) is bits ``[(i % PER) * BITS,
(i % PER + 1) * BITS)`` of byte ``i // PER``, ``PER = 8 // BITS``; the unused bits of the last byte are 0.
Unpacking writes the values back, in any floating dtype, into a tensor of the original shape and strides, so a
channels-last map comes back channels-last. Bits above ``BITS`` of an input value are dropped (the value is taken
modulo ``2**BITS``; truncated toward zero first if it is not an integer): the caller guarantees the range.

Registered as ``torch.ops.snntrain.spike_pack`` and ``torch.ops.snntrain.spike_unpack`` (:mod:`.op_utils`: a
``triton_op`` visible to ``torch.compile``; no autograd: the packed form is a saved tensor, not a differentiable
value). :func:`pack_reference` and :func:`unpack_reference` are the same format in PyTorch operations, the torch
backend's implementation and the tests' reference.

Bytes moved: the pack reads the input and writes ``1 / (8 / BITS)`` of a byte an element; the unpack the reverse.
Both are one pass over flat memory, ``ELEMENTS`` elements a program, offsets 32-bit unless the tensor has more than
``2**31`` elements.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .op_utils import INT32_MAX, cdiv, direct, op_wrap, profiled, register_op, traced

#: The widths a packed element can have.
WIDTHS = (1, 2, 4, 8)
#: Elements per program in both kernels.
ELEMENTS = 8192
WARPS = 8


def width_for(value_max: int) -> int:
    """The fewest bits of :data:`WIDTHS` that hold every integer in ``[0, value_max]``; ``value_max`` from 1 to
    255."""
    if isinstance(value_max, bool) or not isinstance(value_max, int) or not 1 <= value_max <= 255:
        raise ValueError(f"value_max={value_max!r} must be an int from 1 to 255 (the largest value to pack)")
    return next(b for b in WIDTHS if value_max < 1 << b)


@triton.jit
def _block(BITS: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    """The program's ``BLOCK`` packed bytes and, for each, its ``8 // BITS`` lanes: ``(offs_b [BLOCK], lane [PER],
    offs [BLOCK, PER])``, ``offs`` the elements' indices in memory order."""
    PER: tl.constexpr = 8 // BITS
    pid = tl.program_id(0)
    if WIDE:
        pid = pid.to(tl.int64)
    offs_b = pid * BLOCK + tl.arange(0, BLOCK)
    lane = tl.arange(0, PER)
    return offs_b, lane, offs_b[:, None] * PER + lane[None, :]


@triton.jit
def _pack_kernel(x_ptr, p_ptr, n, nbytes, BITS: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    offs_b, lane, offs = _block(BITS, BLOCK, WIDE)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0).to(tl.int32) & ((1 << BITS) - 1)
    packed = tl.sum(v << (lane[None, :] * BITS), axis=1)
    tl.store(p_ptr + offs_b, packed.to(tl.uint8), mask=offs_b < nbytes)


@triton.jit
def _unpack_kernel(p_ptr, y_ptr, n, nbytes, BITS: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    offs_b, lane, offs = _block(BITS, BLOCK, WIDE)
    b = tl.load(p_ptr + offs_b, mask=offs_b < nbytes, other=0).to(tl.int32)
    v = (b[:, None] >> (lane[None, :] * BITS)) & ((1 << BITS) - 1)
    # through float32: exact for these small integers, and the interpreter converts int32 to bfloat16 wrongly
    tl.store(y_ptr + offs, v.to(tl.float32).to(y_ptr.dtype.element_ty), mask=offs < n)


def dense(x: Tensor) -> Tensor:
    """``x`` itself where its elements fill one block of memory (row-major, or channels-last for a 4-D map), else
    a row-major copy: what :func:`pack` reads in memory order."""
    if x.is_contiguous() or (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)):
        return x
    return x.contiguous()


def _flat(x: Tensor) -> Tensor:
    """The elements of a :func:`dense` tensor in memory order, as a 1-D view."""
    return x.as_strided((x.numel(),), (1,))


def packed_bytes(numel: int, bits: int) -> int:
    return cdiv(numel, 8 // bits) if numel else 0


def _check_packed(p: Tensor, n: int, bits: int) -> None:
    if p.numel() != packed_bytes(n, bits):
        raise ValueError(f"{p.numel()} packed bytes do not hold {n} elements of {bits} bits "
                         f"({packed_bytes(n, bits)} bytes do)")


def _check_bits(bits: int) -> None:
    if bits not in WIDTHS:
        raise ValueError(f"bits={bits!r} is not a packed width; choose one of {WIDTHS}")


def _pack_host(x: Tensor, bits: int, launch: bool = True, wrap=direct) -> Tensor:
    _check_bits(bits)
    x = dense(x)
    n = x.numel()
    p = torch.empty(packed_bytes(n, bits), dtype=torch.uint8, device=x.device)
    if launch and n:
        block = ELEMENTS * bits // 8
        wrap(_pack_kernel)[(cdiv(p.numel(), block),)](x, p, n, p.numel(), BITS=bits, BLOCK=block,
                                                      WIDE=n > INT32_MAX - ELEMENTS, num_warps=WARPS)
    return p


def _unpack_host(p: Tensor, bits: int, shape: list[int], stride: list[int], dtype: torch.dtype,
                 launch: bool = True, wrap=direct) -> Tensor:
    _check_bits(bits)
    y = torch.empty_strided(shape, stride, dtype=dtype, device=p.device)
    n = y.numel()
    _check_packed(p, n, bits)
    if launch and n:
        block = ELEMENTS * bits // 8
        wrap(_unpack_kernel)[(cdiv(p.numel(), block),)](p, y, n, p.numel(), BITS=bits, BLOCK=block,
                                                        WIDE=n > INT32_MAX - ELEMENTS, num_warps=WARPS)
    return y


def _pack_op(x: Tensor, bits: int) -> Tensor:
    """``x``'s values (integers in ``[0, 2**bits - 1]``), ``bits`` each, packed in its memory order (uint8, 1-D)."""
    return _pack_host(x, bits, wrap=op_wrap)


def _pack_fake(x, bits):
    return _pack_host(x, bits, launch=False)


def _unpack_op(p: Tensor, bits: int, shape: list[int], stride: list[int], dtype: torch.dtype) -> Tensor:
    """The tensor of ``shape`` and ``stride`` in ``dtype`` whose values :func:`pack` packed into ``p``."""
    return _unpack_host(p, bits, shape, stride, dtype, wrap=op_wrap)


def _unpack_fake(p, bits, shape, stride, dtype):
    return _unpack_host(p, bits, shape, stride, dtype, launch=False)


spike_pack = register_op("snntrain::spike_pack", _pack_op, _pack_fake)
spike_unpack = register_op("snntrain::spike_unpack", _unpack_op, _unpack_fake)


def pack(x: Tensor, bits: int) -> Tensor:
    """``x`` packed ``bits`` an element with the Triton kernel: the registered operator under ``torch.compile`` and
    ``torch.export`` (:func:`~.op_utils.traced`), a direct launch otherwise (under the operator's name while a
    profiler records)."""
    if traced(x):
        return spike_pack(x, bits)
    with profiled("snntrain::spike_pack"):
        return _pack_host(x, bits)


def unpack(p: Tensor, bits: int, shape, stride, dtype: torch.dtype) -> Tensor:
    """The inverse of :func:`pack`: a tensor of ``shape`` and ``stride`` (those of the packed tensor, or of its
    :func:`dense` copy) in ``dtype``; the registered operator or a direct launch, as :func:`pack`."""
    if traced(p):
        return spike_unpack(p, bits, list(shape), list(stride), dtype)
    with profiled("snntrain::spike_unpack"):
        return _unpack_host(p, bits, list(shape), list(stride), dtype)


def _shifts(bits: int, device: torch.device) -> Tensor:
    return torch.arange(0, 8, bits, dtype=torch.uint8, device=device)


def pack_reference(x: Tensor, bits: int) -> Tensor:
    """:func:`pack` in PyTorch operations (the same bytes)."""
    _check_bits(bits)
    flat = _flat(dense(x))
    per = 8 // bits
    v = flat.to(torch.int32).bitwise_and_((1 << bits) - 1).to(torch.uint8)
    pad = packed_bytes(flat.numel(), bits) * per - flat.numel()
    if pad:
        v = torch.cat([v, v.new_zeros(pad)])
    return (v.view(-1, per) << _shifts(bits, x.device)).sum(1, dtype=torch.uint8)


def unpack_reference(p: Tensor, bits: int, shape, stride, dtype: torch.dtype) -> Tensor:
    """:func:`unpack` in PyTorch operations (the same values)."""
    _check_bits(bits)
    y = torch.empty_strided(list(shape), list(stride), dtype=dtype, device=p.device)
    n = y.numel()
    _check_packed(p, n, bits)
    v = (p[:, None] >> _shifts(bits, p.device)).bitwise_and_((1 << bits) - 1)
    _flat(y).copy_(v.view(-1)[:n])
    return y
