"""Building blocks for multi-step spiking networks: time-distributed layers, convolutions of spikes that keep their
input as bytes, dropout over time and SEW connections."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from ..backend import FallbackWarning, check_backend, use_triton
from ..kernels import spike_conv, spike_pack
from ..validation import flag

CONNECTS = ("ADD", "AND", "IAND")


class MultiStep(nn.Sequential):
    """Apply stateless layers (conv, norm, pooling, linear) to every time step at once.

    Input ``[T, B, ...]`` is folded to ``[T * B, ...]``, run through the layers and
    unfolded again, so a convolution sees one large batch instead of T small ones.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 3:
            raise ValueError(f"MultiStep expects [T, B, ...] input, got shape {tuple(x.shape)}")
        t, b = x.shape[:2]
        x = x.flatten(0, 1)
        if not x.is_cuda and x.dim() == 4 and len(self) and isinstance(self[0], nn.Conv2d) and not x.is_contiguous():
            # PyTorch's CPU convolution (oneDNN) gets the weight gradient wrong (a different value on every call),
            # or crashes, on some channels-last maps (a strided 1x1 convolution of 4 channels, on several threads):
            # the CPU path hands a convolution contiguous maps. A channels-last weight alone still meets it, which is
            # why channels_last=auto keeps CPU models row-major
            x = x.contiguous()
        return super().forward(x).unflatten(0, (t, b))

    def folded(self, x: torch.Tensor) -> torch.Tensor:
        """The layers on a batch that is already folded, ``[N, ...]``: a static image ``[B, C, H, W]`` that a
        stem convolution reads once before its output is repeated over T (direct encoding)."""
        return super().forward(x)


#: The largest value :class:`SpikeConv2d` keeps exactly: its input is saved in at most one byte an element.
BYTE_MAX = 255

#: tensor (the base of the viewed input) -> (its view's geometry, version and the packing, the packed copy): see
#: :func:`pack_input`
_PACKED_COPIES = WeakIdKeyDictionary()


def _pack(x: torch.Tensor, bits: int, triton: bool) -> tuple[torch.Tensor, tuple]:
    """``(packed, packing)``: ``x`` packed ``bits`` an element (:mod:`snntrain.kernels.spike_pack`, its Triton
    kernel or the PyTorch reference) and what :func:`unpack_input` needs to unpack it, ``(bits, triton, (shape,
    stride))`` with the geometry of ``x`` (or of its row-major copy where ``x`` does not fill one block of memory)."""
    x = spike_pack.dense(x)
    packed = spike_pack.pack(x, bits) if triton else spike_pack.pack_reference(x, bits)
    return packed, (bits, triton, (tuple(x.shape), x.stride()))


def pack_input(x: torch.Tensor, bits: int, triton: bool) -> tuple[torch.Tensor, tuple]:
    """:func:`_pack` of ``x``, one copy for all the convolutions that read the same tensor (a block's first
    convolution and its shortcut): the copy is remembered beside the tensor ``x`` views, weakly (it goes when that
    tensor goes), and used again for the same view while the tensor is unchanged (its version counter; an in-place
    change makes a new copy). Under ``torch.compile`` every call packs."""
    if torch.compiler.is_compiling():
        return _pack(x, bits, triton)
    base = x if x._base is None else x._base
    key = (x.shape, x.stride(), x.storage_offset(), x.dtype, x.device, x._version, bits, triton)
    hit = _PACKED_COPIES.get(base)
    if hit is not None and hit[0] == key:
        return hit[1]
    copy = _pack(x, bits, triton)
    _PACKED_COPIES[base] = (key, copy)
    return copy


def unpack_input(packed: torch.Tensor, packing: tuple, dtype: torch.dtype) -> torch.Tensor:
    """The tensor :func:`pack_input` packed into ``packed``, in ``dtype``, from its ``packing``."""
    bits, triton, (shape, strides) = packing
    if triton:
        return spike_pack.unpack(packed, bits, shape, strides, dtype)
    return spike_pack.unpack_reference(packed, bits, shape, strides, dtype)


#: Where a SpikeConv2d with ``fp8`` on runs its forward in its own dtype instead: one warning per reason and process.
_fp8_fallback = FallbackWarning("SpikeConv2d(fp8=True): {reason}; this convolution's forward runs in its own dtype "
                                "instead")


