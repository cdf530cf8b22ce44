"""Spike-driven Transformer (Yao et al., "Spike-driven Transformer", NeurIPS 2023).

The residual stream carries membrane-level (real-valued) tokens and every block fires its own spikes from it
first (the membrane shortcut), so each projection's input is binary: a patch stem (three conv-norm-neuron
stages and a conv-norm fourth, each optionally max-pooled by ``pooling``, then a relative position encoding
``x + norm(conv(neuron(x)))``), ``depth`` blocks of spike-driven self-attention
(:class:`~snntrain.nn.attention.SpikeDrivenSelfAttention`) and an MLP ``x + norm(W_2 neuron(norm(W_1
neuron(x))))``, then token average, a neuron, the linear head per step, averaged over T.

Named variants follow SpikingJelly 2.0's ``sdt_8_384`` (ImageNet) and the paper's CIFAR and event models
(:data:`VARIANTS`) with the parameter counts of SpikingJelly's ``SpikeDrivenTransformer`` built alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..nn.attention import (
    SpikeDrivenSelfAttention,
    SpikingParts,
    checkpointed,
    neuron_tokens,
    norm_tokens,
    tokens_from_map,
)
from ..nn.layers import MultiStep
from ..nn.pool import SpikeMaxPool2d
from ..validation import flag, number, positive_int
from .transformer import DEFAULT_NEURON, encode_stem, init_transformer, pooled_spikes, resolve_variant

#: Variant name -> architecture: ``sdt_8_384`` as SpikingJelly 2.0.0 builds it (ImageNet, 224 -> 14x14 tokens);
#: ``sdt_2_512`` the paper's CIFAR model (32 -> 8x8 tokens); ``sdt_2_256`` its event-camera model (128 -> 16x16).
VARIANTS: dict[str, dict[str, Any]] = {
    "sdt_8_384": {"embed_dim": 384, "depth": 8, "pooling": "1111"},
    "sdt_2_512": {"embed_dim": 512, "depth": 2, "pooling": "0011"},
    "sdt_2_256": {"embed_dim": 256, "depth": 2, "pooling": "0111"},
}


def _pool(on: str, spikes_backend: str | None = None) -> nn.Module:
    """A 3x3 stride-2 max-pool where ``on`` is "1": of spikes with ``spikes_backend`` (:class:`SpikeMaxPool2d`), of
    other maps (``spikes_backend`` None) PyTorch's."""
    if on != "1":
        return nn.Identity()
    if spikes_backend is None:
        return MultiStep(nn.MaxPool2d(3, stride=2, padding=1))
    return MultiStep(SpikeMaxPool2d(3, stride=2, padding=1, backend=spikes_backend))


