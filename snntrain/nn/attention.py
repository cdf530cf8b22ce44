"""Spiking self-attention and the token layers of the spiking transformers.

Tokens are ``[T, B, N, C]`` tensors (time, batch, token, channel), contiguous, so every channel
projection is one matrix product (:class:`torch.nn.Linear` over the last dim). A contiguous token
tensor is, element for element, the map ``[T, B, C, N, 1]`` in channels-last memory order (strides
``(B N C, N C, 1, C, C)``): :func:`tokens_as_map` gives that view, so the norm and neuron after a
projection run as one fused :class:`~snntrain.nn.norm_neuron.NormNeuron` over the channels, reading
and writing the tokens in place (no transposes), and every neuron sees its channels at dim 2, where the
efficiency report counts them.

The attentions, each as its paper defines it (Q, K, V are spike tensors, split into heads of
``C / heads`` channels):

* :class:`SpikingSelfAttention` (Spikformer's SSA, Zhou et al. 2023): per head
  ``S = neuron(scale * Q K^T V)``, no softmax; computed as ``Q (K^T V)`` (``K^T V`` is ``d x d`` per
  head and step, so the cost is linear in the tokens). Under the Triton backend the product and the
  neuron after it are one fused operator (:mod:`snntrain.kernels.spike_attention`): the attention
  current never reaches memory.
* :class:`SpikeDrivenSelfAttention` (Spike-driven Transformer's SDSA, Yao et al. 2023): per channel
  ``S = neuron(sum_tokens K * V)``, then ``Q * S`` (a mask of Q by a spike per channel).
* :class:`QKAttention` (QKFormer, Zhou et al. 2024): token attention ``S = neuron(sum over a head's
  channels of Q)`` (one spike per token and head) or channel attention ``S = neuron(sum_tokens Q)``
  (one per channel), then ``S * K``.

The reductions are summed in float32 (exact spike counts, whatever the dtype of the spikes). The
attention neurons fire at ``attn_v_threshold`` (0.5 in all three papers).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..backend import check_backend, use_triton
from ..validation import flag, number, one_of, positive_int
from .layers import BYTE_MAX, MultiStep, PackedInput, make_conv2d, unpack_input
from .neurons import BaseNeuron, build_neuron, config_neuron, neuron_class, neuron_parameters, spike_max
from .norm import build_norm2d
from .norm_neuron import NormNeuron

__all__ = [
    "LinearNormNeuron", "QKAttention", "QKVNeuron", "SpikeDrivenSelfAttention", "SpikeLinear", "SpikingMLP",
    "SpikingParts", "SpikingSelfAttention", "checkpointed", "map_as_tokens", "neuron_tokens", "norm_tokens",
    "ssa_reference", "tokens_as_map", "tokens_from_map",
]

#: Neuron kinds the fused attention operators implement (others run the product, then the neuron module).
_FUSED_KINDS = ("if", "lif", "plif")
_FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def tokens_as_map(x: torch.Tensor) -> torch.Tensor:
    """Tokens ``[T, B, N, C]`` as the map ``[T, B, C, N, 1]`` (a view; channels-last when ``x`` is contiguous).

    The last dim's stride is ``C``, a channels-last map's (not 1, which ``unsqueeze(-1)`` would give): PyTorch's CPU
    batch norm computes wrong input gradients for a channels-last map whose size-1 width has stride 1."""
    return x.unsqueeze(-2).movedim(-1, -3)


def map_as_tokens(y: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`tokens_as_map`: ``[T, B, C, N, 1]`` as tokens ``[T, B, N, C]`` (a view)."""
    return y.squeeze(-1).transpose(-1, -2)


def tokens_from_map(x: torch.Tensor) -> torch.Tensor:
    """Feature maps ``[T, B, C, H, W]`` as contiguous tokens ``[T, B, H W, C]``: a view of a channels-last map,
    a copy otherwise."""
    return x.flatten(-2).transpose(-1, -2).contiguous()