def _fp8_conv2d(x, weight, bias, stride, padding, dilation, dtype, impl: str) -> torch.Tensor:
    """The convolution with the weight rounded to FP8 per output channel (:mod:`snntrain.kernels.spike_conv`):
    ``impl`` ``"triton"`` its kernels, ``"torch"`` the same arithmetic in PyTorch operations."""
    size = tuple(weight.shape[2:])
    if impl == "triton":
        q, scale = spike_conv.quantize_weight(weight)
        return spike_conv.conv2d(x, q, scale, bias, size, stride, padding, dilation, dtype)
    q, scale = spike_conv.quantize_weight_reference(weight)
    return spike_conv.conv2d_reference(x, q, scale, bias, size, stride, padding, dilation, dtype)


class _PackedInputConv2d(torch.autograd.Function):
    """``conv2d(x, weight, bias)`` keeping ``x`` for the backward as ``packed`` (:func:`pack_input`: ``x`` holds
    integers in ``[0, 2**bits - 1]``: spikes or spike counts), and the weight as it is (not autocast's 16-bit copy);
    the backward unpacks ``x`` in the convolution's dtype and runs PyTorch's convolution backward, so the gradients
    are those of :func:`torch.nn.functional.conv2d` bit for bit."""

    @staticmethod
    def forward(ctx, x, packed, packing, weight, bias, stride, padding, dilation, groups, dtype, fp8):
        ctx.save_for_backward(packed, weight)
        ctx.conv = (stride, padding, dilation, groups)
        ctx.packing = packing
        ctx.dtype, ctx.x_dtype, ctx.weight_dtype = dtype, x.dtype, weight.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.bias_sizes = None if bias is None else [bias.shape[0]]
        if fp8 is not None:  # the forward in FP8 (the rounded weight), the backward as below (the weight itself)
            return _fp8_conv2d(x, weight, bias, stride, padding, dilation, dtype or x.dtype, fp8)
        # under autocast (``dtype``, its dtype) autocast casts the input and parameters here as it does for
        # nn.Conv2d, the weight's cast from its per-forward cache
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, grad):
        packed, weight = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conv
        dtype = ctx.x_dtype if ctx.dtype is None else ctx.dtype
        if ctx.dtype is not None:
            weight = weight.to(dtype)
        x = unpack_input(packed, ctx.packing, dtype)
        need_x, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[3], ctx.needs_input_grad[4]
        gx, gw, gb = torch.ops.aten.convolution_backward(
            grad, x, weight, ctx.bias_sizes, stride, padding, dilation, False, [0, 0], groups,
            [need_x, need_w, need_b and ctx.bias_sizes is not None])
        return (None if gx is None else gx.to(ctx.x_dtype), None, None, None if gw is None else gw.to(ctx.weight_dtype),
                None if gb is None else gb.to(ctx.bias_dtype), None, None, None, None, None, None)


class PackedInput:
    """What a layer that keeps its input packed (:class:`SpikeConv2d`, :class:`~snntrain.nn.attention.SpikeLinear`)
    adds to its ``torch.nn`` base, first in its bases: the keywords ``input_max`` (the largest input value, 1 to
    255; the packing's width follows) and ``backend``, both checked before the layer is built, its repr, and
    :meth:`packed`, its input packed for the backward."""

    def __init__(self, *args, input_max: int = BYTE_MAX, backend: str = "auto", **kwargs) -> None:
        bits = spike_pack.width_for(input_max)  # validates input_max, before anything is built
        backend = check_backend(backend)
        super().__init__(*args, **kwargs)
        self.input_max, self.bits, self.backend = input_max, bits, backend

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, input_max={self.input_max}, kept in {self.bits} bit{'s' * (self.bits > 1)}"

    def packed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """:func:`pack_input` of ``x`` with this layer's width and backend."""
        return pack_input(x, self.bits, use_triton(self.backend, x))