class PatchStem(nn.Module):
    """Stages to ``[E/8, E/4, E/2]`` channels (conv with bias, norm, neuron, pooled where ``pooling`` has a 1), a
    fourth conv-norm to ``E`` (pooled where ``pooling[3]`` is 1) whose output is the stream, and the relative
    position encoding ``x + norm(conv(neuron(x)))``."""

    def __init__(self, in_channels: int, dim: int, pooling: str, parts: SpikingParts) -> None:
        super().__init__()
        widths = (dim // 8, dim // 4, dim // 2)
        self.convs = nn.ModuleList()
        self.sns = nn.ModuleList()
        self.pools = nn.ModuleList()
        cin = in_channels
        for i, (w, on) in enumerate(zip(widths, pooling)):  # the first convolution reads the image, the rest spikes
            self.convs.append(MultiStep(parts.conv(cin, w, bias=True, input_max=parts.spike_max if i else None)))
            self.sns.append(parts.norm_neuron(w))
            self.pools.append(_pool(on, parts.backend))
            cin = w
        self.final = MultiStep(parts.conv(cin, dim, bias=True, input_max=parts.spike_max), parts.norm2d(dim))
        self.final_pool = _pool(pooling[3])
        self.final_neuron = parts.neuron()
        self.rpe = MultiStep(parts.conv(dim, dim, input_max=parts.spike_max), parts.norm2d(dim))

    def forward(self, x: torch.Tensor, T: int, recompute: bool = False) -> torch.Tensor:
        """``recompute``: each stage's activations are recomputed in the backward (:func:`checkpointed`)."""
        def first(x):
            return encode_stem(self.convs[0], self.sns[0], x, T, self.pools[0])

        x = checkpointed(self, first, x) if recompute else first(x)
        for conv, sn, pool in zip(self.convs[1:], self.sns[1:], self.pools[1:]):
            def stage(x, conv=conv, sn=sn, pool=pool):
                return pooled_spikes(sn, pool, conv(x))

            x = checkpointed(self, stage, x) if recompute else stage(x)

        def last(x):
            x = self.final_pool(self.final(x))
            return x + self.rpe(self.final_neuron(x))

        return checkpointed(self, last, x) if recompute else last(x)


class MLP(nn.Module):
    """``x + norm(W_2 neuron(norm(W_1 neuron(x) + b_1)) + b_2)``; with ``hidden == dim`` the hidden map also adds
    ``x`` before its neuron (and carries it on), as SpikingJelly's."""

    def __init__(self, dim: int, hidden: int, parts: SpikingParts) -> None:
        super().__init__()
        self.residual = hidden == dim
        self.neuron1 = parts.neuron()
        if self.residual:  # the norm's output is needed beside the neuron: not fused
            self.fc1 = parts.linear(dim, hidden, spikes=True)
            self.norm1 = parts.map_norm(hidden)
            self.neuron2 = parts.neuron()
        else:
            self.fc1 = parts.linear_norm_neuron(dim, hidden, bias=True, spikes=True)
        self.fc2 = parts.linear(hidden, dim, spikes=True)  # both read a neuron's spikes
        self.norm2 = parts.map_norm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = neuron_tokens(self.neuron1, x)
        if self.residual:
            x = x + norm_tokens(self.norm1, self.fc1(s))
            s = neuron_tokens(self.neuron2, x)
        else:
            s = self.fc1(s)
        return x + norm_tokens(self.norm2, self.fc2(s))


class Block(nn.Module):
    def __init__(self, dim: int, mlp_ratio: float, parts: SpikingParts) -> None:
        super().__init__()
        self.attn = SpikeDrivenSelfAttention(dim, parts)
        self.mlp = MLP(dim, int(dim * mlp_ratio), parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.attn(x))


class SpikeDrivenTransformer(nn.Module):
    """Spike-driven Transformer classifier.

    Args:
        variant: a name of :data:`VARIANTS` (``sdt_8_384``, ``sdt_2_512``, ``sdt_2_256``); the architecture
            arguments below override it where given (not None).
        embed_dim: token channels ``E`` (a multiple of 8).
        depth: blocks.
        pooling: four characters 0/1: which stem stages max-pool (stride 2).
        mlp_ratio: MLP hidden channels over ``E``.
        num_classes, in_channels, T, neuron, attn_v_threshold, norm, checkpoint, backend, spike_bytes: as
            :class:`~snntrain.models.Spikformer`.

    ``forward`` returns logits ``[B, num_classes]`` averaged over T.
    """

    nir_refusal = ("spike-driven self-attention multiplies spike tensors with each other (Q * neuron(sum K * V)); "
                   "NIR graphs connect neurons through fixed weights and have no node for a product of two activities")

    def __init__(
        self,
        variant: str | None = "sdt_2_512",
        embed_dim: int | None = None,
        depth: int | None = None,
        pooling: str | None = None,
        mlp_ratio: float = 4.0,
        num_classes: int = 10,
        in_channels: int = 3,
        T: int = 4,
        neuron: Mapping[str, Any] | None = None,
        attn_v_threshold: float | None = 0.5,
        norm: str = "batchnorm",
        checkpoint: bool = False,
        backend: str = "auto",
        spike_bytes: bool = False,
    ) -> None:
        super().__init__()
        self.checkpoint = flag("checkpoint", checkpoint)
        arch = resolve_variant("spike_driven_transformer", VARIANTS, variant, embed_dim=embed_dim, depth=depth,
                               pooling=pooling)
        dim, self.depth = positive_int("embed_dim", arch["embed_dim"]), positive_int("depth", arch["depth"])
        pooling = arch["pooling"]
        if not isinstance(pooling, str) or len(pooling) != 4 or set(pooling) - {"0", "1"}:
            raise ValueError(f"pooling={pooling!r} is not valid; give four characters 0/1 (e.g. '1111')")
        if dim % 8:
            raise ValueError(f"embed_dim={dim} must be a multiple of 8 (the stem's first stage has E/8 channels)")
        self.variant, self.embed_dim, self.pooling = variant, dim, pooling
        self.T = positive_int("T", T)
        self.num_classes = positive_int("num_classes", num_classes)
        mlp_ratio = number("mlp_ratio", mlp_ratio)
        parts = SpikingParts(DEFAULT_NEURON if neuron is None else neuron, norm, backend, attn_v_threshold, T=T,
                             spike_bytes=spike_bytes)
        self.stem = PatchStem(positive_int("in_channels", in_channels), dim, pooling, parts)
        self.blocks = nn.ModuleList(Block(dim, mlp_ratio, parts) for _ in range(self.depth))
        self.head_neuron = parts.neuron()
        self.head = nn.Linear(dim, self.num_classes)
        init_transformer(self)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Membrane-level tokens ``[T, B, N, E]`` after the last block."""
        recompute = self.checkpoint and self.training
        x = tokens_from_map(self.stem(x, self.T, recompute))
        for block in self.blocks:
            x = checkpointed(block, block, x) if recompute else block(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.forward_features(x).mean(2, keepdim=True)  # [T, B, 1, E]
        return self.head(neuron_tokens(self.head_neuron, pooled).squeeze(2)).mean(0)