def neuron_tokens(neuron: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``neuron`` over tokens ``[T, B, N, C]`` (run on the map view, so that it sees the channels at dim 2)."""
    return map_as_tokens(neuron(tokens_as_map(x)))


def norm_tokens(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A channel norm (a :class:`~snntrain.nn.layers.MultiStep` of ``BatchNorm2d`` or ``LayerNorm2d``) over
    tokens ``[T, B, N, C]``."""
    return map_as_tokens(norm(tokens_as_map(x)))


class _NarrowLinear(torch.autograd.Function):
    """``x W^T + b`` keeping ``x`` for the backward as ``packed`` (:func:`~snntrain.nn.layers.pack_input`: ``x``
    holds small non-negative integers, spikes or spike counts, exact in ``bits``) and not keeping the weight's 16-bit
    copy."""

    @staticmethod
    def forward(ctx, x, packed, packing, weight, bias, dtype):
        ctx.save_for_backward(packed, weight, bias)
        ctx.dtype, ctx.x_dtype, ctx.packing = dtype, x.dtype, packing
        return F.linear(x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype))

    @staticmethod
    def backward(ctx, grad):
        packed, weight, bias = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[3], ctx.needs_input_grad[4]
        g = grad.to(ctx.dtype)
        gx = (g @ weight.to(ctx.dtype)).to(ctx.x_dtype) if need_x else None
        g2 = g.reshape(-1, g.shape[-1])
        gw = None
        if need_w:
            xs = unpack_input(packed, ctx.packing, ctx.dtype)
            gw = (g2.T @ xs.reshape(-1, xs.shape[-1])).to(weight.dtype)
        gb = g2.sum(0).to(bias.dtype) if need_b and bias is not None else None
        return gx, None, None, gw, gb, None


class SpikeLinear(PackedInput, nn.Linear):
    """A :class:`torch.nn.Linear` over spikes or spike counts (small non-negative integers): in training it keeps its
    input for the backward packed in the fewest bits that hold ``input_max`` (keyword, 1 to 255, default 255: one
    bit an element for spikes, a byte for counts up to 255; :mod:`snntrain.kernels.spike_pack`, with ``backend``'s
    kernels or PyTorch reference, as :class:`~snntrain.nn.layers.SpikeConv2d`), and computes in autocast's dtype, or
    the wider of the input's and the weight's. Values, gradients and state dict are the Linear's; its input must be
    integers in [0, input_max] (what the spiking transformers feed it: binary spikes, or sums of at most a few hundred
    of them), which is not checked (that would wait for the device). ``narrow = False`` (a plain attribute) makes it
    a plain Linear, for other inputs."""

    narrow = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.narrow or not torch.is_grad_enabled() or not (x.requires_grad or self.weight.requires_grad):
            return super().forward(x)
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else \
            torch.promote_types(x.dtype, self.weight.dtype)
        with torch.autocast(device, enabled=False):
            return _NarrowLinear.apply(x, *self.packed(x), self.weight, self.bias, dtype)