class SpikeConv2d(PackedInput, nn.Conv2d):
    """A :class:`torch.nn.Conv2d` over spikes or spike counts that keeps its input for the backward packed into the
    fewest bits that hold it exactly, and the weight itself instead of autocast's 16-bit copy of it.

    ``input_max`` (keyword; 1 to 255, default 255) is the largest input value: 1 (binary spikes) keeps one bit an
    element (a sixteenth of bfloat16's bytes), up to 3 two bits, up to 15 four, up to 255 a byte
    (:mod:`snntrain.kernels.spike_pack`: the elements in their memory order, so a channels-last map comes back
    channels-last). ``backend`` (``auto``, ``torch``, ``triton``; :mod:`snntrain.backend`) picks the packing's
    Triton kernels or its PyTorch reference, which write the same bytes.

    Its parameters, state dict, output and gradients are the ``Conv2d``'s, bit for bit, **for input of integers in
    [0, input_max]** (0/1 spikes, or sums of at most ``input_max`` of them). Any other input (an image, a membrane
    current, dropout's scaled spikes, negative values, a count above the bound) would get a wrong weight gradient,
    so a network builds this class only where its input is integers in that range by construction: the model
    families' layer factories (:class:`snntrain.models.LayerFactory`, :class:`snntrain.nn.attention.SpikingParts`)
    build it for a convolution whose input the network declares as the output of its neurons (and only for neurons
    that declare the integers they fire, :func:`snntrain.nn.neurons.spike_max`), or as a sum of such outputs whose
    largest value is at most 255, with that bound as ``input_max``; a stem convolution reading the image, or one
    reading currents (MS-ResNet's shortcut), stays a ``Conv2d``. The model option ``spike_bytes: false`` builds
    ``Conv2d`` everywhere.

    The narrow path runs in training with a gradient recorded; evaluation, ``torch.no_grad``, unbatched ``[C, H, W]``
    input and a ``padding_mode`` other than ``zeros`` (whose padding would keep the input for its own backward) run
    ``Conv2d.forward``. The convolutions that read one tensor (a block's first one and its shortcut) keep one packed
    copy of it between them.

    ``check_input = True`` (an attribute; off by default, when it costs nothing) asserts on the device that the input
    is integers in [0, input_max] (``torch._assert_async``: no wait for the device on CUDA, where a failure ends the
    process as a device-side assertion), for debugging a network of one's own.

    ``fp8`` (keyword, and an attribute that :func:`set_spike_fp8` switches; default False) runs the training forward
    in FP8 (:mod:`snntrain.kernels.spike_conv`): the input exact (integers up to 16), the weight rounded to ``e4m3``
    with one scale per output channel from the master weight on every call, the sums in float32, the output in the
    convolution's dtype (autocast's, else the input's) and channels-last. The backward is the one above, with the
    weight itself (the rounding passes the gradient straight through), so only the forward's values change, by the
    weight's rounding (a relative step of 2**-4 at most per weight). Under ``backend=torch`` the same arithmetic runs
    in PyTorch operations. Where the Triton kernel cannot run it (a GPU older than compute capability 8.9, an
    ``input_max`` above 16, ``groups`` other than 1, input channels not a multiple of 32) the forward is
    ``Conv2d``'s, with one warning per reason. Evaluation and ``torch.no_grad`` calls stay ``Conv2d``'s, so a
    checkpoint trained with it validates, exports and runs like any other.
    """

    check_input = False

    def __init__(self, *args, fp8: bool = False, **kwargs) -> None:
        fp8 = flag("fp8", fp8)
        super().__init__(*args, **kwargs)
        self.fp8 = fp8

    def extra_repr(self) -> str:
        return super().extra_repr() + (", forward in fp8" if self.fp8 else "")

    def _fp8_impl(self, x: torch.Tensor, padding) -> str | None:
        """``"triton"`` or ``"torch"``: how this call's FP8 forward runs; None (after one warning per reason) where
        it cannot."""
        if self.input_max > spike_conv.EXACT_MAX:
            reason = (f"input_max={self.input_max} is above {spike_conv.EXACT_MAX}, the largest integer up to which "
                      "FP8 (e4m3) holds every value")
        else:
            reason = spike_conv.unsupported(self.weight.shape, self.groups, padding)
        if reason is None:
            if not use_triton(self.backend, x):
                return "torch"
            reason = spike_conv.fp8_device_reason(x.device)
            if reason is None:
                return "triton"
        _fp8_fallback(reason, stacklevel=4)
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.dim() != 4 or self.padding_mode != "zeros" or not self.training or not torch.is_grad_enabled()
                or not (x.requires_grad or self.weight.requires_grad)):
            return super().forward(x)
        if self.check_input:
            torch._assert_async(((x >= 0) & (x <= self.input_max) & (x == torch.round(x))).all(),
                                f"{type(self).__name__}: input values must be integers in [0, {self.input_max}] "
                                "(spikes or spike counts); use torch.nn.Conv2d for other input")
        padding = self.padding
        if isinstance(padding, str):  # "valid", or "same": as many zeros on both sides, or one more after
            total = [d * (k - 1) for d, k in zip(self.dilation, self.kernel_size)] if padding == "same" else [0, 0]
            if all(t % 2 == 0 for t in total):
                padding = tuple(t // 2 for t in total)
            else:  # as Conv2d does: pad the input, then no padding
                x, padding = F.pad(x, self._reversed_padding_repeated_twice), (0, 0)
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        fp8 = self._fp8_impl(x, padding) if self.fp8 else None
        return _PackedInputConv2d.apply(x, *self.packed(x), self.weight, self.bias, self.stride, padding, self.dilation,
                                        self.groups, dtype, fp8)


def set_spike_fp8(module: nn.Module, on: bool = True) -> int:
    """Switch the FP8 forward (:class:`SpikeConv2d`'s ``fp8``) on or off in every :class:`SpikeConv2d` inside
    ``module``; returns how many there are (the convolutions of spikes that a model family builds with
    ``spike_bytes`` or ``spike_fp8`` on; 0: the model has none, so nothing runs in FP8)."""
    on = flag("on", on)
    convs = [m for m in module.modules() if isinstance(m, SpikeConv2d)]
    for m in convs:
        m.fp8 = on
    return len(convs)


def make_conv2d(cin: int, cout: int, k: int, stride: int = 1, bias: bool = False, *, input_max: int | None = None,
                spike_bytes: bool = False, backend: str = "auto") -> nn.Conv2d:
    """A ``k x k`` convolution (padding ``k // 2``), as the model families build theirs. ``input_max``: its input is
    integers in ``[0, input_max]`` by construction (spikes: the neurons' :func:`~snntrain.nn.neurons.spike_max`; a sum
    of spike maps: the sum of their bounds); None: any values (an image, currents). With ``spike_bytes`` and
    ``input_max`` at most 255 it is a :class:`SpikeConv2d` (the same parameters and results, the input kept packed
    for the backward in the fewest bits that hold ``input_max``, with ``backend``'s packing), else a
    :class:`torch.nn.Conv2d`."""
    if input_max is not None and (isinstance(input_max, bool) or not isinstance(input_max, int) or input_max < 1):
        raise ValueError(f"input_max={input_max!r} must be a positive int (the largest input value) or None")
    if spike_bytes and input_max is not None and input_max <= BYTE_MAX:
        return SpikeConv2d(cin, cout, k, stride=stride, padding=k // 2, bias=bias, input_max=input_max,
                           backend=backend)
    return nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=bias)


