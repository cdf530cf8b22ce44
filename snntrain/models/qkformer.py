"""QKFormer (Zhou et al., "QKFormer: Hierarchical Spiking Transformer using Q-K Attention", NeurIPS 2024).

Three stages at ``E/4, E/2, E`` channels, each behind a spiking patch embedding with a spike shortcut
(``x + neuron(norm(conv_1x1(x)))``): the first two stages' blocks use Q-K token attention
(:class:`~snntrain.nn.attention.QKAttention`), the last Spikformer's spiking self-attention; every block is
``x + attn(x)``, ``x + MLP(x)`` on spike-count tokens. Token average, the linear head per step, averaged over T.

The layout is SpikingJelly 2.0's (``QKFormer``: its first embedding convolves three times and pools twice). Its
four max-pools can be switched off one by one (``pooling``) so that small images keep enough tokens (the paper's
CIFAR model pools only in the last two embeddings); pooling has no parameters, so the counts stay SpikingJelly's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..nn.attention import (
    QK_MODES,
    QKAttention,
    SpikingMLP,
    SpikingParts,
    SpikingSelfAttention,
    checkpointed,
    tokens_from_map,
)
from ..nn.layers import MultiStep
from ..nn.norm_neuron import norm_neuron_add
from ..validation import flag, number, one_of, positive_int
from .transformer import DEFAULT_NEURON, init_transformer, resolve_variant

#: Variant name -> architecture: ``qkformer_10_384`` as SpikingJelly 2.0.0 builds it (ImageNet, 224 -> 14x14
#: tokens in the last stage); ``qkformer_4_384`` the paper's CIFAR model (blocks 1-1-2, stages at 32, 16 and 8
#: tokens a side); ``qkformer_2_256`` its event-camera model (no first-stage block, 128 -> 8x8 tokens).
VARIANTS: dict[str, dict[str, Any]] = {
    "qkformer_10_384": {"embed_dim": 384, "heads": (6, 6, 6), "depths": (1, 2, 7), "pooling": "1111"},
    "qkformer_4_384": {"embed_dim": 384, "heads": (8, 8, 8), "depths": (1, 1, 2), "pooling": "0011"},
    "qkformer_2_256": {"embed_dim": 256, "heads": (8, 8, 8), "depths": (0, 1, 1), "pooling": "1111"},
}


def _pool(on: str) -> nn.Module:
    return MultiStep(nn.MaxPool2d(3, stride=2, padding=1)) if on == "1" else nn.Identity()


class EmbedInit(nn.Module):
    """``conv-norm-pool-neuron`` to ``E/8`` (the identity), ``conv-norm-pool-neuron`` then ``conv-norm-neuron`` to
    ``E/4``, plus the shortcut ``neuron(norm(conv_1x1(identity)))`` (stride 2 where the second pool is on)."""

    def __init__(self, cin: int, cout: int, pooling: str, parts: SpikingParts) -> None:
        super().__init__()
        hidden = cout // 2
        self.conv1 = MultiStep(parts.conv(cin, hidden, bias=True))
        self.norm1 = parts.norm2d(hidden)
        self.pool1 = nn.MaxPool2d(3, stride=2, padding=1) if pooling[0] == "1" else nn.Identity()
        self.neuron1 = parts.neuron()
        m = parts.spike_max  # every convolution but the first reads spikes
        self.conv2 = MultiStep(parts.conv(hidden, cout, bias=True, input_max=m), parts.norm2d(cout))
        self.pool2 = _pool(pooling[1])
        self.neuron2 = parts.neuron()
        self.conv3 = MultiStep(parts.conv(cout, cout, bias=True, input_max=m))
        self.sn3 = parts.norm_neuron(cout)
        self.shortcut = MultiStep(parts.conv(hidden, cout, 1, stride=2 if pooling[1] == "1" else 1, bias=True,
                                             input_max=m))
        self.shortcut_sn = parts.norm_neuron(cout)

    def forward(self, x: torch.Tensor, T: int) -> torch.Tensor:
        if x.dim() == 4:  # direct encoding: convolution, norm and pooling once, the neuron over T steps
            y = self.pool1(self.norm1(self.conv1[0](x)))
            x = self.neuron1(y.unsqueeze(0).expand(T, *y.shape))
        elif x.dim() == 5:
            x = self.neuron1(MultiStep(self.norm1, self.pool1)(self.conv1(x)))
        else:
            raise ValueError(f"input has shape {tuple(x.shape)}; expected [B, C, H, W] or [T, B, C, H, W]")
        y = self.conv3(self.neuron2(self.pool2(self.conv2(x))))
        return norm_neuron_add(self.sn3, y, lambda: self.shortcut_sn(self.shortcut(x)))


class EmbedStage(nn.Module):
    """``conv-norm-pool-neuron``, ``conv-norm-neuron``, plus the shortcut ``neuron(norm(conv_1x1(x)))`` (stride 2
    where the pool is on). ``input_max``: the input is spike counts in ``[0, input_max]`` (:func:`stage_max`; None:
    not known)."""

    def __init__(self, cin: int, cout: int, pool: str, parts: SpikingParts, input_max: int | None = None) -> None:
        super().__init__()
        self.conv1 = MultiStep(parts.conv(cin, cout, bias=True, input_max=input_max), parts.norm2d(cout))
        self.pool = _pool(pool)
        self.neuron1 = parts.neuron()
        self.conv2 = MultiStep(parts.conv(cout, cout, bias=True, input_max=parts.spike_max))
        self.sn2 = parts.norm_neuron(cout)
        self.shortcut = MultiStep(parts.conv(cin, cout, 1, stride=2 if pool == "1" else 1, bias=True,
                                             input_max=input_max))
        self.shortcut_sn = parts.norm_neuron(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.neuron1(self.pool(self.conv1(x))))
        return norm_neuron_add(self.sn2, y, lambda: self.shortcut_sn(self.shortcut(x)))


class Block(nn.Module):
    """``x + attn(x)``, ``x + MLP(x)`` on tokens: Q-K attention (``mode``) or, with ``mode=None``, spiking
    self-attention."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float, mode: str | None, parts: SpikingParts) -> None:
        super().__init__()
        self.attn = SpikingSelfAttention(dim, heads, parts) if mode is None else QKAttention(dim, heads, parts, mode)
        self.mlp = SpikingMLP(dim, int(dim * mlp_ratio), parts, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.mlp(x)


def stage_max(spike_max: int | None, depth: int) -> int | None:
    """The largest value of a stage's output tokens (spike counts): its embedding adds two spike maps, each of its
    ``depth`` blocks two more (``x + attn(x)``, ``x + MLP(x)``); None where the neurons' ``spike_max`` is."""
    return None if spike_max is None else 2 * spike_max * (1 + depth)


def _triple(name: str, value: Any) -> tuple[int, int, int]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 3:
        raise ValueError(f"{name}={value!r} must be three integers, one per stage")
    return tuple(int(v) for v in value)  # type: ignore[return-value]


class QKFormer(nn.Module):
    """QKFormer classifier.

    Args:
        variant: a name of :data:`VARIANTS` (``qkformer_10_384``, ``qkformer_4_384``, ``qkformer_2_256``); the
            architecture arguments below override it where given (not None).
        embed_dim: channels of the last stage ``E`` (a multiple of 8); the stages have ``E/4, E/2, E``.
        heads: attention heads per stage (three integers).
        depths: blocks per stage (three integers, 0 allowed).
        pooling: four characters 0/1: the first embedding's two max-pools, the second's and the third's.
        qk_mode: the first two stages' Q-K attention, ``token`` (the paper) or ``channel``.
        mlp_ratio: MLP hidden channels over the stage's channels.
        num_classes, in_channels, T, neuron, attn_v_threshold, norm, checkpoint, backend, spike_bytes: as
            :class:`~snntrain.models.Spikformer`.

    ``forward`` returns logits ``[B, num_classes]`` averaged over T.
    """

    nir_refusal = ("Q-K attention and spiking self-attention multiply spike tensors with each other; NIR graphs "
                   "connect neurons through fixed weights and have no node for a product of two activities")

    def __init__(
        self,
        variant: str | None = "qkformer_4_384",
        embed_dim: int | None = None,
        heads: Sequence[int] | None = None,
        depths: Sequence[int] | None = None,
        pooling: str | None = None,
        qk_mode: str = "token",
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
        arch = resolve_variant("qkformer", VARIANTS, variant, embed_dim=embed_dim, heads=heads, depths=depths,
                               pooling=pooling)
        dim = positive_int("embed_dim", arch["embed_dim"])
        heads, depths = _triple("heads", arch["heads"]), _triple("depths", arch["depths"])
        if any(d < 0 for d in depths):
            raise ValueError(f"depths={list(depths)} must not be negative")
        pooling = arch["pooling"]
        if not isinstance(pooling, str) or len(pooling) != 4 or set(pooling) - {"0", "1"}:
            raise ValueError(f"pooling={pooling!r} is not valid; give four characters 0/1 (e.g. '1111')")
        if dim % 8:
            raise ValueError(f"embed_dim={dim} must be a multiple of 8 (the first embedding has E/8 channels)")
        dims = (dim // 4, dim // 2, dim)
        for d, h in zip(dims, heads):
            positive_int("heads", h)
            if d % h:
                raise ValueError(f"heads={list(heads)}: a stage of {d} channels does not split into {h} heads")
        self.variant, self.embed_dim, self.heads, self.depths, self.pooling = variant, dim, heads, depths, pooling
        self.T = positive_int("T", T)
        self.num_classes = positive_int("num_classes", num_classes)
        one_of("qk_mode", qk_mode, QK_MODES)
        mlp_ratio = number("mlp_ratio", mlp_ratio)
        parts = SpikingParts(DEFAULT_NEURON if neuron is None else neuron, norm, backend, attn_v_threshold, T=T,
                             spike_bytes=spike_bytes)
        self.embed1 = EmbedInit(positive_int("in_channels", in_channels), dims[0], pooling, parts)
        self.embed2 = EmbedStage(dims[0], dims[1], pooling[2], parts, stage_max(parts.spike_max, depths[0]))
        self.embed3 = EmbedStage(dims[1], dims[2], pooling[3], parts, stage_max(parts.spike_max, depths[1]))
        self.stage1, self.stage2, self.stage3 = (
            nn.ModuleList(Block(d, h, mlp_ratio, qk_mode if i < 2 else None, parts) for _ in range(n))
            for i, (d, h, n) in enumerate(zip(dims, heads, depths)))
        self.head = nn.Linear(dim, self.num_classes)
        init_transformer(self)

    def _recompute(self) -> bool:
        return self.checkpoint and self.training

    def _run(self, module: nn.Module, *args: Any) -> torch.Tensor:
        return checkpointed(module, module, *args) if self._recompute() else module(*args)

    def _blocks(self, stage: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
        """A stage's blocks over tokens of the map ``x`` ``[T, B, C, H, W]``; returns the map (a channels-last view of
        the tokens)."""
        if not len(stage):
            return x
        h, w = x.shape[-2:]
        t = tokens_from_map(x)
        for block in stage:
            t = self._run(block, t)
        return t.transpose(-1, -2).unflatten(-1, (h, w))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens ``[T, B, N, E]`` after the last stage."""
        x = self._blocks(self.stage1, self._run(self.embed1, x, self.T))
        x = self._blocks(self.stage2, self._run(self.embed2, x))
        return tokens_from_map(self._blocks(self.stage3, self._run(self.embed3, x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x).mean(2)).mean(0)