class _KeepBuffers:
    """Restores ``module``'s buffers (batch-norm running statistics and counts) on exit: a recomputed forward
    leaves them as the first forward did."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __enter__(self) -> None:
        self.saved = [(b, b.clone()) for b in self.module.buffers()]

    def __exit__(self, *exc) -> bool:
        with torch.no_grad():
            for b, copy in self.saved:
                b.copy_(copy)
        self.saved = []
        return False


def checkpointed(module: nn.Module, fn: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
    """``fn(*args)`` (``module``'s computation) with activation recomputation when a gradient is recorded: only the
    inputs are kept, and the backward runs ``fn`` again (:func:`torch.utils.checkpoint.checkpoint`, non-reentrant).
    The recomputation leaves ``module``'s running statistics as the first forward set them; under ``torch.compile``
    the compiler replays no buffer update, so the plain checkpoint is used."""
    from torch.utils.checkpoint import checkpoint

    if not torch.is_grad_enabled():
        return fn(*args)
    if torch.compiler.is_compiling():
        return checkpoint(fn, *args, use_reentrant=False)
    return checkpoint(fn, *args, use_reentrant=False,
                      context_fn=lambda: (contextlib.nullcontext(), _KeepBuffers(module)))


class SpikingParts:
    """Builds the spiking layers of a network with its settings: every neuron through
    :func:`~snntrain.nn.neurons.build_neuron` from ``neuron`` (any registered neuron type), every norm through
    :func:`~snntrain.nn.norm.build_norm2d` (``batchnorm`` or ``layernorm``, the latter on our Triton layer norm),
    a norm followed by a neuron as one :class:`NormNeuron`.

    Args:
        neuron: neuron settings (``{"type": "LIF", "tau": 2.0, ...}``).
        norm: ``batchnorm`` or ``layernorm``.
        backend: ``auto``, ``torch`` or ``triton``.
        attn_v_threshold: the attention neurons' threshold (None: the neuron settings' own).
        T: the time steps, for neuron types that take them (the parallel spiking neurons).
        spike_bytes: convolutions of spikes keep their input for the backward packed in the fewest bits that hold
            it (:class:`~snntrain.nn.layers.SpikeConv2d`); False (the default): plain ``Conv2d``. Projections (where the
            neurons fire binary spikes) are :class:`SpikeLinear` either way (a bit for spikes, a byte for counts).

    :attr:`spike_max` is the largest value the neurons fire (1: binary spikes; None: not known integers,
    :func:`snntrain.nn.neurons.spike_max`), what a model passes as ``input_max`` of a convolution of spikes.
    """

    def __init__(self, neuron: Mapping[str, Any], norm: str = "batchnorm", backend: str = "auto",
                 attn_v_threshold: float | None = 0.5, T: int | None = None, spike_bytes: bool = False) -> None:
        self.neuron_cfg = config_neuron(neuron)
        self.T = T
        kind = self.neuron_cfg.get("type", "LIF")
        needs = inspect.signature(neuron_class(kind).__init__).parameters.get("channels")
        if needs is not None and needs.default is inspect.Parameter.empty:
            raise ValueError(f"neuron type {kind} needs the channel count of every layer, which the transformer "
                             "families do not have for their token and attention neurons; choose a type without "
                             "per-channel parameters (LIF, PLIF, ALIF, LearnableThresholdLIF, ...)")
        self.norm = norm
        self.backend = check_backend(backend)
        self.attn_v_threshold = None if attn_v_threshold is None else number("attn_v_threshold", attn_v_threshold)
        self.spike_bytes = flag("spike_bytes", spike_bytes)
        self.spike_max = spike_max(self.neuron())  # also validates the settings once, up front
        self.attention_neuron()
        build_norm2d(norm, 1, backend)

    def neuron(self, **overrides: Any) -> nn.Module:
        return build_neuron(**{**self.neuron_cfg, **overrides}, backend=self.backend, T=self.T)

    def attention_neuron(self) -> nn.Module:
        """The neuron after an attention product (threshold ``attn_v_threshold``)."""
        named, takes_any = neuron_parameters(self.neuron_cfg.get("type", "LIF"))
        if self.attn_v_threshold is None or not (takes_any or "v_threshold" in named):  # PSN: no threshold
            return self.neuron()
        return self.neuron(v_threshold=self.attn_v_threshold)

    def norm2d(self, channels: int) -> nn.Module:
        return build_norm2d(self.norm, channels, self.backend)

    def map_norm(self, channels: int) -> MultiStep:
        """A norm over the channels of ``[T, B, C, H, W]`` maps (also tokens, through :func:`norm_tokens`)."""
        return MultiStep(self.norm2d(channels))

    def norm_neuron(self, channels: int) -> NormNeuron:
        return NormNeuron(self.norm2d(channels), self.neuron(), self.backend)

    def conv(self, cin: int, cout: int, k: int = 3, stride: int = 1, bias: bool = False,
             input_max: int | None = None) -> nn.Conv2d:
        """A ``k x k`` convolution; ``input_max`` as :func:`~snntrain.nn.layers.make_conv2d`'s (None: the image)."""
        return make_conv2d(cin, cout, k, stride, bias, input_max=input_max, spike_bytes=self.spike_bytes,
                           backend=self.backend)

    def linear(self, cin: int, cout: int, bias: bool = True, spikes: bool = False) -> nn.Linear:
        """A projection of spikes (``spikes``: the output of one of the neurons, 0 or 1) or of spike counts (a
        residual stream's sums): a :class:`SpikeLinear` where the neurons fire binary spikes, whatever
        ``spike_bytes`` says (which is about the convolutions), keeping its input in one bit an element for spikes
        and in one byte for counts."""
        if self.spike_max != 1:
            return nn.Linear(cin, cout, bias=bias)
        return SpikeLinear(cin, cout, bias=bias, input_max=1 if spikes else BYTE_MAX, backend=self.backend)

    def linear_norm_neuron(self, cin: int, cout: int, bias: bool = False, spikes: bool = False) -> LinearNormNeuron:
        return LinearNormNeuron(self.linear(cin, cout, bias, spikes), self.norm_neuron(cout))


class LinearNormNeuron(nn.Module):
    """A channel projection of tokens, then a norm and a neuron: ``neuron(norm(x W^T + b))``.

    ``forward`` takes tokens ``[T, B, N, C_in]`` and returns spikes ``[T, B, N, C_out]``. The norm and the
    neuron are one :class:`NormNeuron` over the projection's output viewed as a channels-last map
    (:func:`tokens_as_map`), fused under the Triton backend. This is SpikingJelly's ``Conv1d(k=1) + BatchNorm1d
    + LIF`` unit; its parameters are the same.
    """

    def __init__(self, fc: nn.Linear, sn: NormNeuron) -> None:
        super().__init__()
        self.fc = fc
        self.sn = sn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return map_as_tokens(self.sn(tokens_as_map(self.fc(x))))


