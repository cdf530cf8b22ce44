"""Spikformer (Zhou et al., "Spikformer: When Spiking Neural Network Meets Transformer", ICLR 2023).

A spiking patch stem (four conv-norm-neuron stages, max-pooling the spikes of the last
``log2(patch_size)`` of them, then a conv-norm-neuron relative position encoding added to its input),
``depth`` blocks of spiking self-attention and a spiking MLP with residual additions of spikes
(:class:`~snntrain.nn.attention.SpikingSelfAttention`), token average and a linear head per step,
averaged over T.

Tokens flow as ``[T, B, N, C]``; every projection is followed by a fused norm-neuron
(:class:`~snntrain.nn.attention.LinearNormNeuron`). Named variants follow SpikingJelly 2.0's constructors
(:data:`VARIANTS`), with the same parameter counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..nn.attention import SpikingMLP, SpikingParts, SpikingSelfAttention, checkpointed, tokens_from_map
from ..nn.layers import MultiStep
from ..nn.norm_neuron import norm_neuron_add
from ..nn.pool import SpikeMaxPool2d
from ..validation import flag, number, positive_int
from .transformer import DEFAULT_NEURON, encode_stem, init_transformer, pooled_spikes, resolve_variant

#: Variant name -> architecture, as SpikingJelly 2.0.0's constructors of the same name build it.
VARIANTS: dict[str, dict[str, Any]] = {
    "spikformer_ti": {"embed_dim": 256, "heads": 8, "depth": 4, "patch_size": 16},
    "spikformer_s": {"embed_dim": 384, "heads": 12, "depth": 6, "patch_size": 16},
    "spikformer_cifar10": {"embed_dim": 384, "heads": 12, "depth": 4, "patch_size": 4},
}


class Block(nn.Module):
    """``x + SSA(x)``, then ``x + MLP(x)``: the residual stream holds spike counts."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float, parts: SpikingParts, scale: float) -> None:
        super().__init__()
        self.attn = SpikingSelfAttention(dim, heads, parts, scale)
        self.mlp = SpikingMLP(dim, int(dim * mlp_ratio), parts, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.mlp(x)


class PatchStem(nn.Module):
    """Four conv-norm-neuron stages to ``[E/8, E/4, E/2, E]`` channels, the spikes of the last ``log2(patch)`` of
    them max-pooled (stride 2), then ``x + neuron(norm(conv(x)))`` (relative position encoding)."""

    def __init__(self, in_channels: int, dim: int, patch_size: int, parts: SpikingParts) -> None:
        super().__init__()
        pools = int(math.log2(patch_size))
        widths = (dim // 8, dim // 4, dim // 2, dim)
        self.convs = nn.ModuleList()
        self.sns = nn.ModuleList()
        self.pools = nn.ModuleList()
        cin = in_channels
        for i, w in enumerate(widths):  # the first convolution reads the image, the others spikes
            self.convs.append(MultiStep(parts.conv(cin, w, input_max=parts.spike_max if i else None)))
            self.sns.append(parts.norm_neuron(w))
            pooled = i >= len(widths) - pools
            self.pools.append(MultiStep(SpikeMaxPool2d(3, stride=2, padding=1, backend=parts.backend)) if pooled
                              else nn.Identity())
            cin = w
        self.rpe_conv = MultiStep(parts.conv(dim, dim, input_max=parts.spike_max))
        self.rpe_sn = parts.norm_neuron(dim)

    def forward(self, x: torch.Tensor, T: int, recompute: bool = False) -> torch.Tensor:
        """``recompute``: each stage's activations are recomputed in the backward (:func:`checkpointed`)."""
        def first(x):
            return encode_stem(self.convs[0], self.sns[0], x, T, self.pools[0])

        x = checkpointed(self, first, x) if recompute else first(x)
        for conv, sn, pool in zip(self.convs[1:], self.sns[1:], self.pools[1:]):
            def stage(x, conv=conv, sn=sn, pool=pool):
                return pooled_spikes(sn, pool, conv(x))

            x = checkpointed(self, stage, x) if recompute else stage(x)
        return norm_neuron_add(self.rpe_sn, self.rpe_conv(x), x)


class Spikformer(nn.Module):
    """Spikformer classifier.

    Args:
        variant: a name of :data:`VARIANTS` (``spikformer_ti``, ``spikformer_s``, ``spikformer_cifar10``); the
            architecture arguments below override it where given (not None).
        embed_dim: channels of the tokens ``E``.
        depth: transformer blocks.
        heads: attention heads.
        patch_size: 1, 2, 4, 8 or 16: the stem pools the last ``log2(patch_size)`` stages.
        mlp_ratio: hidden channels of the MLP over ``E``.
        num_classes, in_channels: classifier outputs, image channels.
        T: time steps for static ``[B, C, H, W]`` input (the first convolution runs once and its output is the
            input current of every step); ``[T, B, C, H, W]`` input is used as it is.
        neuron: neuron settings (every neuron type of :func:`snntrain.nn.build_neuron`).
        attn_v_threshold: threshold of the neuron after ``Q K^T V`` (0.5 in the paper).
        scale: the attention's factor (0.125).
        norm: ``batchnorm`` (the paper) or ``layernorm`` (over each token's channels, our Triton layer norm).
        checkpoint: activation recomputation in training: every block and stem stage keeps only its input and
            runs again in the backward (about a third more compute for a fraction of the activation memory).
        backend: ``auto``, ``torch`` or ``triton``.
        spike_bytes: convolutions of spikes keep their input for the backward packed in bits (one bit
            an element for spikes, :class:`~snntrain.nn.layers.SpikeConv2d`; the same results); False: plain ``Conv2d``.
            Projections keep theirs packed either way (:class:`~snntrain.nn.attention.SpikeLinear`: a bit for spikes,
            a byte for spike counts).

    ``forward`` returns logits ``[B, num_classes]`` averaged over T.
    """

    #: why :func:`snntrain.nir.to_nir` refuses the model
    nir_refusal = ("spiking self-attention multiplies spike tensors with each other (Q K^T V); NIR graphs connect "
                   "neurons through fixed weights and have no node for a product of two activities")

    def __init__(
        self,
        variant: str | None = "spikformer_cifar10",
        embed_dim: int | None = None,
        depth: int | None = None,
        heads: int | None = None,
        patch_size: int | None = None,
        mlp_ratio: float = 4.0,
        num_classes: int = 10,
        in_channels: int = 3,
        T: int = 4,
        neuron: Mapping[str, Any] | None = None,
        attn_v_threshold: float | None = 0.5,
        scale: float = 0.125,
        norm: str = "batchnorm",
        checkpoint: bool = False,
        backend: str = "auto",
        spike_bytes: bool = False,
    ) -> None:
        super().__init__()
        self.checkpoint = flag("checkpoint", checkpoint)
        arch = resolve_variant("spikformer", VARIANTS, variant, embed_dim=embed_dim, depth=depth, heads=heads,
                               patch_size=patch_size)
        dim, self.depth = positive_int("embed_dim", arch["embed_dim"]), positive_int("depth", arch["depth"])
        heads = positive_int("heads", arch["heads"])
        patch = positive_int("patch_size", arch["patch_size"])
        if patch not in (1, 2, 4, 8, 16):
            raise ValueError(f"patch_size={patch!r} is not valid; choose one of 1, 2, 4, 8, 16")
        if dim % 8 or dim % heads:
            raise ValueError(f"embed_dim={dim} must be a multiple of 8 (the stem's first stage has E/8 channels) "
                             f"and of heads={heads}")
        self.variant, self.embed_dim, self.heads, self.patch_size = variant, dim, heads, patch
        self.T = positive_int("T", T)
        self.num_classes = positive_int("num_classes", num_classes)
        mlp_ratio = number("mlp_ratio", mlp_ratio)
        parts = SpikingParts(DEFAULT_NEURON if neuron is None else neuron, norm, backend, attn_v_threshold, T=T,
                             spike_bytes=spike_bytes)
        self.stem = PatchStem(positive_int("in_channels", in_channels), dim, patch, parts)
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio, parts, scale) for _ in range(self.depth))
        self.head = nn.Linear(dim, self.num_classes)
        init_transformer(self)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens ``[T, B, N, E]`` after the last block."""
        recompute = self.checkpoint and self.training
        x = tokens_from_map(self.stem(x, self.T, recompute))
        for block in self.blocks:
            x = checkpointed(block, block, x) if recompute else block(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x).mean(2)).mean(0)