class TemporalDropout(nn.Module):
    """Dropout of ``[T, B, ...]`` input with one mask for all T steps of a sample (as SpikingJelly's
    multi-step ``layer.Dropout``): a unit that is dropped stays silent for the whole sequence, instead of a
    fresh mask per step, which would act as extra input noise to the neurons after it. Kept elements are
    scaled by ``1 / (1 - p)``; in eval mode the input passes unchanged.
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise ValueError(f"dropout p={p!r} must be a number in [0, 1)")
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.dim() < 2:
            raise ValueError(f"TemporalDropout expects [T, B, ...] input, got shape {tuple(x.shape)}")
        keep = torch.empty((1, *x.shape[1:]), dtype=x.dtype, device=x.device).bernoulli_(1.0 - self.p)
        return x * keep.div_(1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def check_connect(connect: object) -> str:
    if not isinstance(connect, str) or connect.upper() not in CONNECTS:
        raise ValueError(f"connect={connect!r} is not valid; choose one of {', '.join(CONNECTS)}")
    return connect.upper()


def sew_connect_max(connect: str, out_max: int | None, identity_max: int | None) -> int | None:
    """The largest value of :func:`sew_connect` ``(out, identity, connect)`` for ``out`` of integers in
    ``[0, out_max]`` and ``identity`` of integers in ``[0, identity_max]``: its output is then integers in
    ``[0, result]``. None where either bound is None or the output can be negative (IAND of counts above 1)."""
    if out_max is None or identity_max is None:
        return None
    if connect == "ADD":
        return out_max + identity_max
    if connect == "AND":
        return out_max * identity_max
    if connect == "IAND":
        return identity_max if out_max == 1 else None
    raise ValueError(f"connect={connect!r} is not valid; choose one of {', '.join(CONNECTS)}")


def sew_connect(out: torch.Tensor, identity: torch.Tensor, connect: str) -> torch.Tensor:
    """Spike-element-wise residual ``g(A, S)`` of the block output ``A`` and the shortcut ``S``.

    ``ADD``: ``A + S``; ``AND``: ``A * S``; ``IAND``: ``(1 - A) * S`` (Fang et al., 2021).
    """
    if connect == "ADD":
        return out + identity
    if connect == "AND":
        return out * identity
    if connect == "IAND":
        return (1.0 - out) * identity
    raise ValueError(f"connect={connect!r} is not valid; choose one of {', '.join(CONNECTS)}")