def ssa_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, scale: float) -> torch.Tensor:
    """``scale * Q K^T V`` per head of tokens ``[T, B, N, C]``, in float32, as ``Q (K^T V)``: the attention current
    of :class:`SpikingSelfAttention` (the PyTorch reference of the fused operator). Exact for spikes: ``K^T V`` holds
    integer counts."""
    t, b, n, c = q.shape
    d = c // heads
    with torch.autocast(q.device.type, enabled=False):
        qh, kh, vh = (z.float().reshape(t, b, n, heads, d).transpose(2, 3) for z in (q, k, v))  # [T, B, H, N, d]
        kv = kh.transpose(-1, -2) @ vh  # [T, B, H, d, d]
        y = (qh @ kv) * scale
    return y.transpose(2, 3).reshape(t, b, n, c)


class QKVNeuron(nn.Module):
    """``neuron(scale * Q K^T V)`` per head: the spiking self-attention of Spikformer after its Q, K, V spikes.

    Args:
        heads: attention heads (``C`` must be a multiple).
        scale: the product's factor (0.125 in Spikformer).
        neuron: the neuron after the product.
        backend: ``auto``, ``torch`` or ``triton``.

    ``forward(q, k, v)`` takes spike tokens ``[T, B, N, C]`` (views of one ``[T, B, N, 3C]`` tensor are read in
    place) and returns spikes ``[T, B, N, C]`` in ``q``'s dtype. Under Triton, with an IF/LIF/PLIF neuron, the
    product and the neuron are one fused operator: the float32 current is computed in registers from ``Q`` and
    ``K^T V`` (exact counts) and never stored; the backward recomputes it. Other neurons (and ``fused = False``)
    run :func:`ssa_reference`, then the neuron module. The layer hands its spikes to an attached efficiency counter
    (``activity``), like :class:`NormNeuron`.
    """

    #: the efficiency report's sink while a counter is attached (see :class:`NormNeuron`)
    activity = None

    def __init__(self, heads: int, scale: float, neuron: nn.Module, backend: str = "auto") -> None:
        super().__init__()
        self.heads = positive_int("heads", heads)
        self.scale = number("scale", scale)
        self.neuron = neuron
        self.backend = check_backend(backend)
        self.fused = True

    def _fusable(self, q: torch.Tensor) -> bool:
        neuron = self.neuron
        return (self.fused and isinstance(neuron, BaseNeuron) and neuron.params.kind in _FUSED_KINDS
                and not neuron.store_v_seq and q.dtype in _FUSED_DTYPES and use_triton(self.backend, q))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
            raise ValueError(f"QKVNeuron takes q, k, v tokens [T, B, N, C] of one shape, got {tuple(q.shape)}, "
                             f"{tuple(k.shape)}, {tuple(v.shape)}")
        if q.shape[-1] % self.heads:
            raise ValueError(f"{q.shape[-1]} channels do not split into heads={self.heads}")
        sink = None if torch.compiler.is_compiling() else self.activity
        if self._fusable(q):
            from ..kernels import spike_attention as K

            p = self.neuron.params
            spikes = K.ssa_neuron(q, k, v, self.heads, self.scale, kind=p.kind, tau=p.tau, w=self.neuron._w(),
                                  v_threshold=p.v_threshold, v_reset=p.v_reset, decay_input=p.decay_input,
                                  detach_reset=p.detach_reset, surrogate=p.surrogate, alpha=p.alpha)
        else:
            y = ssa_reference(q, k, v, self.heads, self.scale)
            spikes = neuron_tokens(self.neuron, y).to(q.dtype)
        if sink is not None:
            sink(tokens_as_map(spikes))
        return spikes

    def extra_repr(self) -> str:
        return f"heads={self.heads}, scale={self.scale}, backend={self.backend}"


class SpikingSelfAttention(nn.Module):
    """Spikformer's spiking self-attention (SSA) on spike (or spike-count) tokens ``[T, B, N, C]``:
    ``Q, K, V = neuron(norm(x W_qkv))``, ``neuron_0.5(scale * Q K^T V)`` per head, then
    ``neuron(norm(. W_proj))``. Returns spikes ``[T, B, N, C]``. The projections have no bias (as SpikingJelly's)."""

    def __init__(self, dim: int, heads: int, parts: SpikingParts, scale: float = 0.125) -> None:
        super().__init__()
        dim, heads = positive_int("dim", dim), positive_int("heads", heads)
        if dim % heads:
            raise ValueError(f"dim={dim} is not a multiple of heads={heads}")
        self.dim = dim
        self.qkv = parts.linear_norm_neuron(dim, 3 * dim)
        self.attn = QKVNeuron(heads, scale, parts.attention_neuron(), parts.backend)
        self.proj = parts.linear_norm_neuron(dim, dim, spikes=True)  # reads the attention neuron's spikes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).split(self.dim, dim=-1)
        return self.proj(self.attn(q, k, v))


class SpikeDrivenSelfAttention(nn.Module):
    """The Spike-driven Transformer's self-attention (SDSA) with its membrane shortcut, on real-valued tokens
    ``[T, B, N, C]``: ``s = neuron(x)``, ``Q, K, V = neuron(norm(s W_qkv))``, ``A = neuron_0.5(sum_tokens K * V)``
    (one spike per channel and step), ``x + norm((Q * A) W_proj + b)``. Returns the new membrane-level tokens.

    The attention is per channel, so it has no heads (SpikingJelly's ``num_heads`` does not change the result)."""

    def __init__(self, dim: int, parts: SpikingParts) -> None:
        super().__init__()
        dim = positive_int("dim", dim)
        self.dim = dim
        self.shortcut_neuron = parts.neuron()
        self.qkv = parts.linear_norm_neuron(dim, 3 * dim, spikes=True)  # reads the shortcut neuron's spikes
        self.attn_neuron = parts.attention_neuron()
        self.proj = parts.linear(dim, dim, spikes=True)  # reads Q * A, a product of spikes
        self.proj_norm = parts.map_norm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(neuron_tokens(self.shortcut_neuron, x)).split(self.dim, dim=-1)
        kv = (k * v).sum(2, keepdim=True, dtype=torch.float32)  # [T, B, 1, C] exact counts
        a = neuron_tokens(self.attn_neuron, kv).to(q.dtype)
        return x + norm_tokens(self.proj_norm, self.proj(q * a))


QK_MODES = ("token", "channel")


class QKAttention(nn.Module):
    """QKFormer's Q-K attention on spike-count tokens ``[T, B, N, C]``: ``Q, K = neuron(norm(x W_qk))``; ``token``
    mode: ``A = neuron_0.5(sum over each head's channels of Q)`` (one spike per token and head), ``channel`` mode:
    ``A = neuron_0.5(sum_tokens Q)`` (one per channel); then ``neuron(norm((A * K) W_proj))``. Returns spikes."""

    def __init__(self, dim: int, heads: int, parts: SpikingParts, mode: str = "token") -> None:
        super().__init__()
        dim, heads = positive_int("dim", dim), positive_int("heads", heads)
        if dim % heads:
            raise ValueError(f"dim={dim} is not a multiple of heads={heads}")
        self.dim, self.heads, self.mode = dim, heads, one_of("mode", mode, QK_MODES)
        self.qk = parts.linear_norm_neuron(dim, 2 * dim)
        self.attn_neuron = parts.attention_neuron()
        self.proj = parts.linear_norm_neuron(dim, dim, spikes=True)  # reads A * K, a product of spikes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.qk(x).split(self.dim, dim=-1)
        if self.mode == "token":
            heads = (self.heads, self.dim // self.heads)
            a = neuron_tokens(self.attn_neuron, q.unflatten(-1, heads).sum(-1, dtype=torch.float32))  # [T, B, N, H]
            y = (k.unflatten(-1, heads) * a.to(k.dtype).unsqueeze(-1)).flatten(-2)
        else:
            a = neuron_tokens(self.attn_neuron, q.sum(2, keepdim=True, dtype=torch.float32))  # [T, B, 1, C]
            y = k * a.to(k.dtype)
        return self.proj(y)

    def extra_repr(self) -> str:
        return f"heads={self.heads}, mode={self.mode}"


class SpikingMLP(nn.Module):
    """Two projections of tokens, each followed by a norm and a neuron: ``C -> hidden -> C``, returning spikes."""

    def __init__(self, dim: int, hidden: int, parts: SpikingParts, bias: bool = False) -> None:
        super().__init__()
        self.fc1 = parts.linear_norm_neuron(positive_int("dim", dim), positive_int("hidden", hidden), bias)
        self.fc2 = parts.linear_norm_neuron(hidden, dim, bias, spikes=True)  # reads fc1's spikes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x))
